//! The documentation-driven strategies over a private library
//! (papers/memcoder.txt): naive doc-RAG (the top `K_doc` API docs by
//! embedding similarity, §V-F), MEMCoder end to end (dual-source retrieval,
//! the Eq. 4 context, execution, then the reflector's evolution of task-
//! and API-level memory after every task of the stream, RQ2's continual
//! setting), its ablations, and MEMCoder-Accum (raw trajectories kept
//! first-in-first-out, no reflector).
//!
//! Tasks are a stream: each one is solved with the memory as the earlier
//! tasks left it, then the memory evolves from its first sample (one
//! evolution per task, as in the paper's one-answer setting; the other
//! samples only count towards pass@k).

use std::collections::VecDeque;

use tch::Tensor;

use crate::config::{Rendering, RunConfig, StrategyKind};
use crate::memory::guidelines::{
    feedback_text, load_api_docs, ApiDoc, MemCoderMemory, MemCoderParams, TaskEntry,
    REFLECTION_PREFILL,
};
use crate::memory::render::View;
use crate::memory::{embedder_from_config, Embedder, ExactIndex, VectorIndex};
use crate::task::Task;

use super::name_hint;
use super::strategy::{code_of, Env, Format, ReflectionRecord, RolloutError, Solution, Strategy};

/// Which of the documentation strategies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DocMode {
    /// Docs only; nothing is remembered.
    Rag,
    /// MEMCoder, with each memory level switchable for its ablations.
    Memcoder { task_memory: bool, api_memory: bool },
    /// Raw (requirement, code, feedback) trajectories, oldest dropped first.
    Accum { capacity: usize },
}

/// Retrieval sizes.
#[derive(Debug, Clone, Copy)]
pub struct DocSizes {
    pub k_doc: usize,
    pub k_task: usize,
}

/// A documentation strategy with its memory and indexes.
pub struct DocStrategy {
    mode: DocMode,
    sizes: DocSizes,
    embedder: Box<dyn Embedder>,
    memory: MemCoderMemory,
    doc_names: Vec<String>,
    docs: ExactIndex,
    /// Past task requirements, id = index in `memory.tasks()`.
    past: ExactIndex,
    accum: VecDeque<(TaskEntry, Tensor)>,
    /// One entry per task solved, unless switched off by
    /// [`DocStrategy::without_log`] (a long training run does not need it).
    pub log: Vec<StepLog>,
    keep_log: bool,
    /// How past tasks and snippets are shown (`[memory] render`,
    /// `render_chars`); the papers' rendering unless set.
    render: Rendering,
    render_chars: usize,
}

/// What a [`DocStrategy`] has learned, as a trainer checkpoints it. The
/// indexes are rebuilt from it (the embedders are deterministic).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DocState {
    pub memory: MemCoderMemory,
    /// MEMCoder-Accum's trajectories, oldest first.
    pub accum: Vec<TaskEntry>,
}

/// What one task of the stream saw and changed (for tests and logs).
#[derive(Debug, Clone, PartialEq)]
pub struct StepLog {
    pub task: String,
    pub candidate_apis: Vec<String>,
    pub injected_guidelines: Vec<u64>,
    /// Requirements of the past tasks shown.
    pub similar: Vec<String>,
    pub prompt: String,
    pub passed: bool,
    /// Guidelines added to APIs by the evolution after this task.
    pub added_guidelines: Vec<(String, u64)>,
    pub reweighted: Vec<u64>,
}

fn doc_text(d: &ApiDoc) -> String {
    format!("{} {} {}", d.name, d.signature, d.description)
}

impl DocStrategy {
    /// The strategy `kind` (doc-rag, memcoder, memcoder-accum) as `cfg`
    /// sets it up: `[memory]`'s API docs, embedder and sizes, `[strategy]`'s
    /// ablations and Accum capacity.
    pub fn from_config(kind: StrategyKind, cfg: &RunConfig) -> Result<Self, RolloutError> {
        let s = &cfg.strategy;
        let mode = match kind {
            StrategyKind::DocRag => DocMode::Rag,
            StrategyKind::Memcoder => DocMode::Memcoder {
                task_memory: s.task_memory,
                api_memory: s.api_memory,
            },
            StrategyKind::MemcoderAccum => DocMode::Accum {
                capacity: s.accum_capacity,
            },
            other => {
                return Err(RolloutError::Invalid(format!(
                    "\"{}\" is not a documentation strategy",
                    other.name()
                )))
            }
        };
        let Some(path) = &cfg.memory.api_docs else {
            return Err(RolloutError::Invalid(format!(
                "strategy \"{}\" needs the library documentation: [memory] api_docs",
                kind.name()
            )));
        };
        let docs = load_api_docs(path)?;
        let embedder = embedder_from_config(&cfg.memory, crate::model::device::device_of(cfg))?;
        let sizes = DocSizes {
            k_doc: cfg.memory.k_doc,
            k_task: cfg.memory.k_task,
        };
        Ok(
            Self::new(mode, sizes, docs, cfg.memory.memcoder.clone(), embedder)?
                .with_render(cfg.memory.render, cfg.memory.render_chars),
        )
    }

