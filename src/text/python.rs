//! The one Python scanner of the crate, for reading model-written and
//! benchmark Python without running it: where string literals and comments
//! are ([`segments`], [`string_end`]), the bracket depth and open string
//! each line starts in ([`line_starts`]), a token stream ([`tokens`]), and
//! the functions `def` lines define ([`defs`]).
//!
//! It is lexical and forgiving, never an error: an unterminated string runs
//! to the end (or its line, see [`LineBreak`]), and f-strings are plain
//! strings, so a quote inside their braces (Python 3.12) closes them. A
//! backslash always escapes the next character, in raw strings too: `r"\""`
//! is one string in Python as well, so where a string ends comes out right.
//! Positions are byte offsets into the source; every delimiter is ASCII, so
//! they always fall on character boundaries.

/// What a single-quoted string (`'…'`, `"…"`) does at a line break that
/// comes before its closing quote. Triple-quoted strings always run on.
/// The callers differ here, and each keeps the rule its results were made
/// with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineBreak {
    /// The break belongs to the string, which runs to its quote or the end
    /// (an MBPP test is one line; a stray quote cannot hide much).
    Continues,
    /// An unescaped break ends the string, as in Python, and a backslash
    /// before it carries the string over. The break itself is code: one
    /// stray quote does not hide the rest of a file.
    Ends,
    /// Every break ends the string, escaped or not: the view of a scanner
    /// that reads one line at a time, where only a triple-quoted string is
    /// ever open at a line's start.
    AlwaysEnds,
}

/// Byte offset just past the string literal whose opening quote is at
/// `start` (a string prefix such as `rb` comes before it and is not looked
/// at). Where `breaks` ends a string at a line break, that is the offset of
/// the `\n`; an unterminated string ends at `src.len()`.
pub fn string_end(src: &str, start: usize, breaks: LineBreak) -> usize {
    let b = src.as_bytes();
    let q = b[start];
    debug_assert!(q == b'\'' || q == b'"', "no quote at byte {start}");
    let triple = b.get(start + 1) == Some(&q) && b.get(start + 2) == Some(&q);
    let single = |breaks_here: bool| !triple && breaks_here;
    let mut i = start + if triple { 3 } else { 1 };
    while i < b.len() {
        match b[i] {
            b'\\' if !single(breaks == LineBreak::AlwaysEnds && b.get(i + 1) == Some(&b'\n')) => {
                i += 2
            }
            c if c == q => {
                if !triple {
                    return i + 1;
                }
                if b.get(i + 1) == Some(&q) && b.get(i + 2) == Some(&q) {
                    return i + 3;
                }
                i += 1;
            }
            b'\n' if single(breaks != LineBreak::Continues) => return i,
            _ => i += 1,
        }
    }
    b.len()
}

/// What a [`Segment`] of source is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Anything outside strings and comments, string prefixes included.
    Code,
    /// A string literal from its opening quote to its end.
    String,
    /// From `#` to the end of its line, the line break excluded.
    Comment,
}

/// A maximal run of one [`Part`] of the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment<'a> {
    pub part: Part,
    pub text: &'a str,
    /// Byte offset of `text` in the source.
    pub start: usize,
    /// 1-based line `text` starts on.
    pub line: usize,
}

impl Segment<'_> {
    /// Byte offset just past the segment.
    pub fn end(&self) -> usize {
        self.start + self.text.len()
    }
}

/// The source cut into code, strings and comments, in order and covering
/// all of it; `breaks` says where single-quoted strings end.
pub fn segments(src: &str, breaks: LineBreak) -> Segments<'_> {
    Segments {
        src,
        at: 0,
        line: 1,
        breaks,
    }
}

/// The iterator of [`segments`].
#[derive(Debug, Clone)]
pub struct Segments<'a> {
    src: &'a str,
    at: usize,
    line: usize,
    breaks: LineBreak,
}

impl<'a> Iterator for Segments<'a> {
    type Item = Segment<'a>;

