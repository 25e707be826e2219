//! MEMCoder's multi-dimensional evolving memory (Li et al. 2026,
//! papers/memcoder.txt §IV): the task-level entries `m_Task = ⟨r, c, f,
//! A_used, g_Task⟩` (Eq. 1), the API-level entries `m_API = ⟨a, D_a, C_a,
//! G_a⟩` (Eq. 2) with weighted usage guidelines, dual-source retrieval and
//! the Eq. 4 context, the reflector's prompts and strict answer parsing
//! (Discard / Delete / Add), and the Eq. 5 weight update.
//!
//! Pure logic: embedding, similar-task search and persistence live
//! elsewhere. Every state type is serde, so a store can save it as JSON.
//!
//! Where the paper is silent we chose, and say so: the Eq. 5 constants, the
//! reflector's answer format (`GUIDELINE:` / `ACTION:` lines), the order of
//! candidate APIs, and what `Delete` does with the candidate guideline.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::exec::{ExecReport, RewardClass, TestStatus};
use crate::memory::render::{task_statement, View};
use crate::model::{GenerationParams, Generator, ModelError};
use crate::text::python::{self, TokenKind};

/// Everything that can go wrong in this module. Doc-file errors carry
/// `path:line` so a user knows which entry to fix.
#[derive(Debug, thiserror::Error)]
pub enum MemcoderError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {reason}")]
    BadDoc {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("memcoder parameters: {0}")]
    BadParams(String),
    /// The sandbox gave no signal about the sample; the memory is unchanged.
    #[error("no execution signal, memory unchanged: {0}")]
    NoSignal(String),
    #[error("reflector: {0}")]
    Reflector(#[from] ModelError),
    #[error("expected {expected} reflector answers, got {got}")]
    AnswerCount { expected: usize, got: usize },
}

// ---------------------------------------------------------------------------
// Static documentation D.

/// One API of the private library's static documentation (`D_a`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiDoc {
    /// Fully qualified, e.g. `numpy.zeros`.
    pub name: String,
    pub signature: String,
    pub description: String,
    /// The definition's source code, when the docs carry it.
    #[serde(default)]
    pub source: Option<String>,
}

/// Reads API docs from a JSON array or a JSONL file (one object per line,
/// blank lines skipped). Names must be dotted identifiers and unique.
pub fn load_api_docs(path: &Path) -> Result<Vec<ApiDoc>, MemcoderError> {
    let text = std::fs::read_to_string(path).map_err(|source| MemcoderError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse_api_docs(&text, path)
}

/// [`load_api_docs`] on text already read; `path` only names the errors.
pub fn parse_api_docs(text: &str, path: &Path) -> Result<Vec<ApiDoc>, MemcoderError> {
    let bad = |line: usize, reason: String| MemcoderError::BadDoc {
        path: path.to_owned(),
        line,
        reason,
    };
    let mut entries: Vec<(usize, &str)> = Vec::new();
    if text.trim_start().starts_with('[') {
        // Check the whole array first so syntax errors get serde's line; then
        // parse element by element so field errors point at their element.
        if let Err(e) = serde_json::from_str::<Vec<serde_json::Value>>(text) {
            return Err(bad(e.line(), e.to_string()));
        }
        for (start, end) in array_elements(text) {
            entries.push((line_of(text, start), &text[start..end]));
        }
    } else {
        for (i, line) in text.lines().enumerate() {
            if !line.trim().is_empty() {
                entries.push((i + 1, line));
            }
        }
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut docs = Vec::with_capacity(entries.len());
    for (line, json) in entries {
        let doc: ApiDoc = serde_json::from_str(json)
            .map_err(|e| bad(line + e.line().saturating_sub(1), e.to_string()))?;
        if !is_dotted_name(&doc.name) {
            return Err(bad(
                line,
                format!(
                    "API name {:?} is not a dotted identifier like `pkg.mod.func`",
                    doc.name
                ),
            ));
        }
        if let Some(first) = seen.insert(doc.name.clone(), line) {
            return Err(bad(
                line,
                format!("duplicate API {:?} (first at line {first})", doc.name),
            ));
        }
        docs.push(doc);
    }
    Ok(docs)
}

/// Byte ranges of the top-level elements of a JSON array that serde has
/// already accepted, so only strings and nesting need tracking.
fn array_elements(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let (mut depth, mut in_str, mut escaped) = (0usize, false, false);
    let mut start: Option<usize> = None;
    for (i, b) in text.bytes().enumerate() {
        if in_str {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'[' | b'{' => {
                if depth == 1 && start.is_none() {
                    start = Some(i);
                }
                depth += 1;
            }
            b']' | b'}' => {
                depth -= 1;
                if depth == 0 {
                    out.extend(start.take().map(|s| (s, i)));
                }
            }
            b',' if depth == 1 => out.extend(start.take().map(|s| (s, i))),
            b' ' | b'\t' | b'\r' | b'\n' => {}
            _ => {
                if b == b'"' {
                    in_str = true;
                }
                if depth == 1 && start.is_none() {
                    start = Some(i);
                }
            }
        }
    }
    out
}

fn line_of(text: &str, byte: usize) -> usize {
    text[..byte].matches('\n').count() + 1
}

fn is_dotted_name(name: &str) -> bool {
    !name.is_empty() && name.split('.').all(python::is_name)
}

// ---------------------------------------------------------------------------
// Memory entries.

/// A task-level entry `m_Task = ⟨r, c, f, A_used, g_Task⟩` (Eq. 1). The
/// requirement `r` is its index key; embedding it is done elsewhere.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskEntry {
    pub requirement: String,
    pub code: String,
    /// Execution feedback `f` ([`feedback_text`]).
    pub feedback: String,
    /// Documented APIs the code uses, in order of first use.
    pub apis_used: Vec<String>,
    /// `g_Task`; empty when the reflector's answer was unparseable.
    pub guideline: String,
    pub passed: bool,
}

/// One usage guideline `g ∈ G_a` with its weight `w`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Guideline {
    /// Unique across the whole memory, assigned in creation order from 1.
    pub id: u64,
    pub text: String,
    pub weight: f64,
}

