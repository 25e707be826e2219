//! MemoCoder's fixing knowledge set and Mentor (papers/memocoder.txt).
//!
//! * [`FixKnowledge`]: every successful repair (failing code, fixed code, the
//!   error), retrieved by the "Longest Sequential Matching" of error messages
//!   (§4.1.2): the longest contiguous run of words two messages share, words
//!   being alphanumeric tokens with punctuation removed; up to ten entries.
//! * [`Mentor`]: per error class, a short list of fixing suggestions (§2.2.4).
//!   After `rewrite_threshold` (paper: 20) new fixes of a class it asks for a
//!   rewrite: [`Mentor::rewrite_request`] builds the prompt and
//!   [`Mentor::apply_rewrite`] strictly parses the answer. No model is called
//!   here; the caller runs the generator.
//!
//! The mentor is keyed by MemoCoder's own four classes ([`MemoCoderClass`],
//! §2.2.3), the "error types" its suggestions are written for; fixes keep
//! the finer [`ErrorKind`].
//!
//! Persistence: each [`FixEntry`] is a record of kind [`FIX_RECORD_KIND`]
//! under [`FixKnowledge::record_key`]; the [`Mentor`] is one record of kind
//! [`MENTOR_RECORD_KIND`], key [`MENTOR_RECORD_KEY`].

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::exec::{ErrorKind, MemoCoderClass};

pub const FIX_RECORD_KIND: &str = "memocoder_fix";
pub const MENTOR_RECORD_KIND: &str = "memocoder_mentor";
pub const MENTOR_RECORD_KEY: &str = "state";

/// Longest suggestion line the parser accepts, in characters: a suggestion
/// is a sentence, and a runaway line means the model ignored the format.
pub const MAX_SUGGESTION_CHARS: usize = 400;

pub use crate::config::FixesConfig;

/// What went wrong in this module.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FixesError {
    #[error("fixes config: {0}")]
    Config(String),
    #[error("fix record key {0:?} is not a fix id")]
    BadKey(String),
    #[error("the {} suggestions are at version {current}, the rewrite was asked for version {asked}; ask again", class.name())]
    Stale {
        class: MemoCoderClass,
        asked: u32,
        current: u32,
    },
    #[error("the mentor's answer for {} was not used: {reason}", class.name())]
    Unparseable {
        class: MemoCoderClass,
        reason: String,
    },
}

/// One successful repair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FixEntry {
    pub error_kind: ErrorKind,
    pub error_message: String,
    pub failing_code: String,
    pub fixed_code: String,
    /// The task's description.
    pub task: String,
}

/// A retrieved fix with its match length in words.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetrievedFix<'a> {
    pub id: u64,
    pub score: usize,
    pub entry: &'a FixEntry,
}

/// The fixing knowledge set, with each message's words interned for retrieval.
#[derive(Debug, Clone, Default)]
pub struct FixKnowledge {
    /// Ascending ids.
    entries: Vec<(u64, FixEntry, Vec<u32>)>,
    vocab: HashMap<String, u32>,
    next_id: u64,
}

impl FixKnowledge {
    pub fn new() -> Self {
        Self::default()
    }

    /// Rebuild from stored records (`store.records(FIX_RECORD_KIND)`).
    pub fn from_records(records: Vec<(String, FixEntry)>) -> Result<Self, FixesError> {
        let mut out = FixKnowledge::new();
        let mut with_ids = records
            .into_iter()
            .map(|(key, e)| match key.parse::<u64>() {
                Ok(id) => Ok((id, e)),
                Err(_) => Err(FixesError::BadKey(key)),
            })
            .collect::<Result<Vec<_>, _>>()?;
        with_ids.sort_by_key(|(id, _)| *id);
        for (id, e) in with_ids {
            out.push(id, e);
        }
        Ok(out)
    }

    /// The record key of fix `id`; zero-padded so key order is id order.
    pub fn record_key(id: u64) -> String {
        format!("{id:020}")
    }

    /// Add a repair; returns its id (store the entry under [`Self::record_key`]).
    pub fn add(&mut self, entry: FixEntry) -> u64 {
        let id = self.next_id;
        self.push(id, entry);
        id
    }