    fn next(&mut self) -> Option<Segment<'a>> {
        let rest = self.src.get(self.at..).filter(|r| !r.is_empty())?;
        let start = self.at;
        let (part, len) = match rest.as_bytes()[0] {
            b'#' => (Part::Comment, rest.find('\n').unwrap_or(rest.len())),
            b'\'' | b'"' => (
                Part::String,
                string_end(self.src, start, self.breaks) - start,
            ),
            _ => (
                Part::Code,
                rest.find(['#', '\'', '"']).unwrap_or(rest.len()),
            ),
        };
        let text = &rest[..len];
        let seg = Segment {
            part,
            text,
            start,
            line: self.line,
        };
        self.line += newlines(text);
        self.at += len;
        Some(seg)
    }
}

/// The state a line starts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LineStart {
    /// Brackets (`(`, `[`, `{`) open in the code before it; a stray closing
    /// bracket does not take it below 0.
    pub depth: usize,
    /// Whether it starts inside a string literal.
    pub in_string: bool,
}

/// The [`LineStart`] of every line of `code`, one per piece of
/// `code.split('\n')`, so the last one is the state after the last line
/// break. Brackets count in code only, never in strings or comments.
pub fn line_starts(code: &str, breaks: LineBreak) -> Vec<LineStart> {
    let mut out = vec![LineStart::default()];
    let mut depth = 0usize;
    for seg in segments(code, breaks) {
        match seg.part {
            Part::Code => {
                for b in seg.text.bytes() {
                    match b {
                        b'(' | b'[' | b'{' => depth += 1,
                        b')' | b']' | b'}' => depth = depth.saturating_sub(1),
                        b'\n' => out.push(LineStart {
                            depth,
                            in_string: false,
                        }),
                        _ => {}
                    }
                }
            }
            Part::String => out.extend((0..newlines(seg.text)).map(|_| LineStart {
                depth,
                in_string: true,
            })),
            Part::Comment => {}
        }
    }
    out
}

/// What a [`Token`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// An identifier or keyword ([`is_name`]).
    Name,
    /// A number, `1.5e-3` and `0x1F` alike; it never holds an attribute
    /// dot, but swallows letters right after it (`1if` is one number).
    Number,
    /// A string literal with its prefix (`rb'…'`), ended as
    /// [`LineBreak::Ends`] says.
    String,
    /// `#` to the end of the line.
    Comment,
    /// A line break. Inside brackets it ends no statement; see
    /// [`Token::depth`].
    Newline,
    /// Any other character, one at a time (`==` is two).
    Op,
}

/// One token of [`tokens`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token<'a> {
    pub kind: TokenKind,
    pub text: &'a str,
    /// Byte offset of `text` in the source.
    pub start: usize,
    /// 1-based line the token starts on.
    pub line: usize,
    /// Brackets open before the token.
    pub depth: usize,
}

/// The string prefixes, compared in lowercase: a name right before a quote
/// that is one of these is part of the string.
const STRING_PREFIXES: [&str; 10] = ["r", "u", "b", "f", "br", "rb", "fr", "rf", "t", "tr"];

/// Python source as tokens. Spaces, tabs, `\r` and form feeds separate
/// tokens and are dropped, and so is a backslash right before `\n` (a line
/// continuation; before `\r\n` the backslash is an [`TokenKind::Op`]).
pub fn tokens(src: &str) -> Tokens<'_> {
    Tokens {
        src,
        at: 0,
        line: 1,
        depth: 0,
    }
}

/// The iterator of [`tokens`].
#[derive(Debug, Clone)]
pub struct Tokens<'a> {
    src: &'a str,
    at: usize,
    line: usize,
    depth: usize,
}

impl<'a> Iterator for Tokens<'a> {
    type Item = Token<'a>;

