//! What every strategy shares: the [`Env`] it runs in (generator,
//! reflector, sandbox, sampler, batch size, seeds), the [`Solution`] it
//! returns per sample, the [`Strategy`] trait, and the single-shot
//! strategies (one prompt per task: zero-shot, FALCON, doc-RAG).
//!
//! Repairing strategies see only a task's guiding test (its first test,
//! MemoCoder §2.1); the evaluation scores every final answer on all tests,
//! so no strategy learns from the tests it is scored on.

use std::cell::Cell;

use crate::exec::{ExecReport, Sandbox, TestStatus};
use crate::memory::guidelines::MemcoderError;
use crate::memory::MemoryError;
use crate::model::{Completion, GenerationParams, Generator, ModelError};
use crate::reward::answer_code;
use crate::task::Task;

/// Problems a strategy can hit.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Memcoder(#[from] MemcoderError),
    #[error("{0}")]
    Invalid(String),
}

/// Where a strategy runs.
pub struct Env<'a> {
    /// Writes the code (and MemoCoder's plans).
    pub generator: &'a dyn Generator,
    /// MEMCoder's reflector and MemoCoder's mentor (often the generator).
    pub reflector: &'a dyn Generator,
    pub sandbox: &'a Sandbox,
    /// The zero-shot instruction put before each task.
    pub instruction: &'a str,
    /// Sampling for answers; its seed is replaced per call.
    pub params: GenerationParams,
    /// Sampling for reflections (greedy in practice); seed replaced too.
    pub reflect_params: GenerationParams,
    /// Prompts per generator call.
    pub batch_size: usize,
    seed: u64,
    calls: Cell<u64>,
}

impl<'a> Env<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        generator: &'a dyn Generator,
        reflector: &'a dyn Generator,
        sandbox: &'a Sandbox,
        instruction: &'a str,
        params: GenerationParams,
        reflect_params: GenerationParams,
        batch_size: usize,
        seed: u64,
    ) -> Self {
        Env {
            generator,
            reflector,
            sandbox,
            instruction,
            params,
            reflect_params,
            batch_size: batch_size.max(1),
            seed,
            calls: Cell::new(0),
        }
    }

    /// Generate one answer per prompt, `batch_size` prompts per call. Each
    /// call gets the next seed after the evaluation seed, so a rerun makes
    /// the same samples and no two calls share a stream.
    pub fn generate(&self, prompts: &[String]) -> Result<Vec<Completion>, RolloutError> {
        self.run(self.generator, &self.params, prompts)
    }

    /// Generator calls made so far: the next call's seed is the evaluation
    /// seed plus this. Saved with a partial evaluation.
    pub fn calls(&self) -> u64 {
        self.calls.get()
    }

    /// Continue the seed sequence of an evaluation that made `calls` calls.
    pub fn resume_calls(&self, calls: u64) {
        self.calls.set(calls);
    }

    /// [`Env::generate`] with the reflector and its parameters.
    pub fn reflect(&self, prompts: &[String]) -> Result<Vec<Completion>, RolloutError> {
        self.run(self.reflector, &self.reflect_params, prompts)
    }

    /// Answers that must follow `format`: the model continues its prefill
    /// (the answer starts with it), and each returned text is the whole
    /// answer, prefill included, ready to parse. Never train on these: the
    /// text no longer matches the token ids.
    pub fn structured(
        &self,
        prompts: &[String],
        format: &Format,
    ) -> Result<Vec<Completion>, RolloutError> {
        let (g, base) = if format.reflector {
            (self.reflector, &self.reflect_params)
        } else {
            (self.generator, &self.params)
        };
        let mut p = base.clone();
        p.prefill = format.prefill.to_owned();
        p.max_new_tokens = p.max_new_tokens.min(format.max_new_tokens);
        p.stop.extend(format.stop.iter().cloned());
        p.stop_at_block_end = false;
        let mut comps = self.run(g, &p, prompts)?;
        for c in &mut comps {
            c.text.insert_str(0, format.prefill);
        }
        Ok(comps)
    }

    fn run(
        &self,
        generator: &dyn Generator,
        params: &GenerationParams,
        prompts: &[String],
    ) -> Result<Vec<Completion>, RolloutError> {
        let mut out = Vec::with_capacity(prompts.len());
        for chunk in prompts.chunks(self.batch_size) {
            let call = self.calls.get();
            self.calls.set(call + 1);
            let mut p = params.clone();
            p.seed = Some(self.seed.wrapping_add(call));
            let comps = generator.generate(chunk, &p)?;
            if comps.len() != chunk.len() {
                return Err(RolloutError::Invalid(format!(
                    "the generator returned {} completions for {} prompts",
                    comps.len(),
                    chunk.len()
                )));
            }
            out.extend(comps);
        }
        Ok(out)
    }
}

