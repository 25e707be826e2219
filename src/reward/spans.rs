//! Token spans for FALCON's fine-grained loss (Eq. 2 / Eq. 8):
//! `L = −Σ_{t=S_fine}^{E_fine} R_fine(ŵ_t) · log p(ŵ_t | D, θ, ŵ_{1:t−1})`.
//!
//! The sandbox reports error lines: 1-based line numbers in the candidate's
//! code. Here they become `(start_token, end_token, reward)` spans over the
//! completion's tokens, through each token's byte range in the completion
//! text. The byte ranges come from the tokenizer (`encode_with_offsets`) or,
//! for the completion's own sampled ids, from [`offsets_by_incremental_decode`].
//!
//! The code may sit inside a ```` ```python ```` fence in the completion:
//! its line 1 then starts at some byte offset of the completion, which every
//! function here takes as `code_offset` ([`code_in_completion`] finds it).
//!
//! Spans are half-open: tokens `start_token..end_token`, so Eq. 2's inclusive
//! `E_fine` is `end_token − 1`. A token belongs to a line when its byte range
//! overlaps the line's text (the newline excluded), so a token spanning two
//! lines (a docstring piece, `)\n    `) belongs to both.

use serde::{Deserialize, Serialize};

use crate::text::python::{self, LineBreak};

/// A run of completion tokens sharing one fine-grained reward.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TokenSpan {
    /// First token index (`S_fine`).
    pub start_token: usize,
    /// One past the last token index (`E_fine + 1`).
    pub end_token: usize,
    /// `R_fine` for every token of the span.
    pub reward: f64,
}

/// Error lines or token offsets that do not fit the code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpanError {
    /// A line number is 0 or past the code's last line.
    #[error("error line {line} is outside the code's lines 1..={n_lines}")]
    LineOutOfRange {
        /// The offending line.
        line: u32,
        /// Lines in the code.
        n_lines: usize,
    },
    /// A token's byte range ends before it starts.
    #[error("token {index} has byte range {start}..{end}, which ends before it starts")]
    BadOffsets {
        /// Token index.
        index: usize,
        /// Its start byte.
        start: usize,
        /// Its end byte.
        end: usize,
    },
}

/// The whole-completion span of `R_coarse` (`S_coarse = 0`, `E_coarse = T`);
/// `None` for an empty completion.
pub fn coarse_span(n_tokens: usize, reward: f64) -> Option<TokenSpan> {
    (n_tokens > 0).then_some(TokenSpan {
        start_token: 0,
        end_token: n_tokens,
        reward,
    })
}

/// Where the code is in a completion: `(byte offset, code)`. In order:
/// the body of the first non-blank fence whose info string is `python`,
/// `py` or `python3`; else that of the first non-blank fence with an empty
/// info string (each up to its closing fence, or the end of the text when
/// it was cut off); else, when the text starts with code that a lone fence
/// closes, the text before that fence; else the whole text at offset 0.
///
/// The labelled fence comes first because small models open a bare fence,
/// write a sentence, and then open the labelled one (`` ``` `` / "The code
/// is:" / `` ```python ``), and a fence is not closed by a labelled line.
pub fn code_in_completion(text: &str) -> (usize, &str) {
    let mut line_start = 0;
    // Inside a fence of another language, whose closing line is no opening.
    let mut in_other_fence = false;
    let mut bare: Option<(usize, &str)> = None;
    let mut first_fence: Option<usize> = None;
    while line_start < text.len() {
        let line_end = text[line_start..]
            .find('\n')
            .map_or(text.len(), |i| line_start + i);
        let line = text[line_start..line_end].trim_end_matches('\r');
        if let Some(info) = line.trim_start().strip_prefix("```") {
            first_fence.get_or_insert(line_start);
            let info = info.trim().to_ascii_lowercase();
            let labelled = matches!(info.as_str(), "python" | "py" | "python3");
            if in_other_fence {
                in_other_fence = false;
            } else if !labelled && !info.is_empty() {
                in_other_fence = true;
            } else {
                let body_start = (line_end + 1).min(text.len());
                let body = &text[body_start..];
                let mut end = body.len();
                let mut at = 0;
                for l in body.split_inclusive('\n') {
                    if l.trim_start().starts_with("```") {
                        end = at;
                        break;
                    }
                    at += l.len();
                }
                // A blank fence is a stray opening (small models often
                // write "```" and then "```python"): look further.
                if !body[..end].trim().is_empty() {
                    if labelled {
                        return (body_start, &body[..end]);
                    }
                    bare.get_or_insert((body_start, &body[..end]));
                }
            }
        }
        line_start = line_end + 1;
    }
    if let Some(found) = bare {
        return found;
    }
    match first_fence {
        Some(at) if !text[..at].trim().is_empty() => (0, &text[..at]),
        _ => (0, text),
    }
}