    /// Show past tasks and snippets as `render` says, in at most `chars`
    /// characters of memory per prompt (0: no limit).
    pub fn with_render(mut self, render: Rendering, chars: usize) -> Self {
        self.render = render;
        self.render_chars = chars;
        self
    }

    /// Stop recording [`StepLog`]s.
    pub fn without_log(mut self) -> Self {
        self.keep_log = false;
        self
    }

    pub fn new(
        mode: DocMode,
        sizes: DocSizes,
        docs: Vec<ApiDoc>,
        params: MemCoderParams,
        embedder: Box<dyn Embedder>,
    ) -> Result<Self, RolloutError> {
        if docs.is_empty() {
            return Err(RolloutError::Invalid(
                "the API documentation is empty ([memory] api_docs)".into(),
            ));
        }
        let mut params = params;
        if let DocMode::Memcoder {
            api_memory: false, ..
        } = mode
        {
            // Without API-level memory the APIs show their docs only.
            params.guidelines_per_api = 0;
            params.snippets_per_api = 0;
        }
        let device = embedder.device();
        let texts: Vec<String> = docs.iter().map(doc_text).collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let mut index = ExactIndex::new(embedder.dim(), device);
        let ids: Vec<i64> = (0..docs.len() as i64).collect();
        index.add(&ids, &embedder.embed(&refs)?)?;
        let doc_names = docs.iter().map(|d| d.name.clone()).collect();
        let past = ExactIndex::new(embedder.dim(), device);
        Ok(DocStrategy {
            mode,
            sizes,
            embedder,
            memory: MemCoderMemory::new(docs, params)?,
            doc_names,
            docs: index,
            past,
            accum: VecDeque::new(),
            log: Vec::new(),
            keep_log: true,
            render: Rendering::Full,
            render_chars: 0,
        })
    }

    pub fn memory(&self) -> &MemCoderMemory {
        &self.memory
    }

    fn prompt_for(&mut self, env: &Env, task: &Task) -> Result<(String, StepLog), RolloutError> {
        let q = self.embedder.embed(&[task.prompt.as_str()])?;
        let doc_hits: Vec<(String, f32)> = self
            .docs
            .search(&q, self.sizes.k_doc)?
            .remove(0)
            .into_iter()
            .map(|h| (self.doc_names[h.id as usize].clone(), h.score))
            .collect();
        let similar: Vec<TaskEntry> = match self.mode {
            DocMode::Rag
            | DocMode::Memcoder {
                task_memory: false, ..
            } => Vec::new(),
            DocMode::Memcoder { .. } => {
                let hits = if self.past.is_empty() {
                    Vec::new()
                } else {
                    self.past.search(&q, self.sizes.k_task)?.remove(0)
                };
                hits.iter()
                    .map(|h| self.memory.tasks()[h.id as usize].clone())
                    .collect()
            }
            DocMode::Accum { .. } => {
                let mut scored: Vec<(f64, usize)> = self
                    .accum
                    .iter()
                    .enumerate()
                    .map(|(i, (_, v))| (q.get(0).dot(v).double_value(&[]), i))
                    .collect();
                // Best first; ties to the newer trajectory.
                scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
                scored
                    .iter()
                    .take(self.sizes.k_task)
                    .map(|&(_, i)| self.accum[i].0.clone())
                    .collect()
            }
        };
        let refs: Vec<&TaskEntry> = similar.iter().collect();
        let mut view = View::new(self.render, &task.entry_point, self.render_chars);
        let ctx = self
            .memory
            .render_context(&task.prompt, &doc_hits, &refs, &mut view);
        let mut prompt = format!("{}\n\n{}", env.instruction, ctx.text);
        if let Some(h) = name_hint(task) {
            prompt.push_str(&h);
            prompt.push('\n');
        }
        let log = StepLog {
            task: task.id.clone(),
            candidate_apis: ctx.candidate_apis,
            injected_guidelines: ctx.injected_guideline_ids,
            similar: similar.iter().map(|e| e.requirement.clone()).collect(),
            prompt: prompt.clone(),
            passed: false,
            added_guidelines: Vec::new(),
            reweighted: Vec::new(),
        };
        Ok((prompt, log))
    }

