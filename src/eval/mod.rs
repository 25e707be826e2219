//! Evaluation: run a generator on a task set (n samples per task), execute
//! every sample in the sandbox, and report pass@k / exec@k with the
//! unbiased estimator, per-task results and an error-kind histogram; and
//! McNemar's exact test for paired pass/fail results (two checkpoints or
//! two strategies on the same tasks).
//!
//! [`evaluate_strategy`] runs any `rollout::Strategy` and scores every final
//! answer on all of its task's tests; results carry each sample's attempt
//! chain, the error transition matrix across repair attempts and what the
//! strategy's memory did; [`evaluate_in_groups`] does it a group of tasks at
//! a time and keeps each finished group, so a killed evaluation resumes;
//! [`rescore`] scores a result's saved answers again.
//! `train` calls [`evaluate`] (zero-shot) for its
//! before/after held-out figures; [`job::run`] is a whole `falcon eval`
//! from a config; plots and pages are `crate::report`'s.

pub mod job;
pub mod plus;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::config::{EvalConfig, GenerationConfig};
use crate::exec::{ExecReport, RewardClass, Sandbox};
use crate::model::{Completion, FinishReason, Generator, ModelError};
use crate::reward::{execute, CustomSample, CustomTerms, CustomValue};
use crate::rollout::strategy::Prompted;
use crate::rollout::{generation_params, reflection_params, Env, RolloutError, Strategy};
use crate::task::Task;

/// pass@k's unbiased estimator (Chen et al., 2021) for a task with `n`
/// samples of which `c` passed: `1 − C(n−c, k) / C(n, k)`, computed as a
/// product so it neither overflows nor loses precision for large `n`.
///
/// # Panics
/// When `k == 0`, `k > n` or `c > n`: the estimator is undefined there, and
/// callers check `n ≥ k` when they read the config.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    assert!(
        k >= 1 && k <= n && c <= n,
        "pass@k needs 1 <= k <= n and c <= n (n={n}, c={c}, k={k})"
    );
    if n - c < k {
        return 1.0;
    }
    // C(n−c, k)/C(n, k) = Π_{i=n−c+1}^{n} (1 − k/i)
    let mut miss = 1.0f64;
    for i in (n - c + 1)..=n {
        miss *= 1.0 - k as f64 / i as f64;
    }
    1.0 - miss
}

/// McNemar's exact test on paired binary outcomes: `b` pairs where only the
/// first system passed, `c` where only the second did. Returns the
/// two-sided p-value `min(1, 2·P[X ≤ min(b, c)])`, `X ~ Binomial(b + c, ½)`
/// (1 when there are no discordant pairs).
pub fn mcnemar_exact(b: usize, c: usize) -> f64 {
    let n = b + c;
    if n == 0 {
        return 1.0;
    }
    let m = b.min(c);
    // Σ_{i≤m} C(n, i) / 2^n, in logs so large n does not overflow.
    let ln_half_n = n as f64 * 0.5f64.ln();
    let mut ln_c = 0.0f64; // ln C(n, 0)
    let mut tail = 0.0f64;
    for i in 0..=m {
        if i > 0 {
            ln_c += ((n - i + 1) as f64).ln() - (i as f64).ln();
        }
        tail += (ln_c + ln_half_n).exp();
    }
    (2.0 * tail).min(1.0)
}

/// The outcome of one sample.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SampleResult {
    pub completion: String,
    /// Why generation ended: `eos`, `stop` or `length` (cut off at the
    /// token limit, so only its complete statements were run). Absent in
    /// results written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish: Option<String>,
    /// `pass`, the error kind (`AssertionError`, `NameError`, ...), or
    /// `no_signal` when the sandbox itself failed.
    pub outcome: String,
    pub passed: bool,
    /// Ran to the end without an exception other than a failed assertion.
    pub executed: bool,
    /// Outcomes of every attempt on the guiding test, in order, for the
    /// strategies that repair their code (self-repair, MemoCoder); empty
    /// for single-shot strategies. `outcome` is the last attempt's code
    /// on all tests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<String>,
    /// The reflector's answers about this sample and what the memory made
    /// of each (MEMCoder, a task's first sample); empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reflections: Vec<crate::rollout::ReflectionRecord>,
    /// The value of each `[[reward.custom]]` term that gave one, by name
    /// (written by [`rescore`] when the config has such terms).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rewards: BTreeMap<String, f64>,
}

