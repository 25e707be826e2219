//! How retrieved memory is shown to the model (`[memory] render`): the code
//! of FALCON's past entries, of MemoCoder's fixes and of MEMCoder's past
//! tasks and snippets, renamed or cut down
//! so that a small model does not copy another task's function into its
//! answer (docs/results/eval.md measured SmolLM2-135M doing exactly that), and a
//! character budget over everything retrieved into one prompt.

use crate::config::Rendering;

/// What one prompt may show of memory: the rendering, the task's entry
/// point (the one function name the answer must define) and what is left of
/// the budget.
#[derive(Debug, Clone)]
pub struct View {
    pub rendering: Rendering,
    pub entry_point: String,
    /// Characters left; `None`: no limit.
    left: Option<usize>,
}

impl View {
    /// `chars` = 0: no budget.
    pub fn new(rendering: Rendering, entry_point: &str, chars: usize) -> Self {
        View {
            rendering,
            entry_point: entry_point.to_owned(),
            left: (chars > 0).then_some(chars),
        }
    }

    /// The papers' rendering, unbounded.
    pub fn full() -> Self {
        View::new(Rendering::Full, "", 0)
    }

    /// Code from another task as this view shows it: whole (`full`), with
    /// its functions renamed to the entry point (`renamed`), or `None`
    /// (`brief`: no foreign code).
    pub fn code(&self, code: &str) -> Option<String> {
        match self.rendering {
            Rendering::Full => Some(code.trim_end().to_owned()),
            Rendering::Renamed => Some(self.renamed(code)),
            Rendering::Brief => None,
        }
    }

    /// `code` with every function it defines at the top level renamed to
    /// the entry point (as [`View::rename_from`] does).
    pub fn renamed(&self, code: &str) -> String {
        self.rename_from(code, code.trim_end())
    }

    /// `text` with every function `defs` defines at the top level renamed
    /// to the entry point (when the task has one and the rendering is not
    /// `full`, which shows memory as the papers do): an error message or a
    /// task statement that names another task's function.
    pub fn rename_from(&self, defs: &str, text: &str) -> String {
        let mut out = text.to_owned();
        if self.entry_point.is_empty() || self.rendering == Rendering::Full {
            return out;
        }
        for name in defined_functions(defs) {
            if name != self.entry_point {
                out = replace_word(&out, name, &self.entry_point);
            }
        }
        out
    }

    /// Take `text` out of the budget: all of it, its first part with a cut
    /// marker, or `None` when the budget is spent.
    pub fn take(&mut self, text: String) -> Option<String> {
        let Some(left) = self.left else {
            return Some(text);
        };
        if left == 0 {
            return None;
        }
        let n = text.chars().count();
        if n <= left {
            self.left = Some(left - n);
            return Some(text);
        }
        self.left = Some(0);
        Some(crate::text::clip(&text, left, "\n... [cut]\n"))
    }
}

/// A task statement without its code: the prose of a stub's docstring (or
/// of an MBPP-style statement), before its examples, on one line. A past
/// task's signature in a prompt reads as the current task's: SmolLM2-135M
/// copied it, renamed or not (docs/results/eval.md).
pub fn task_statement(task: &str) -> String {
    let mut words: Vec<&str> = Vec::new();
    for line in task.lines() {
        let t = line.trim();
        let lower = t.to_ascii_lowercase();
        if t.starts_with(">>>") || lower.starts_with("example") || lower.starts_with("for example")
        {
            break;
        }
        let code = ["def ", "async def ", "class ", "import ", "from ", "@"]
            .iter()
            .any(|k| t.starts_with(k));
        if code {
            continue;
        }
        words.extend(t.trim_matches(|c| c == '"' || c == '\'').split_whitespace());
    }
    words.join(" ")
}

/// Names of the functions `code` defines at column 0 (`def name(`), in
/// order, without repeats.
pub fn defined_functions(code: &str) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for line in code.lines().filter(|l| !l.starts_with(char::is_whitespace)) {
        for name in crate::text::python::defs(line) {
            if !out.contains(&name) {
                out.push(name);
            }
        }
    }
    out
}