/// An API-level entry `m_API = ⟨a, D_a, C_a, G_a⟩` (Eq. 2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiEntry {
    pub name: String,
    pub doc: ApiDoc,
    /// `C_a`: code of passing solutions that use this API, oldest first.
    pub snippets: Vec<String>,
    /// `G_a`: the active guidelines.
    pub guidelines: Vec<Guideline>,
    /// Guidelines removed by a `Delete` routing. §IV-D says the obsolete
    /// entry is "marked for deletion" (Fig. 3 still shows it), so it is kept
    /// here for inspection but never retrieved, reweighted or deletable again.
    #[serde(default)]
    pub retired: Vec<Guideline>,
}

impl ApiEntry {
    /// The `k` highest-weighted active guidelines; ties go to the older id.
    pub fn top_guidelines(&self, k: usize) -> Vec<&Guideline> {
        let mut g: Vec<&Guideline> = self.guidelines.iter().collect();
        g.sort_by(|a, b| b.weight.total_cmp(&a.weight).then(a.id.cmp(&b.id)));
        g.truncate(k);
        g
    }
}

// ---------------------------------------------------------------------------
// Parameters and Eq. 5.

pub use crate::config::{MemCoderParams, WeightParams};

impl WeightParams {
    /// Eq. 5: `w + Δw+` on success, `max(w_min, w − Δw−)` on failure.
    pub fn update(&self, w: f64, passed: bool) -> f64 {
        if passed {
            w + self.delta_plus
        } else {
            (w - self.delta_minus).max(self.w_min)
        }
    }
}

// ---------------------------------------------------------------------------
// Reflector answers.

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
/// (docs/eval.md).
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
const SOURCE_CAP: usize = 2000;
const CONTEXT_FEEDBACK_CAP: usize = 600;

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

// ---------------------------------------------------------------------------
// The memory.

/// The context of Eq. 4 and what went into it.
#[derive(Debug, Clone, PartialEq)]
pub struct Context {
    /// `A_cand`, documented APIs only, in rendering order.
    pub candidate_apis: Vec<String>,
    /// `G_used`: ids of the guidelines in `text`; pass them to `evolve`.
    pub injected_guideline_ids: Vec<u64>,
    /// The prompt block, ending with the requirement.
    pub text: String,
}

/// What the reflector decided for one used API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiOutcome {
    pub api: String,
    /// `None`: the answer was unparseable and changed nothing.
    pub reflection: Option<Reflection>,
    /// The id given to an added guideline.
    pub added_id: Option<u64>,
}

/// What one [`MemCoderMemory::evolve`] call changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvolveSummary {
    /// Index of the new entry in [`MemCoderMemory::tasks`].
    pub task_index: usize,
    pub passed: bool,
    pub apis_used: Vec<String>,
    /// Whether `g_Task` was parsed (the entry is stored either way).
    pub task_guideline: bool,
    pub apis: Vec<ApiOutcome>,
    /// Injected guidelines whose weight Eq. 5 updated (retired ones are skipped).
    pub reweighted: Vec<u64>,
}

/// The reflector prompts for one executed sample (see [`MemCoderMemory::reflection_prompts`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ReflectionPrompts {
    /// `A_c_t`, in order; `api_prompts[i]` is about `apis_used[i]`.
    pub apis_used: Vec<String>,
    pub task_prompt: String,
    pub api_prompts: Vec<String>,
}

/// The multi-dimensional evolving memory `M = (M_Task, M_API)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemCoderMemory {
    pub params: MemCoderParams,
    tasks: Vec<TaskEntry>,
    /// One entry per documented API, keyed by qualified name.
    apis: BTreeMap<String, ApiEntry>,
    next_guideline_id: u64,
    stats: ReflectStats,
}

/// Where a run's MEMCoder memory lives in the store: (kind, key).
pub const RECORD: (&str, &str) = ("memcoder", "state");

impl MemCoderMemory {
    /// The memory saved in `store`, if any.
    pub fn load(store: &super::MemoryStore) -> Result<Option<Self>, super::StoreError> {
        store.get_record(RECORD.0, RECORD.1)
    }

    /// Save the whole memory as one record (one transaction).
    pub fn save(&self, store: &mut super::MemoryStore, step: u64) -> Result<(), super::StoreError> {
        store.put_record(RECORD.0, RECORD.1, step, self)
    }

    /// An empty memory over the library's docs: every documented API gets an
    /// entry with no snippets and no guidelines.
    pub fn new(docs: Vec<ApiDoc>, params: MemCoderParams) -> Result<Self, MemcoderError> {
        params.validate().map_err(MemcoderError::BadParams)?;
        let mut apis = BTreeMap::new();
        for doc in docs {
            if !is_dotted_name(&doc.name) {
                return Err(MemcoderError::BadParams(format!(
                    "API name {:?} is not a dotted identifier",
                    doc.name
                )));
            }
            let entry = ApiEntry {
                name: doc.name.clone(),
                doc,
                snippets: Vec::new(),
                guidelines: Vec::new(),
                retired: Vec::new(),
            };
            if let Some(dup) = apis.insert(entry.name.clone(), entry) {
                return Err(MemcoderError::BadParams(format!(
                    "duplicate API {:?}",
                    dup.name
                )));
            }
        }
        Ok(MemCoderMemory {
            params,
            tasks: Vec::new(),
            apis,
            next_guideline_id: 1,
            stats: ReflectStats::default(),
        })
    }

    /// `M_Task`, oldest first (the index the similar-task search embeds).
    pub fn tasks(&self) -> &[TaskEntry] {
        &self.tasks
    }

    /// `m_API^(a)`, when `name` is documented.
    pub fn api(&self, name: &str) -> Option<&ApiEntry> {
        self.apis.get(name)
    }

    /// Whether `name` is in the documentation `D`.
    pub fn is_documented(&self, name: &str) -> bool {
        self.apis.contains_key(name)
    }