    fn next(&mut self) -> Option<Token<'a>> {
        loop {
            let start = self.at;
            let rest = &self.src[start..];
            let c = rest.chars().next()?;
            let after = &rest[c.len_utf8()..];
            let (kind, len) = if c == '#' {
                (TokenKind::Comment, rest.find('\n').unwrap_or(rest.len()))
            } else if c == '\\' && after.starts_with('\n') {
                self.at += 2;
                self.line += 1;
                continue;
            } else if c == '\n' {
                (TokenKind::Newline, 1)
            } else if c == '\'' || c == '"' {
                let end = string_end(self.src, start, LineBreak::Ends);
                (TokenKind::String, end - start)
            } else if is_name_start(c) {
                let len = rest.find(|c| !is_name_char(c)).unwrap_or(rest.len());
                let prefix = STRING_PREFIXES.contains(&rest[..len].to_ascii_lowercase().as_str());
                if prefix && rest[len..].starts_with(['\'', '"']) {
                    let end = string_end(self.src, start + len, LineBreak::Ends);
                    (TokenKind::String, end - start)
                } else {
                    (TokenKind::Name, len)
                }
            } else if c.is_ascii_digit()
                || (c == '.' && after.starts_with(|d: char| d.is_ascii_digit()))
            {
                (TokenKind::Number, number_len(rest))
            } else if matches!(c, ' ' | '\t' | '\r' | '\x0c') {
                self.at += 1;
                continue;
            } else {
                (TokenKind::Op, c.len_utf8())
            };
            let depth = self.depth;
            match c {
                _ if kind != TokenKind::Op => {}
                '(' | '[' | '{' => self.depth += 1,
                ')' | ']' | '}' => self.depth = self.depth.saturating_sub(1),
                _ => {}
            }
            let text = &rest[..len];
            let tok = Token {
                kind,
                text,
                start,
                line: self.line,
                depth,
            };
            self.line += newlines(text);
            self.at += len;
            return Some(tok);
        }
    }
}

/// Length of the number `rest` starts with: name characters and dots, and
/// a sign right after an exponent's `e`.
fn number_len(rest: &str) -> usize {
    let mut len = 0;
    while let Some(d) = rest[len..].chars().next() {
        if !(is_name_char(d) || d == '.') {
            break;
        }
        let exp = matches!(d, 'e' | 'E') && rest[len + 1..].starts_with(['+', '-']);
        len += if exp { 2 } else { d.len_utf8() };
    }
    len
}

fn is_name_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_name_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Whether `s` is one identifier: `_` or a letter, then `_`, letters and
/// digits (Unicode ones too).
pub fn is_name(s: &str) -> bool {
    s.chars().next().is_some_and(is_name_start) && s.chars().all(is_name_char)
}

fn newlines(s: &str) -> usize {
    s.bytes().filter(|&b| b == b'\n').count()
}