/// `text` with every whole-word `from` replaced by `to` (a word is a run
/// of letters, digits and `_`).
pub fn replace_word(text: &str, from: &str, to: &str) -> String {
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(from) {
        let before = rest[..i].chars().next_back();
        let after = rest[i + from.len()..].chars().next();
        out.push_str(&rest[..i]);
        if before.is_some_and(is_word) || after.is_some_and(is_word) {
            out.push_str(from);
        } else {
            out.push_str(to);
        }
        rest = &rest[i + from.len()..];
    }
    out.push_str(rest);
    out
}

/// The lines a fix changed, as `- old` / `+ new` lines (a longest-common-
/// subsequence line diff, whitespace at line ends ignored), at most
/// `max_lines` of them; empty when nothing changed.
pub fn changed_lines(before: &str, after: &str, max_lines: usize) -> String {
    let a: Vec<&str> = before.lines().map(str::trim_end).collect();
    let b: Vec<&str> = after.lines().map(str::trim_end).collect();
    // lcs[i][j]: common lines of a[i..] and b[j..].
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut out: Vec<String> = Vec::new();
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            out.push(format!("- {}", a[i]));
            i += 1;
        } else {
            out.push(format!("+ {}", b[j]));
            j += 1;
        }
    }
    out.truncate(max_lines);
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defined_functions_are_column_zero_def_lines_even_in_strings() {
        let code = "def a():\n    def b(): pass\n\"\"\"\ndef doc():\n\"\"\"\nasync def c(): pass\ndef a(): pass\n";
        assert_eq!(defined_functions(code), ["a", "doc", "c"]);
    }

    #[test]
    fn renaming_replaces_whole_words_only() {
        let code = "def find_zero(xs):\n    return helper(xs) + find_zeros\n\ndef helper(x):\n    return find_zero(x)\n";
        let v = View::new(Rendering::Renamed, "below_zero", 0);
        assert_eq!(
            v.renamed(code),
            "def below_zero(xs):\n    return below_zero(xs) + find_zeros\n\ndef below_zero(x):\n    return below_zero(x)"
        );
        assert_eq!(defined_functions(code), ["find_zero", "helper"]);
        assert_eq!(View::new(Rendering::Brief, "f", 0).code(code), None);
        assert_eq!(View::full().code("x = 1\n").as_deref(), Some("x = 1"));
    }

    #[test]
    fn a_task_statement_keeps_the_prose_only() {
        let stub = "from typing import List\n\n\ndef below_zero(ops: List[int]) -> bool:\n    \"\"\" You're given a list of\n    operations.\n    >>> below_zero([1, 2])\n    False\n    \"\"\"\n";
        assert_eq!(task_statement(stub), "You're given a list of operations.");
        assert_eq!(
            task_statement("Write a function to find the n largest items.\nFor example: f(1)"),
            "Write a function to find the n largest items."
        );
    }

    #[test]
    fn the_budget_cuts_and_then_refuses() {
        let mut v = View::new(Rendering::Full, "f", 10);
        assert_eq!(v.take("abcdef".into()).as_deref(), Some("abcdef"));
        assert_eq!(
            v.take("ghijkl".into()).as_deref(),
            Some("ghij\n... [cut]\n")
        );
        assert_eq!(v.take("m".into()), None);
        let mut free = View::full();
        assert_eq!(free.take("x".repeat(5000)).map(|s| s.len()), Some(5000));
    }

    #[test]
    fn a_fix_shows_the_lines_it_changed() {
        let before = "def f(x):\n    y = x +\n    return y\n";
        let after = "def f(x):\n    y = x + 1\n    return y\n";
        assert_eq!(
            changed_lines(before, after, 10),
            "-     y = x +\n+     y = x + 1"
        );
        assert_eq!(changed_lines("a\nb\n", "a\nb\nc\n", 10), "+ c");
        assert_eq!(changed_lines("a\n", "a  \n", 10), "");
        assert_eq!(
            changed_lines("a\nb\nc\n", "x\ny\nz\n", 2).lines().count(),
            2
        );
    }
}
