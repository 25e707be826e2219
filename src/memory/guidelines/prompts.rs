//! What MEMCoder says to its reflector and reads back: the task- and
//! API-level reflection prompts, the strict parsing of their answers
//! (`GUIDELINE:` / `ACTION:` lines into a [`Reflection`]), and the
//! execution feedback `f` as text ([`feedback_text`]).

use serde::{Deserialize, Serialize};

use super::{fenced, tail_chars, truncate_chars, ApiDoc, ApiEntry, SOURCE_CAP};
use crate::exec::{ExecReport, RewardClass, TestStatus};

/// The routing decision for one API's candidate guideline `ĝ` (§IV-D).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Reflection {
    /// `ĝ` is redundant with `D_a` or `G_a`.
    Discard,
    /// `ĝ` invalidates the existing guideline with this id. Following the
    /// paper literally, the obsolete entry is retired and `ĝ` is not added.
    Delete { guideline_id: u64 },
    /// `ĝ` is a new insight, added with `w_init`.
    Add { text: String },
}

/// Counts of what the reflector's answers did, for logs and health checks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReflectStats {
    pub task_guidelines: u64,
    pub added: u64,
    pub deleted: u64,
    pub discarded: u64,
    /// Answers with no unambiguous reading, including a `DELETE` of an id
    /// the API does not have. They changed nothing.
    pub unparseable: u64,
}

/// The placeholder answer format earlier API-level prompts showed; the
/// parser refuses an answer that copies it.
pub const API_ANSWER_FORMAT: &str = "GUIDELINE: <the candidate guideline, on one line>
ACTION: ADD | DELETE <id> | DISCARD";

/// The placeholder earlier task-level prompts showed; the parser refuses
/// an answer that copies it.
pub const TASK_ANSWER_FORMAT: &str = "GUIDELINE: <the guideline, on one line>";

/// How every reflector answer starts: written for the model, which
/// continues it. The prompts show no placeholder line: SmolLM2-135M copies
/// a placeholder, and without the prefill it repeats the instruction
/// (docs/results/eval.md).
pub const REFLECTION_PREFILL: &str = "GUIDELINE:";

/// The task-level reflection prompt: distil `g_Task` from `(r, c, f)`.
pub fn task_reflection_prompt(
    requirement: &str,
    code: &str,
    feedback: &str,
    apis: &[&ApiDoc],
) -> String {
    let verdict = verdict_word(feedback);
    let mut p = String::from(
        "You are reviewing a solution that uses a private Python library, to record a reusable lesson for future tasks.\n\n",
    );
    p.push_str(&format!("Requirement:\n{}\n\n", requirement.trim_end()));
    p.push_str(&format!("Code:\n{}\n", fenced(code, "python")));
    p.push_str(&format!("Execution feedback:\n{}\n\n", feedback.trim_end()));
    p.push_str("Library APIs the code uses:\n");
    if apis.is_empty() {
        p.push_str("(none)\n");
    }
    for d in apis {
        p.push_str(&format!("- {}: {}\n", d.name, d.signature));
    }
    p.push_str(&format!(
        "\nThe code {verdict}. What should a programmer remember about how these APIs are combined for requirements like this one (data dependencies, call order, conversions between them){}?\n\n",
        if verdict == "passed" {
            ", as shown by this working solution"
        } else {
            ", and which combination caused the failure"
        }
    ));
    p.push_str("Answer with one sentence on a line that starts with \"GUIDELINE:\".");
    p
}

/// The API-level reflection prompt: a candidate guideline `ĝ` for `api` and
/// its routing against `D_a` and the current `G_a`, listed with their ids.
pub fn api_reflection_prompt(
    api: &ApiEntry,
    requirement: &str,
    code: &str,
    feedback: &str,
) -> String {
    let mut p = format!(
        "You are maintaining usage guidelines for the private library API `{}`.\n\n",
        api.name
    );
    p.push_str(&format!(
        "Documentation:\nSignature: {}\nDescription: {}\n",
        api.doc.signature,
        api.doc.description.trim_end()
    ));
    if let Some(src) = &api.doc.source {
        p.push_str(&format!(
            "Source:\n{}\n",
            fenced(&truncate_chars(src, SOURCE_CAP), "python")
        ));
    }
    p.push_str("\nCurrent guidelines for this API:\n");
    if api.guidelines.is_empty() {
        p.push_str("(none)\n");
    }
    for g in &api.guidelines {
        p.push_str(&format!("[{}] (weight {:.2}) {}\n", g.id, g.weight, g.text));
    }
    p.push_str(&format!(
        "\nA new task used this API.\nRequirement:\n{}\n\nCode:\n{}\nExecution feedback:\n{}\n\n",
        requirement.trim_end(),
        fenced(code, "python"),
        feedback.trim_end()
    ));
    p.push_str(&format!(
        "First write one candidate guideline about how to call `{}` correctly (parameter meaning, constraints, boundary conditions) that this outcome teaches. Then route it:\n\
ADD: it is a new, verified insight not covered by the documentation or the current guidelines.\n\
DELETE <id>: it shows that the current guideline with that id is wrong or obsolete; that guideline is removed.\n\
DISCARD: it is redundant with the documentation or a current guideline.\n\n\
Answer with two lines: one that starts with \"GUIDELINE:\", then one that starts with \"ACTION:\" followed by ADD, DELETE and the id, or DISCARD.",
        api.name
    ));
    p
}