    /// Evolve the memory from `task`'s first sample.
    fn evolve(
        &mut self,
        env: &Env,
        task: &Task,
        code: &str,
        report: &crate::exec::ExecReport,
        log: &mut StepLog,
    ) -> Result<Vec<ReflectionRecord>, RolloutError> {
        let mut records = Vec::new();
        if report.outcome.is_none() {
            // No signal about the sample: nothing to learn from.
            return Ok(records);
        }
        match self.mode {
            DocMode::Rag => {}
            DocMode::Accum { capacity } => {
                let v = self.embedder.embed(&[task.prompt.as_str()])?.get(0);
                self.accum.push_back((
                    TaskEntry {
                        requirement: task.prompt.clone(),
                        code: code.to_owned(),
                        feedback: feedback_text(report),
                        apis_used: self.memory.apis_used(code),
                        guideline: String::new(),
                        passed: report.outcome == Some(crate::exec::RewardClass::Pass),
                    },
                    v,
                ));
                while self.accum.len() > capacity {
                    self.accum.pop_front();
                }
            }
            DocMode::Memcoder {
                task_memory,
                api_memory,
            } => {
                let prompts = self.memory.reflection_prompts(&task.prompt, code, report)?;
                let mut asks = Vec::new();
                if task_memory {
                    asks.push(prompts.task_prompt);
                }
                if api_memory {
                    asks.extend(prompts.api_prompts);
                }
                let format = Format {
                    prefill: REFLECTION_PREFILL,
                    max_new_tokens: 128,
                    stop: Vec::new(),
                    reflector: true,
                };
                let answers: Vec<String> = env
                    .structured(&asks, &format)?
                    .into_iter()
                    .map(|c| c.text)
                    .collect();
                let (task_answer, api_answers) = if task_memory {
                    (Some(answers[0].as_str()), &answers[1..])
                } else {
                    (None, &answers[..])
                };
                let api_refs: Vec<&str> = api_answers.iter().map(String::as_str).collect();
                let summary = self.memory.evolve_parts(
                    &task.prompt,
                    code,
                    report,
                    &log.injected_guidelines,
                    task_answer,
                    api_memory.then_some(api_refs.as_slice()),
                )?;
                if let Some(a) = task_answer {
                    records.push(ReflectionRecord {
                        target: "task".into(),
                        result: if summary.task_guideline {
                            "guideline"
                        } else {
                            "unparseable"
                        }
                        .into(),
                        answer: a.to_owned(),
                    });
                }
                for (o, a) in summary.apis.iter().zip(api_answers) {
                    use crate::memory::guidelines::Reflection;
                    let result = match (&o.reflection, o.added_id) {
                        (None, _) => "unparseable".to_string(),
                        (Some(Reflection::Discard), _) => "discard".into(),
                        (Some(Reflection::Delete { guideline_id }), _) => {
                            format!("delete #{guideline_id}")
                        }
                        (Some(Reflection::Add { .. }), Some(id)) => format!("add #{id}"),
                        (Some(Reflection::Add { .. }), None) => "repeat".into(),
                    };
                    records.push(ReflectionRecord {
                        target: o.api.clone(),
                        result,
                        answer: a.clone(),
                    });
                }
                log.added_guidelines = summary
                    .apis
                    .iter()
                    .filter_map(|a| Some((a.api.clone(), a.added_id?)))
                    .collect();
                log.reweighted = summary.reweighted;
                if task_memory {
                    let v = self.embedder.embed(&[task.prompt.as_str()])?;
                    self.past.add(&[summary.task_index as i64], &v)?;
                }
            }
        }
        Ok(records)
    }
}