/// Error transition matrix across repair iterations (MemoCoder §3.3):
/// `counts[i][j]` samples went from outcome `labels[i]` at one attempt to
/// `labels[j]` at the next.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Transitions {
    pub labels: Vec<String>,
    pub counts: Vec<Vec<usize>>,
}

impl Transitions {
    /// Count every consecutive pair of outcomes over all samples' attempt
    /// chains on the guiding test. Labels are sorted, `pass` first.
    pub fn from_tasks(tasks: &[TaskResult]) -> Self {
        let chains: Vec<Vec<&str>> = tasks
            .iter()
            .flat_map(|t| &t.samples)
            .map(|s| s.attempts.iter().map(String::as_str).collect())
            .collect();
        let mut labels: Vec<String> = chains
            .iter()
            .filter(|c| c.len() > 1)
            .flatten()
            .map(|s| s.to_string())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        labels.sort_by_key(|l| (l != "pass", l.clone()));
        let at = |l: &str| labels.iter().position(|x| x == l).unwrap();
        let mut counts = vec![vec![0; labels.len()]; labels.len()];
        for c in &chains {
            for w in c.windows(2) {
                counts[at(w[0])][at(w[1])] += 1;
            }
        }
        Transitions { labels, counts }
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

/// One task's samples.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TaskResult {
    pub id: String,
    pub n: usize,
    /// Samples that passed every test.
    pub passed: usize,
    /// Samples that executed (see [`SampleResult::executed`]).
    pub executed: usize,
    pub samples: Vec<SampleResult>,
    /// EvalPlus tasks: samples that passed the base tests (`passed` counts
    /// base and plus together, EvalPlus's "plus").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_passed: Option<usize>,
}

/// A whole evaluation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EvalResult {
    pub tasks: Vec<TaskResult>,
    /// `pass@k` by k (as a string key, for JSON), averaged over tasks.
    pub pass_at: BTreeMap<String, f64>,
    /// `exec@k` by k.
    pub exec_at: BTreeMap<String, f64>,
    /// EvalPlus's base pass@k by k over the tasks with base tests (HumanEval+,
    /// MBPP+); `pass_at` is then the plus figure.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub base_pass_at: BTreeMap<String, f64>,
    /// Samples by outcome (`pass`, error kinds, `no_signal`).
    pub outcomes: BTreeMap<String, usize>,
    pub samples_per_task: usize,
    pub temperature: f64,
    pub seconds: f64,
    /// The rollout strategy that produced the samples.
    #[serde(default = "zero_shot_label")]
    pub strategy: String,
    /// Outcome transitions across repair attempts (repairing strategies).
    #[serde(default, skip_serializing_if = "Transitions::is_empty")]
    pub transitions: Transitions,
    /// What the strategy's memory did (fixes learned, guidelines added, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub strategy_stats: BTreeMap<String, f64>,
    /// Where numba-cuda tasks ran their kernels (`simulator` or `device`),
    /// when the set has any: CPU scores are simulator scores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<String>,
    /// The final answers were scored again by [`rescore`] (after a change to
    /// code extraction, the sandbox or the tests); `seconds`, the attempt
    /// chains and the strategy's stats are the original run's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rescored: bool,
}

fn zero_shot_label() -> String {
    "zero-shot".into()
}

