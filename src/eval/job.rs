//! A whole `falcon eval` from a config: `[eval]`'s tasks, the generators
//! (`[strategy.generator]` writes the answers, `[memory.reflector]`
//! reflects; each the policy or an OpenAI-compatible server), the sandbox,
//! the strategy from the one factory (MemoCoder first accumulates on
//! `[strategy] accumulate_on`), then the evaluation, a group of tasks at a
//! time when `[eval] checkpoint_tasks` asks, kept beside `out` so a killed
//! evaluation resumes.

use std::path::{Path, PathBuf};

use super::{eval_tasks, evaluate_in_groups, evaluate_strategy, seed_of};
use super::{EvalError, EvalResult, EvalSpec, Partial};
use crate::config::{EngineKind, GeneratorSource, RunConfig, StrategyKind};
use crate::exec::Sandbox;
use crate::model::openai::OpenAiGenerator;
use crate::model::vllm::VllmEngine;
use crate::model::{Generator, Policy};
use crate::rollout::{self, Use};
use crate::run_dir::Start;
use crate::task::{Selection, Task, TaskSet};

/// Where an evaluation reports what it is doing; only the CLI draws.
pub trait Progress {
    fn message(&mut self, _message: &str) {}
    /// `done` of `total` samples are finished.
    fn samples(&mut self, _done: u64, _total: u64) {}
}

/// Whether `cfg`'s evaluation generates or reflects with the policy (and
/// so needs the model loaded).
pub fn needs_policy(cfg: &RunConfig) -> bool {
    let reflects = matches!(
        cfg.strategy.kind,
        StrategyKind::Memocoder | StrategyKind::Memcoder
    );
    matches!(cfg.strategy.generator, GeneratorSource::Policy)
        || (reflects && matches!(cfg.memory.reflector, GeneratorSource::Policy))
}

/// Where a partial evaluation of `out` keeps its groups: `out` with
/// `.partial` for its extension (`result.json` → `result.partial/`).
pub fn partial_dir(out: &Path) -> PathBuf {
    out.with_extension("partial")
}

/// What an evaluation writing to `out` finds there already: the result
/// file, its per-task lines, its partial groups.
pub fn existing_output(out: &Path) -> Vec<PathBuf> {
    [
        out.to_path_buf(),
        out.with_extension("tasks.jsonl"),
        partial_dir(out),
    ]
    .into_iter()
    .filter(|p| p.exists())
    .collect()
}

/// Decide what to do with an earlier evaluation at `out` before a new one
/// writes there: [`Start::New`] refuses when anything is there,
/// [`Start::Overwrite`] deletes it, [`Start::Resume`] keeps the partial
/// groups to continue from (a finished result is refused: nothing is left
/// to resume).
pub fn prepare_output(out: &Path, start: Start) -> Result<(), EvalError> {
    let found = existing_output(out);
    if found.is_empty() {
        return Ok(());
    }
    let names = || crate::config::tried_list(&found);
    match start {
        Start::New => Err(EvalError::Invalid(format!(
            "{} already holds an evaluation ({}): continue a partial one with --resume, write to another --out, or replace it with --overwrite",
            out.display(),
            names()
        ))),
        Start::Resume if out.exists() => Err(EvalError::Invalid(format!(
            "{} is a finished evaluation, nothing to resume: write to another --out, or replace it with --overwrite",
            out.display()
        ))),
        Start::Resume => Ok(()),
        Start::Overwrite => {
            for p in found {
                let r = if p.is_dir() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
                r.map_err(|e| {
                    EvalError::Invalid(format!("deleting {} (--overwrite): {e}", p.display()))
                })?;
            }
            Ok(())
        }
    }
}

