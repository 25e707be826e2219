//! FALCON's long-term memory (§4.3): entries of (task, code, execution
//! report, reward terms, step) embedded from (task, feedback), kept in the
//! store and a vector index; retrieval by the current task's embedding,
//! top-k by cosine similarity; and the Table 7 prompt built from what comes
//! back.

use std::collections::BTreeMap;
use std::path::Path;

use super::embed::Embedder;
use super::guidelines::feedback_text;
use super::index::VectorIndex;
use super::render::{task_statement, View};
pub use super::store::LongTermRecord;
use super::store::MemoryStore;
use super::MemoryError;
use crate::config::Rendering;
use crate::exec::{ExecReport, TestStatus};

impl LongTermRecord {
    /// A finished sample to remember: `rewards` by term name (`coarse`,
    /// `error`, `style`, `complexity`, ...). The feedback and the embedding
    /// are left empty; [`LongTerm::insert`] derives them.
    pub fn new(
        step: u64,
        task_id: String,
        task_text: String,
        code: String,
        report: ExecReport,
        rewards: BTreeMap<String, f64>,
    ) -> Self {
        LongTermRecord {
            step,
            task_id,
            task_text,
            code,
            report,
            rewards,
            feedback: String::new(),
            embedder: String::new(),
            embedding: Vec::new(),
        }
    }
}

/// A retrieved entry, its id in the store and its cosine similarity to the
/// query.
#[derive(Debug, Clone)]
pub struct Retrieved {
    pub id: i64,
    pub score: f32,
    pub record: LongTermRecord,
}

/// Long-term memory over one store and one index. The embedder is passed to
/// each call (the policy embedder borrows the policy); its name must match
/// the one the memory was opened with.
pub struct LongTerm {
    store: MemoryStore,
    index: Box<dyn VectorIndex>,
    embedder: String,
}

impl LongTerm {
    /// Open (or create) the store in `run_dir` and rebuild `index` from
    /// every entry embedded by `embedder`. Entries of other embedders stay in
    /// the store but are not searchable until re-embedded.
    pub fn open(
        run_dir: &Path,
        embedder: &dyn Embedder,
        index: Box<dyn VectorIndex>,
    ) -> Result<Self, MemoryError> {
        let store = MemoryStore::open(run_dir)?;
        Self::with_store(store, embedder, index)
    }

    /// Like [`LongTerm::open`] on an already open store.
    pub fn with_store(
        store: MemoryStore,
        embedder: &dyn Embedder,
        mut index: Box<dyn VectorIndex>,
    ) -> Result<Self, MemoryError> {
        if index.dim() != embedder.dim() {
            return Err(MemoryError::Invalid(format!(
                "index dimension {} does not match embedder {} ({})",
                index.dim(),
                embedder.name(),
                embedder.dim()
            )));
        }
        let name = embedder.name();
        let (ids, flat, dim) = store.load_embeddings(&name)?;
        if !ids.is_empty() {
            if dim != embedder.dim() {
                return Err(MemoryError::Invalid(format!(
                    "stored {name} embeddings have dimension {dim}, the embedder {}",
                    embedder.dim()
                )));
            }
            let t = tch::Tensor::from_slice(&flat).view([ids.len() as i64, dim as i64]);
            index.add(&ids, &t)?;
        }
        Ok(LongTerm {
            store,
            index,
            embedder: name,
        })
    }

    pub fn store(&self) -> &MemoryStore {
        &self.store
    }

    pub fn store_mut(&mut self) -> &mut MemoryStore {
        &mut self.store
    }

    pub fn index(&self) -> &dyn VectorIndex {
        self.index.as_ref()
    }

    fn check(&self, embedder: &dyn Embedder) -> Result<(), MemoryError> {
        if embedder.name() != self.embedder {
            return Err(MemoryError::Invalid(format!(
                "long-term memory was opened with embedder {}, called with {}",
                self.embedder,
                embedder.name()
            )));
        }
        Ok(())
    }

    /// The text an entry is embedded from: φ(t_i, f_i).
    pub fn key_text(task_text: &str, feedback: &str) -> String {
        format!("{task_text}\n{feedback}")
    }