/// The code of an answer: [`code_in_completion`], and when the answer was
/// cut off at the token limit (`cut_off`), only its complete top-level
/// statements ([`complete_statements`]). Training, evaluation and
/// `falcon eval rescore` all cut code out of answers here, so they run
/// the same code.
pub fn answer_code(text: &str, cut_off: bool) -> (usize, &str) {
    let (off, code) = code_in_completion(text);
    if cut_off {
        (off, complete_statements(code))
    } else {
        (off, code)
    }
}

/// `code` up to the start of its last top-level statement, which a cut at
/// the token limit left unfinished: a line at column 0 outside brackets,
/// strings and backslash continuations that is not a comment, a decorated
/// line or a clause of the statement above (`else`, `elif`, `except`,
/// `finally`). Code with one top-level statement is returned whole: there
/// is nothing complete to keep.
pub fn complete_statements(code: &str) -> &str {
    // Line by line, a single-quoted string never outlives its line.
    let states = python::line_starts(code, LineBreak::AlwaysEnds);
    let mut starts: Vec<usize> = Vec::new();
    let mut continued = false;
    let mut after_decorator = false;
    let mut at = 0;
    for (i, line) in code.split_inclusive('\n').enumerate() {
        let text = line.trim_end_matches(['\n', '\r']);
        let here = states[i];
        let top = !here.in_string
            && here.depth == 0
            && !continued
            && text.starts_with(|c: char| !c.is_whitespace())
            && !text.starts_with('#')
            && !is_clause(text);
        if top {
            if !after_decorator {
                starts.push(at);
            }
            after_decorator = text.starts_with('@');
        }
        let next = states.get(i + 1).copied().unwrap_or_default();
        continued = !next.in_string && text.ends_with('\\');
        at += line.len();
    }
    match starts.as_slice() {
        [_, .., last] => &code[..*last],
        _ => code,
    }
}

/// `else:`, `elif x:`, `except E:`, `finally:`: a clause continues the
/// statement above it.
fn is_clause(line: &str) -> bool {
    let word: String = line
        .chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .collect();
    matches!(word.as_str(), "else" | "elif" | "except" | "finally")
}

/// Byte range `[start, end)` of each 1-based line's text in `code` (no newline).
fn line_ranges(code: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    for piece in code.split_inclusive('\n') {
        let text = piece.strip_suffix('\n').unwrap_or(piece);
        let text = text.strip_suffix('\r').unwrap_or(text);
        out.push((start, start + text.len()));
        start += piece.len();
    }
    out
}

/// Maps error lines of `code` to token spans carrying `reward`.
///
/// `code_offset` is the byte offset of `code` in the text the tokens cover
/// (0 when the completion is bare code; the fence body's offset otherwise).
/// `token_offsets[i]` is token `i`'s byte range in that text. Zero-width
/// tokens (special tokens) belong to no line. Spans come back sorted, with
/// overlapping or touching spans merged; repeated lines count once. A line
/// whose text is empty is matched through the byte after it (its newline).
pub fn error_line_spans(
    code: &str,
    code_offset: usize,
    error_lines: &[u32],
    token_offsets: &[(usize, usize)],
    reward: f64,
) -> Result<Vec<TokenSpan>, SpanError> {
    for (index, &(start, end)) in token_offsets.iter().enumerate() {
        if end < start {
            return Err(SpanError::BadOffsets { index, start, end });
        }
    }
    let lines = line_ranges(code);
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for &line in error_lines {
        let Some(&(mut lo, mut hi)) = (line as usize).checked_sub(1).and_then(|i| lines.get(i))
        else {
            return Err(SpanError::LineOutOfRange {
                line,
                n_lines: lines.len(),
            });
        };
        if lo == hi {
            hi = (hi + 1).min(code.len());
        }
        lo += code_offset;
        hi += code_offset;
        let mut hit = token_offsets
            .iter()
            .enumerate()
            .filter(|(_, &(s, e))| s < e && s < hi && e > lo)
            .map(|(i, _)| i);
        if let Some(first) = hit.next() {
            let last = hit.next_back().unwrap_or(first);
            ranges.push((first, last + 1));
        }
    }
    ranges.sort_unstable();
    let mut spans: Vec<TokenSpan> = Vec::new();
    for (start, end) in ranges {
        match spans.last_mut() {
            Some(prev) if start <= prev.end_token => prev.end_token = prev.end_token.max(end),
            _ => spans.push(TokenSpan {
                start_token: start,
                end_token: end,
                reward,
            }),
        }
    }
    Ok(spans)
}