/// How [`Env::structured`] asks for an answer in a format.
pub struct Format<'a> {
    /// The answer's start, written for the model.
    pub prefill: &'a str,
    /// At most this many tokens (and at most the parameters' own limit).
    pub max_new_tokens: usize,
    /// Stop strings on top of the parameters' own.
    pub stop: Vec<String>,
    /// The reflector and its parameters, else the generator's.
    pub reflector: bool,
}

/// One sample's answer.
#[derive(Debug, Clone)]
pub struct Solution {
    /// The final completion (with its prompt and token ids when the
    /// in-process policy wrote it, so a trainer can learn from it).
    pub completion: Completion,
    /// Outcome labels (`pass`, an error kind, `no_signal`) of every attempt
    /// on the guiding test, in order; empty for single-shot strategies.
    pub attempts: Vec<String>,
    /// The final code's run on all tests, when the strategy needed it
    /// anyway (MEMCoder evolves from it); the evaluation runs it otherwise.
    pub report: Option<ExecReport>,
    /// The reflector's answers about this sample and what became of each
    /// (MEMCoder evolves from a task's first sample); empty otherwise.
    pub reflections: Vec<ReflectionRecord>,
}

/// One reflector answer and what the memory made of it, kept with the
/// sample so that an answer the parser refused can be read afterwards.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReflectionRecord {
    /// `task` for the task-level lesson, else the API the answer is about.
    pub target: String,
    /// `guideline`, `add #ID`, `repeat` (an exact copy of a guideline,
    /// discarded), `discard`, `delete #ID`, or `unparseable`.
    pub result: String,
    pub answer: String,
}

impl Solution {
    pub fn single(completion: Completion) -> Self {
        Solution {
            completion,
            attempts: Vec::new(),
            report: None,
            reflections: Vec::new(),
        }
    }
}

/// A way of producing answers for tasks.
pub trait Strategy {
    /// The name results carry (`zero-shot`, `memocoder`, ...).
    fn name(&self) -> String;