impl EvalResult {
    /// Read a result file written by `falcon eval --out` or by training's
    /// `eval/step-N.json`.
    pub fn load(path: &std::path::Path) -> Result<Self, EvalError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| EvalError::Invalid(format!("{}: {e}", path.display())))?;
        serde_json::from_str(&text).map_err(|e| {
            EvalError::Invalid(format!(
                "{}: not an evaluation result ({e})",
                path.display()
            ))
        })
    }

    /// pass@k, when k was evaluated.
    pub fn pass(&self, k: usize) -> Option<f64> {
        self.pass_at.get(&k.to_string()).copied()
    }

    /// McNemar's exact test of this result against `other` on the tasks both
    /// evaluated, pairing each task's first sample (greedy pass@1 when
    /// n = 1): `(only_self, only_other, p_value)`.
    pub fn mcnemar_vs(&self, other: &EvalResult) -> (usize, usize, f64) {
        self.paired_vs(other, |t| Some(t.samples.first()?.passed as u8 as f64))
    }

    /// The sign test on each task's share of passing samples, so every
    /// sample counts, not only the first: `(tasks where self passed a larger
    /// share, tasks where other did, p_value)`. Ties drop out; the p-value is
    /// McNemar's exact binomial on the two counts.
    pub fn sign_test_vs(&self, other: &EvalResult) -> (usize, usize, f64) {
        self.paired_vs(other, |t| (t.n > 0).then(|| t.passed as f64 / t.n as f64))
    }

    /// Pairs tasks by id and counts where `score` is higher on each side.
    fn paired_vs(
        &self,
        other: &EvalResult,
        score: impl Fn(&TaskResult) -> Option<f64>,
    ) -> (usize, usize, f64) {
        let theirs: BTreeMap<&str, f64> = other
            .tasks
            .iter()
            .filter_map(|t| Some((t.id.as_str(), score(t)?)))
            .collect();
        let (mut b, mut c) = (0, 0);
        for t in &self.tasks {
            let (Some(mine), Some(&other)) = (score(t), theirs.get(t.id.as_str())) else {
                continue;
            };
            if mine > other {
                b += 1;
            } else if other > mine {
                c += 1;
            }
        }
        (b, c, mcnemar_exact(b, c))
    }
}

/// Problems an evaluation can hit.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Rollout(#[from] RolloutError),
    #[error(transparent)]
    Task(#[from] crate::task::TaskError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Exec(#[from] crate::exec::ExecError),
    #[error("{0}")]
    Invalid(String),
    /// EvalPlus's expected outputs could not be computed.
    #[error(transparent)]
    Plus(#[from] plus::PlusError),
}

/// What to generate: the instruction, `[generation]` for token limits and
/// stop strings, and `[eval]` for n, k and the sampler.
pub struct EvalSpec<'a> {
    pub instruction: &'a str,
    pub generation: &'a GenerationConfig,
    pub eval: &'a EvalConfig,
    pub seed: u64,
    /// One prompt per task (e.g. FALCON's Table 7 with retrieved memory);
    /// `None` is the zero-shot prompt from `instruction`.
    pub prompts: Option<&'a [String]>,
}

/// `[eval]`'s tasks: its file (else `[tasks] path`) filtered by its tags
/// and cut to `max_tasks`.
pub fn eval_tasks(cfg: &crate::config::RunConfig) -> Result<crate::task::TaskSet, EvalError> {
    let Some(path) = cfg.eval.path.as_ref().or(cfg.tasks.path.as_ref()) else {
        return Err(EvalError::Invalid(
            "neither [eval] path nor [tasks] path is set: name the held-out task file".into(),
        ));
    };
    Ok(crate::task::TaskSet::load_selected(
        path,
        &crate::task::Selection {
            format: cfg.eval.format,
            load: crate::task::LoadOptions {
                split: cfg.eval.split.clone(),
                ..crate::task::LoadOptions::of(&cfg.tasks)
            },
            tags: &cfg.eval.tags,
            max_tasks: cfg.eval.max_tasks,
            what: "[eval]",
        },
    )?)
}

/// The sampler seed of every evaluation a run config makes (training's
/// before/after and `falcon eval`): `[generation] seed`, else `[run] seed`.
pub fn seed_of(cfg: &crate::config::RunConfig) -> u64 {
    cfg.generation.seed.unwrap_or(cfg.run.seed)
}

impl<'s> EvalSpec<'s> {
    /// The environment strategies run in: answers sampled with `[eval]`'s
    /// temperature and top-p and `[generation]`'s token limit and stop
    /// strings; reflections greedy.
    pub fn env<'a>(
        &self,
        generator: &'a dyn Generator,
        reflector: &'a dyn Generator,
        sandbox: &'a Sandbox,
    ) -> Env<'a>
    where
        's: 'a,
    {
        let mut gen = self.generation.clone();
        gen.temperature = self.eval.temperature;
        gen.top_p = self.eval.top_p;
        let params = generation_params(&gen, self.seed);
        let reflect_params = reflection_params(self.generation, self.seed);
        Env::new(
            generator,
            reflector,
            sandbox,
            self.instruction,
            params,
            reflect_params,
            self.eval.batch_size,
            self.seed,
        )
    }
}

