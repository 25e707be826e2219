//! The LM judge of FALCON §4.4: style `S` with the coding style assessment
//! template (Table 8) and complexity `C` with the complexity assessment
//! template (Table 9), both on the −1..2 scale, through the [`Generator`]
//! trait (the policy itself, a separate local judge model, or an HTTP client).
//!
//! The prompt is the paper's template verbatim, then the code in a fenced
//! block, then one line asking for the score as `Score: N` (the paper does not
//! show how the code and answer format were attached; this is our addition).
//!
//! [`parse_score`] is strict: it accepts the score written as the template
//! asks (an integer of −1, 0, 1, 2 after `Score:`/`Rating:`, a bare number,
//! or exactly one of the scale's labels) and rejects anything ambiguous (two
//! different scores, a range, a fraction, a number off the scale, a negated
//! label). An unparseable answer gives no signal and is counted, never guessed.

use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Aspect, Judge, JudgeStats, RewardError};
use crate::config::LmJudgeConfig;
use crate::model::{GenerationParams, Generator};

/// FALCON Table 8, verbatim.
pub const STYLE_TEMPLATE: &str = "Coding Style Assessment
Evaluate the coding style of provided code segments. Assess how well the code adheres to the best practices of the language, focusing on readability, maintainability, and efficiency in line with the language\u{2019}s idiomatic style.
Reward Scale: Rate outputs on a scale of -1 to 2
-1. Poor Adherence: The code significantly deviates from standard practices, showing poor readability, maintainability, and efficiency.
0. Basic Adherence: The code makes some effort to follow language conventions but lacks consistency in readability, maintainability, or efficiency.
1. Good Adherence: The code generally follows standards, demonstrating adequate readability, maintainability, and efficiency, though with room for improvement.
2. Excellent Adherence: The code exemplifies best practices, with high readability, maintainability, and efficiency, fully adhering to idiomatic conventions.";

/// FALCON Table 9, verbatim.
pub const COMPLEXITY_TEMPLATE: &str = "Complexity Assessment
Evaluate the solutions and code provided by the assistant based on their complexity. Assess how well the code manages complexity while achieving the desired outcomes.
Reward Scale: Rate outputs on a scale of -1 to 2
-1. Overly Complex: The code is unnecessarily complicated, with a high level of complexity that makes it hard to understand or maintain.
0. Acceptable Complexity: The code has a reasonable level of complexity, but there may be opportunities to simplify further.
1. Moderately Simple: The code is simple and well-organized, with minimal complexity and clear logic.
2. Optimal Simplicity: The code exemplifies the best practices in minimizing complexity while ensuring functionality.";

/// The line appended after the code, asking for a parseable answer.
pub const ANSWER_INSTRUCTION: &str =
    "Answer with the score (-1, 0, 1 or 2) in the form `Score: N`.";

/// The scale's labels with their scores, as the templates name them.
pub fn labels(aspect: Aspect) -> [(&'static str, i8); 4] {
    match aspect {
        Aspect::Style => [
            ("poor adherence", -1),
            ("basic adherence", 0),
            ("good adherence", 1),
            ("excellent adherence", 2),
        ],
        Aspect::Complexity => [
            ("overly complex", -1),
            ("acceptable complexity", 0),
            ("moderately simple", 1),
            ("optimal simplicity", 2),
        ],
    }
}

/// The judge prompt for one code: template, fenced code, answer instruction.
/// The fence is longer than any run of backticks inside the code.
pub fn prompt(aspect: Aspect, code: &str) -> String {
    let template = match aspect {
        Aspect::Style => STYLE_TEMPLATE,
        Aspect::Complexity => COMPLEXITY_TEMPLATE,
    };
    let longest_run = code.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest_run.max(2) + 1);
    let code = code.strip_suffix('\n').unwrap_or(code);
    format!("{template}\n\nCode:\n{fence}python\n{code}\n{fence}\n\n{ANSWER_INSTRUCTION}")
}

/// Words that introduce an explicit score.
const MARKERS: [&str; 4] = ["score", "rating", "grade", "reward"];
/// Filler allowed between a marker and its number ("Score is 2", "score of 1").
const FILLERS: [&str; 5] = ["is", "of", "would", "be", "will"];
/// Words that join two numbers into a range or a choice ("1 or 2").
const JOINERS: [&str; 3] = ["or", "to", "and"];