    /// Derive each entry's feedback from its report, embed (task, feedback),
    /// store (one transaction) and index a batch; returns the ids. Whatever
    /// feedback or embedding the entries held is replaced.
    pub fn insert(
        &mut self,
        embedder: &dyn Embedder,
        mut batch: Vec<LongTermRecord>,
    ) -> Result<Vec<i64>, MemoryError> {
        self.check(embedder)?;
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        for e in &mut batch {
            e.feedback = feedback_text(&e.report);
        }
        let keys: Vec<String> = batch
            .iter()
            .map(|e| Self::key_text(&e.task_text, &e.feedback))
            .collect();
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let vectors = embedder.embed(&key_refs)?;
        let flat: Vec<f32> = Vec::try_from(vectors.to_device(tch::Device::Cpu).reshape([-1]))
            .map_err(|e| MemoryError::Invalid(format!("embedding: {e}")))?;
        let dim = embedder.dim();
        for (i, e) in batch.iter_mut().enumerate() {
            e.embedder.clone_from(&self.embedder);
            e.embedding = flat[i * dim..(i + 1) * dim].to_vec();
        }
        // Store first: the index is derived and can be rebuilt from it.
        let ids = self.store.insert_long_term(&batch)?;
        self.index.add(&ids, &vectors)?;
        Ok(ids)
    }

    /// The `k` most similar past entries for each task text, best first.
    pub fn retrieve(
        &mut self,
        embedder: &dyn Embedder,
        tasks: &[&str],
        k: usize,
    ) -> Result<Vec<Vec<Retrieved>>, MemoryError> {
        self.check(embedder)?;
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let q = embedder.embed(tasks)?;
        let hits = self.index.search(&q, k)?;
        let all_ids: Vec<i64> = hits.iter().flatten().map(|h| h.id).collect();
        let records = self.store.get_long_term(&all_ids)?;
        let by_id: BTreeMap<i64, LongTermRecord> = records.into_iter().collect();
        Ok(hits
            .into_iter()
            .map(|row| {
                row.into_iter()
                    .filter_map(|h| {
                        by_id.get(&h.id).map(|r| Retrieved {
                            id: h.id,
                            score: h.score,
                            record: r.clone(),
                        })
                    })
                    .collect()
            })
            .collect())
    }
}

fn score(rewards: &BTreeMap<String, f64>, name: &str) -> String {
    rewards
        .get(name)
        .map_or_else(|| "n/a".to_owned(), |v| format!("{v:.2}"))
}

/// A past sample's outcome in one line: `passed`, or its first error.
fn outcome_line(report: &ExecReport) -> String {
    if report.outcome == Some(crate::exec::RewardClass::Pass) {
        return "passed".into();
    }
    match errors_of(report).into_iter().next() {
        Some(e) => format!("failed: {}", crate::text::clip(&e, 160, "…")),
        None => "failed".into(),
    }
}

/// The errors a past sample made, one line each (kind and message of its
/// failing tests, deduplicated).
fn errors_of(report: &ExecReport) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for t in &report.tests {
        let line = match &t.status {
            TestStatus::Pass => continue,
            TestStatus::Fail => "WrongAnswer: an assertion on the result failed".to_owned(),
            TestStatus::Error { kind, message } => {
                let msg = message.lines().next().unwrap_or("").trim();
                if msg.is_empty() {
                    kind.name().to_owned()
                } else {
                    format!("{}: {msg}", kind.name())
                }
            }
        };
        if !out.contains(&line) {
            out.push(line);
        }
    }
    out
}