    /// Totals over every evolve so far.
    pub fn stats(&self) -> &ReflectStats {
        &self.stats
    }

    /// Documented APIs `code` uses, in order of first use ([`apis_used`]).
    pub fn apis_used(&self, code: &str) -> Vec<String> {
        apis_used(code, |n| self.is_documented(n))
    }

    /// Dual-source retrieval (§IV-C) and the Eq. 4 context
    /// `C_t = [m.c, m.f, m.g_Task]_{m ∈ M_rt} ; [m_API^(a)]_{a ∈ A_cand} ; r_t`.
    ///
    /// `doc_hits` are the `K_doc` APIs retrieved from the docs with their
    /// similarity, `similar_tasks` the `K_task` nearest task entries, best
    /// first. `A_cand` is their union: doc hits by descending score (NaN
    /// last, ties in given order), then the tasks' `A_used` in order,
    /// without repeats; undocumented names are dropped. Each API shows its
    /// docs, its newest successful snippet(s) and its top guidelines.
    pub fn render_context<S: AsRef<str>>(
        &self,
        requirement: &str,
        doc_hits: &[(S, f32)],
        similar_tasks: &[&TaskEntry],
        view: &mut View,
    ) -> Context {
        let candidates: Vec<String> = candidate_apis(doc_hits, similar_tasks)
            .into_iter()
            .filter(|a| self.is_documented(a))
            .collect();
        let mut injected = Vec::new();
        let mut text = String::new();
        if !similar_tasks.is_empty() {
            text.push_str("## Similar past tasks\n\n");
            for (i, m) in similar_tasks.iter().enumerate() {
                let mut block = format!("### Past task {}\n", i + 1);
                match view.code(&m.code) {
                    Some(code) => block.push_str(&format!("Code:\n{}", fenced(&code, "python"))),
                    // No foreign code: the task in words, renamed where it
                    // names the past code's functions.
                    None => block.push_str(&format!(
                        "Task: {}\n",
                        view.rename_from(&m.code, &task_statement(&m.requirement))
                    )),
                }
                let feedback = truncate_chars(m.feedback.trim(), CONTEXT_FEEDBACK_CAP);
                block.push_str(&format!(
                    "Execution feedback: {}\n",
                    view.rename_from(&m.code, &feedback)
                ));
                if !m.guideline.is_empty() {
                    block.push_str(&format!(
                        "Guideline: {}\n",
                        view.rename_from(&m.code, &m.guideline)
                    ));
                }
                block.push('\n');
                match view.take(block) {
                    Some(b) => text.push_str(&b),
                    None => break,
                }
            }
        }
        if !candidates.is_empty() {
            text.push_str("## Library APIs\n\n");
            for name in &candidates {
                let a = &self.apis[name];
                text.push_str(&format!("### {}\nSignature: {}\n", a.name, a.doc.signature));
                if !a.doc.description.trim().is_empty() {
                    text.push_str(&format!("Description: {}\n", a.doc.description.trim()));
                }
                if let Some(src) = &a.doc.source {
                    text.push_str(&format!(
                        "Source:\n{}",
                        fenced(&truncate_chars(src, SOURCE_CAP), "python")
                    ));
                }
                let k = self.params.snippets_per_api;
                for s in a.snippets.iter().rev().take(k) {
                    // `brief`: only the lines that call the API, no foreign def.
                    let shown = view.code(s).unwrap_or_else(|| api_call_lines(s, &a.name));
                    if shown.is_empty() {
                        continue;
                    }
                    if let Some(b) = view.take(format!(
                        "Example of successful use:\n{}",
                        fenced(&shown, "python")
                    )) {
                        text.push_str(&b);
                    }
                }
                let top = a.top_guidelines(self.params.guidelines_per_api);
                if !top.is_empty() {
                    text.push_str("Usage guidelines:\n");
                    for g in top {
                        text.push_str(&format!("- {}\n", g.text));
                        injected.push(g.id);
                    }
                }
                text.push('\n');
            }
        }
        text.push_str(&format!("## Requirement\n{}\n", requirement.trim_end()));
        Context {
            candidate_apis: candidates,
            injected_guideline_ids: injected,
            text,
        }
    }

    /// The reflector prompts for one executed sample: one task-level prompt,
    /// then one API-level prompt per documented API the code uses.
    /// Errors with [`MemcoderError::NoSignal`] when the run gave no signal.
    pub fn reflection_prompts(
        &self,
        requirement: &str,
        code: &str,
        report: &ExecReport,
    ) -> Result<ReflectionPrompts, MemcoderError> {
        signal(report)?;
        let feedback = feedback_text(report);
        let used = self.apis_used(code);
        let docs: Vec<&ApiDoc> = used.iter().map(|a| &self.apis[a].doc).collect();
        Ok(ReflectionPrompts {
            task_prompt: task_reflection_prompt(requirement, code, &feedback, &docs),
            api_prompts: used
                .iter()
                .map(|a| api_reflection_prompt(&self.apis[a], requirement, code, &feedback))
                .collect(),
            apis_used: used,
        })
    }

    /// The whole §IV-D evolution for one executed sample: ask `reflector`
    /// (one batched call) and apply its answers with
    /// [`MemCoderMemory::evolve_with_answers`].
    pub fn evolve(
        &mut self,
        requirement: &str,
        code: &str,
        report: &ExecReport,
        injected_guideline_ids: &[u64],
        reflector: &dyn Generator,
        params: &GenerationParams,
    ) -> Result<EvolveSummary, MemcoderError> {
        let prompts = self.reflection_prompts(requirement, code, report)?;
        let mut all = Vec::with_capacity(1 + prompts.api_prompts.len());
        all.push(prompts.task_prompt);
        all.extend(prompts.api_prompts);
        let mut p = params.clone();
        p.prefill = REFLECTION_PREFILL.into();
        let mut answers = reflector.generate(&all, &p)?;
        for a in &mut answers {
            a.text.insert_str(0, REFLECTION_PREFILL);
        }
        if answers.len() != all.len() {
            return Err(MemcoderError::AnswerCount {
                expected: all.len(),
                got: answers.len(),
            });
        }
        let api_answers: Vec<&str> = answers[1..].iter().map(|c| c.text.as_str()).collect();
        self.evolve_with_answers(
            requirement,
            code,
            report,
            injected_guideline_ids,
            &answers[0].text,
            &api_answers,
        )
    }