/// Names of all `def NAME(` in Python `code`, nested ones included, in
/// order (an entry point may be defined inside `if`/`try`; a past entry's
/// helpers are renamed in prompts). It reads line by line and does not
/// look at strings: a `def` line inside a docstring counts, and so does
/// one line handed over alone.
pub fn defs(code: &str) -> Vec<&str> {
    code.lines()
        .filter_map(|line| {
            let rest = line.trim_start();
            let rest = rest.strip_prefix("async ").unwrap_or(rest);
            let rest = rest.strip_prefix("def ")?.trim_start();
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            Some(&rest[..end]).filter(|name| !name.is_empty())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(src: &str, breaks: LineBreak) -> Vec<(Part, &str, usize)> {
        segments(src, breaks)
            .map(|s| (s.part, s.text, s.line))
            .collect()
    }

    fn kinds(src: &str) -> Vec<(TokenKind, &str)> {
        tokens(src).map(|t| (t.kind, t.text)).collect()
    }

    #[test]
    fn a_string_ends_at_its_own_quote_past_escapes() {
        let end = |s: &str, at: usize| string_end(s, at, LineBreak::Ends);
        assert_eq!(end("'abc' + x", 0), 5);
        assert_eq!(end(r#""a'b" + x"#, 0), 5);
        assert_eq!(end(r#""a\"b" + x"#, 0), 6);
        assert_eq!(end(r"'a\\' + x", 0), 5);
        // Raw and byte strings: the scan starts at the quote.
        assert_eq!(end(r#"r"\"" + x"#, 1), 5);
        assert_eq!(end("b'x' + y", 1), 4);
        assert_eq!(end("'' + x", 0), 2);
        assert_eq!(end("'''''' + x", 0), 6);
        assert_eq!(end("'unterminated", 0), 13);
        // Positions are bytes; escaping a multi-byte character is fine.
        assert_eq!(end("'é\\é' + x", 0), 7);
    }

    #[test]
    fn triple_quotes_span_lines_and_hold_lone_quotes() {
        for breaks in [LineBreak::Continues, LineBreak::Ends, LineBreak::AlwaysEnds] {
            let s = "\"\"\"a \"b\" \"\"c\nd\\\"\"\"\" + x";
            assert_eq!(string_end(s, 0, breaks), s.len() - 4, "{breaks:?}");
            assert_eq!(string_end("'''a\\\n'''", 0, breaks), 9, "{breaks:?}");
            assert_eq!(string_end("'''open\n", 0, breaks), 8, "{breaks:?}");
        }
    }

    #[test]
    fn a_single_quoted_string_meets_a_line_break_as_told() {
        let plain = "'a\nb' + x";
        let escaped = "'a\\\nb' + x";
        let end = |s, breaks| string_end(s, 0, breaks);
        assert_eq!(end(plain, LineBreak::Continues), 5);
        assert_eq!(end(escaped, LineBreak::Continues), 6);
        assert_eq!(end(plain, LineBreak::Ends), 2);
        assert_eq!(end(escaped, LineBreak::Ends), 6);
        assert_eq!(end(plain, LineBreak::AlwaysEnds), 2);
        assert_eq!(end(escaped, LineBreak::AlwaysEnds), 3);
        // A backslash before `\r\n` escapes the `\r` only.
        assert_eq!(end("'a\\\r\nb'", LineBreak::AlwaysEnds), 4);
    }

    #[test]
    fn segments_cover_code_strings_and_comments() {
        use Part::{Code, Comment, String};
        let src = "x = f\"{a}\" + 'b#' # it's \"c\"\ny = \"\"\"d\ne\"\"\"  # (\n";
        let got = parts(src, LineBreak::Ends);
        assert_eq!(
            got,
            [
                (Code, "x = f", 1),
                (String, "\"{a}\"", 1),
                (Code, " + ", 1),
                (String, "'b#'", 1),
                (Code, " ", 1),
                (Comment, "# it's \"c\"", 1),
                (Code, "\ny = ", 1),
                (String, "\"\"\"d\ne\"\"\"", 2),
                (Code, "  ", 3),
                (Comment, "# (", 3),
                (Code, "\n", 3),
            ]
        );
        assert_eq!(
            got.iter().map(|p| p.1).collect::<std::string::String>(),
            src
        );
        // An f-string's nested quote closes it.
        assert_eq!(
            parts("f\"{d[\"k\"]}\"", LineBreak::Ends),
            [
                (Code, "f", 1),
                (String, "\"{d[\"", 1),
                (Code, "k", 1),
                (String, "\"]}\"", 1),
            ]
        );
        assert_eq!(parts("", LineBreak::Ends), []);
        let seg = segments("a'b'", LineBreak::Ends).nth(1).unwrap();
        assert_eq!((seg.start, seg.end()), (1, 4));
    }

    #[test]
    fn an_unterminated_string_hides_what_its_rule_says() {
        use Part::{Code, String};
        let src = "s = 'oops\nt = 1\n";
        assert_eq!(
            parts(src, LineBreak::Ends),
            [
                (Code, "s = ", 1),
                (String, "'oops", 1),
                (Code, "\nt = 1\n", 1)
            ]
        );
        assert_eq!(
            parts(src, LineBreak::Continues),
            [(Code, "s = ", 1), (String, "'oops\nt = 1\n", 1)]
        );
    }

    #[test]
    fn lines_start_with_their_bracket_depth_and_open_string() {
        let at = |depth, in_string| LineStart { depth, in_string };
        let code = "f(a, [\n  b], # )\n  '''\n)''', c)\nd = 'x(\ny\n";
        assert_eq!(
            line_starts(code, LineBreak::AlwaysEnds),
            [
                at(0, false),
                at(2, false),
                at(1, false),
                at(1, true),
                at(0, false),
                at(0, false),
                at(0, false),
            ]
        );
        // One entry per piece of `split('\n')`.
        assert_eq!(line_starts("", LineBreak::Ends), [at(0, false)]);
        assert_eq!(line_starts("x = ((", LineBreak::Ends), [at(0, false)]);
        // An escaped line break carries a single-quoted string over, or not.
        let code = "s = 'a\\\nb'\n";
        assert_eq!(
            line_starts(code, LineBreak::Ends),
            [at(0, false), at(0, true), at(0, false)]
        );
        assert_eq!(
            line_starts(code, LineBreak::AlwaysEnds),
            [at(0, false), at(0, false), at(0, false)]
        );
    }

    #[test]
    fn tokens_name_numbers_strings_and_line_ends() {
        use TokenKind::{Comment, Name, Newline, Number, Op, String};
        assert_eq!(
            kinds("x = rb'a' + Fr\"b\" + q'c'  # d\n"),
            [
                (Name, "x"),
                (Op, "="),
                (String, "rb'a'"),
                (Op, "+"),
                (String, "Fr\"b\""),
                (Op, "+"),
                (Name, "q"),
                (String, "'c'"),
                (Comment, "# d"),
                (Newline, "\n"),
            ]
        );
        assert_eq!(
            kinds("a.b(1.5e-3, .5, 0x1F, 1if x)==é_1"),
            [
                (Name, "a"),
                (Op, "."),
                (Name, "b"),
                (Op, "("),
                (Number, "1.5e-3"),
                (Op, ","),
                (Number, ".5"),
                (Op, ","),
                (Number, "0x1F"),
                (Op, ","),
                (Number, "1if"),
                (Name, "x"),
                (Op, ")"),
                (Op, "="),
                (Op, "="),
                (Name, "é_1"),
            ]
        );
        // f-strings are strings; a line break ends an unclosed one.
        assert_eq!(
            kinds("f'{x}' 'oops\ny"),
            [
                (String, "f'{x}'"),
                (String, "'oops"),
                (Newline, "\n"),
                (Name, "y")
            ]
        );
    }

    #[test]
    fn tokens_carry_lines_and_bracket_depth() {
        let src = "f(a,\n  b) \\\n+ '''x\ny''' \\\r\n)\n";
        let got: Vec<(&str, usize, usize)> =
            tokens(src).map(|t| (t.text, t.line, t.depth)).collect();
        assert_eq!(
            got,
            [
                ("f", 1, 0),
                ("(", 1, 0),
                ("a", 1, 1),
                (",", 1, 1),
                ("\n", 1, 1),
                ("b", 2, 1),
                (")", 2, 1),
                // The continuation is dropped but still counts as a line.
                ("+", 3, 0),
                ("'''x\ny'''", 3, 0),
                ("\\", 4, 0),
                ("\n", 4, 0),
                (")", 5, 0),
                ("\n", 5, 0),
            ]
        );
        assert_eq!(tokens("").count(), 0);
    }

    #[test]
    fn names_are_identifiers() {
        assert!(is_name("_x9") && is_name("éa") && is_name("A"));
        assert!(!is_name("") && !is_name("9a") && !is_name("a.b") && !is_name("a-b"));
    }

    #[test]
    fn defs_reads_def_lines_without_looking_at_strings() {
        let code = "async def a(): pass\n  def b(x):\nclass C:\n    async  def c(): ...\n\
                    def (x)\ndefx():\ndef _z9(\n\"\"\"\ndef in_doc():\n\"\"\"\n\tdef éa():\n\
                    x = 'def s(): '\n";
        assert_eq!(defs(code), ["a", "b", "_z9", "in_doc", "éa"]);
        assert!(defs("").is_empty());
    }
}