/// Evaluate `cfg`'s strategy on `[eval]`'s tasks. `policy` is the model
/// (or checkpoint) to evaluate; it must be given when [`needs_policy`].
/// `checkpoint` only names it in what a partial evaluation was made with.
/// With `out` (prepared by [`prepare_output`]), finished groups are kept in
/// [`partial_dir`] until the caller has written the result.
pub fn run(
    cfg: &RunConfig,
    policy: Option<&Policy>,
    checkpoint: Option<&Path>,
    out: Option<&Path>,
    progress: &mut dyn Progress,
) -> Result<EvalResult, EvalError> {
    cfg.check(crate::config::Job::Eval)?;
    let mut tasks = eval_tasks(cfg)?;
    let server = |src: &GeneratorSource| -> Result<Option<OpenAiGenerator>, EvalError> {
        Ok(match src {
            GeneratorSource::Policy => None,
            GeneratorSource::Openai(o) => Some(OpenAiGenerator::new(o)?),
        })
    };
    let answer_server = server(&cfg.strategy.generator)?;
    let reflect_server = server(&cfg.memory.reflector)?;
    // `[rollout] engine = "vllm"`: what the policy generates goes through
    // vLLM, serving the policy as loaded (its adapter, or merged weights).
    let mut scratch = Scratch(None);
    let engine = match (cfg.rollout.engine, policy) {
        (EngineKind::Vllm, Some(p)) => {
            // What the server reads (an export of the policy) is scratch;
            // its log is kept beside the results.
            let work =
                std::env::temp_dir().join(format!("falcon-eval-vllm-{}", std::process::id()));
            scratch.0 = Some(work.clone());
            let log = match out {
                Some(o) => PathBuf::from(format!("{}.vllm.log", o.display())),
                None => std::env::temp_dir()
                    .join(format!("falcon-eval-vllm-{}.log", std::process::id())),
            };
            let mut e = VllmEngine::start(&cfg.rollout.vllm, p, 0, 2, &work, &log, &mut |m| {
                progress.message(m)
            })?;
            e.sync(p, 0)?;
            Some(e)
        }
        _ => None,
    };
    let policy: Option<&dyn Generator> = match (&engine, policy) {
        (Some(e), _) => Some(e),
        (None, Some(p)) => Some(p),
        (None, None) => None,
    };
    let generator = pick(&answer_server, policy)?;
    let reflector = pick(&reflect_server, policy)?;
    let sandbox = Sandbox::new(&cfg.exec)?;
    if super::plus::needs_expansion(&tasks) {
        let n = super::plus::expand(&mut tasks, &sandbox)?;
        progress.message(&format!("EvalPlus: base and plus tests of {n} tasks ready"));
    }
    let list: Vec<&Task> = tasks.iter().collect();
    sandbox.require_modules(&list)?;
    let spec = EvalSpec {
        instruction: &cfg.train.instruction,
        generation: &cfg.generation,
        eval: &cfg.eval,
        seed: seed_of(cfg),
        prompts: None,
    };
    let env = spec.env(generator, reflector, &sandbox);
    let kind = cfg.strategy.kind;
    let mut strategy = rollout::strategy(
        kind,
        cfg,
        Use::Eval {
            memory_run: cfg.strategy.memory_run.as_deref(),
            tasks: &list,
        },
    )?;
    if let Some(path) = &cfg.strategy.accumulate_on {
        let acc = accumulation_tasks(cfg, path)?;
        let acc: Vec<&Task> = acc.iter().collect();
        progress.message(&format!(
            "accumulating {} memory on {} tasks of {}",
            strategy.name(),
            acc.len(),
            path.display()
        ));
        strategy.solve(&env, &acc, 1, &mut |_, _| {})?;
        let stats: Vec<String> = strategy
            .stats()
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        progress.message(&format!("{}: {}", strategy.name(), stats.join(", ")));
    }
    progress.message(&format!(
        "strategy {} on {} tasks x {} samples",
        strategy.name(),
        list.len(),
        cfg.eval.n
    ));
    let dir = out.map(partial_dir);
    let partial = dir.as_deref().map(|dir| Partial {
        dir,
        made_with: serde_json::json!({
            "config": cfg,
            "checkpoint": checkpoint,
            "memory": cfg.strategy.memory_run,
            "tasks": list.iter().map(|t| &t.id).collect::<Vec<_>>(),
        }),
    });
    if let Some(p) = partial.as_ref().filter(|_| cfg.eval.checkpoint_tasks > 0) {
        if p.dir.join("manifest.json").exists() {
            progress.message(&format!(
                "continuing the partial evaluation in {}",
                p.dir.display()
            ));
        }
    }
    let mut tick = |done: usize, total: usize| progress.samples(done as u64, total as u64);
    if cfg.eval.checkpoint_tasks == 0 {
        return evaluate_strategy(strategy.as_mut(), &env, &list, &cfg.eval, &mut tick);
    }
    evaluate_in_groups(
        strategy.as_mut(),
        &env,
        &list,
        &cfg.eval,
        cfg.eval.checkpoint_tasks,
        partial.as_ref(),
        &mut tick,
    )
}

/// A directory removed when the evaluation ends, however it ends.
struct Scratch(Option<PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// The server when a source names one, else the policy.
fn pick<'a>(
    server: &'a Option<OpenAiGenerator>,
    policy: Option<&'a dyn Generator>,
) -> Result<&'a dyn Generator, EvalError> {
    match (server, policy) {
        (Some(s), _) => Ok(s),
        (None, Some(p)) => Ok(p),
        (None, None) => Err(EvalError::Invalid(
            "this evaluation generates with the policy, but no model was loaded".into(),
        )),
    }
}

/// MemoCoder's accumulation tasks: `path` (format by its content), at most
/// `[strategy] accumulate_max_tasks`.
fn accumulation_tasks(cfg: &RunConfig, path: &Path) -> Result<TaskSet, EvalError> {
    Ok(TaskSet::load_selected(
        path,
        &Selection {
            format: crate::config::TaskFormat::Auto,
            load: crate::task::LoadOptions::of(&cfg.tasks),
            tags: &[],
            max_tasks: cfg.strategy.accumulate_max_tasks,
            what: "[strategy] accumulate_on",
        },
    )?)
}