/// The task guideline in a task-level answer, or `None` when there is not
/// exactly one (repeats of the same text are fine).
pub fn parse_task_guideline(answer: &str) -> Option<String> {
    let lines = answer_lines(answer)?;
    single_value(&lines, "GUIDELINE")
}

/// The routing in an API-level answer, or `None` when it is missing,
/// ambiguous, or deletes an id not in `valid_ids` (the API's active
/// guidelines). `ADD` needs exactly one `GUIDELINE:` text.
pub fn parse_api_reflection(answer: &str, valid_ids: &[u64]) -> Option<Reflection> {
    let lines = answer_lines(answer)?;
    let action = single_value(&lines, "ACTION")?;
    let action = action.trim_end_matches('.');
    let mut words = action.split_whitespace();
    let verb = words.next()?.to_ascii_uppercase();
    let arg = words.next();
    if words.next().is_some() {
        return None;
    }
    match (verb.as_str(), arg) {
        ("ADD", None) => Some(Reflection::Add {
            text: single_value(&lines, "GUIDELINE")?,
        }),
        ("DISCARD", None) => Some(Reflection::Discard),
        ("DELETE", Some(id)) => {
            let id = id
                .strip_prefix('#')
                .or_else(|| id.strip_prefix('[').and_then(|s| s.strip_suffix(']')))
                .unwrap_or(id);
            let id: u64 = id.parse().ok()?;
            valid_ids
                .contains(&id)
                .then_some(Reflection::Delete { guideline_id: id })
        }
        _ => None,
    }
}

/// The answer's lines outside `<think>` blocks, minus code-fence lines.
/// `None` for an unclosed think block: its answer never came.
fn answer_lines(answer: &str) -> Option<Vec<&str>> {
    let mut kept = Vec::new();
    let mut rest = answer;
    while let Some(open) = rest.find("<think>") {
        kept.push(&rest[..open]);
        let close = rest[open..].find("</think>")?;
        rest = &rest[open + close + "</think>".len()..];
    }
    kept.push(rest);
    Some(
        kept.into_iter()
            .flat_map(str::lines)
            .map(str::trim)
            .filter(|l| !l.starts_with("```"))
            .collect(),
    )
}

/// The one distinct non-empty value of `MARKER:` lines; markdown bullets and
/// emphasis around the marker are allowed, a template placeholder is not.
fn single_value(lines: &[&str], marker: &str) -> Option<String> {
    let mut found: Option<String> = None;
    for line in lines {
        let Some(v) = marker_value(line, marker) else {
            continue;
        };
        if v.is_empty() || (v.starts_with('<') && v.ends_with('>')) {
            return None;
        }
        match &found {
            Some(prev) if *prev != v => return None,
            _ => found = Some(v),
        }
    }
    found
}

fn marker_value(line: &str, marker: &str) -> Option<String> {
    let l = line.trim_start_matches(['-', '>', '*', '#', '_', ' ']);
    let head = l.get(..marker.len())?;
    if !head.eq_ignore_ascii_case(marker) {
        return None;
    }
    let rest = l[marker.len()..].trim_start_matches(['*', '_']);
    let value = rest.strip_prefix(':')?;
    let value = value.trim_matches(|c: char| c.is_whitespace() || matches!(c, '*' | '_' | '`'));
    Some(value.to_owned())
}

fn verdict_word(feedback: &str) -> &'static str {
    if feedback.starts_with(SUCCESS) {
        "passed"
    } else {
        "failed"
    }
}

// ---------------------------------------------------------------------------
// Execution feedback f.

const SUCCESS: &str = "Success";
const FEEDBACK_TAIL_CAP: usize = 1500;

