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
//! This file owns [`MemCoderMemory`] (retrieval, the Eq. 4 context and
//! evolution); the doc loader (`api_docs`), the entries and the Eq. 5
//! update (`entries`), the reflector's prompts and answers (`prompts`) and
//! used-API extraction (`apis_used`) are its submodules, re-exported here.
//!
//! Where the paper is silent we chose, and say so: the Eq. 5 constants, the
//! reflector's answer format (`GUIDELINE:` / `ACTION:` lines), the order of
//! candidate APIs, and what `Delete` does with the candidate guideline.

mod api_docs;
mod apis_used;
mod entries;
mod prompts;

use api_docs::is_dotted_name;
pub use api_docs::{load_api_docs, parse_api_docs, ApiDoc};
pub use apis_used::apis_used;
pub use entries::{ApiEntry, Guideline, TaskEntry};
pub use prompts::{
    api_reflection_prompt, feedback_text, parse_api_reflection, parse_task_guideline,
    task_reflection_prompt, ReflectStats, Reflection, API_ANSWER_FORMAT, REFLECTION_PREFILL,
    TASK_ANSWER_FORMAT,
};

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::exec::{ExecReport, RewardClass};
use crate::memory::render::{task_statement, View};
use crate::model::{GenerationParams, Generator, ModelError};

pub use crate::config::{MemCoderParams, WeightParams};

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
// The memory.

/// Characters of an API's source shown in a prompt or context.
const SOURCE_CAP: usize = 2000;
/// Characters of a similar task's feedback shown in a context.
const CONTEXT_FEEDBACK_CAP: usize = 600;

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
    use super::*;
    use crate::exec::{ErrorKind, TestResult, TestStatus};
    use crate::model::testing::Scripted;
    use crate::model::Completion;

    pub(super) const DOC_NAMES: [&str; 7] = [
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

    pub(super) fn report(pass: bool) -> ExecReport {
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

    /// Answers reflector prompts from a script keyed by a prompt substring.
    fn scripted(script: Vec<(&'static str, &'static str)>) -> Scripted<impl Fn(&str) -> String> {
        Scripted::new(move |p: &str| {
            let (_, a) = script
                .iter()
                .find(|(key, _)| p.contains(key))
                .unwrap_or_else(|| panic!("unscripted prompt:\n{p}"));
            a.to_string()
        })
    }

    #[test]
    fn evolve_end_to_end_with_a_fake_reflector() {
        let mut m = memory(MemCoderParams::default());
        let code = "import numpy as np\nimport ndonnx as ndx\nx = ndx.asarray(np.zeros((2, 3)))\n";
        let first = scripted(vec![
            (
                "API `numpy.zeros`",
                "GUIDELINE: Pass the shape as a tuple.\nACTION: ADD",
            ),
            (
                "API `ndonnx.asarray`",
                "GUIDELINE:The docs cover it.\nACTION: DISCARD",
            ),
            (
                "What should a programmer remember",
                "GUIDELINE: Build with numpy, then convert with ndx.asarray.",
            ),
        ]);
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
        let seen = first.seen();
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
        let second = scripted(vec![
            (
                "API `numpy.zeros`",
                "GUIDELINE: An int shape also works.\nACTION: DELETE 1",
            ),
            ("What should a programmer remember", "GUIDELINE:\n"),
        ]);
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
        let seen = second.seen();
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
    fn text_helpers_fence_and_clip() {
        assert!(fenced("a = '```'\n", "python").starts_with("````python\na = '```'\n````"));
        assert_eq!(truncate_chars("héllo", 2), "hé…");
        assert_eq!(tail_chars("héllo", 3), "…llo");
    }
}
