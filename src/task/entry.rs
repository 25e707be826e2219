//! The function a test calls: for formats that do not name their entry
//! point (MBPP, verl's `assert_case`), the one the first assert calls, read
//! from Python source without running it.

use crate::text::python::{self, LineBreak, Part};

const PY_KEYWORDS: &[&str] = &[
    "and", "assert", "await", "elif", "if", "in", "is", "lambda", "not", "or", "return", "yield",
];

// Wrappers MBPP asserts put around the call under test (`set(f(x))`,
// `int(f(x))`, `math.isclose(f(x), ...)` — attribute calls are skipped anyway).
const PY_BUILTINS: &[&str] = &[
    "abs",
    "all",
    "any",
    "bool",
    "bytes",
    "chr",
    "complex",
    "dict",
    "divmod",
    "enumerate",
    "filter",
    "float",
    "frozenset",
    "hash",
    "int",
    "isinstance",
    "iter",
    "len",
    "list",
    "map",
    "max",
    "min",
    "next",
    "ord",
    "pow",
    "print",
    "range",
    "repr",
    "reversed",
    "round",
    "set",
    "sorted",
    "str",
    "sum",
    "tuple",
    "type",
    "zip",
];

/// MBPP has no entry point field: the function under test is the one the
/// first assert calls. Of the plain names called there, take the first one
/// the reference `code` defines (`def NAME`); without code, the first one that
/// is not a builtin. This sees through `assert set(f(...)) == ...`,
/// `assert math.isclose(f(...), ...)`, `assert not f(...)` and `assert (f(...))`.
pub(super) fn mbpp_entry_point(first_test: &str, code: Option<&str>) -> Result<String, String> {
    let called = called_names(first_test);
    let defined: Vec<&str> = code.map(python::defs).unwrap_or_default();
    called
        .iter()
        .find(|name| defined.contains(name))
        .or_else(|| called.iter().find(|name| !PY_BUILTINS.contains(name)))
        .map(|name| (*name).to_owned())
        .ok_or_else(|| {
            format!(
                "cannot derive `entry_point`: the first test calls no user function \
                 (names called: {called:?}): {first_test:?}"
            )
        })
}

/// Plain (non-attribute) names that `src` calls, in order, skipping string
/// literals and comments so `assert f("g(x)")` yields only `f`. A name is
/// an ASCII run (`[A-Za-z_][A-Za-z0-9_]*`) and a single-quoted string runs
/// over line breaks ([`LineBreak::Continues`]), as when this scanned alone.
pub(super) fn called_names(src: &str) -> Vec<&str> {
    let bytes = src.as_bytes();
    let mut names = Vec::new();
    let mut prev_significant = b' ';
    for seg in python::segments(src, LineBreak::Continues) {
        match seg.part {
            Part::Comment => {}
            // A name right after a string follows its quote, not a dot.
            Part::String => prev_significant = bytes[seg.start],
            Part::Code => {
                let (mut i, end) = (seg.start, seg.end());
                while i < end {
                    let b = bytes[i];
                    if b.is_ascii_alphabetic() || b == b'_' {
                        let start = i;
                        while i < end && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                            i += 1;
                        }
                        let name = &src[start..i];
                        let mut j = i;
                        while j < end && (bytes[j] == b' ' || bytes[j] == b'\t') {
                            j += 1;
                        }
                        let is_call = j < end && bytes[j] == b'(';
                        if is_call && prev_significant != b'.' && !PY_KEYWORDS.contains(&name) {
                            names.push(name);
                        }
                        prev_significant = b'a';
                    } else {
                        if !b.is_ascii_whitespace() {
                            prev_significant = b;
                        }
                        i += 1;
                    }
                }
            }
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::{called_names, mbpp_entry_point};

    #[test]
    fn called_names_skip_strings_and_comments_of_every_kind() {
        let c = called_names;
        assert_eq!(c(r#"assert f("g(x)") == h('k(') # m(1)"#), ["f", "h"]);
        // An f-string is a string: the call inside its braces is not seen.
        assert_eq!(c(r#"assert f(f"{g(1)}") == 1"#), ["f"]);
        assert_eq!(
            c(r#"assert f("a\"g(1)", 'it\'s h(2)') == k(3)"#),
            ["f", "k"]
        );
        assert_eq!(c("assert f(\"\"\"\ng(1)\n\"\"\") == '''h(2)'''"), ["f"]);
        assert_eq!(
            c(r#"assert f(r"\"g(1)", b'h(2)', rb"k(3)") == m(4)"#),
            ["f", "m"]
        );
        assert_eq!(c("assert f(1) # it's g(2) \"\nassert h(3)"), ["f", "h"]);
        // A single-quoted string runs over a line break to its quote...
        assert_eq!(c("assert f('a\nb') == g(1)"), ["f", "g"]);
        // ...and to the end when it never closes.
        assert_eq!(c("assert f('oops\ng(1)"), ["f"]);
        assert_eq!(c("assert f(\"a\\\ng(1)\") == h(2)"), ["f", "h"]);
        // Only spaces and tabs may sit between a name and its `(`.
        assert_eq!(c("assert f \\\n(1) == g\t(2)"), ["g"]);
        assert_eq!(c("assert f\n(1)"), Vec::<&str>::new());
        // After a dot (spaces and line breaks between) a call is a method's.
        assert_eq!(c("assert a . f(1) == \"s\".join(h(1)) + x.\n  k(2)"), ["h"]);
        assert_eq!(
            c("assert not(f(1)) and g(2) or print(h(3)) if lambda(x) else y"),
            ["f", "g", "print", "h"]
        );
        assert_eq!(
            c("assert (f(1)) == [g(x) for x in range(3)]"),
            ["f", "g", "range"]
        );
        // Names are ASCII runs read byte by byte.
        assert_eq!(c("assert éf(1) == g(2)"), ["f", "g"]);
        assert_eq!(c("assert x == 0xf(1) + 1e5(2)"), ["xf", "e5"]);
        assert_eq!(c("assert f(\"é(\") == g('''é\n''')"), ["f", "g"]);
    }

    #[test]
    fn mbpp_entry_points_see_defs_line_by_line() {
        // A `def` line inside a docstring of the reference code counts.
        let code = "def helper():\n    \"\"\"\n    def f(x): example\n    \"\"\"\n";
        assert_eq!(
            mbpp_entry_point("assert f(1) == helper(2)", Some(code)).unwrap(),
            "f"
        );
        let code = "if True:\n    async def go(x):\n        pass\n";
        assert_eq!(
            mbpp_entry_point("assert helper(go(1)) == 1", Some(code)).unwrap(),
            "go"
        );
        assert_eq!(
            mbpp_entry_point("assert helper(\"go(1)\") == 1", Some(code)).unwrap(),
            "helper"
        );
    }
}