    fn push(&mut self, id: u64, entry: FixEntry) {
        let tokens = words(&entry.error_message)
            .map(|w| {
                let next = self.vocab.len() as u32;
                *self.vocab.entry(w.to_owned()).or_insert(next)
            })
            .collect();
        self.entries.push((id, entry, tokens));
        self.next_id = self.next_id.max(id + 1);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every fix with its id, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = (u64, &FixEntry)> {
        self.entries.iter().map(|(id, e, _)| (*id, e))
    }

    pub fn get(&self, id: u64) -> Option<&FixEntry> {
        self.entries
            .binary_search_by_key(&id, |(i, _, _)| *i)
            .ok()
            .map(|i| &self.entries[i].1)
    }

    /// The `k` fixes whose error messages share the longest contiguous run
    /// of words with `message`, longest first; ties go to the newer fix
    /// (higher id), whose fix came from a policy closer to the current one.
    /// Fixes sharing no word are not returned.
    pub fn retrieve(&self, message: &str, k: usize) -> Vec<RetrievedFix<'_>> {
        // A query word never seen in any fix cannot match; u32::MAX stands for it.
        let query: Vec<u32> = words(message)
            .map(|w| self.vocab.get(w).copied().unwrap_or(u32::MAX))
            .collect();
        let mut row = Vec::new();
        let mut hits: Vec<RetrievedFix<'_>> = self
            .entries
            .iter()
            .filter_map(|(id, entry, tokens)| {
                let score = longest_common_run(&query, tokens, &mut row);
                (score > 0).then_some(RetrievedFix {
                    id: *id,
                    score,
                    entry,
                })
            })
            .collect();
        hits.sort_by(|a, b| b.score.cmp(&a.score).then(b.id.cmp(&a.id)));
        hits.truncate(k);
        hits
    }
}

/// The words of an error message: maximal runs of alphanumeric characters
/// and `_` (so a Python identifier stays one word); every other character
/// is punctuation or space and only separates words. Case-sensitive, since
/// the paper does not fold case and Python's messages are case-stable.
pub fn words(message: &str) -> impl Iterator<Item = &str> {
    message
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
}

/// The longest contiguous run of equal tokens in `a` and `b` (longest common
/// substring over words), by the O(|a|·|b|) dynamic programme with one row.
fn longest_common_run(a: &[u32], b: &[u32], row: &mut Vec<usize>) -> usize {
    row.clear();
    row.resize(b.len() + 1, 0);
    let mut best = 0;
    for &x in a {
        // Walk b backwards so row[j] still holds the previous row's value.
        for j in (0..b.len()).rev() {
            row[j + 1] = if b[j] == x { row[j] + 1 } else { 0 };
            best = best.max(row[j + 1]);
        }
    }
    best
}

/// Longest common run of words of two messages (the paper's similarity).
pub fn match_length(a: &str, b: &str) -> usize {
    fn intern<'s>(vocab: &mut HashMap<&'s str, u32>, s: &'s str) -> Vec<u32> {
        words(s)
            .map(|w| {
                let next = vocab.len() as u32;
                *vocab.entry(w).or_insert(next)
            })
            .collect()
    }
    let mut vocab = HashMap::new();
    let (a, b) = (intern(&mut vocab, a), intern(&mut vocab, b));
    longest_common_run(&a, &b, &mut Vec::new())
}

/// One class's suggestions and its progress towards the next rewrite.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassSuggestions {
    pub suggestions: Vec<String>,
    /// 0 for the built-in list; +1 per applied rewrite.
    pub version: u32,
    /// Ids of fixes added since the last rewrite.
    pub pending: Vec<u64>,
    /// Rewrite answers that could not be parsed.
    pub parse_failures: u32,
}

impl ClassSuggestions {
    fn builtin(suggestions: &[&str]) -> Self {
        ClassSuggestions {
            suggestions: suggestions.iter().map(|s| (*s).to_owned()).collect(),
            version: 0,
            pending: Vec::new(),
            parse_failures: 0,
        }
    }
}

/// The Mentor's state: fixing suggestions for each MemoCoder class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mentor {
    pub compile_error: ClassSuggestions,
    pub exception: ClassSuggestions,
    pub assertion_failure: ClassSuggestions,
    pub timeout: ClassSuggestions,
}

/// A rewrite for the caller to send to the generator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewriteRequest {
    pub class: MemoCoderClass,
    /// The version the prompt shows; a rewrite of an older one is refused.
    pub based_on_version: u32,
    /// Every pending fix at request time; applying the answer clears them.
    pub covers: Vec<u64>,
    pub prompt: String,
}