    /// [`MemCoderMemory::evolve`] with the reflector's answers given:
    /// `api_answers[i]` answers the prompt for the i-th used API. In the
    /// order of Fig. 3: store the task entry (steps 7-9), store the snippet
    /// on success (11), apply Eq. 5 to the injected guidelines (12), then
    /// route each API's candidate guideline (13-14). Guidelines added now
    /// were not injected, so Eq. 5 does not touch them.
    pub fn evolve_with_answers(
        &mut self,
        requirement: &str,
        code: &str,
        report: &ExecReport,
        injected_guideline_ids: &[u64],
        task_answer: &str,
        api_answers: &[&str],
    ) -> Result<EvolveSummary, MemcoderError> {
        self.evolve_parts(
            requirement,
            code,
            report,
            injected_guideline_ids,
            Some(task_answer),
            Some(api_answers),
        )
    }

    /// [`MemCoderMemory::evolve_with_answers`] for the ablations that run
    /// without one level: with `task_answer = None` the task entry is
    /// stored without a guideline (and no reflection was asked for); with
    /// `api_answers = None` the API level is left untouched (no snippet,
    /// no Eq. 5 update, no routing).
    pub fn evolve_parts(
        &mut self,
        requirement: &str,
        code: &str,
        report: &ExecReport,
        injected_guideline_ids: &[u64],
        task_answer: Option<&str>,
        api_answers: Option<&[&str]>,
    ) -> Result<EvolveSummary, MemcoderError> {
        let passed = signal(report)?;
        let used = self.apis_used(code);
        if let Some(a) = api_answers.filter(|a| a.len() != used.len()) {
            return Err(MemcoderError::AnswerCount {
                expected: used.len(),
                got: a.len(),
            });
        }

        let guideline = task_answer.and_then(parse_task_guideline);
        match (task_answer, &guideline) {
            (None, _) => {}
            (Some(_), Some(_)) => self.stats.task_guidelines += 1,
            (Some(_), None) => self.stats.unparseable += 1,
        }
        let task_index = self.tasks.len();
        self.tasks.push(TaskEntry {
            requirement: requirement.to_owned(),
            code: code.to_owned(),
            feedback: feedback_text(report),
            apis_used: used.clone(),
            guideline: guideline.clone().unwrap_or_default(),
            passed,
        });

        let Some(api_answers) = api_answers else {
            return Ok(EvolveSummary {
                task_index,
                passed,
                apis_used: used,
                task_guideline: guideline.is_some(),
                apis: Vec::new(),
                reweighted: Vec::new(),
            });
        };
        if passed {
            let cap = self.params.max_snippets;
            for a in &used {
                let e = self
                    .apis
                    .get_mut(a)
                    .expect("apis_used only returns documented APIs");
                if !e.snippets.iter().any(|s| s == code) {
                    e.snippets.push(code.to_owned());
                    let excess = e.snippets.len().saturating_sub(cap);
                    e.snippets.drain(..excess);
                }
            }
        }

        let reweighted = self.update_weights(injected_guideline_ids, passed);

        let mut outcomes = Vec::with_capacity(used.len());
        for (api, answer) in used.iter().zip(api_answers) {
            outcomes.push(self.route(api, answer));
        }

        Ok(EvolveSummary {
            task_index,
            passed,
            apis_used: used,
            task_guideline: guideline.is_some(),
            apis: outcomes,
            reweighted,
        })
    }

    /// Eq. 5 on each injected active guideline, once per id; returns the ids
    /// updated.
    fn update_weights(&mut self, injected: &[u64], passed: bool) -> Vec<u64> {
        let wanted: HashSet<u64> = injected.iter().copied().collect();
        let mut done = Vec::new();
        for e in self.apis.values_mut() {
            for g in e.guidelines.iter_mut().filter(|g| wanted.contains(&g.id)) {
                g.weight = self.params.weights.update(g.weight, passed);
                done.push(g.id);
            }
        }
        done.sort_unstable();
        done
    }

    fn route(&mut self, api: &str, answer: &str) -> ApiOutcome {
        let entry = self
            .apis
            .get_mut(api)
            .expect("apis_used only returns documented APIs");
        let ids: Vec<u64> = entry.guidelines.iter().map(|g| g.id).collect();
        let reflection = parse_api_reflection(answer, &ids);
        let mut added_id = None;
        match &reflection {
            None => self.stats.unparseable += 1,
            Some(Reflection::Discard) => self.stats.discarded += 1,
            Some(Reflection::Delete { guideline_id }) => {
                let at = entry
                    .guidelines
                    .iter()
                    .position(|g| g.id == *guideline_id)
                    .expect("the parser only accepts active ids");
                entry.retired.push(entry.guidelines.remove(at));
                self.stats.deleted += 1;
            }
            Some(Reflection::Add { text }) => {
                // An exact repeat is redundant by definition: count it as a discard.
                if entry.guidelines.iter().any(|g| g.text == *text) {
                    self.stats.discarded += 1;
                } else {
                    let id = self.next_guideline_id;
                    self.next_guideline_id += 1;
                    entry.guidelines.push(Guideline {
                        id,
                        text: text.clone(),
                        weight: self.params.weights.w_init,
                    });
                    added_id = Some(id);
                    self.stats.added += 1;
                }
            }
        }
        ApiOutcome {
            api: api.to_owned(),
            reflection,
            added_id,
        }
    }
}

