//! The documented APIs a piece of Python uses ([`apis_used`]): imports and
//! their aliases resolved, then attribute chains read, over the tokens of
//! `text::python`.

use std::collections::{HashMap, HashSet};

use crate::text::python::{self, TokenKind};

// `text::python`.

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Name(String),
    Dot,
    Comma,
    Star,
    /// The end of a logical line (or `;`).
    End,
    Other,
}

/// Tokens of Python source with strings, comments and numbers dropped.
/// Newlines inside brackets and after `\` do not end a line, as in Python.
fn lex(code: &str) -> Vec<Tok> {
    let mut toks = Vec::new();
    for t in python::tokens(code) {
        let tok = match (t.kind, t.text) {
            (TokenKind::Name, name) => Tok::Name(name.to_owned()),
            (TokenKind::Newline, _) | (TokenKind::Op, ";") => Tok::End,
            (TokenKind::Op, ".") => Tok::Dot,
            (TokenKind::Op, ",") => Tok::Comma,
            (TokenKind::Op, "*") => Tok::Star,
            (TokenKind::Op, _) => Tok::Other,
            (TokenKind::String | TokenKind::Comment | TokenKind::Number, _) => continue,
        };
        if tok != Tok::End {
            toks.push(tok);
        } else if t.depth == 0 && toks.last().is_some_and(|t| *t != Tok::End) {
            toks.push(Tok::End);
        }
    }
    toks
}

/// Reads `a.b.c` starting at `toks[i]`; returns the parts and the next index.
fn dotted(toks: &[Tok], mut i: usize) -> (Vec<String>, usize) {
    let mut parts = Vec::new();
    while let Some(Tok::Name(n)) = toks.get(i) {
        parts.push(n.clone());
        i += 1;
        if toks.get(i) == Some(&Tok::Dot) && matches!(toks.get(i + 1), Some(Tok::Name(_))) {
            i += 1;
        } else {
            break;
        }
    }
    (parts, i)
}

/// Documented APIs used in Python `code`, qualified and in order of first
/// use. `is_api` says whether a qualified name is in the docs.
///
/// Resolves `import x`, `import x.y as z`, `from x import y [as z]` and
/// `from x import *` (a bare name `n` then tries `x.n`), then reads every
/// attribute chain `alias.attr.attr` and every imported bare name, and keeps
/// the longest documented prefix of the qualified chain (`np.random.rand(3)`
/// → `numpy.random.rand`). Imports alone are not uses. Strings and comments
/// are skipped, so names used only inside f-string braces are missed;
/// relative imports and shadowing of an alias are ignored.
pub fn apis_used(code: &str, is_api: impl Fn(&str) -> bool) -> Vec<String> {
    let toks = lex(code);
    let mut alias: HashMap<String, String> = HashMap::new();
    let mut star_modules: Vec<String> = Vec::new();
    // Start token of each import statement -> its end.
    let mut import_spans: HashMap<usize, usize> = HashMap::new();

    // Bindings first, so a use before a later import (inside a function)
    // still resolves.
    let mut i = 0;
    while i < toks.len() {
        let line_start = i == 0 || toks[i - 1] == Tok::End;
        let end = toks[i..]
            .iter()
            .position(|t| *t == Tok::End)
            .map_or(toks.len(), |p| i + p);
        if line_start {
            match &toks[i] {
                Tok::Name(k) if k == "import" => {
                    read_import(&toks[i + 1..end], &mut alias);
                    import_spans.insert(i, end);
                }
                Tok::Name(k) if k == "from" => {
                    read_from_import(&toks[i + 1..end], &mut alias, &mut star_modules);
                    import_spans.insert(i, end);
                }
                _ => {}
            }
        }
        i = end + 1;
    }

    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if let Some(&end) = import_spans.get(&i) {
            i = end;
            continue;
        }
        let after_dot = i > 0 && toks[i - 1] == Tok::Dot;
        if !matches!(toks[i], Tok::Name(_)) || after_dot {
            i += 1;
            continue;
        }
        let (parts, next) = dotted(&toks, i);
        i = next;
        let heads: Vec<String> = match alias.get(&parts[0]) {
            Some(q) => vec![q.clone()],
            None => star_modules
                .iter()
                .map(|m| format!("{m}.{}", parts[0]))
                .collect(),
        };
        for head in heads {
            let mut qualified: Vec<String> = head.split('.').map(str::to_owned).collect();
            qualified.extend(parts[1..].iter().cloned());
            let found = (1..=qualified.len())
                .rev()
                .map(|n| qualified[..n].join("."))
                .find(|name| is_api(name));
            if let Some(name) = found {
                if seen.insert(name.clone()) {
                    out.push(name);
                }
                break;
            }
        }
    }
    out
}

/// `import a.b [as z], c` (the tokens after `import`).
fn read_import(toks: &[Tok], alias: &mut HashMap<String, String>) {
    let mut i = 0;
    while i < toks.len() {
        let (parts, next) = dotted(toks, i);
        if parts.is_empty() {
            return;
        }
        i = next;
        match (toks.get(i), toks.get(i + 1)) {
            (Some(Tok::Name(k)), Some(Tok::Name(z))) if k == "as" => {
                alias.insert(z.clone(), parts.join("."));
                i += 2;
            }
            // `import a.b.c` binds `a`, through which the full path is reached.
            _ => {
                alias.insert(parts[0].clone(), parts[0].clone());
            }
        }
        if toks.get(i) == Some(&Tok::Comma) {
            i += 1;
        }
    }
}