/// Byte ranges of generated tokens by decoding growing prefixes: token `i`
/// covers the bytes that decoding `ids[..=i]` adds, measured as the common
/// prefix with the full decode. Returns the full decode and the ranges.
///
/// Works with any detokenizer (byte-level BPE, SentencePiece's leading-space
/// rule) because only prefix decodes are compared with the full one. A token
/// that ends inside a multi-byte character gets an empty range and the token
/// completing the character gets the whole character. `Completion::text` is a
/// prefix of the full decode (it is cut before a stop string), so the ranges
/// index it too. Costs `ids.len() + 1` decodes.
pub fn offsets_by_incremental_decode<E>(
    ids: &[i64],
    mut decode: impl FnMut(&[i64]) -> Result<String, E>,
) -> Result<(String, Vec<(usize, usize)>), E> {
    let full = decode(ids)?;
    let mut offsets = Vec::with_capacity(ids.len());
    let mut prev = 0;
    for i in 0..ids.len() {
        let prefix = decode(&ids[..=i])?;
        let mut common = prefix
            .bytes()
            .zip(full.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        while !full.is_char_boundary(common) {
            common -= 1;
        }
        let end = common.max(prev);
        offsets.push((prev, end));
        prev = end;
    }
    Ok((full, offsets))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start_token: usize, end_token: usize, reward: f64) -> TokenSpan {
        TokenSpan {
            start_token,
            end_token,
            reward,
        }
    }

    /// Offsets of consecutive pieces that concatenate to the text.
    fn offsets_of(pieces: &[&str], base: usize) -> Vec<(usize, usize)> {
        let mut at = base;
        pieces
            .iter()
            .map(|p| {
                let r = (at, at + p.len());
                at += p.len();
                r
            })
            .collect()
    }

    // Code (byte offsets):
    //   line 1 "def f(x):"      0..9   newline 9
    //   line 2 "    y = x + 1"  10..23 newline 23
    //   line 3 "    return y"   24..36 newline 36
    const CODE: &str = "def f(x):\n    y = x + 1\n    return y\n";
    // Tokens: 0 "def", 1 " f", 2 "(x", 3 "):", 4 "\n   ", 5 " y", 6 " =",
    //         7 " x", 8 " +", 9 " 1", 10 "\n   ", 11 " return", 12 " y", 13 "\n"
    const PIECES: [&str; 14] = [
        "def", " f", "(x", "):", "\n   ", " y", " =", " x", " +", " 1", "\n   ", " return", " y",
        "\n",
    ];

    #[test]
    fn a_cut_off_answer_keeps_its_complete_top_level_statements() {
        let code = "import math\n\n@cache\ndef f(x):\n    if x:\n        return 1\n    else:\n        return 2\n\nprint(f(";
        assert_eq!(
            complete_statements(code),
            "import math\n\n@cache\ndef f(x):\n    if x:\n        return 1\n    else:\n        return 2\n\n"
        );
        // Column-0 lines inside a docstring, brackets or after a backslash
        // start nothing; a decorator belongs to the def below it.
        let code = "def g():\n    \"\"\"Doc\nat column 0\n    \"\"\"\n    return [\n1,\n]\nx = 1 + \\\n2\n@dec\ndef h(): retu";
        assert_eq!(
            complete_statements(code),
            "def g():\n    \"\"\"Doc\nat column 0\n    \"\"\"\n    return [\n1,\n]\nx = 1 + \\\n2\n"
        );
        // A string that holds a quote or a hash does not open anything.
        let code = "s = \"it's # not\"\nt = '\"\"\"'\ndef k(";
        assert_eq!(
            complete_statements(code),
            "s = \"it's # not\"\nt = '\"\"\"'\n"
        );
        // One statement: nothing complete to fall back on.
        assert_eq!(
            complete_statements("def f(x):\n    return (x"),
            "def f(x):\n    return (x"
        );
        assert_eq!(complete_statements(""), "");
    }

    #[test]
    fn statement_starts_skip_every_kind_of_string_and_comment() {
        let cs = complete_statements;
        // Brackets inside strings, f-strings, byte and raw strings and
        // comments open nothing.
        let code = "s = \"(\" + f\"{x}[\" + b'{' + r'('\nt = 1  # (\nu(";
        assert_eq!(
            cs(code),
            "s = \"(\" + f\"{x}[\" + b'{' + r'('\nt = 1  # (\n"
        );
        // An escaped quote does not close its string.
        let code = "s = \"a\\\"(\"\nt = 'it\\'s ['\nu(";
        assert_eq!(cs(code), "s = \"a\\\"(\"\nt = 'it\\'s ['\n");
        // A triple quote escaped inside a docstring does not close it.
        let code = "s = \"\"\"a\\\"\"\"\nstill\n\"\"\"\nt = 1\nu(";
        assert_eq!(cs(code), "s = \"\"\"a\\\"\"\"\nstill\n\"\"\"\nt = 1\n");
        let code = "s = '''x\n'''; t = (1,\n2)\nu = 1\nv(";
        assert_eq!(cs(code), "s = '''x\n'''; t = (1,\n2)\nu = 1\n");
        // A single-quoted string ends with its line, even after a backslash
        // (whose line then continues into the next).
        let code = "s = 'abc\nt = (1\n)\nu(";
        assert_eq!(cs(code), "s = 'abc\nt = (1\n)\n");
        let code = "x = 'a\\\nb = 2\nc = 3\nd(";
        assert_eq!(cs(code), "x = 'a\\\nb = 2\nc = 3\n");
        let code = "x = 'a\\\nb = (1\nc = 3\nd(";
        assert_eq!(cs(code), code, "the bracket on the continued line counts");
        // A line ending in a backslash continues, a comment's too.
        let code = "a = 1  # note \\\nb = 2\nc(";
        assert_eq!(cs(code), "a = 1  # note \\\nb = 2\n");
        // CRLF lines; a stray closing bracket does not go below zero.
        assert_eq!(cs("a = 1\r\nb = 2\r\nc("), "a = 1\r\nb = 2\r\n");
        assert_eq!(cs(")\nx = 1\ny("), ")\nx = 1\n");
        // A `#` inside a string is no comment: its bracket still counts.
        assert_eq!(cs("s = '#' + (\n1)\nt = 2\nu("), "s = '#' + (\n1)\nt = 2\n");
        // A bracket closed only inside a string leaves the rest inside it.
        let code = "x = [\n'''\n]\n'''\ny = 1\nz(";
        assert_eq!(cs(code), code);
    }

    #[test]
    fn answer_code_trims_only_cut_off_answers() {
        let text = "Sure:\n```python\ndef f():\n    return 1\nassert f() ==";
        let (off, code) = answer_code(text, true);
        assert_eq!((off, code), (16, "def f():\n    return 1\n"));
        assert_eq!(
            answer_code(text, false).1,
            "def f():\n    return 1\nassert f() =="
        );
    }

    #[test]
    fn pieces_cover_the_code() {
        assert_eq!(PIECES.concat(), CODE);
    }

    #[test]
    fn lines_map_to_their_tokens() {
        let offs = offsets_of(&PIECES, 0);
        // Line 2 is bytes 10..23: token 4 ("\n   ", 9..13) reaches into its
        // indentation, then tokens 5..=9; token 10 starts at the newline (23).
        assert_eq!(
            error_line_spans(CODE, 0, &[2], &offs, -0.6).unwrap(),
            vec![span(4, 10, -0.6)]
        );
        assert_eq!(
            error_line_spans(CODE, 0, &[1], &offs, -1.0).unwrap(),
            vec![span(0, 4, -1.0)]
        );
        // Lines 1 and 3 are apart; 2 and 3 share token 10 and merge.
        assert_eq!(
            error_line_spans(CODE, 0, &[3, 1], &offs, -0.3).unwrap(),
            vec![span(0, 4, -0.3), span(10, 13, -0.3)]
        );
        assert_eq!(
            error_line_spans(CODE, 0, &[2, 3, 2], &offs, -0.3).unwrap(),
            vec![span(4, 13, -0.3)]
        );
        assert_eq!(error_line_spans(CODE, 0, &[], &offs, -0.3).unwrap(), vec![]);
    }

    #[test]
    fn a_multi_line_token_belongs_to_every_line_it_touches() {
        // line 1 `s = """a`  line 2 `b"""`  line 3 `t = s`
        let code = "s = \"\"\"a\nb\"\"\"\nt = s\n";
        // Token 2 is `"""a\nb"""`, spanning lines 1 and 2.
        let pieces = ["s", " =", " \"\"\"a\nb\"\"\"", "\n", "t", " =", " s", "\n"];
        assert_eq!(pieces.concat(), code);
        let offs = offsets_of(&pieces, 0);
        assert_eq!(
            error_line_spans(code, 0, &[2], &offs, -0.6).unwrap(),
            vec![span(2, 3, -0.6)]
        );
        assert_eq!(
            error_line_spans(code, 0, &[1], &offs, -0.6).unwrap(),
            vec![span(0, 3, -0.6)]
        );
        assert_eq!(
            error_line_spans(code, 0, &[3], &offs, -0.6).unwrap(),
            vec![span(4, 7, -0.6)]
        );
    }

    #[test]
    fn fenced_completion_uses_the_code_offset() {
        let completion = format!("Here is the code:\n```python\n{CODE}```\nDone.");
        let (offset, code) = code_in_completion(&completion);
        assert_eq!(code, CODE);
        assert_eq!(offset, "Here is the code:\n```python\n".len());
        assert_eq!(offset, 28);
        // Tokens of the prose and fence, then the code's tokens, then the rest.
        let mut pieces = vec!["Here", " is", " the", " code", ":\n", "```", "python", "\n"];
        pieces.extend(PIECES);
        pieces.extend(["```", "\n", "Done", "."]);
        assert_eq!(pieces.concat(), completion);
        let offs = offsets_of(&pieces, 0);
        // The code's tokens start at index 8: line 2 → tokens 12..18.
        assert_eq!(
            error_line_spans(code, offset, &[2], &offs, -0.6).unwrap(),
            vec![span(12, 18, -0.6)]
        );
        // A token that straddles the fence line and line 1 (`python\ndef`).
        let pieces2 = ["```", "python\ndef", " f", "(x", "):", "\n"];
        let text2 = pieces2.concat();
        let (off2, code2) = code_in_completion(&text2);
        assert_eq!(code2, "def f(x):\n");
        let offs2 = offsets_of(&pieces2, 0);
        assert_eq!(
            error_line_spans(code2, off2, &[1], &offs2, -1.0).unwrap(),
            vec![span(1, 5, -1.0)]
        );
    }

    #[test]
    fn code_in_completion_variants() {
        assert_eq!(code_in_completion("x = 1\n"), (0, "x = 1\n"));
        assert_eq!(
            code_in_completion("```py\nx = 1\n"),
            (6, "x = 1\n"),
            "cut-off fence"
        );
        assert_eq!(code_in_completion("```\nx\n```"), (4, "x\n"));
        // A fence of another language is skipped for the python one.
        let t = "```bash\nls\n```\n```python\ny = 2\n```\n";
        assert_eq!(code_in_completion(t), (t.find("y = 2").unwrap(), "y = 2\n"));
        assert_eq!(code_in_completion("```python\r\nx\r\n```"), (11, "x\r\n"));
        // A blank fence before the real one (as SmolLM2 writes) is skipped.
        let t = "```\n\n```python\ndef f():\n    return 1\n```";
        let want = "def f():\n    return 1\n";
        assert_eq!(code_in_completion(t), (t.find("def f").unwrap(), want));
        let t = "```python\n```\n```python\nz = 3\n```";
        assert_eq!(code_in_completion(t), (t.find("z = 3").unwrap(), "z = 3\n"));
        // Only blank fences: the whole text, as for no fence at all.
        assert_eq!(code_in_completion("```\n\n```"), (0, "```\n\n```"));
        // Code that a lone fence closes (the model never opened one).
        let t = "def f():\n    return 1\n```";
        assert_eq!(code_in_completion(t), (0, "def f():\n    return 1\n"));
        let t = "def f():\n    return 1\n```\n\n```\n";
        assert_eq!(code_in_completion(t), (0, "def f():\n    return 1\n"));
        // A bare fence holding a sentence, then the labelled one.
        let t = "```\n\nThe code is:\n```python\ndef f():\n    return 1";
        assert_eq!(
            code_in_completion(t),
            (t.find("def f").unwrap(), "def f():\n    return 1")
        );
        // With no labelled fence, the first non-blank bare one.
        let t = "Here:\n```\nx = 1\n```\nand\n```\ny = 2\n```";
        assert_eq!(code_in_completion(t), (t.find("x = 1").unwrap(), "x = 1\n"));
        // A sentence before a fence is not code, however the fence ends.
        let t = "Here is the code:\n```python\ndef f(): pass\n```";
        assert_eq!(code_in_completion(t).1, "def f(): pass\n");
    }

    #[test]
    fn special_and_zero_width_tokens_belong_to_no_line() {
        let mut offs = offsets_of(&PIECES, 0);
        offs.push((0, 0)); // an end-of-sequence token with an empty range
        assert_eq!(
            error_line_spans(CODE, 0, &[1], &offs, -1.0).unwrap(),
            vec![span(0, 4, -1.0)]
        );
    }

    #[test]
    fn crlf_and_empty_lines() {
        let code = "a = 1\r\n\r\nb = 2\r\n";
        let pieces = ["a", " =", " 1", "\r\n\r\n", "b", " =", " 2", "\r\n"];
        let offs = offsets_of(&pieces, 0);
        // The empty line 2 is matched through its "\r" byte, inside token 3.
        assert_eq!(
            error_line_spans(code, 0, &[2], &offs, -0.6).unwrap(),
            vec![span(3, 4, -0.6)]
        );
        assert_eq!(
            error_line_spans(code, 0, &[3], &offs, -0.6).unwrap(),
            vec![span(4, 7, -0.6)]
        );
    }

    #[test]
    fn bad_input_is_an_error() {
        let offs = offsets_of(&PIECES, 0);
        assert_eq!(
            error_line_spans(CODE, 0, &[4], &offs, -0.6),
            Err(SpanError::LineOutOfRange {
                line: 4,
                n_lines: 3
            })
        );
        assert!(error_line_spans(CODE, 0, &[0], &offs, -0.6).is_err());
        assert_eq!(
            error_line_spans(CODE, 0, &[1], &[(5, 2)], -0.6),
            Err(SpanError::BadOffsets {
                index: 0,
                start: 5,
                end: 2
            })
        );
    }

    #[test]
    fn coarse_span_covers_every_token() {
        assert_eq!(coarse_span(7, -0.3), Some(span(0, 7, -0.3)));
        assert_eq!(coarse_span(0, -0.3), None);
    }

    #[test]
    fn incremental_decode_offsets() {
        // A toy detokenizer: ids index pieces; ids 100/101 are the two bytes of "é"
        // (a lone first byte decodes to U+FFFD, as real byte-level decoders do).
        let vocab = ["def", " f", "():", "\n", "    ", "return", " 1"];
        let decode = |ids: &[i64]| -> Result<String, ()> {
            let mut bytes = Vec::new();
            for &id in ids {
                match id {
                    100 => bytes.push(0xC3),
                    101 => bytes.push(0xA9),
                    i => bytes.extend(vocab[i as usize].as_bytes()),
                }
            }
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        };
        let ids = [0, 1, 2, 3, 4, 5, 6, 100, 101, 3];
        let (text, offs) = offsets_by_incremental_decode(&ids, decode).unwrap();
        assert_eq!(text, "def f():\n    return 1é\n");
        assert_eq!(
            offs,
            vec![
                (0, 3),
                (3, 5),
                (5, 8),
                (8, 9),
                (9, 13),
                (13, 19),
                (19, 21),
                (21, 21), // half a character: empty
                (21, 23), // completes "é"
                (23, 24),
            ]
        );
        // The same spans as from tokenizer offsets.
        assert_eq!(
            error_line_spans(&text, 0, &[2], &offs, -0.6).unwrap(),
            vec![span(4, 9, -0.6)]
        );
    }
}