impl Strategy for DocStrategy {
    fn name(&self) -> String {
        match self.mode {
            DocMode::Rag => "doc-rag".into(),
            DocMode::Accum { .. } => "memcoder-accum".into(),
            DocMode::Memcoder {
                task_memory,
                api_memory,
            } => match (task_memory, api_memory) {
                (true, true) => "memcoder".into(),
                (false, true) => "memcoder-no-task-memory".into(),
                (true, false) => "memcoder-no-api-memory".into(),
                (false, false) => "memcoder-no-memory".into(),
            },
        }
    }

    fn solve(
        &mut self,
        env: &Env,
        tasks: &[&Task],
        n: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Vec<Vec<Solution>>, RolloutError> {
        let total = tasks.len() * n;
        let mut out = Vec::with_capacity(tasks.len());
        for (i, task) in tasks.iter().enumerate() {
            let (prompt, mut log) = self.prompt_for(env, task)?;
            let comps = env.generate(&vec![prompt; n])?;
            let codes: Vec<&str> = comps.iter().map(code_of).collect();
            let jobs: Vec<(&Task, &str)> = codes.iter().map(|c| (*task, *c)).collect();
            let reports = env.sandbox.run_batch(&jobs);
            log.passed = reports[0].outcome == Some(crate::exec::RewardClass::Pass);
            let mut reflections = self.evolve(env, task, codes[0], &reports[0], &mut log)?;
            if self.keep_log {
                self.log.push(log);
            }
            out.push(
                comps
                    .into_iter()
                    .zip(reports)
                    .map(|(c, r)| Solution {
                        completion: c,
                        attempts: Vec::new(),
                        report: Some(r),
                        // The memory evolved from the first sample.
                        reflections: std::mem::take(&mut reflections),
                    })
                    .collect(),
            );
            progress((i + 1) * n, total);
        }
        Ok(out)
    }

    fn save_state(&self) -> Result<Option<serde_json::Value>, RolloutError> {
        if self.mode == DocMode::Rag {
            return Ok(None);
        }
        let state = DocState {
            memory: self.memory.clone(),
            accum: self.accum.iter().map(|(e, _)| e.clone()).collect(),
        };
        serde_json::to_value(state)
            .map(Some)
            .map_err(|e| RolloutError::Invalid(format!("MEMCoder state: {e}")))
    }

    fn load_state(&mut self, state: serde_json::Value) -> Result<(), RolloutError> {
        if self.mode == DocMode::Rag && state.is_null() {
            return Ok(());
        }
        let state: DocState = serde_json::from_value(state)
            .map_err(|e| RolloutError::Invalid(format!("MEMCoder state: {e}")))?;
        if let Some(missing) = self
            .doc_names
            .iter()
            .find(|n| !state.memory.is_documented(n))
        {
            return Err(RolloutError::Invalid(format!(
                "the saved memory does not know API {missing}: it was built from other API docs"
            )));
        }
        // One text per call, as when they were added, so the vectors are
        // bit for bit the ones the run had.
        let mut past = ExactIndex::new(self.embedder.dim(), self.embedder.device());
        if let DocMode::Memcoder {
            task_memory: true, ..
        } = self.mode
        {
            for (i, t) in state.memory.tasks().iter().enumerate() {
                let v = self.embedder.embed(&[t.requirement.as_str()])?;
                past.add(&[i as i64], &v)?;
            }
        }
        let mut accum = VecDeque::with_capacity(state.accum.len());
        for e in state.accum {
            let v = self.embedder.embed(&[e.requirement.as_str()])?.get(0);
            accum.push_back((e, v));
        }
        self.memory = state.memory;
        self.past = past;
        self.accum = accum;
        Ok(())
    }

    fn stats(&self) -> Vec<(String, f64)> {
        let s = self.memory.stats();
        let guidelines: usize = self
            .doc_names
            .iter()
            .filter_map(|n| self.memory.api(n))
            .map(|a| a.guidelines.len())
            .sum();
        match self.mode {
            DocMode::Rag => Vec::new(),
            DocMode::Accum { .. } => vec![("trajectories".into(), self.accum.len() as f64)],
            DocMode::Memcoder { .. } => vec![
                ("task_entries".into(), self.memory.tasks().len() as f64),
                ("task_guidelines".into(), s.task_guidelines as f64),
                ("guidelines_active".into(), guidelines as f64),
                ("added".into(), s.added as f64),
                ("deleted".into(), s.deleted as f64),
                ("discarded".into(), s.discarded as f64),
                ("unparseable".into(), s.unparseable as f64),
            ],
        }
    }
}