/// Why a marker's number was not taken.
enum Marker {
    /// No number follows: not a marker ("Reward Scale: ...").
    NotAScore,
    /// A number follows but is off the scale, fractional, or a range.
    Bad,
    Value(i8),
}

/// The score in a judge's answer, or `None` when there is no unambiguous one.
///
/// In order: (1) explicit markers (`Score: 2`, `**Rating**: -1`,
/// `final score is 1`): every one must give the same value; (2) otherwise a
/// first line that is only a number; (3) otherwise the scale's labels
/// (`2. Excellent Adherence`): exactly one distinct label, not negated.
/// Text inside `<think>…</think>` is ignored.
pub fn parse_score(aspect: Aspect, answer: &str) -> Option<f64> {
    let text = normalize(answer)?;
    let lower = text.to_lowercase();

    // (1) explicit markers.
    let mut found: Option<i8> = None;
    for marker in MARKERS {
        for (at, _) in lower.match_indices(marker) {
            let before_ok = lower[..at]
                .chars()
                .next_back()
                .is_none_or(|c| !c.is_alphanumeric());
            if !before_ok {
                continue;
            }
            match read_marker(&lower[at + marker.len()..]) {
                Marker::NotAScore => {}
                Marker::Bad => return None,
                Marker::Value(v) => match found {
                    Some(prev) if prev != v => return None,
                    _ => found = Some(v),
                },
            }
        }
    }
    if let Some(v) = found {
        return Some(f64::from(v));
    }

    // (2) a bare number on the first non-empty line.
    if let Some(first) = lower.lines().map(str::trim).find(|l| !l.is_empty()) {
        let bare = first
            .trim_matches(|c: char| c == '"' || c == '\'' || c.is_whitespace())
            .trim_end_matches('.');
        if let Some((v, rest)) = read_number(bare) {
            if rest.is_empty() {
                return v.map(f64::from);
            }
        }
    }

    // (3) exactly one of the scale's labels.
    let mut found: Option<i8> = None;
    for (label, v) in labels(aspect) {
        for (at, _) in lower.match_indices(label) {
            let before = &lower[..at];
            let window = &before[floor_boundary(before, before.len().saturating_sub(16))..];
            if window.contains("not ") || window.contains("n't ") || window.contains("no ") {
                return None;
            }
            match found {
                Some(prev) if prev != v => return None,
                _ => found = Some(v),
            }
        }
    }
    found.map(f64::from)
}

/// Drops `<think>` blocks and markdown emphasis, and spells minus signs as `-`.
fn normalize(answer: &str) -> Option<String> {
    let mut text = String::with_capacity(answer.len());
    let mut rest = answer;
    while let Some(open) = rest.find("<think>") {
        text.push_str(&rest[..open]);
        // An unclosed think block holds no answer.
        let close = rest[open..].find("</think>")?;
        rest = &rest[open + close + "</think>".len()..];
    }
    text.push_str(rest);
    let text: String = text
        .chars()
        .filter(|c| !matches!(c, '*' | '`' | '#'))
        .map(|c| if c == '\u{2212}' { '-' } else { c })
        .collect();
    Some(text)
}

/// Reads what follows a marker word.
fn read_marker(after: &str) -> Marker {
    let mut s = after;
    loop {
        let t = s.trim_start_matches(|c: char| c.is_whitespace() || c == ':' || c == '=');
        let filler = FILLERS.iter().find(|w| {
            t.starts_with(*w) && !t[w.len()..].starts_with(|c: char| c.is_alphanumeric())
        });
        match filler {
            Some(w) => s = &t[w.len()..],
            None => {
                s = t;
                break;
            }
        }
    }
    let Some((value, rest)) = read_number(s) else {
        return Marker::NotAScore;
    };
    let Some(value) = value else {
        return Marker::Bad;
    };
    // "1 or 2", "1-2", "1/2", "0 to 1", "1, 2": not one score.
    let r = rest.trim_start();
    if r.starts_with(['/', '-', '\u{2013}', '~', ','])
        && starts_with_number(&r[r.chars().next().map_or(0, char::len_utf8)..])
    {
        return Marker::Bad;
    }
    for joiner in JOINERS {
        if let Some(after) = r.strip_prefix(joiner) {
            if starts_with_number(after) {
                return Marker::Bad;
            }
        }
    }
    Marker::Value(value)
}

fn starts_with_number(s: &str) -> bool {
    let s = s.trim_start();
    let s = s.strip_prefix(['-', '+']).unwrap_or(s);
    s.starts_with(|c: char| c.is_ascii_digit())
}