/// The lines of `code` that call `api` (by its last name: `ndx.sum(` and
/// `sum(` after a from-import both count), trimmed, without `def` lines,
/// at most [`CALL_LINES`]: how a `brief` view shows a snippet.
fn api_call_lines(code: &str, api: &str) -> String {
    let short = api.rsplit('.').next().unwrap_or(api);
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let calls = |line: &str| {
        line.match_indices(&format!("{short}(")).any(|(i, _)| {
            let before = line[..i].chars().next_back();
            before.is_none_or(|c| c == '.' || !is_word(c))
        })
    };
    code.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("def ") && !l.starts_with('#') && calls(l))
        .take(CALL_LINES)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Lines of a snippet a `brief` view shows at most.
const CALL_LINES: usize = 3;

/// Whether the run passed; an error when it gave no signal.
fn signal(report: &ExecReport) -> Result<bool, MemcoderError> {
    match report.outcome {
        None => Err(MemcoderError::NoSignal(
            report.no_signal.clone().unwrap_or_else(|| "unknown".into()),
        )),
        Some(o) => Ok(o == RewardClass::Pass),
    }
}

/// `A_cand = A_doc ∪ ⋃ m.A_used` in a deterministic order: doc hits by
/// descending score (NaN last, ties keep their given order), then each
/// similar task's APIs in order, first occurrence kept.
pub fn candidate_apis<S: AsRef<str>>(
    doc_hits: &[(S, f32)],
    similar_tasks: &[&TaskEntry],
) -> Vec<String> {
    let mut hits: Vec<(&str, f32)> = doc_hits.iter().map(|(n, s)| (n.as_ref(), *s)).collect();
    let key = |s: f32| if s.is_nan() { f32::NEG_INFINITY } else { s };
    hits.sort_by(|a, b| key(b.1).total_cmp(&key(a.1)));
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let task_apis = similar_tasks
        .iter()
        .flat_map(|t| t.apis_used.iter().map(String::as_str));
    for name in hits.into_iter().map(|(n, _)| n).chain(task_apis) {
        if seen.insert(name) {
            out.push(name.to_owned());
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Used-API extraction: imports and attribute chains over the tokens of
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

// ---------------------------------------------------------------------------
// Text helpers.

/// `code` in a fence longer than any backtick run inside it, ending in `\n`.
fn fenced(code: &str, lang: &str) -> String {
    let longest = code.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    let code = code.strip_suffix('\n').unwrap_or(code);
    format!("{fence}{lang}\n{code}\n{fence}\n")
}

/// The first `cap` characters, with a marker when cut.
fn truncate_chars(s: &str, cap: usize) -> String {
    crate::text::clip(s, cap, "…")
}

/// The last `cap` characters, with a marker when cut.
fn tail_chars(s: &str, cap: usize) -> String {
    let n = s.chars().count();
    if n <= cap {
        return s.to_owned();
    }
    let (at, _) = s.char_indices().nth(n - cap).expect("n > cap");
    format!("…{}", &s[at..])
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::exec::{ErrorKind, TestResult};
    use crate::model::{Completion, FinishReason};

    const DOC_NAMES: [&str; 7] = [
        "numpy.zeros",
        "numpy.random.rand",
        "numpy.linalg.norm",
        "ndonnx.asarray",
        "ndonnx.broadcast_arrays",
        "numba.cuda.jit",
        "numba.cuda.grid",
    ];

    fn doc(name: &str) -> ApiDoc {
        ApiDoc {
            name: name.into(),
            signature: format!("{name}(x)"),
            description: format!("Docs of {name}."),
            source: None,
        }
    }

    fn memory(params: MemCoderParams) -> MemCoderMemory {
        MemCoderMemory::new(DOC_NAMES.iter().map(|n| doc(n)).collect(), params).unwrap()
    }

    fn report(pass: bool) -> ExecReport {
        let status = if pass {
            TestStatus::Pass
        } else {
            TestStatus::Error {
                kind: ErrorKind::TypeError,
                message: "TypeError: shape must be a tuple".into(),
            }
        };
        ExecReport::from_tests(
            vec![TestResult {
                index: 0,
                status,
                error_lines: if pass { vec![] } else { vec![3] },
                seconds: 0.0,
            }],
            String::new(),
            0.0,
        )
    }

    fn task(apis: &[&str]) -> TaskEntry {
        TaskEntry {
            requirement: "r".into(),
            code: "c".into(),
            feedback: "Success".into(),
            apis_used: apis.iter().map(|s| s.to_string()).collect(),
            guideline: String::new(),
            passed: true,
        }
    }

    fn guideline(id: u64, weight: f64) -> Guideline {
        Guideline {
            id,
            text: format!("guideline {id}"),
            weight,
        }
    }

    #[test]
    fn eq5_sequence_hits_the_floor_and_stays() {
        // Binary-exact steps so the hand computation is exact.
        let p = WeightParams {
            w_init: 1.0,
            delta_plus: 0.5,
            delta_minus: 0.25,
            w_min: 0.5,
        };
        p.validate().unwrap();
        let outcomes = [
            true, true, false, false, false, false, false, false, false, true,
        ];
        let want = [1.5, 2.0, 1.75, 1.5, 1.25, 1.0, 0.75, 0.5, 0.5, 1.0];
        let mut w = p.w_init;
        for (pass, want) in outcomes.iter().zip(want) {
            w = p.update(w, *pass);
            assert_eq!(w, want);
        }
    }

    #[test]
    fn eq5_applies_to_injected_guidelines_only_once_each() {
        let mut m = memory(MemCoderParams {
            weights: WeightParams {
                w_init: 1.0,
                delta_plus: 0.5,
                delta_minus: 0.25,
                w_min: 0.5,
            },
            ..MemCoderParams::default()
        });
        let e = m.apis.get_mut("numpy.zeros").unwrap();
        e.guidelines = vec![guideline(1, 1.0), guideline(2, 0.5), guideline(3, 1.0)];
        m.next_guideline_id = 4;
        let code = "import numpy as np\nnp.zeros(3)\n";
        let answer = "ACTION: DISCARD";
        // Fail with 1 and 2 injected (2 twice): 1 drops, 2 stays at the floor.
        let s = m
            .evolve_with_answers("r", code, &report(false), &[1, 2, 2, 99], "x", &[answer])
            .unwrap();
        assert_eq!(s.reweighted, vec![1, 2]);
        let w: Vec<f64> = m
            .api("numpy.zeros")
            .unwrap()
            .guidelines
            .iter()
            .map(|g| g.weight)
            .collect();
        assert_eq!(w, vec![0.75, 0.5, 1.0]);
        m.evolve_with_answers("r", code, &report(true), &[2, 3], "x", &[answer])
            .unwrap();
        let w: Vec<f64> = m
            .api("numpy.zeros")
            .unwrap()
            .guidelines
            .iter()
            .map(|g| g.weight)
            .collect();
        assert_eq!(w, vec![0.75, 1.0, 1.5]);
    }

    #[test]
    fn bad_weight_params_are_rejected() {
        for p in [
            WeightParams {
                w_min: 0.0,
                ..WeightParams::default()
            },
            WeightParams {
                w_init: 0.05,
                ..WeightParams::default()
            },
            WeightParams {
                delta_minus: -1.0,
                ..WeightParams::default()
            },
            WeightParams {
                delta_plus: f64::NAN,
                ..WeightParams::default()
            },
        ] {
            assert!(p.validate().is_err(), "{p:?}");
        }
        WeightParams::default().validate().unwrap();
    }

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
    fn routing_adds_deletes_discards_and_counts_bad_deletes() {
        let mut m = memory(MemCoderParams::default());
        let code = "import numpy as np\nx = np.zeros((2, 3))\n";
        let run = |m: &mut MemCoderMemory, pass: bool, answer: &str| {
            m.evolve_with_answers("r", code, &report(pass), &[], "GUIDELINE: t", &[answer])
                .unwrap()
        };

        let s = run(
            &mut m,
            false,
            "GUIDELINE: shape must be a tuple\nACTION: ADD",
        );
        assert_eq!(s.apis[0].added_id, Some(1));
        let s = run(
            &mut m,
            false,
            "GUIDELINE: dtype defaults to float\nACTION: ADD",
        );
        assert_eq!(s.apis[0].added_id, Some(2));
        // An exact repeat is a discard.
        let s = run(
            &mut m,
            false,
            "GUIDELINE: shape must be a tuple\nACTION: ADD",
        );
        assert_eq!(s.apis[0].added_id, None);
        let g = &m.api("numpy.zeros").unwrap().guidelines;
        assert_eq!(g.iter().map(|g| g.id).collect::<Vec<_>>(), vec![1, 2]);
        assert!(g.iter().all(|g| g.weight == WeightParams::default().w_init));

        run(&mut m, true, "GUIDELINE: anything\nACTION: DISCARD");
        let s = run(
            &mut m,
            true,
            "GUIDELINE: shape may be an int\nACTION: DELETE 1",
        );
        assert_eq!(
            s.apis[0].reflection,
            Some(Reflection::Delete { guideline_id: 1 })
        );
        let e = m.api("numpy.zeros").unwrap();
        assert_eq!(
            e.guidelines.iter().map(|g| g.id).collect::<Vec<_>>(),
            vec![2]
        );
        assert_eq!(e.retired.iter().map(|g| g.id).collect::<Vec<_>>(), vec![1]);

        // Deleting a retired or unknown id changes nothing and is counted.
        let before = m.api("numpy.zeros").unwrap().clone();
        for answer in ["ACTION: DELETE 1", "ACTION: DELETE 42", "maybe delete 2?"] {
            let s = run(&mut m, true, answer);
            assert_eq!(s.apis[0].reflection, None);
        }
        let after = m.api("numpy.zeros").unwrap();
        assert_eq!(after.guidelines, before.guidelines);
        assert_eq!(after.retired, before.retired);
        assert_eq!(
            m.stats(),
            &ReflectStats {
                task_guidelines: 8,
                added: 2,
                deleted: 1,
                discarded: 2,
                unparseable: 3,
            }
        );
        // Guideline ids stay unique after a delete.
        let s = run(&mut m, true, "GUIDELINE: new\nACTION: ADD");
        assert_eq!(s.apis[0].added_id, Some(3));
    }

    #[test]
    fn brief_context_shows_no_foreign_function() {
        use crate::config::Rendering;
        let mut m = memory(MemCoderParams::default());
        let past_code = "import ndonnx as ndx\n\ndef row_sum(x):\n    a = ndx.asarray(x)\n    return helper(a)\n\ndef helper(a):\n    return a\n";
        m.apis.get_mut("ndonnx.asarray").unwrap().snippets = vec![past_code.into()];
        let past = TaskEntry {
            requirement: "import ndonnx as ndx\n\ndef row_sum(x):\n    \"\"\"Sum each row.\n\n    Examples\n    >>> row_sum([[1]])\n    \"\"\"\n".into(),
            code: past_code.into(),
            feedback: "FAIL: NameError: name 'row_sum' is not defined".into(),
            apis_used: vec!["ndonnx.asarray".into()],
            guideline: "Call row_sum on an array.".into(),
            passed: false,
        };
        let hits = [("ndonnx.asarray", 0.9f32)];
        let full = m.render_context("Scale it.", &hits, &[&past], &mut View::full());
        assert!(full.text.contains("def row_sum(x):"), "{}", full.text);

        let mut brief = View::new(Rendering::Brief, "scale", 0);
        let ctx = m.render_context("Scale it.", &hits, &[&past], &mut brief);
        let t = &ctx.text;
        for foreign in ["def ", "row_sum", "helper", ">>>"] {
            assert!(!t.contains(foreign), "{foreign:?} in\n{t}");
        }
        assert!(t.contains("Task: Sum each row.\n"), "{t}");
        assert!(t.contains("name 'scale' is not defined"), "{t}");
        assert!(t.contains("Guideline: Call scale on an array."), "{t}");
        assert!(t.contains("```python\na = ndx.asarray(x)\n```"), "{t}");
        assert_eq!(
            api_call_lines(
                "y = np.asarray(x)\nz = myasarray(x)\nfrom a import asarray\nw = asarray(y)",
                "ndonnx.asarray"
            ),
            "y = np.asarray(x)\nw = asarray(y)"
        );

        // A budget keeps what fits and drops the rest.
        let mut small = View::new(Rendering::Brief, "scale", 40);
        let ctx = m.render_context("Scale it.", &hits, &[&past], &mut small);
        assert!(ctx.text.contains("[cut]") && !ctx.text.contains("Example of successful use"));
    }

    #[test]
    fn retrieval_unions_in_order_and_injects_top_three() {
        let mut m = memory(MemCoderParams::default());
        let e = m.apis.get_mut("ndonnx.asarray").unwrap();
        e.guidelines = vec![
            guideline(1, 1.0),
            guideline(2, 2.0),
            guideline(3, 1.0),
            guideline(4, 0.1),
            guideline(5, 1.5),
        ];
        e.snippets = vec!["old_snippet()".into(), "new_snippet()".into()];
        m.apis.get_mut("numpy.linalg.norm").unwrap().guidelines = vec![guideline(6, 0.1)];

        let hits = [
            ("numpy.zeros", 0.5f32),
            ("ndonnx.asarray", 0.9),
            ("bogus.api", 0.7),
            ("numpy.random.rand", f32::NAN),
            ("numba.cuda.grid", 0.5),
        ];
        let t1 = task(&["numpy.linalg.norm", "ndonnx.asarray"]);
        let t2 = task(&["numba.cuda.jit", "numpy.zeros"]);
        assert_eq!(
            candidate_apis(&hits, &[&t1, &t2]),
            vec![
                "ndonnx.asarray",
                "bogus.api",
                "numpy.zeros",
                "numba.cuda.grid",
                "numpy.random.rand",
                "numpy.linalg.norm",
                "numba.cuda.jit",
            ]
        );
        let ctx = m.render_context(
            "Compute the row product.",
            &hits,
            &[&t1, &t2],
            &mut View::full(),
        );
        assert_eq!(
            ctx.candidate_apis,
            vec![
                "ndonnx.asarray",
                "numpy.zeros",
                "numba.cuda.grid",
                "numpy.random.rand",
                "numpy.linalg.norm",
                "numba.cuda.jit",
            ]
        );
        assert_eq!(ctx.injected_guideline_ids, vec![2, 5, 1, 6]);
        let t = &ctx.text;
        let at = |s: &str| t.find(s).unwrap_or_else(|| panic!("{s:?} missing in\n{t}"));
        assert!(at("guideline 2") < at("guideline 5") && at("guideline 5") < at("guideline 1\n"));
        assert!(!t.contains("guideline 3") && !t.contains("guideline 4"));
        assert!(t.contains("new_snippet()") && !t.contains("old_snippet()"));
        assert!(!t.contains("bogus.api"));
        assert!(at("## Similar past tasks") < at("## Library APIs"));
        assert!(at("### ndonnx.asarray") < at("### numpy.zeros"));
        assert!(
            t.ends_with("## Requirement\nCompute the row product.\n"),
            "{t}"
        );
    }

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

    /// Answers reflector prompts from a script keyed by a prompt substring.
    struct Scripted {
        script: Vec<(&'static str, &'static str)>,
        seen: Mutex<Vec<String>>,
    }

    impl Generator for Scripted {
        fn generate(
            &self,
            prompts: &[String],
            params: &GenerationParams,
        ) -> Result<Vec<Completion>, ModelError> {
            self.seen.lock().unwrap().extend(prompts.iter().cloned());
            Ok(prompts
                .iter()
                .map(|p| {
                    let (_, a) = self
                        .script
                        .iter()
                        .find(|(key, _)| p.contains(key))
                        .unwrap_or_else(|| panic!("unscripted prompt:\n{p}"));
                    // A model continues the prefill; a scripted answer
                    // that does not start with it reads as written after it.
                    let a = a.strip_prefix(params.prefill.as_str()).unwrap_or(a);
                    Completion::text_only(a, FinishReason::Eos)
                })
                .collect())
        }
    }

    #[test]
    fn evolve_end_to_end_with_a_fake_reflector() {
        let mut m = memory(MemCoderParams::default());
        let code = "import numpy as np\nimport ndonnx as ndx\nx = ndx.asarray(np.zeros((2, 3)))\n";
        let first = Scripted {
            script: vec![
                (
                    "API `numpy.zeros`",
                    "GUIDELINE: Pass the shape as a tuple.\nACTION: ADD",
                ),
                (
                    "API `ndonnx.asarray`",
                    "The docs cover it.\nACTION: DISCARD",
                ),
                (
                    "What should a programmer remember",
                    "GUIDELINE: Build with numpy, then convert with ndx.asarray.",
                ),
            ],
            seen: Mutex::new(vec![]),
        };
        let params = GenerationParams::default();
        let s = m
            .evolve(
                "Make a 2x3 array.",
                code,
                &report(true),
                &[],
                &first,
                &params,
            )
            .unwrap();
        assert_eq!(s.task_index, 0);
        assert!(s.passed && s.task_guideline);
        assert_eq!(s.apis_used, vec!["ndonnx.asarray", "numpy.zeros"]);
        assert_eq!(s.apis[0].reflection, Some(Reflection::Discard));
        assert_eq!(s.apis[1].added_id, Some(1));
        let seen = first.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 3);
        assert!(
            seen[0].contains("Make a 2x3 array.")
                && seen[0].contains("- numpy.zeros: numpy.zeros(x)")
        );
        assert!(seen[0].ends_with("starts with \"GUIDELINE:\"."));
        assert!(
            !seen[0].contains(TASK_ANSWER_FORMAT),
            "no placeholder to copy"
        );
        assert!(seen[2].contains("Current guidelines for this API:\n(none)"));
        assert!(seen[2].ends_with("or DISCARD."));
        assert!(
            !seen[2].contains(API_ANSWER_FORMAT),
            "no placeholder to copy"
        );
        let t = &m.tasks()[0];
        assert_eq!(
            t.guideline,
            "Build with numpy, then convert with ndx.asarray."
        );
        assert!(t.feedback.starts_with("Success"));
        assert_eq!(
            m.api("numpy.zeros").unwrap().snippets,
            vec![code.to_string()]
        );

        // The next task sees the guideline, fails, and the reflector deletes it.
        let ctx = m.render_context(
            "Another array.",
            &[("numpy.zeros", 0.9f32)],
            &[&m.tasks()[0]],
            &mut View::full(),
        );
        assert_eq!(ctx.injected_guideline_ids, vec![1]);
        assert!(ctx.text.contains("- Pass the shape as a tuple.\n"));
        assert!(ctx.text.contains("Guideline: Build with numpy"));
        let second = Scripted {
            script: vec![
                (
                    "API `numpy.zeros`",
                    "GUIDELINE: An int shape also works.\nACTION: DELETE 1",
                ),
                ("What should a programmer remember", "GUIDELINE:\n"),
            ],
            seen: Mutex::new(vec![]),
        };
        let bad = "import numpy as np\ny = np.zeros(3, 4)\n";
        let s = m
            .evolve(
                "Another array.",
                bad,
                &report(false),
                &ctx.injected_guideline_ids,
                &second,
                &params,
            )
            .unwrap();
        assert!(!s.passed && !s.task_guideline);
        assert_eq!(s.reweighted, vec![1]);
        let seen = second.seen.lock().unwrap().clone();
        assert!(
            seen[1].contains("[1] (weight 1.00) Pass the shape as a tuple."),
            "{}",
            seen[1]
        );
        assert!(seen[1].contains("TypeError: shape must be a tuple"));
        let e = m.api("numpy.zeros").unwrap();
        assert!(e.guidelines.is_empty());
        assert_eq!(e.retired[0].weight, 0.9);
        assert_eq!(e.snippets.len(), 1, "failed code is not a snippet");
        assert_eq!(m.tasks()[1].guideline, "");
        assert_eq!(m.stats().unparseable, 1);

        // State round-trips through JSON for the store.
        let json = serde_json::to_string(&m).unwrap();
        let back: MemCoderMemory = serde_json::from_str(&json).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn no_signal_and_answer_count_mismatch_change_nothing() {
        let mut m = memory(MemCoderParams::default());
        let before = m.clone();
        let code = "import numpy as np\nnp.zeros(1)\n";
        let e = m.evolve_with_answers(
            "r",
            code,
            &ExecReport::no_signal("sandbox died"),
            &[],
            "",
            &[""],
        );
        assert!(matches!(e, Err(MemcoderError::NoSignal(_))));
        let e = m.evolve_with_answers("r", code, &report(true), &[], "", &[]);
        assert!(matches!(
            e,
            Err(MemcoderError::AnswerCount {
                expected: 1,
                got: 0
            })
        ));
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
        let e = m.evolve(
            "r",
            code,
            &report(true),
            &[],
            &Short,
            &GenerationParams::default(),
        );
        assert!(matches!(
            e,
            Err(MemcoderError::AnswerCount {
                expected: 2,
                got: 0
            })
        ));
        assert_eq!(m, before);
    }

    #[test]
    fn docs_load_from_json_array_and_jsonl_with_line_errors() {
        let p = Path::new("docs.json");
        let array = r#"[
  {"name": "numpy.zeros", "signature": "zeros(shape)", "description": "d"},
  {"name": "ndonnx.asarray", "signature": "asarray(obj)",
   "description": "d, with a ] and } in it", "source": "def asarray(obj): ..."}
]"#;
        let docs = parse_api_docs(array, p).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1].source.as_deref(), Some("def asarray(obj): ..."));
        let jsonl = "{\"name\": \"a.b\", \"signature\": \"s\", \"description\": \"d\"}\n\n\
                     {\"name\": \"a.c\", \"signature\": \"s\", \"description\": \"d\"}\n";
        assert_eq!(parse_api_docs(jsonl, p).unwrap().len(), 2);

        let err = |text: &str| parse_api_docs(text, p).unwrap_err().to_string();
        let missing = "[\n  {\"name\": \"a.b\", \"signature\": \"s\", \"description\": \"d\"},\n  {\"name\": \"a.c\",\n   \"signature\": \"s\"}\n]";
        assert!(
            err(missing).starts_with("docs.json:4: missing field `description`"),
            "{}",
            err(missing)
        );
        let syntax = "[\n  {\"name\": \"a.b\",}\n]";
        assert!(err(syntax).starts_with("docs.json:2: "), "{}", err(syntax));
        let dup =
            format!("{jsonl}{{\"name\": \"a.b\", \"signature\": \"s\", \"description\": \"d\"}}\n");
        assert_eq!(
            err(&dup),
            "docs.json:4: duplicate API \"a.b\" (first at line 1)"
        );
        let badname = "{\"name\": \"a b\", \"signature\": \"s\", \"description\": \"d\"}\n";
        assert!(err(badname).starts_with("docs.json:1: API name"));
        let badline =
            "{\"name\": \"a.b\", \"signature\": \"s\", \"description\": \"d\"}\nnot json\n";
        assert!(
            err(badline).starts_with("docs.json:2: "),
            "{}",
            err(badline)
        );
        assert!(matches!(
            load_api_docs(Path::new("/nonexistent/docs.json")),
            Err(MemcoderError::Io { .. })
        ));
    }

    #[test]
    fn feedback_text_summarises_the_report() {
        assert_eq!(feedback_text(&report(true)), "Success: all 1 tests passed.");
        let f = feedback_text(&report(false));
        assert_eq!(
            f,
            "Failure: 1 of 1 tests failed; first error: TypeError in test 0: TypeError: shape must be a tuple; error at line(s) 3."
        );
        assert!(fenced("a = '```'\n", "python").starts_with("````python\na = '```'\n````"));
        assert_eq!(truncate_chars("héllo", 2), "hé…");
        assert_eq!(tail_chars("héllo", 3), "…llo");
    }
}