/// The execution feedback `f` as text: `Success...` or `Failure...` with
/// the first failing test's error, the error lines and the output tail.
pub fn feedback_text(report: &ExecReport) -> String {
    let Some(outcome) = report.outcome else {
        return format!(
            "No signal: {}",
            report.no_signal.as_deref().unwrap_or("unknown")
        );
    };
    if outcome == RewardClass::Pass {
        return format!("{SUCCESS}: all {} tests passed.", report.tests.len());
    }
    let mut f = format!(
        "Failure: {} of {} tests failed",
        report.n_fail(),
        report.tests.len()
    );
    if let Some(kind) = report.error_kind {
        f.push_str(&format!("; first error: {}", kind.name()));
    }
    if let Some(t) = report.tests.iter().find(|t| t.status != TestStatus::Pass) {
        match &t.status {
            TestStatus::Error { message, .. } if !message.is_empty() => {
                f.push_str(&format!(" in test {}: {}", t.index, message.trim()));
            }
            TestStatus::Fail => {
                f.push_str(&format!(" in test {}: wrong result", t.index));
            }
            _ => {}
        }
    }
    if !report.error_lines.is_empty() {
        let lines: Vec<String> = report.error_lines.iter().map(u32::to_string).collect();
        f.push_str(&format!("; error at line(s) {}", lines.join(", ")));
    }
    f.push('.');
    let tail = report.output_tail.trim();
    if !tail.is_empty() {
        f.push_str("\nOutput:\n");
        f.push_str(&tail_chars(tail, FEEDBACK_TAIL_CAP));
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::guidelines::tests::report;

    #[test]
    fn api_answers_parse_strictly() {
        let ids = [17, 4];
        let add = |t: &str| Some(Reflection::Add { text: t.into() });
        for (answer, want) in [
            ("GUIDELINE: Pass shape as a tuple.\nACTION: ADD", add("Pass shape as a tuple.")),
            (
                "Sure! Here is my answer:\n```\nGUIDELINE: g\nACTION: DELETE 17\n```\nHope it helps.",
                Some(Reflection::Delete { guideline_id: 17 }),
            ),
            ("**ACTION:** DISCARD", Some(Reflection::Discard)),
            ("- **Action**: discard.", Some(Reflection::Discard)),
            ("ACTION: DELETE #4", Some(Reflection::Delete { guideline_id: 4 })),
            ("action: delete [17]", Some(Reflection::Delete { guideline_id: 17 })),
            ("GUIDELINE: `g`\nACTION: `ADD`", add("g")),
            ("ACTION: ADD\nGUIDELINE: g\nACTION: ADD", add("g")),
            ("<think>ACTION: DISCARD</think>\nGUIDELINE: g\nACTION: ADD", add("g")),
        ] {
            assert_eq!(parse_api_reflection(answer, &ids), want, "{answer:?}");
        }
        for answer in [
            "",
            "I would add it.",
            "ACTION: DELETE 99",
            "ACTION: DELETE",
            "ACTION: DELETE 17 4",
            "ACTION: DELETE seventeen",
            "ACTION: ADD",
            "ACTION: ADD | DELETE <id> | DISCARD",
            API_ANSWER_FORMAT,
            "GUIDELINE: <the candidate guideline, on one line>\nACTION: ADD",
            "GUIDELINE: a\nGUIDELINE: b\nACTION: ADD",
            "ACTION: ADD\nACTION: DISCARD",
            "ACTION: ADD it",
            "I think the ACTION: ADD\nGUIDELINE: g",
            "<think>GUIDELINE: g\nACTION: ADD",
        ] {
            assert_eq!(parse_api_reflection(answer, &ids), None, "{answer:?}");
        }
        assert_eq!(
            parse_task_guideline("Here you go.\n\nGUIDELINE: Convert with asarray first.\n"),
            Some("Convert with asarray first.".into())
        );
        for answer in [
            "",
            "Convert first.",
            "GUIDELINE:",
            "GUIDELINE: a\nGUIDELINE: b",
            TASK_ANSWER_FORMAT,
        ] {
            assert_eq!(parse_task_guideline(answer), None, "{answer:?}");
        }
    }

    #[test]
    fn feedback_text_summarises_the_report() {
        assert_eq!(feedback_text(&report(true)), "Success: all 1 tests passed.");
        let f = feedback_text(&report(false));
        assert_eq!(
            f,
            "Failure: 1 of 1 tests failed; first error: TypeError in test 0: TypeError: shape must be a tuple; error at line(s) 3."
        );
    }
}