    /// `n` independent samples for each task, in task order (strategies
    /// with memory learn from earlier tasks while they go).
    /// `progress(done, total)` counts finished samples.
    fn solve(
        &mut self,
        env: &Env,
        tasks: &[&Task],
        n: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Vec<Vec<Solution>>, RolloutError>;

    /// What the strategy's memory did (fixes learned, guidelines added,
    /// mentor rewrites), for logs and results; empty when it has none.
    fn stats(&self) -> Vec<(String, f64)> {
        Vec::new()
    }

    /// What the strategy has learned so far, for a trainer's checkpoint;
    /// `None` when it learns nothing (zero-shot, doc-RAG).
    fn save_state(&self) -> Result<Option<serde_json::Value>, RolloutError> {
        Ok(None)
    }

    /// Continue from what [`Strategy::save_state`] returned.
    fn load_state(&mut self, state: serde_json::Value) -> Result<(), RolloutError> {
        match state {
            serde_json::Value::Null => Ok(()),
            _ => Err(RolloutError::Invalid(format!(
                "strategy {} keeps no state, but a saved state was given",
                self.name()
            ))),
        }
    }
}

/// The code a completion's answer contains.
pub fn code_of(completion: &Completion) -> &str {
    answer_code(&completion.text, completion.cut_off()).1
}

/// Each task with only its guiding test: the first test when a task has
/// several (MBPP). A task whose tests are one program (HumanEval's
/// `check`, NdonnxEval's script) would otherwise show the repair loop the
/// very test it is scored on, so its guide is the first example of its own
/// prompt made an assertion (`>>> f(x)` and the line after it, or
/// `f(x) == y` / `f(x) ➞ y` prose), kept only when the reference solution
/// passes it; failing that, `assert callable(f)`, which still catches code
/// that does not parse or never defines the function. A program task's guide
/// is its first (input, output) pair.
pub fn guiding_tests(sandbox: &Sandbox, tasks: &[&Task]) -> Vec<Task> {
    let mut guides: Vec<Task> = tasks
        .iter()
        .map(|t| {
            let mut g = (*t).clone();
            if t.kind == crate::task::TaskKind::Stdio {
                // A program task's first (input, output) pair: its statement's
                // example in every format we read.
                g.tests.truncate(1);
                g.outputs.truncate(1);
            } else if t.tests.len() > 1 {
                g.tests.truncate(1);
            } else {
                g.tests = vec![example_assert(&t.prompt, &t.entry_point)
                    .unwrap_or_else(|| callable_assert(&t.entry_point))];
            }
            g
        })
        .collect();
    // Check prompt-derived guides against the reference solutions.
    let checks: Vec<usize> = (0..tasks.len())
        .filter(|&i| tasks[i].tests.len() == 1 && tasks[i].canonical_solution.is_some())
        .filter(|&i| tasks[i].kind != crate::task::TaskKind::Stdio)
        .filter(|&i| guides[i].tests[0] != callable_assert(&tasks[i].entry_point))
        .collect();
    let jobs: Vec<(&Task, &str)> = checks
        .iter()
        .map(|&i| {
            let code = tasks[i].canonical_solution.as_deref().unwrap_or_default();
            (&guides[i], code)
        })
        .collect();
    let reports = sandbox.run_batch(&jobs);
    for (&i, r) in checks.iter().zip(reports) {
        if r.outcome != Some(crate::exec::RewardClass::Pass) {
            guides[i].tests = vec![callable_assert(&tasks[i].entry_point)];
        }
    }
    guides
}

fn callable_assert(entry: &str) -> String {
    format!("assert callable({entry})")
}

/// The first example in a prompt as an assertion, when there is one.
pub fn example_assert(prompt: &str, entry: &str) -> Option<String> {
    let lines: Vec<&str> = prompt.lines().map(str::trim).collect();
    for (i, l) in lines.iter().enumerate() {
        let Some(expr) = l.strip_prefix(">>>").map(str::trim) else {
            continue;
        };
        let out: Vec<&str> = lines[i + 1..]
            .iter()
            .copied()
            .take_while(|x| {
                !x.is_empty()
                    && !x.starts_with(">>>")
                    && !x.starts_with("\"\"\"")
                    && !x.starts_with("'''")
            })
            .collect();
        if expr.contains(entry) && !out.is_empty() {
            return Some(format!("assert ({expr}) == ({})", out.join(" ")));
        }
    }
    let call = format!("{entry}(");
    for l in &lines {
        let Some(at) = l.find(&call) else { continue };
        let l = &l[at..];
        for sep in [" == ", " ➞ ", " => ", " -> "] {
            if let Some((lhs, rhs)) = l.split_once(sep) {
                let rhs = rhs.trim().trim_end_matches(['.', ',']);
                if !rhs.is_empty() && lhs.ends_with(')') {
                    return Some(format!("assert ({lhs}) == ({rhs})"));
                }
            }
        }
    }
    None
}

/// The error a failing run shows: the first failing test's kind and
/// message, as the interpreter wrote it (no framing words, so MemoCoder's
/// word-run retrieval matches on the error itself).
pub fn error_message(report: &ExecReport) -> String {
    if let Some(why) = &report.no_signal {
        return format!("no signal: {why}");
    }
    match report.tests.iter().find(|t| t.status != TestStatus::Pass) {
        Some(t) => match &t.status {
            TestStatus::Error { kind, message } => {
                let m = message.trim();
                if m.is_empty() {
                    kind.name().to_owned()
                } else if m.contains(kind.name()) {
                    m.to_owned()
                } else {
                    format!("{}: {m}", kind.name())
                }
            }
            _ => "AssertionError: the test's assertion failed (wrong result)".to_owned(),
        },
        None => String::new(),
    }
}

/// Single-shot strategies: one fixed prompt per task, `n` samples each.
pub struct Prompted {
    name: String,
    prompts: PromptSource,
}

enum PromptSource {
    ZeroShot,
    /// By task id, so that any subset of the tasks can be solved (an
    /// evaluation that goes a group of tasks at a time).
    Given(std::collections::HashMap<String, String>),
}

impl Prompted {
    pub fn zero_shot() -> Self {
        Prompted {
            name: "zero-shot".into(),
            prompts: PromptSource::ZeroShot,
        }
    }