const CLASSES: [MemoCoderClass; 4] = [
    MemoCoderClass::CompileError,
    MemoCoderClass::Exception,
    MemoCoderClass::AssertionFailure,
    MemoCoderClass::Timeout,
];

/// How the prompt names a class (after MemoCoder §2.2.3).
fn describe(class: MemoCoderClass) -> &'static str {
    match class {
        MemoCoderClass::CompileError => {
            "compile errors: the code does not parse (invalid syntax or indentation)"
        }
        MemoCoderClass::Exception => {
            "exceptions: the code parses but raises an exception while it runs"
        }
        MemoCoderClass::AssertionFailure => {
            "assertion failures: the code runs but returns a wrong result for a test"
        }
        MemoCoderClass::Timeout => "timeouts: the code does not finish within the time limit",
    }
}

impl Default for Mentor {
    /// The predefined suggestions (version 0) each class starts from.
    fn default() -> Self {
        Mentor {
            compile_error: ClassSuggestions::builtin(&[
                "Check that every bracket, parenthesis and string quote is closed.",
                "Indent each block consistently with four spaces and no tabs.",
                "Make sure every def, if, for, while and else line ends with a colon.",
            ]),
            exception: ClassSuggestions::builtin(&[
                "Read the exception type and line, then guard the failing operation against that input.",
                "Check indices against lengths and dictionary keys with `in` before using them.",
                "Convert inputs to the types the operation needs and define every name before use.",
            ]),
            assertion_failure: ClassSuggestions::builtin(&[
                "Re-read the task and trace the failing test's input through the code by hand.",
                "Check edge cases: empty inputs, single elements, negatives and off-by-one bounds.",
                "Return exactly the type and format the test expects.",
            ]),
            timeout: ClassSuggestions::builtin(&[
                "Make sure every loop makes progress towards its exit condition.",
                "Replace nested loops over the input with sorting, hashing or a single pass.",
                "Give recursion a base case that every call reaches, or make it iterative.",
            ]),
        }
    }
}

impl Mentor {
    /// One class's state.
    pub fn class(&self, class: MemoCoderClass) -> &ClassSuggestions {
        match class {
            MemoCoderClass::CompileError => &self.compile_error,
            MemoCoderClass::Exception => &self.exception,
            MemoCoderClass::AssertionFailure => &self.assertion_failure,
            MemoCoderClass::Timeout => &self.timeout,
        }
    }

    fn class_mut(&mut self, class: MemoCoderClass) -> &mut ClassSuggestions {
        match class {
            MemoCoderClass::CompileError => &mut self.compile_error,
            MemoCoderClass::Exception => &mut self.exception,
            MemoCoderClass::AssertionFailure => &mut self.assertion_failure,
            MemoCoderClass::Timeout => &mut self.timeout,
        }
    }

    /// The suggestions as the numbered list the code writer's prompt shows.
    pub fn suggestion_text(&self, class: MemoCoderClass) -> String {
        numbered(&self.class(class).suggestions)
    }

    /// Count a fix just added to the knowledge set under `id`.
    pub fn note_fix(&mut self, id: u64, entry: &FixEntry) {
        let state = self.class_mut(entry.error_kind.memocoder_class());
        if !state.pending.contains(&id) {
            state.pending.push(id);
        }
    }

    /// Classes with enough new fixes for a rewrite.
    pub fn due(&self, config: &FixesConfig) -> Vec<MemoCoderClass> {
        CLASSES
            .into_iter()
            .filter(|c| self.class(*c).pending.len() >= config.rewrite_threshold)
            .collect()
    }

    /// The rewrite prompt for `class`, or `None` while fewer than
    /// `rewrite_threshold` fixes are pending. Shows the newest
    /// `max_fixes_in_prompt` pending fixes that `fixes` still holds.
    pub fn rewrite_request(
        &self,
        class: MemoCoderClass,
        fixes: &FixKnowledge,
        config: &FixesConfig,
    ) -> Option<RewriteRequest> {
        let state = self.class(class);
        if state.pending.len() < config.rewrite_threshold {
            return None;
        }
        let shown: Vec<&FixEntry> = state
            .pending
            .iter()
            .rev()
            .filter_map(|id| fixes.get(*id))
            .take(config.max_fixes_in_prompt)
            .collect();
        Some(RewriteRequest {
            class,
            based_on_version: state.version,
            covers: state.pending.clone(),
            prompt: rewrite_prompt(class, state, &shown, config),
        })
    }