/// FALCON's Table 7 code-generation prompt with the retrieved history,
/// shown as `view` says (the papers' rendering: [`View::full`]). Style and
/// efficiency scores are the stored `style` and `complexity` reward terms
/// (FALCON's −1..2 scale), `n/a` when a run did not compute them.
pub fn table7_prompt(task: &str, history: &[Retrieved], view: &mut View) -> String {
    let mut p = String::from(
        "Instruction:\nPlease write a Python function based on the task description, referencing \
         the historical context for inspiration. Ensure that the generated code follows the \
         provided requirements and avoids the listed errors.\n\n",
    );
    p.push_str(&format!(
        "Task: {}\n\nContext of relevant code:\n",
        task.trim()
    ));
    if history.is_empty() {
        p.push_str("\n(no similar past tasks yet)\n");
    }
    let mut errors: Vec<String> = Vec::new();
    for h in history {
        let r = &h.record;
        // Outside the papers' rendering, the functions an entry's code and
        // task define are the task's own wherever they appear.
        let defs = format!("{}\n{}", r.code, r.task_text);
        let own = |s: &str| view.rename_from(&defs, s);
        let task_text = match view.rendering {
            Rendering::Full => r.task_text.trim().to_owned(),
            _ => crate::text::clip(&task_statement(&r.task_text), 300, " …"),
        };
        let mut entry = format!("\n- Historical Task: {}\n", own(&task_text));
        match view.code(&r.code) {
            Some(code) => entry.push_str(&format!("- Code:\n```python\n{}\n```\n", own(&code))),
            None => entry.push_str(&format!("- Result: {}\n", own(&outcome_line(&r.report)))),
        }
        entry.push_str(&format!(
            "- Style Score: {}\n- Efficiency Score: {}\n- Additional Feedback: {}\n",
            score(&r.rewards, "style"),
            score(&r.rewards, "complexity"),
            own(r.feedback.trim()),
        ));
        let seen: Vec<String> = errors_of(&r.report).iter().map(|e| own(e)).collect();
        let Some(entry) = view.take(entry) else { break };
        p.push_str(&entry);
        for e in seen {
            if !errors.contains(&e) {
                errors.push(e);
            }
        }
    }
    p.push_str(
        "\nRequirements:\n1. Ensure the generated code adheres to best practices for Python, \
         including proper naming conventions, consistent formatting, and coding standards.\n\
         2. Optimize the code for performance, avoiding unnecessary recursion or nested loops.\n\
         3. Use built-in or efficient library functions whenever applicable to improve both \
         readability and performance.\n",
    );
    if !errors.is_empty() {
        p.push_str("\nAvoid the following errors:\n");
        for e in &errors {
            p.push_str(&format!(
                "- {e} – Avoid structural or logical issues found in previous code snippets.\n"
            ));
        }
    }
    p.push_str("\nOutput: Ensure your response is in the format of ```python```.\n");
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{ErrorKind, TestResult};

    /// A past entry of another task that failed with a NameError on its
    /// own helper.
    fn neighbour() -> Retrieved {
        let report = ExecReport::from_tests(
            vec![TestResult {
                index: 0,
                status: TestStatus::Error {
                    kind: ErrorKind::NameError,
                    message: "name 'find_zero' is not defined".into(),
                },
                error_lines: vec![2],
                seconds: 0.0,
            }],
            String::new(),
            0.0,
        );
        Retrieved {
            id: 1,
            score: 0.9,
            record: LongTermRecord {
                step: 1,
                task_id: "other".into(),
                task_text: "def find_zero(xs: list):\n    \"\"\"Find a zero of the polynomial xs.\n    >>> find_zero([1, 2])\n    \"\"\"\n".into(),
                code: "def find_zero(xs):\n    return helper(xs)\n\ndef helper(xs):\n    return find_zero(xs)\n".into(),
                report,
                rewards: BTreeMap::new(),
                feedback: "Failure: NameError in test 0: name 'find_zero' is not defined".into(),
                embedder: "hash".into(),
                embedding: vec![],
            },
        }
    }

    #[test]
    fn no_rendering_but_full_shows_a_foreign_function() {
        let task = "def below_zero(ops):\n    \"\"\"...\"\"\"\n";
        let history = [neighbour()];
        let full = table7_prompt(task, &history, &mut View::full());
        assert!(full.contains("def find_zero(xs):") && full.contains("def helper(xs):"));
        for rendering in [Rendering::Renamed, Rendering::Brief] {
            let p = table7_prompt(task, &history, &mut View::new(rendering, "below_zero", 0));
            assert!(
                !p.contains("find_zero") && !p.contains("helper"),
                "{rendering:?}:\n{p}"
            );
            let defs: Vec<&str> = p
                .split("def ")
                .skip(1)
                .map(|r| r.split('(').next().unwrap_or(""))
                .collect();
            assert!(
                defs.iter().all(|d| *d == "below_zero"),
                "{rendering:?}: {defs:?}"
            );
            assert!(
                p.contains("- Historical Task: Find a zero of the polynomial xs.\n"),
                "{p}"
            );
        }
        let brief = table7_prompt(
            task,
            &history,
            &mut View::new(Rendering::Brief, "below_zero", 0),
        );
        assert!(brief.contains("- Result: failed: NameError: name 'below_zero' is not defined"));
        assert!(!brief.contains("- Code:"));
        // The budget drops what does not fit.
        let tight = table7_prompt(
            task,
            &[neighbour(), neighbour()],
            &mut View::new(Rendering::Brief, "below_zero", 40),
        );
        assert_eq!(tight.matches("- Historical Task:").count(), 1, "{tight}");
    }
}