/// Run `spec.eval.n` samples of every task through `generator` and the
/// sandbox with the zero-shot prompt (or `spec.prompts`). Prompts go to the
/// generator `spec.eval.batch_size` at a time; `progress(done, total)` is
/// called after each batch.
pub fn evaluate(
    generator: &dyn Generator,
    tasks: &[&Task],
    sandbox: &Sandbox,
    spec: &EvalSpec,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<EvalResult, EvalError> {
    let mut strategy = match spec.prompts {
        Some(p) => Prompted::given("falcon", tasks, p.to_vec())?,
        None => Prompted::zero_shot(),
    };
    let env = spec.env(generator, generator, sandbox);
    evaluate_strategy(&mut strategy, &env, tasks, spec.eval, progress)
}

/// Run `eval.n` samples of every task through `strategy`, score each final
/// answer on all of its task's tests, and summarise. `progress(0, total)`
/// comes first, so a caller knows where the work it times began.
pub fn evaluate_strategy(
    strategy: &mut dyn Strategy,
    env: &Env,
    tasks: &[&Task],
    eval: &EvalConfig,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<EvalResult, EvalError> {
    let n = eval.n;
    if let Some(&k) = eval.k.iter().find(|&&k| k == 0 || k > n) {
        return Err(EvalError::Invalid(format!(
            "pass@{k} needs 1 <= k <= n = {n} samples per task"
        )));
    }
    let t0 = Instant::now();
    progress(0, tasks.len() * n);
    let solutions = strategy.solve(env, tasks, n, progress)?;
    if solutions.len() != tasks.len() || solutions.iter().any(|s| s.len() != n) {
        return Err(EvalError::Invalid(format!(
            "strategy {} returned answers of the wrong shape for {} tasks x {n} samples",
            strategy.name(),
            tasks.len()
        )));
    }
    // Score what the strategy has not already run on all tests.
    let pending: Vec<(usize, usize)> = solutions
        .iter()
        .enumerate()
        .flat_map(|(i, s)| {
            s.iter()
                .enumerate()
                .filter(|(_, x)| x.report.is_none())
                .map(move |(j, _)| (i, j))
        })
        .collect();
    let jobs: Vec<(&Task, &Completion)> = pending
        .iter()
        .map(|&(i, j)| (tasks[i], &solutions[i][j].completion))
        .collect();
    let mut fresh = execute(env.sandbox, &jobs).into_iter();
    let mut results = Vec::with_capacity(tasks.len());
    for (task, sols) in tasks.iter().zip(solutions) {
        let mut tr = TaskResult {
            id: task.id.clone(),
            n,
            passed: 0,
            executed: 0,
            samples: Vec::with_capacity(n),
            base_passed: None,
        };
        for s in sols {
            let r = match s.report {
                Some(r) => r,
                None => fresh.next().expect("one report per pending job"),
            };
            let (outcome, passed, executed) = scored(&r);
            if let Some(b) = plus::base_passed(task, &r) {
                *tr.base_passed.get_or_insert(0) += b as usize;
            }
            tr.passed += passed as usize;
            tr.executed += executed as usize;
            tr.samples.push(SampleResult {
                finish: Some(s.completion.finish.name().to_owned()),
                completion: s.completion.text,
                outcome,
                passed,
                executed,
                attempts: s.attempts,
                reflections: s.reflections,
                rewards: BTreeMap::new(),
            });
        }
        results.push(tr);
    }
    Ok(summarize(
        tasks,
        results,
        eval,
        t0.elapsed().as_secs_f64(),
        strategy,
        env,
    ))
}

/// A sample's outcome label, whether it passed and whether it executed.
fn scored(r: &ExecReport) -> (String, bool, bool) {
    let passed = r.outcome == Some(RewardClass::Pass);
    let executed = matches!(r.outcome, Some(RewardClass::Pass | RewardClass::Failure));
    (r.outcome_label(), passed, executed)
}

type Figures = (
    BTreeMap<String, f64>,
    BTreeMap<String, f64>,
    BTreeMap<String, usize>,
);

/// pass@k and exec@k for each k, averaged over tasks, and samples by
/// outcome.
fn figures(results: &[TaskResult], ks: &[usize]) -> Figures {
    let mut outcomes = BTreeMap::new();
    for s in results.iter().flat_map(|t| &t.samples) {
        *outcomes.entry(s.outcome.clone()).or_insert(0) += 1;
    }
    let mean = |f: &dyn Fn(&TaskResult) -> f64| {
        results.iter().map(f).sum::<f64>() / results.len().max(1) as f64
    };
    let mut pass_at = BTreeMap::new();
    let mut exec_at = BTreeMap::new();
    for &k in ks {
        pass_at.insert(k.to_string(), mean(&|t| pass_at_k(t.n, t.passed, k)));
        exec_at.insert(k.to_string(), mean(&|t| pass_at_k(t.n, t.executed, k)));
    }
    (pass_at, exec_at, outcomes)
}

/// `simulator` or `device` when `tasks` hold numba-cuda tasks.
fn cuda_of(tasks: &[&Task], sandbox: &Sandbox) -> Option<String> {
    tasks
        .iter()
        .any(|t| t.kind == crate::task::TaskKind::NumbaCuda)
        .then(|| sandbox.cuda_label().to_owned())
}

/// The figures of an evaluation of `tasks` from its per-task results.
fn summarize(
    tasks: &[&Task],
    results: Vec<TaskResult>,
    eval: &EvalConfig,
    seconds: f64,
    strategy: &dyn Strategy,
    env: &Env,
) -> EvalResult {
    let (pass_at, exec_at, outcomes) = figures(&results, &eval.k);
    let base_pass_at = plus::base_pass_at(&results, &eval.k);
    let transitions = Transitions::from_tasks(&results);
    let cuda = cuda_of(tasks, env.sandbox);
    EvalResult {
        tasks: results,
        pass_at,
        exec_at,
        base_pass_at,
        outcomes,
        samples_per_task: eval.n,
        temperature: eval.temperature,
        seconds,
        strategy: strategy.name(),
        transitions,
        strategy_stats: strategy.stats().into_iter().collect(),
        cuda,
        rescored: false,
    }
}

/// What [`rescore`] made of a result.
#[derive(Debug)]
pub struct Rescored {
    pub result: EvalResult,
    /// Samples whose outcome changed, by (old outcome, new outcome).
    pub changed: BTreeMap<(String, String), usize>,
}

/// Score every saved final answer of `old` again on all of its task's tests
/// with today's code extraction and `sandbox`: after a fix to either, or to
/// the tests, a result is brought up to date without generating anything.
/// Exact for single-shot strategies; for repairing ones only the final
/// answers are rescored, since the repair loop saw the scoring of its day.
/// pass@k and exec@k are recomputed for the k the result had; `custom`
/// terms, when given, score every answer too (its `rewards`).
///
/// `cut_off` says which saved answers the token limit ended (their last
/// statement is trimmed before they run, as at generation time): the
/// recorded `finish` where there is one, else the caller's estimate.
pub fn rescore(
    old: &EvalResult,
    tasks: &[&Task],
    sandbox: &Sandbox,
    cut_off: &dyn Fn(&SampleResult) -> bool,
    custom: Option<&CustomTerms>,
) -> Result<Rescored, EvalError> {
    let by_id: std::collections::HashMap<&str, &Task> =
        tasks.iter().map(|t| (t.id.as_str(), *t)).collect();
    let mut found = Vec::with_capacity(old.tasks.len());
    for t in &old.tasks {
        let Some(&task) = by_id.get(t.id.as_str()) else {
            return Err(EvalError::Invalid(format!(
                "task {} of the result is not in the configured task set",
                t.id
            )));
        };
        if t.samples.len() != t.n {
            return Err(EvalError::Invalid(format!(
                "task {} says n = {} but holds {} samples",
                t.id,
                t.n,
                t.samples.len()
            )));
        }
        found.push(task);
    }
    let ks: Vec<usize> = old
        .pass_at
        .keys()
        .chain(old.exec_at.keys())
        .map(|k| {
            k.parse::<usize>()
                .map_err(|_| EvalError::Invalid(format!("pass@{k}: k is not a count")))
        })
        .collect::<Result<std::collections::BTreeSet<_>, _>>()?
        .into_iter()
        .collect();
    if let Some(t) = old
        .tasks
        .iter()
        .find(|t| ks.iter().any(|&k| k == 0 || k > t.n))
    {
        return Err(EvalError::Invalid(format!(
            "task {} has {} samples, too few for pass@k with k in {ks:?}",
            t.id, t.n
        )));
    }
    let answers: Vec<(&Task, Completion)> = old
        .tasks
        .iter()
        .zip(&found)
        .flat_map(|(t, &task)| {
            t.samples.iter().map(move |s| {
                let finish = match s.finish.as_deref() {
                    Some("length") => FinishReason::Length,
                    Some(_) => FinishReason::Eos,
                    None if cut_off(s) => FinishReason::Length,
                    None => FinishReason::Eos,
                };
                (task, Completion::text_only(s.completion.clone(), finish))
            })
        })
        .collect();
    let jobs: Vec<(&Task, &Completion)> = answers.iter().map(|(t, c)| (*t, c)).collect();
    let reports = execute(sandbox, &jobs);
    let mut custom_scores = match custom.filter(|c| !c.is_empty()) {
        Some(terms) => terms.score(0, &CustomSample::batch(&jobs, &reports)),
        None => Vec::new(),
    }
    .into_iter();
    let mut reports = reports.into_iter();
    let mut changed = BTreeMap::new();
    let mut result = old.clone();
    for (t, task) in result.tasks.iter_mut().zip(&found) {
        (t.passed, t.executed, t.base_passed) = (0, 0, None);
        for s in &mut t.samples {
            let r = reports.next().expect("one report per sample");
            let (outcome, passed, executed) = scored(&r);
            if let Some(b) = plus::base_passed(task, &r) {
                *t.base_passed.get_or_insert(0) += b as usize;
            }
            if outcome != s.outcome {
                *changed
                    .entry((s.outcome.clone(), outcome.clone()))
                    .or_insert(0) += 1;
            }
            (s.outcome, s.passed, s.executed) = (outcome, passed, executed);
            if let Some(scores) = custom_scores.next() {
                s.rewards = scores
                    .into_iter()
                    .filter_map(|(k, v)| match v {
                        CustomValue::Value(x) => Some((k, x)),
                        _ => None,
                    })
                    .collect();
            }
            t.passed += passed as usize;
            t.executed += executed as usize;
        }
    }
    (result.pass_at, result.exec_at, result.outcomes) = figures(&result.tasks, &ks);
    result.base_pass_at = plus::base_pass_at(&result.tasks, &ks);
    if let Some(cuda) = cuda_of(&found, sandbox) {
        result.cuda = Some(cuda);
    }
    result.rescored = true;
    Ok(Rescored { result, changed })
}

/// Where [`evaluate_in_groups`] keeps its finished groups, and what made
/// them.
pub struct Partial<'a> {
    pub dir: &'a Path,
    /// Everything that decides the samples (the config, a checkpoint, the
    /// task ids). A partial evaluation made with anything else is refused,
    /// never mixed in.
    pub made_with: serde_json::Value,
}

#[derive(Serialize, Deserialize, PartialEq)]
struct Manifest {
    made_with: serde_json::Value,
    group_tasks: usize,
    tasks: usize,
}

/// One finished group: its result, then what the next group starts from.
#[derive(Serialize, Deserialize)]
struct Group {
    result: EvalResult,
    calls: u64,
    state: Option<serde_json::Value>,
}

/// [`evaluate_strategy`] `group` tasks at a time (`[eval] checkpoint_tasks`).
/// With `partial`, each finished group is written there with the
/// strategy's state and the seed counter, and a rerun continues after the
/// last group written: the result is the one an uninterrupted run gives.
pub fn evaluate_in_groups(
    strategy: &mut dyn Strategy,
    env: &Env,
    tasks: &[&Task],
    eval: &EvalConfig,
    group: usize,
    partial: Option<&Partial>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<EvalResult, EvalError> {
    let group = group.max(1);
    let mut done: Vec<EvalResult> = Vec::new();
    if let Some(p) = partial {
        done = resume(p, strategy, env, tasks, group)?;
    }
    let total = tasks.len() * eval.n;
    for (g, chunk) in tasks.chunks(group).enumerate().skip(done.len()) {
        let before = g * group * eval.n;
        let r = evaluate_strategy(strategy, env, chunk, eval, &mut |d, _| {
            progress(before + d, total)
        })?;
        if let Some(p) = partial {
            let kept = Group {
                result: r.clone(),
                calls: env.calls(),
                state: strategy.save_state()?,
            };
            write_json(&group_path(p.dir, g), &kept)?;
        }
        done.push(r);
    }
    let seconds = done.iter().map(|r| r.seconds).sum();
    let results = done.into_iter().flat_map(|r| r.tasks).collect();
    Ok(summarize(tasks, results, eval, seconds, strategy, env))
}

fn group_path(dir: &Path, g: usize) -> std::path::PathBuf {
    dir.join(format!("group-{g:05}.json"))
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<(), EvalError> {
    let text = serde_json::to_vec(value)
        .map_err(|e| EvalError::Invalid(format!("{}: {e}", path.display())))?;
    crate::fsutil::write_atomic(path, &text).map_err(|e| EvalError::Invalid(e.to_string()))
}

/// The groups a partial evaluation in `p.dir` finished, with the strategy
/// and the seed counter set to go on after them.
fn resume(
    p: &Partial,
    strategy: &mut dyn Strategy,
    env: &Env,
    tasks: &[&Task],
    group: usize,
) -> Result<Vec<EvalResult>, EvalError> {
    let dir = p.dir.display();
    let manifest = Manifest {
        made_with: p.made_with.clone(),
        group_tasks: group,
        tasks: tasks.len(),
    };
    let read = |path: &Path| -> Result<Vec<u8>, EvalError> {
        std::fs::read(path).map_err(|e| EvalError::Invalid(format!("{}: {e}", path.display())))
    };
    let mpath = p.dir.join("manifest.json");
    if !mpath.exists() {
        std::fs::create_dir_all(p.dir).map_err(|e| EvalError::Invalid(format!("{dir}: {e}")))?;
        write_json(&mpath, &manifest)?;
        return Ok(Vec::new());
    }
    let old: Manifest = serde_json::from_slice(&read(&mpath)?).map_err(|e| {
        EvalError::Invalid(format!(
            "{}: not a partial evaluation ({e}); delete {dir} to start over",
            mpath.display()
        ))
    })?;
    if old != manifest {
        return Err(EvalError::Invalid(format!(
            "{dir} holds a partial evaluation made with another config, checkpoint, \
             task list or [eval] checkpoint_tasks: rerun with what made it, or delete \
             {dir} to start over"
        )));
    }
    let mut done = Vec::new();
    let mut next = None;
    for (g, chunk) in tasks.chunks(group).enumerate() {
        let path = group_path(p.dir, g);
        if !path.exists() {
            break;
        }
        let kept: Group = serde_json::from_slice(&read(&path)?).map_err(|e| {
            EvalError::Invalid(format!(
                "{}: unreadable ({e}); delete it to rerun that group",
                path.display()
            ))
        })?;
        let ids = kept.result.tasks.iter().map(|t| t.id.as_str());
        if !ids.eq(chunk.iter().map(|t| t.id.as_str())) {
            return Err(EvalError::Invalid(format!(
                "{}: holds other tasks than group {g}; delete {dir} to start over",
                path.display()
            )));
        }
        done.push(kept.result);
        next = Some((kept.calls, kept.state));
    }
    if let Some((calls, state)) = next {
        env.resume_calls(calls);
        if let Some(state) = state {
            strategy.load_state(state)?;
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_at_k_matches_hand_computed_values() {
        // n=5, c=2, k=1: c/n.
        assert!((pass_at_k(5, 2, 1) - 0.4).abs() < 1e-12);
        // n=5, c=2, k=2: 1 − C(3,2)/C(5,2) = 1 − 3/10.
        assert!((pass_at_k(5, 2, 2) - 0.7).abs() < 1e-12);
        // n=10, c=3, k=5: 1 − C(7,5)/C(10,5) = 1 − 21/252.
        assert!((pass_at_k(10, 3, 5) - (1.0 - 21.0 / 252.0)).abs() < 1e-12);
        assert_eq!(pass_at_k(10, 0, 5), 0.0);
        // Fewer failures than k: every k-subset holds a pass.
        assert_eq!(pass_at_k(10, 7, 5), 1.0);
        assert_eq!(pass_at_k(1, 1, 1), 1.0);
        // Large n stays in [0, 1] and equals c/n at k=1.
        assert!((pass_at_k(2000, 3, 1) - 0.0015).abs() < 1e-12);
    }

    #[test]
    #[should_panic(expected = "pass@k needs")]
    fn pass_at_k_refuses_k_above_n() {
        pass_at_k(3, 1, 5);
    }

    #[test]
    fn mcnemar_matches_the_binomial_table() {
        // b=1, c=6: 2·(C(7,0)+C(7,1))/2^7 = 2·8/128.
        assert!((mcnemar_exact(1, 6) - 0.125).abs() < 1e-12);
        assert!((mcnemar_exact(6, 1) - 0.125).abs() < 1e-12);
        // b=0, c=5: 2/32.
        assert!((mcnemar_exact(0, 5) - 0.0625).abs() < 1e-12);
        // Balanced discordance is no evidence at all.
        assert_eq!(mcnemar_exact(4, 4), 1.0);
        assert_eq!(mcnemar_exact(0, 0), 1.0);
        // b=2, c=10: 2·(1+12+66)/4096.
        assert!((mcnemar_exact(2, 10) - 2.0 * 79.0 / 4096.0).abs() < 1e-12);
    }

    fn task_result(id: &str, passed: bool) -> TaskResult {
        TaskResult {
            id: id.into(),
            n: 1,
            passed: passed as usize,
            executed: 1,
            base_passed: None,
            samples: vec![SampleResult {
                completion: String::new(),
                finish: None,
                outcome: if passed { "pass" } else { "WrongAnswer" }.into(),
                passed,
                executed: true,
                attempts: Vec::new(),
                reflections: Vec::new(),
                rewards: BTreeMap::new(),
            }],
        }
    }

    /// A result holding only `tasks`: the pairing tests read nothing else.
    fn result_of(tasks: Vec<TaskResult>) -> EvalResult {
        EvalResult {
            tasks,
            pass_at: BTreeMap::new(),
            exec_at: BTreeMap::new(),
            base_pass_at: BTreeMap::new(),
            outcomes: BTreeMap::new(),
            samples_per_task: 1,
            temperature: 0.0,
            seconds: 0.0,
            strategy: zero_shot_label(),
            transitions: Transitions::default(),
            strategy_stats: BTreeMap::new(),
            cuda: None,
            rescored: false,
        }
    }

    #[test]
    fn transitions_count_consecutive_attempts_pass_first() {
        let mut a = task_result("a", true);
        a.samples[0].attempts = vec!["SyntaxError".into(), "NameError".into(), "pass".into()];
        let mut b = task_result("b", false);
        b.samples[0].attempts = vec!["SyntaxError".into(), "SyntaxError".into()];
        // A single attempt has no transition and adds no label.
        let mut c = task_result("c", false);
        c.samples[0].attempts = vec!["Timeout".into()];
        let t = Transitions::from_tasks(&[a, b, c]);
        assert_eq!(t.labels, ["pass", "NameError", "SyntaxError"]);
        assert_eq!(t.counts, vec![vec![0, 0, 0], vec![1, 0, 0], vec![0, 1, 1]]);
        assert!(Transitions::from_tasks(&[task_result("d", true)]).is_empty());
    }

    #[test]
    fn paired_comparison_counts_discordant_tasks_by_id() {
        let r = |v: &[(&str, bool)]| result_of(v.iter().map(|(i, p)| task_result(i, *p)).collect());
        let after = r(&[("a", true), ("b", true), ("c", false), ("d", true)]);
        // Different order and a task the other side lacks ("e").
        let before = r(&[
            ("d", true),
            ("c", true),
            ("b", false),
            ("a", false),
            ("e", true),
        ]);
        let (b, c, p) = after.mcnemar_vs(&before);
        assert_eq!((b, c), (2, 1));
        assert!((p - mcnemar_exact(2, 1)).abs() < 1e-15);
    }

    #[test]
    fn sign_test_counts_every_sample_per_task() {
        let r = |v: &[(&str, usize, usize)]| {
            result_of(
                v.iter()
                    .map(|&(id, passed, n)| {
                        let mut t = task_result(id, passed > 0);
                        (t.n, t.passed) = (n, passed);
                        t
                    })
                    .collect(),
            )
        };
        // First samples all pass on both sides (McNemar sees nothing), but
        // the pass counts differ: a higher on x and y, b higher on z, w tied;
        // shares, not counts, decide when n differs (4/5 > 7/10).
        let a = r(&[("x", 9, 10), ("y", 4, 5), ("z", 2, 10), ("w", 5, 10)]);
        let b = r(&[("w", 5, 10), ("z", 6, 10), ("y", 7, 10), ("x", 3, 10)]);
        assert_eq!(a.mcnemar_vs(&b).0 + a.mcnemar_vs(&b).1, 0);
        let (hi_a, hi_b, p) = a.sign_test_vs(&b);
        assert_eq!((hi_a, hi_b), (2, 1));
        assert!((p - mcnemar_exact(2, 1)).abs() < 1e-15);
        assert_eq!(b.sign_test_vs(&a).0, 1);
    }
}