/// Parses a leading number. `None` if there is none; `Some((None, rest))`
/// when there is one but it is not an integer in −1..=2.
fn read_number(s: &str) -> Option<(Option<i8>, &str)> {
    let (negative, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let int_len = body.bytes().take_while(u8::is_ascii_digit).count();
    if int_len == 0 {
        return None;
    }
    let mut rest = &body[int_len..];
    let mut fractional = false;
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n > 0 {
            fractional = frac[..n].bytes().any(|b| b != b'0');
            rest = &frac[n..];
        }
    }
    let value: Option<i64> = body[..int_len].parse().ok();
    let value = value
        .map(|v| if negative { -v } else { v })
        .filter(|v| (-1..=2).contains(v) && !fractional)
        .map(|v| v as i8);
    Some((value, rest))
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// An LM judge over a [`Generator`] it borrows (`&G`) or owns (`Box<G>`),
/// greedy by default.
pub struct LmJudge<R> {
    generator: R,
    params: GenerationParams,
    scored: AtomicUsize,
    unparseable: AtomicUsize,
}

impl<R: Deref> LmJudge<R>
where
    R::Target: Generator,
{
    /// A judge that asks `generator` with greedy decoding, `cfg.max_new_tokens`
    /// tokens, and the chat template when `cfg.chat`.
    pub fn new(generator: R, cfg: &LmJudgeConfig) -> Self {
        let params = GenerationParams {
            max_new_tokens: cfg.max_new_tokens,
            chat: cfg.chat,
            ..GenerationParams::default()
        };
        LmJudge {
            generator,
            params,
            scored: AtomicUsize::new(0),
            unparseable: AtomicUsize::new(0),
        }
    }

    /// How many answers had no unambiguous score so far.
    pub fn unparseable_count(&self) -> usize {
        self.unparseable.load(Ordering::Relaxed)
    }

    /// Scores with the raw answers, for sample logs.
    pub fn score_with_answers(
        &self,
        aspect: Aspect,
        codes: &[&str],
    ) -> Result<Vec<(Option<f64>, String)>, RewardError> {
        if codes.is_empty() {
            return Ok(Vec::new());
        }
        let prompts: Vec<String> = codes.iter().map(|c| prompt(aspect, c)).collect();
        let completions = self.generator.generate(&prompts, &self.params)?;
        if completions.len() != prompts.len() {
            return Err(RewardError::AnswerCount {
                expected: prompts.len(),
                got: completions.len(),
            });
        }
        Ok(completions
            .into_iter()
            .map(|c| {
                let score = parse_score(aspect, &c.text);
                let counter = if score.is_some() {
                    &self.scored
                } else {
                    &self.unparseable
                };
                counter.fetch_add(1, Ordering::Relaxed);
                (score, c.text)
            })
            .collect())
    }
}

impl<R: Deref> Judge for LmJudge<R>
where
    R::Target: Generator,
{
    fn score(&self, aspect: Aspect, codes: &[&str]) -> Result<Vec<Option<f64>>, RewardError> {
        Ok(self
            .score_with_answers(aspect, codes)?
            .into_iter()
            .map(|(s, _)| s)
            .collect())
    }

    fn stats(&self) -> JudgeStats {
        JudgeStats {
            scored: self.scored.load(Ordering::Relaxed),
            unparseable: self.unparseable.load(Ordering::Relaxed),
            timeouts: 0,
            failures: 0,
            over_budget: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::model::testing::Scripted;
    use crate::model::{Completion, ModelError};

    fn style(answer: &str) -> Option<f64> {
        parse_score(Aspect::Style, answer)
    }

    #[test]
    fn good_answers() {
        for (answer, want) in [
            ("Score: 2", 2.0),
            ("score: -1", -1.0),
            ("Score:1", 1.0),
            ("**Score:** 0", 0.0),
            ("Score: 2.0", 2.0),
            ("Final score = 1.", 1.0),
            ("The score is 2 because the code is idiomatic.", 2.0),
            ("I give it a score of 1 out of 2? No: Score: 1", 1.0),
            ("Rating: \u{2212}1 (Poor Adherence)", -1.0),
            ("2", 2.0),
            ("-1.\nThe code has no docstrings.", -1.0),
            ("`1`", 1.0),
            (
                "2. Excellent Adherence: The code exemplifies best practices.",
                2.0,
            ),
            ("Good Adherence", 1.0),
            ("The code shows good adherence to PEP 8 overall.", 1.0),
            (
                "Score: 1\nReward Scale: Rate outputs on a scale of -1 to 2",
                1.0,
            ),
            ("<think>maybe 2, maybe 0</think>\nScore: 0", 0.0),
            ("Score: 2\n\nScore: 2", 2.0),
        ] {
            assert_eq!(style(answer), Some(want), "{answer:?}");
        }
        assert_eq!(
            parse_score(Aspect::Complexity, "Moderately Simple."),
            Some(1.0)
        );
        assert_eq!(
            parse_score(Aspect::Complexity, "Score: -1, overly complex"),
            Some(-1.0)
        );
    }

    #[test]
    fn ambiguous_answers_are_rejected() {
        for answer in [
            "Score: 1 or 2",
            "Score: 1-2",
            "Score: 0 to 1",
            "Score: 1/2",
            "Score: 1.5",
            "Score: 3",
            "Score: 8/10",
            "Score: -2",
            "Score: 1\nScore: 2",
            "Rating: 2. Score: 0.",
            "It is Good Adherence, maybe Excellent Adherence.",
            "This is not Poor Adherence.",
            "Reward Scale: Rate outputs on a scale of -1 to 2\n-1. Poor Adherence\n0. Basic Adherence\n1. Good Adherence\n2. Excellent Adherence",
            "<think>Score: 2",
        ] {
            assert_eq!(style(answer), None, "{answer:?}");
        }
    }

    #[test]
    fn garbage_answers_are_rejected() {
        for answer in [
            "",
            "   \n  ",
            "I cannot evaluate this code.",
            "The code looks fine to me!",
            "def f(x):\n    return x\n",
            "Reward Scale: the code is okay",
            "12",
            "Score: excellent",
            "\u{1F600}\u{1F600}",
        ] {
            assert_eq!(style(answer), None, "{answer:?}");
        }
        // A complexity label does not score style.
        assert_eq!(style("Optimal Simplicity"), None);
    }

    #[test]
    fn prompt_is_the_template_verbatim_then_the_code() {
        let p = prompt(Aspect::Style, "def f():\n    return 1\n");
        assert!(p.starts_with(STYLE_TEMPLATE));
        assert!(p.contains("language\u{2019}s idiomatic style."));
        assert!(
            p.contains("\n```python\ndef f():\n    return 1\n```\n"),
            "{p}"
        );
        assert!(p.ends_with(ANSWER_INSTRUCTION));
        let p = prompt(Aspect::Complexity, "s = '```'\n");
        assert!(p.starts_with(COMPLEXITY_TEMPLATE));
        assert!(p.contains("````python\ns = '```'\n````"), "{p}");
    }

    #[test]
    fn judge_scores_and_counts_unparseable_answers() {
        let answers = ["Score: 2", "no idea", "Score: 1 or 2", "-1"];
        let next = AtomicUsize::new(0);
        let g = Scripted::new(|_: &str| answers[next.fetch_add(1, Ordering::Relaxed)].to_owned());
        let judge = LmJudge::new(&g, &LmJudgeConfig::default());
        let codes = ["a = 1\n", "b = 2\n", "c = 3\n", "d = 4\n"];
        let scores = judge.score(Aspect::Complexity, &codes).unwrap();
        assert_eq!(scores, vec![Some(2.0), None, None, Some(-1.0)]);
        assert_eq!(judge.unparseable_count(), 2);
        assert_eq!(
            judge.stats(),
            JudgeStats {
                scored: 2,
                unparseable: 2,
                timeouts: 0,
                failures: 0,
                over_budget: 0,
            }
        );
        let seen = g.seen();
        assert!(seen[0].starts_with(COMPLEXITY_TEMPLATE) && seen[3].contains("d = 4"));
        let params = g.params();
        assert!(!params.is_empty() && params.iter().all(|p| p.chat && p.max_new_tokens == 64));
    }

    #[test]
    fn wrong_answer_count_is_an_error() {
        struct Short;
        impl Generator for Short {
            fn generate(
                &self,
                _: &[String],
                _: &GenerationParams,
            ) -> Result<Vec<Completion>, ModelError> {
                Ok(vec![])
            }
        }
        let judge = LmJudge::new(&Short, &LmJudgeConfig::default());
        assert!(matches!(
            judge.score(Aspect::Style, &["x = 1\n"]),
            Err(RewardError::AnswerCount {
                expected: 1,
                got: 0
            })
        ));
    }
}