/// `from a.b import c [as d], e` / `from a import (c, d)` / `from a import *`.
fn read_from_import(
    toks: &[Tok],
    alias: &mut HashMap<String, String>,
    star_modules: &mut Vec<String>,
) {
    if toks.first() == Some(&Tok::Dot) {
        return; // Relative: not a library import.
    }
    let (module, mut i) = dotted(toks, 0);
    if module.is_empty() || toks.get(i) != Some(&Tok::Name("import".into())) {
        return;
    }
    let module = module.join(".");
    i += 1;
    while i < toks.len() {
        match &toks[i] {
            Tok::Star => star_modules.push(module.clone()),
            Tok::Name(n) => {
                let target = format!("{module}.{n}");
                match (toks.get(i + 1), toks.get(i + 2)) {
                    (Some(Tok::Name(k)), Some(Tok::Name(z))) if k == "as" => {
                        alias.insert(z.clone(), target);
                        i += 3;
                        continue;
                    }
                    _ => {
                        alias.insert(n.clone(), target);
                    }
                }
            }
            _ => {} // commas and parentheses
        }
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::guidelines::tests::DOC_NAMES;

    #[test]
    fn apis_used_resolves_aliases_and_skips_strings_and_comments() {
        let docs: HashSet<String> = DOC_NAMES.iter().map(|s| s.to_string()).collect();
        let code = r#"import numpy as np
import numpy.linalg
from ndonnx import (
    asarray as arr,
    broadcast_arrays,
)
from numba import cuda  # cuda.grid in a comment
s = "np.random.rand(3)"  # np.zeros
t = '''ndonnx.asarray
numpy.zeros'''
u = f"{np.zeros(1)}"

@cuda.jit
def k(x):
    i = cuda.grid(1)

def f(a):
    x = arr(a)
    y = np.random.rand(3).sum()
    z = numpy.linalg.norm(x) + 1.5e-3
    q = np.not_documented(1).zeros
    w = np.zeros((2, 3)).__doc__
    return broadcast_arrays(x, y), arr(x), rand(2), zeros
"#;
        assert_eq!(
            apis_used(code, |n| docs.contains(n)),
            vec![
                "numba.cuda.jit",
                "numba.cuda.grid",
                "ndonnx.asarray",
                "numpy.random.rand",
                "numpy.linalg.norm",
                "numpy.zeros",
                "ndonnx.broadcast_arrays",
            ]
        );
        // Star imports, `import a.b as z`, imports alone are not uses.
        let code = "from numba.cuda import *\nimport numpy.random as npr\nimport ndonnx\n\
                    i = grid(1); r = npr.rand(2)\nx = undefined_name(3)\n";
        assert_eq!(
            apis_used(code, |n| docs.contains(n)),
            vec!["numba.cuda.grid", "numpy.random.rand"]
        );
        assert!(apis_used("import numpy as np\n", |n| docs.contains(n)).is_empty());
        // An unterminated string does not swallow the following lines.
        let code = "import numpy as np\ns = 'oops\nnp.zeros(1)\n";
        assert_eq!(apis_used(code, |n| docs.contains(n)), vec!["numpy.zeros"]);
    }

    #[test]
    fn apis_used_pins_the_lexer_on_strings_comments_and_lines() {
        let is_api = |n: &str| n.starts_with("m.");
        let code = "import m\n\
            a = \"m.s1\" + 'm.s2' + f\"{m.f1}\" + rb'm.rb' + Rb\"m.rb2\" + u'm.u' + br\"m.br\"\n\
            b = 'it\\'s m.e1' + \"q\\\"m.e2\" + m.e3\n\
            # it's m.c1 \"\n\
            m.c2(1)\n\
            t = \"\"\"\nm.t1\n\"\"\" + '''m.t2\n''' + m.t3\n\
            r = r\"\\\"m.r1\" + m.r2\n\
            s = 'oops\nm.u1\n\
            w = 'a\\\nm.bs1' + m.bs2\n\
            x = m \\\n.cont\n\
            y = m \\\r\n.crlf\n\
            z = x\"m.np\" + m.p2\n\
            import m; m.semi\n\
            v = (m\n  .paren)\n\
            n = 1.5e-3 + .5 + 0x1F + m.num\n\
            g = f\"{m.h[\"m.k\"]}\"\n\
            é = m.é1\n";
        assert_eq!(
            apis_used(code, is_api),
            [
                "m.e3", "m.c2", "m.t3", "m.r2", "m.u1", "m.bs2", "m.cont", "m.p2", "m.semi",
                "m.paren", "m.num", "m.k", "m.é1"
            ]
        );
        // Brackets and backslashes join lines into one import statement;
        // `;` and a newline end it.
        let code =
            "from m import (a,\n  b); from m import \\\n  c\nimport m.d as e\na(); b; c; e.f\n";
        assert_eq!(apis_used(code, is_api), ["m.a", "m.b", "m.c", "m.d.f"]);
    }
}