    /// Apply the generator's answer to `request`. On success the class gets
    /// the parsed list, its version goes up by one, and the fixes the request
    /// covered stop counting; returns the new version. An answer that does
    /// not parse changes nothing but the class's `parse_failures`.
    pub fn apply_rewrite(
        &mut self,
        request: &RewriteRequest,
        answer: &str,
        config: &FixesConfig,
    ) -> Result<u32, FixesError> {
        let class = request.class;
        let state = self.class_mut(class);
        if state.version != request.based_on_version {
            return Err(FixesError::Stale {
                class,
                asked: request.based_on_version,
                current: state.version,
            });
        }
        match parse_suggestions(answer, config.max_suggestions) {
            Ok(list) => {
                state.suggestions = list;
                state.version += 1;
                state.pending.retain(|id| !request.covers.contains(id));
                Ok(state.version)
            }
            Err(reason) => {
                state.parse_failures += 1;
                Err(FixesError::Unparseable { class, reason })
            }
        }
    }
}

fn numbered(items: &[String]) -> String {
    let mut out = String::new();
    for (i, s) in items.iter().enumerate() {
        let _ = writeln!(out, "{}. {s}", i + 1);
    }
    out
}

fn rewrite_prompt(
    class: MemoCoderClass,
    state: &ClassSuggestions,
    shown: &[&FixEntry],
    config: &FixesConfig,
) -> String {
    let clip = |s: &str| crate::text::clip(s.trim_end(), config.max_field_chars, "\n... [cut]");
    let mut p = String::new();
    let _ = write!(
        p,
        "You are the mentor of a code-repair team. For one class of errors in Python \
         solutions you keep a short list of fixing suggestions that the code writer reads \
         before repairing code.\n\nError class: {}.\n\nCurrent suggestions (version {}):\n{}\n",
        describe(class),
        state.version,
        numbered(&state.suggestions),
    );
    let _ = writeln!(
        p,
        "{} new fixes of this class were made since the list was last written. \
         The {} most recent:",
        state.pending.len(),
        shown.len()
    );
    for (i, f) in shown.iter().enumerate() {
        let _ = write!(
            p,
            "\n### Fix {}\nTask: {}\nError ({}): {}\nFailing code:\n```python\n{}\n```\n\
             Fixed code:\n```python\n{}\n```\n",
            i + 1,
            clip(&f.task),
            f.error_kind.name(),
            clip(&f.error_message),
            clip(&f.failing_code),
            clip(&f.fixed_code),
        );
    }
    let _ = write!(
        p,
        "\nStudy what caused these errors and what repaired them. Then rewrite the list: \
         keep suggestions that still hold, merge or drop weak ones, and add what the new \
         fixes teach. Each suggestion is one short, general, actionable sentence that names \
         no particular task.\n\nAnswer with at most {} suggestions as a numbered list, one per \
         line, written as \"1. suggestion\", and nothing else.\n",
        config.max_suggestions
    );
    p
}