    /// `prompts[i]` is the prompt of `tasks[i]`; `solve` may then get any of
    /// these tasks. Two tasks with one id must have one prompt.
    pub fn given(name: &str, tasks: &[&Task], prompts: Vec<String>) -> Result<Self, RolloutError> {
        if prompts.len() != tasks.len() {
            return Err(RolloutError::Invalid(format!(
                "{} prompts for {} tasks",
                prompts.len(),
                tasks.len()
            )));
        }
        let mut by_id = std::collections::HashMap::with_capacity(tasks.len());
        for (t, p) in tasks.iter().zip(prompts) {
            if let Some(other) = by_id.insert(t.id.clone(), p) {
                if by_id[&t.id] != other {
                    return Err(RolloutError::Invalid(format!(
                        "task id {} appears twice with different prompts",
                        t.id
                    )));
                }
            }
        }
        Ok(Prompted {
            name: name.into(),
            prompts: PromptSource::Given(by_id),
        })
    }
}

impl Strategy for Prompted {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn solve(
        &mut self,
        env: &Env,
        tasks: &[&Task],
        n: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Vec<Vec<Solution>>, RolloutError> {
        let prompts: Vec<String> = match &self.prompts {
            PromptSource::ZeroShot => tasks
                .iter()
                .map(|t| super::task_prompt(env.instruction, t))
                .collect(),
            PromptSource::Given(by_id) => tasks
                .iter()
                .map(|t| {
                    by_id.get(&t.id).cloned().ok_or_else(|| {
                        RolloutError::Invalid(format!("no prompt was given for task {}", t.id))
                    })
                })
                .collect::<Result<_, _>>()?,
        };
        let jobs: Vec<String> = prompts
            .iter()
            .flat_map(|p| std::iter::repeat_n(p.clone(), n))
            .collect();
        let total = jobs.len();
        let mut out: Vec<Vec<Solution>> = Vec::with_capacity(tasks.len());
        let mut row = Vec::with_capacity(n);
        let mut done = 0;
        // One generate call per batch, so progress moves while it runs.
        for chunk in jobs.chunks(env.batch_size) {
            for c in env.generate(chunk)? {
                row.push(Solution::single(c));
                if row.len() == n {
                    out.push(std::mem::take(&mut row));
                }
            }
            done += chunk.len();
            progress(done, total);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples_become_assertions() {
        let he = "def f(x):\n    \"\"\" Add one.\n    >>> f(1)\n    2\n    >>> f(2)\n    3\n    \"\"\"\n";
        assert_eq!(example_assert(he, "f").unwrap(), "assert (f(1)) == (2)");
        let multi = "    >>> f([1,\n    >>> g(1)\n    >>> f([1, 2])\n    [1,\n     2]\n";
        assert_eq!(
            example_assert(multi, "f").unwrap(),
            "assert (f([1, 2])) == ([1, 2])"
        );
        let prose = "def g(s):\n    '''For example:\n    g(\"ab\") == \"ba\"\n    g(\"\") ➞ \"\"\n    '''\n";
        assert_eq!(
            example_assert(prose, "g").unwrap(),
            "assert (g(\"ab\")) == (\"ba\")"
        );
        let arrow = "Examples\n    h(3) ➞ 9.\n";
        assert_eq!(example_assert(arrow, "h").unwrap(), "assert (h(3)) == (9)");
        assert!(example_assert("def k(x):\n    return x\n", "k").is_none());
        // A doctest that prints nothing is not an example.
        assert!(example_assert(">>> k(1)\n\n", "k").is_none());
    }
}