/// Parse a numbered list strictly: every non-blank line is `N. text` or
/// `N) text`, numbered 1, 2, 3, ...; at least one and at most `max` items,
/// each at most [`MAX_SUGGESTION_CHARS`] characters. Anything else (a preface,
/// a continuation line, a skipped number) refuses the whole answer: it
/// replaces a list that works, so a half-understood answer is worse than none.
/// An item that repeats an earlier one word for word is dropped (small
/// models loop on the last item) and does not count towards `max`.
pub fn parse_suggestions(answer: &str, max: usize) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    // Items numbered so far, repeats included.
    let mut numbered = 0;
    for (i, line) in answer.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let line_no = i + 1;
        let digits = line.len() - line.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let (num, rest) = line.split_at(digits);
        let text = rest
            .strip_prefix(['.', ')'])
            .filter(|t| t.starts_with(char::is_whitespace))
            .map(str::trim)
            .filter(|t| !num.is_empty() && !t.is_empty())
            .ok_or_else(|| {
                format!("line {line_no} is not a numbered item \"N. text\": {line:?}")
            })?;
        let want = numbered + 1;
        if num.parse::<usize>().ok() != Some(want) {
            return Err(format!("line {line_no} is numbered {num}, expected {want}"));
        }
        numbered = want;
        if out.iter().any(|o| o == text) {
            // Numbered in sequence, but nothing new.
            continue;
        }
        if out.len() >= max {
            return Err(format!("more than {max} suggestions"));
        }
        if text.chars().count() > MAX_SUGGESTION_CHARS {
            return Err(format!(
                "suggestion {want} is longer than {MAX_SUGGESTION_CHARS} characters"
            ));
        }
        out.push(text.to_owned());
    }
    if out.is_empty() {
        return Err("no numbered suggestions".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fix(kind: ErrorKind, message: &str, n: usize) -> FixEntry {
        FixEntry {
            error_kind: kind,
            error_message: message.to_owned(),
            failing_code: format!("def f():\n    return {n}"),
            fixed_code: format!("def f():\n    return {}", n + 1),
            task: format!("task {n}"),
        }
    }

    #[test]
    fn paper_example_scores_five() {
        // MemoCoder §4.1.2: "values to unpack expected 2".
        let a = "not enough values to unpack (expected 2, got 1)";
        let b = "too many values to unpack (expected 2)";
        assert_eq!(match_length(a, b), 5);
        assert_eq!(match_length(b, a), 5);
        let w: Vec<_> = words(a).collect();
        assert_eq!(
            w,
            ["not", "enough", "values", "to", "unpack", "expected", "2", "got", "1"]
        );
        assert_eq!(match_length("x", ""), 0);
        // Case-sensitive; identifiers with _ are one word; punctuation splits.
        assert_eq!(match_length("Name error", "name error"), 1);
        assert_eq!(match_length("name 'foo_bar' is", "foo bar is"), 1);
        assert_eq!(match_length("obj.attr missing", "attr missing"), 2);
    }

    #[test]
    fn retrieval_ranks_by_match_then_newest_and_skips_zero() {
        let mut kb = FixKnowledge::new();
        let msgs = [
            "too many values to unpack (expected 2)",   // 0: 5
            "list index out of range",                  // 1: 0
            "cannot unpack non-iterable int object",    // 2: 1 ("unpack")
            "not enough values to unpack (expected 3)", // 3: 6
            "too many values to unpack (expected 2)",   // 4: 5, newer than 0
        ];
        for (i, m) in msgs.iter().enumerate() {
            assert_eq!(kb.add(fix(ErrorKind::ValueError, m, i)), i as u64);
        }
        let q = "not enough values to unpack (expected 2, got 1)";
        let got: Vec<(u64, usize)> = kb.retrieve(q, 10).iter().map(|r| (r.id, r.score)).collect();
        assert_eq!(got, [(3, 6), (4, 5), (0, 5), (2, 1)]);
        let top2: Vec<u64> = kb.retrieve(q, 2).iter().map(|r| r.id).collect();
        assert_eq!(top2, [3, 4]);
        assert!(kb.retrieve("zzz qqq", 10).is_empty());
        assert_eq!(kb.get(3).unwrap().task, "task 3");
    }

    #[test]
    fn knowledge_rebuilds_from_records_in_id_order() {
        let mut kb = FixKnowledge::new();
        let mut records = Vec::new();
        for i in 0..12 {
            let e = fix(ErrorKind::KeyError, &format!("KeyError key {i}"), i);
            let id = kb.add(e.clone());
            records.push((FixKnowledge::record_key(id), e));
        }
        records.reverse();
        let back = FixKnowledge::from_records(records).unwrap();
        assert_eq!(back.len(), 12);
        let q = "KeyError key 7";
        let ids = |k: &FixKnowledge| k.retrieve(q, 3).iter().map(|r| r.id).collect::<Vec<_>>();
        assert_eq!(ids(&back), ids(&kb));
        assert_eq!(ids(&kb), [7, 11, 10]);
        let mut back = back;
        assert_eq!(back.add(fix(ErrorKind::KeyError, "x", 0)), 12);
        assert_eq!(
            FixKnowledge::from_records(vec![("nope".into(), fix(ErrorKind::Other, "", 0))])
                .unwrap_err(),
            FixesError::BadKey("nope".into())
        );
    }

    #[test]
    fn parser_accepts_only_a_clean_numbered_list() {
        assert_eq!(
            parse_suggestions("1. Do a.\n\n2) Do b.  \n", 5).unwrap(),
            ["Do a.", "Do b."]
        );
        for (bad, why) in [
            ("", "no numbered"),
            ("Here you go:\n1. a", "line 1 is not a numbered item"),
            ("1. a\n3. b", "numbered 3, expected 2"),
            ("1. a\n   more of a", "line 2 is not"),
            ("1.a", "not a numbered item"),
            ("1. ", "not a numbered item"),
            (". a", "not a numbered item"),
            ("1. a\n2. b\n3. c", "more than 2"),
        ] {
            let e = parse_suggestions(bad, 2).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        let long = format!("1. {}", "x".repeat(MAX_SUGGESTION_CHARS + 1));
        assert!(parse_suggestions(&long, 5).is_err());
        // A loop on one item is the same list.
        assert_eq!(
            parse_suggestions("1. a\n2. b\n3. b\n4. a", 2).unwrap(),
            ["a", "b"]
        );
    }

    #[test]
    fn mentor_asks_after_threshold_and_applies_a_rewrite() {
        let config = FixesConfig {
            rewrite_threshold: 3,
            max_suggestions: 2,
            max_fixes_in_prompt: 2,
            ..FixesConfig::default()
        };
        config.validate().unwrap();
        let mut kb = FixKnowledge::new();
        let mut m = Mentor::default();
        let exc = MemoCoderClass::Exception;
        for i in 0..2 {
            let e = fix(ErrorKind::IndexError, &format!("index {i}"), i);
            m.note_fix(kb.add(e.clone()), &e);
        }
        let e = fix(ErrorKind::WrongAnswer, "assert", 9);
        m.note_fix(kb.add(e.clone()), &e);
        assert!(m.rewrite_request(exc, &kb, &config).is_none());
        assert!(m.due(&config).is_empty());
        let e = fix(ErrorKind::KeyError, "key 3", 3);
        m.note_fix(kb.add(e.clone()), &e);
        assert_eq!(m.due(&config), [exc]);

        let req = m.rewrite_request(exc, &kb, &config).unwrap();
        assert_eq!(
            (req.based_on_version, req.covers.clone()),
            (0, vec![0, 1, 3])
        );
        // The newest two fixes are shown, the old list, and the format rule.
        assert!(req.prompt.contains("key 3") && req.prompt.contains("index 1"));
        assert!(!req.prompt.contains("index 0"));
        assert!(req.prompt.contains(&m.suggestion_text(exc)));
        assert!(req.prompt.contains("at most 2 suggestions"));

        // A fix arriving while the generator works stays pending afterwards.
        let e = fix(ErrorKind::TypeError, "type 4", 4);
        m.note_fix(kb.add(e.clone()), &e);

        let before = m.clone();
        let err = m.apply_rewrite(&req, "Sure! Here are the tips:\n1. a", &config);
        assert!(matches!(err, Err(FixesError::Unparseable { .. })));
        assert_eq!(m.exception.parse_failures, 1);
        assert_eq!(m.exception.suggestions, before.exception.suggestions);
        assert_eq!(m.exception.pending, before.exception.pending);

        let v = m
            .apply_rewrite(&req, "1. Check bounds first.\n2. Validate keys.", &config)
            .unwrap();
        assert_eq!(v, 1);
        assert_eq!(
            m.exception.suggestions,
            ["Check bounds first.", "Validate keys."]
        );
        assert_eq!(m.exception.pending, [4]);
        assert_eq!(
            m.suggestion_text(exc),
            "1. Check bounds first.\n2. Validate keys.\n"
        );
        // The same request again is stale.
        assert!(matches!(
            m.apply_rewrite(&req, "1. x", &config),
            Err(FixesError::Stale {
                asked: 0,
                current: 1,
                ..
            })
        ));
        assert_eq!(m.assertion_failure.pending, [2]);

        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<Mentor>(&json).unwrap(), m);
    }

    #[test]
    fn long_fields_are_cut_in_the_prompt() {
        let config = FixesConfig {
            rewrite_threshold: 1,
            max_field_chars: 10,
            ..FixesConfig::default()
        };
        let mut kb = FixKnowledge::new();
        let mut m = Mentor::default();
        let mut e = fix(ErrorKind::Timeout, "timed out", 0);
        e.failing_code = "é".repeat(50);
        m.note_fix(kb.add(e.clone()), &e);
        let req = m
            .rewrite_request(MemoCoderClass::Timeout, &kb, &config)
            .unwrap();
        assert!(req
            .prompt
            .contains(&format!("{}\n... [cut]", "é".repeat(10))));
        assert!(!req.prompt.contains(&"é".repeat(11)));
        assert!(FixesConfig {
            top_k: 0,
            ..FixesConfig::default()
        }
        .validate()
        .is_err());
    }
}
