//! Training as a recipe (torchtune's shape, STYLE.md §5): one
//! [`TrainState`] built in one place, sibling step functions over it, and a
//! loop that reads top to bottom.
//!
//! - [`state`](TrainState): policy, optimizer and schedule, reward pipeline,
//!   `P_error`, memories, the rollout strategy's state, step and time;
//!   resume, `init_from`, checkpoints.
//! - [`step`]: the steps, chosen explicitly by the [`Recipe`] (`[meta]
//!   algorithm`, or the `sft` subcommand): `step::rl`, `step::meta`
//!   (`maml` / `fomaml` / `reptile`), `step::sft`. No step imports another;
//!   what they share is below them: generating, running and scoring samples
//!   (`scoring`, into a `scored` batch, with the step's `timer`), the
//!   policy update (`update`), the memories (`meta_memory`), the meta-update's
//!   mathematics (`maml`) and how a step is split over data-parallel ranks
//!   (`shard`: whole groups per rank, gathered samples, summed gradients).
//! - [`run`]: the loop (evaluations, metrics, checkpoints, time budget; rank
//!   0 writes); [`train`]: a whole `falcon train` / `falcon sft` session from
//!   a config, as one process or as a rank of a torchrun / Slurm job.
//! - [`losses`], [`advantage`], [`optim`]: FALCON's loss terms, advantage
//!   estimators, our AdamW / SGD and LR schedules.
//! - [`checkpoint`]: atomic `step-N/` directories, verification, retention.
//! - [`metrics`]: `metrics.jsonl` and TensorBoard event files.
//! - [`ablate`]: `falcon ablate` grids (variants of a base config), the
//!   finished-variant marker and the summary table and plots.

pub mod ablate;
pub mod advantage;
pub mod checkpoint;
mod device_memory;
mod events;
pub mod losses;
mod maml;
mod meta_memory;
pub mod metrics;
pub mod optim;
mod recipe;
mod scored;
mod scoring;
mod shard;
mod state;
pub mod step;
mod timer;
mod update;

use crate::config::{ConfigError, Job, MetaAlgorithm, RunConfig};
use crate::dist::{Group, Launch};
use crate::eval::EvalResult;
use crate::exec::Sandbox;
use crate::fsutil::WriteError;
use crate::model::{ModelError, ModelSpec, Policy};
use crate::run_dir::RunDir;
use crate::task::{Selection, TaskError, TaskSet};

pub use events::{Observer, Silent, StepRecord};
pub use recipe::run;
pub use state::{checkpoint_policy, load_trainable, prepare_policy, trainable, TrainState};
pub use update::sft_example;

/// What can stop a training run.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The config is not valid for this job (the user's to fix).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A task file could not be read, or a selection left nothing.
    #[error(transparent)]
    Task(#[from] TaskError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Optim(#[from] optim::OptimError),
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error(transparent)]
    Metrics(#[from] metrics::MetricsError),
    #[error(transparent)]
    Exec(#[from] crate::exec::ExecError),
    #[error(transparent)]
    Reward(#[from] crate::reward::RewardError),
    #[error(transparent)]
    Memory(#[from] crate::memory::MemoryError),
    /// The process group of a data-parallel run failed (a rank died, timed
    /// out, or disagrees).
    #[error(transparent)]
    Dist(#[from] crate::dist::DistError),
    /// A new run was asked for in a directory that holds one.
    #[error(
        "{} already holds a run ({what}): continue it with --resume, give this run another [run] name, or start it over with --overwrite (which deletes {})",
        dir.display(),
        dir.display()
    )]
    RunExists {
        dir: std::path::PathBuf,
        what: String,
    },
    /// A write failed because the disk (or a quota) is full; what was
    /// written before is intact.
    #[error(
        "{error}\nthe disk is full. {}. Free space on the filesystem of {}, then continue the \
         run with --resume",
        match last_good {
            Some((step, dir)) => format!(
                "The last good checkpoint, {} (step {step}), is intact and a resume continues \
                 from it",
                dir.display()
            ),
            None => "No checkpoint had been written yet, so a resume starts at step 0".to_owned(),
        },
        run_dir.display()
    )]
    DiskFull {
        error: Box<TrainError>,
        run_dir: std::path::PathBuf,
        last_good: Option<(u64, std::path::PathBuf)>,
    },
    /// The long-term memory (the vector index of past tasks) failed.
    #[error("long-term memory: {0}")]
    LongTerm(#[source] crate::memory::MemoryError),
    /// The short-term memory (recent samples on the device) failed.
    #[error("short-term memory: {0}")]
    ShortTerm(#[source] crate::memory::MemoryError),
    /// The rollout strategy failed while solving or saving its state.
    #[error("rollout: {0}")]
    Rollout(#[from] crate::rollout::RolloutError),
    /// `[train] strategy` names a strategy that cannot be built.
    #[error("[train] strategy: {0}")]
    Strategy(#[source] crate::rollout::RolloutError),
    /// A checkpoint's rollout state does not fit the strategy.
    #[error("{}: {source}", path.display())]
    RolloutState {
        path: std::path::PathBuf,
        #[source]
        source: Box<crate::rollout::RolloutError>,
    },
    /// A held-out evaluation during training failed.
    #[error("evaluation: {0}")]
    Eval(#[from] crate::eval::EvalError),
    #[error(transparent)]
    Advantage(#[from] advantage::AdvantageError),
    #[error(transparent)]
    Loss(#[from] losses::LossError),
    #[error(transparent)]
    Stats(#[from] crate::memory::stats::StatsError),
    /// The driver could not say how much memory a device has.
    #[error("reading cuda:{device}'s memory: {source}")]
    DeviceMemory {
        device: usize,
        #[source]
        source: crate::kernels::KernelError,
    },
    /// Autograd could not take the meta-gradient.
    #[error("meta-gradient: {0}")]
    MetaGradient(#[source] tch::TchError),
    /// A file of the run (its state, a strategy's state, a scratch
    /// directory) could not be read or created.
    #[error("{}: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file of the run holds JSON we cannot read back.
    #[error("{}: {source}", path.display())]
    BadJson {
        path: std::path::PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// Samples could not cross between data-parallel ranks.
    #[error("samples from rank {rank}: {source}")]
    Gather {
        rank: usize,
        #[source]
        source: serde_json::Error,
    },
    /// A request this job cannot serve, said in words (no typed cause).
    #[error("{0}")]
    Invalid(String),
}

impl TrainError {
    pub(crate) fn io(path: impl Into<std::path::PathBuf>, source: std::io::Error) -> Self {
        TrainError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn bad_json(path: impl Into<std::path::PathBuf>, source: serde_json::Error) -> Self {
        TrainError::BadJson {
            path: path.into(),
            source,
        }
    }
}

impl TrainError {
    /// `self` as [`TrainError::DiskFull`] when a full disk caused it, with
    /// the newest checkpoint of `run_dir` that verifies.
    fn or_disk_full(self, run_dir: &RunDir) -> TrainError {
        if matches!(self, TrainError::DiskFull { .. }) || !crate::fsutil::is_disk_full(&self) {
            return self;
        }
        let last_good = checkpoint::latest_valid(run_dir.path(), |_| {})
            .ok()
            .flatten();
        TrainError::DiskFull {
            error: Box::new(self),
            run_dir: run_dir.path().to_path_buf(),
            last_good,
        }
    }
}

pub use crate::run_dir::Start;

/// Which step a run takes, chosen explicitly: `falcon sft` takes the SFT
/// step; `falcon train` takes the single-level step, or the meta-step of
/// `[meta] algorithm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipe {
    /// The single-level policy-gradient step (`[meta] algorithm = "off"`).
    Rl,
    /// FALCON's Algorithm 1 with this meta-update (never `Off`).
    Meta(MetaAlgorithm),
    /// Cross-entropy on reference solutions.
    Sft,
}

impl Recipe {
    /// The recipe of `cfg` run as `job`.
    pub fn of(cfg: &RunConfig, job: Job) -> Result<Recipe, TrainError> {
        Ok(match (job, cfg.meta.algorithm) {
            (Job::Sft, _) => Recipe::Sft,
            (Job::Train, MetaAlgorithm::Off) => Recipe::Rl,
            (Job::Train, a) => Recipe::Meta(a),
            (Job::Eval, _) => {
                return Err(TrainError::Invalid(
                    "`falcon eval` trains nothing: run `falcon train` or `falcon sft`".into(),
                ))
            }
        })
    }

    /// `rl`, `maml`, `fomaml`, `reptile` or `sft`.
    pub fn name(self) -> &'static str {
        match self {
            Recipe::Rl => "rl",
            Recipe::Meta(a) => a.name(),
            Recipe::Sft => "sft",
        }
    }
}

/// What a training session did.
pub struct Outcome {
    pub run_dir: RunDir,
    pub recipe: Recipe,
    /// This session's steps.
    pub records: Vec<StepRecord>,
    /// Steps completed by the run (earlier sessions included).
    pub steps: u64,
    /// The held-out evaluation before the first step and after the last,
    /// when the run has both (`eval_before`, `eval_after`): paired, so
    /// McNemar applies.
    pub before_after: Option<(EvalResult, EvalResult)>,
    /// The mean of each reward term over every step of the run (all
    /// sessions), `total` included; empty for SFT.
    pub reward_means: std::collections::BTreeMap<String, f64>,
    /// What the run's memories hold at the end.
    pub memory: MemorySummary,
}

/// What a run's memories hold.
#[derive(Debug, Clone, Default)]
pub struct MemorySummary {
    /// Long-term entries (meta-RL with `[meta] long_term`).
    pub long_term: Option<u64>,
    /// Rows in the short-term buffer (meta-RL).
    pub short_term: Option<usize>,
    /// Samples `P_error` has seen, and its error kinds, largest share first.
    pub p_error_samples: u64,
    pub p_error: Vec<(String, f64)>,
}

impl MemorySummary {
    fn of(s: &TrainState) -> Self {
        let mut p: Vec<(String, f64)> = s
            .error_stats
            .p_error()
            .into_iter()
            .map(|(k, v)| (k.name().to_owned(), v))
            .collect();
        p.sort_by(|a, b| b.1.total_cmp(&a.1));
        MemorySummary {
            long_term: s
                .memory
                .as_ref()
                .and_then(|m| m.long_term.as_ref())
                .and_then(|l| l.len().ok()),
            short_term: s.memory.as_ref().map(|m| m.short_term.len()),
            p_error_samples: s.error_stats.samples(),
            p_error: p,
        }
    }
}

/// The mean of each reward term over the steps in `metrics.jsonl` (each
/// step's mean weighs the same); lines that do not parse are skipped.
pub fn reward_means(metrics: &std::path::Path) -> std::collections::BTreeMap<String, f64> {
    let text = std::fs::read_to_string(metrics).unwrap_or_default();
    let mut sum: std::collections::BTreeMap<String, (f64, usize)> = Default::default();
    for rec in text
        .lines()
        .filter_map(|l| serde_json::from_str::<StepRecord>(l).ok())
    {
        for (k, v) in rec.reward {
            let e = sum.entry(k).or_insert((0.0, 0));
            e.0 += v;
            e.1 += 1;
        }
    }
    sum.into_iter()
        .map(|(k, (s, n))| (k, s / n.max(1) as f64))
        .collect()
}

/// `[tasks]`'s training tasks.
pub fn train_tasks(cfg: &RunConfig) -> Result<TaskSet, TrainError> {
    let Some(path) = &cfg.tasks.path else {
        return Err(TrainError::Invalid(
            "[tasks] path is not set: name the task file to train on".into(),
        ));
    };
    Ok(TaskSet::load_selected(
        path,
        &Selection {
            format: cfg.tasks.format,
            load: crate::task::LoadOptions::of(&cfg.tasks),
            tags: &cfg.tasks.tags,
            max_tasks: 0,
            what: "[tasks]",
        },
    )?)
}

/// What a training session loads before its state: the process group (one
/// process unless torchrun or Slurm started several), the training and
/// held-out tasks, the policy (with the run's fresh LoRA adapters, on the
/// device of this rank's `LOCAL_RANK`) and the sandbox; and the config it
/// checked, for the state.
pub struct Loaded {
    cfg: RunConfig,
    job: Job,
    pub dist: Group,
    pub tasks: TaskSet,
    pub eval_tasks: Option<TaskSet>,
    pub policy: Policy,
    pub sandbox: Sandbox,
}

/// `[model] device` for the rank that drives local device `local_rank`:
/// a bare `cuda` becomes `cuda:<local_rank>`, as torchrun users expect.
fn rank_device(device: &str, dist: &Group) -> String {
    if dist.world() > 1 && device == "cuda" {
        format!("cuda:{}", dist.local_rank())
    } else {
        device.to_owned()
    }
}

/// `[exec]` for this rank: ranks on one node give their candidates
/// disjoint uids (each rank's workers above the previous rank's), so one
/// rank's clean-up never touches another's processes.
fn rank_exec(exec: &crate::config::ExecConfig, dist: &Group) -> crate::config::ExecConfig {
    let mut exec = exec.clone();
    if dist.world() > 1 {
        exec.uid_base += (dist.local_rank() * exec.pool_size()) as u32;
    }
    exec
}

/// Check `cfg` for `job` and load what its run needs (see [`Loaded`]).
pub fn load(cfg: &RunConfig, job: Job, observer: &mut dyn Observer) -> Result<Loaded, TrainError> {
    cfg.check(job)?;
    let launch = Launch::from_env()?;
    let dist = Group::init(
        &launch,
        std::time::Duration::from_secs_f64(cfg.dist.timeout_s),
    )?;
    if dist.world() > 1 {
        // Before the model loads: what cannot run data-parallel says so now.
        shard::check(cfg, Recipe::of(cfg, job)?, dist.world())?;
        observer.on_message(&format!(
            "rank {} of {} (launched by {}, rendezvous at {}:{})",
            dist.rank(),
            dist.world(),
            launch.launcher,
            launch.master_addr,
            launch.master_port
        ));
    }
    let mut tasks = train_tasks(cfg)?;
    let t = &cfg.train;
    let mut eval_tasks = if t.eval_before || t.eval_after || t.eval_every > 0 {
        Some(crate::eval::eval_tasks(cfg).map_err(|e| match e {
            crate::eval::EvalError::Task(e) => TrainError::Task(e),
            e => TrainError::Eval(e),
        })?)
    } else {
        None
    };
    let device = rank_device(&cfg.model.device, &dist);
    let opened = crate::model::open(&ModelSpec {
        device: &device,
        ..ModelSpec::of(&cfg.model)
    })?;
    observer.on_message(&opened.describe(cfg.model.dtype));
    let mut policy = opened.policy;
    prepare_policy(cfg, &mut policy)?;
    let sandbox = Sandbox::new(&rank_exec(&cfg.exec, &dist))?;
    for set in std::iter::once(&mut tasks).chain(eval_tasks.as_mut()) {
        crate::eval::plus::expand(set, &sandbox)
            .map_err(|e| TrainError::Eval(crate::eval::EvalError::Plus(e)))?;
    }
    let all: Vec<&crate::task::Task> = tasks
        .iter()
        .chain(eval_tasks.iter().flat_map(|e| e.iter()))
        .collect();
    sandbox.require_modules(&all)?;
    Ok(Loaded {
        cfg: cfg.clone(),
        job,
        dist,
        tasks,
        eval_tasks,
        policy,
        sandbox,
    })
}

impl Loaded {
    /// The run's [`TrainState`] over what was loaded (see
    /// [`TrainState::new`]; [`load`] checked the config), with the
    /// held-out tasks attached.
    pub fn state<'a>(
        &'a mut self,
        start: Start,
        observer: &mut dyn Observer,
    ) -> Result<TrainState<'a>, TrainError> {
        let state = TrainState::open(
            self.cfg.clone(),
            self.job,
            &mut self.policy,
            &self.tasks,
            &self.sandbox,
            &self.dist,
            start,
            observer,
        )?;
        Ok(match &self.eval_tasks {
            Some(e) => state.with_eval_tasks(e),
            None => state,
        })
    }
}

/// A whole `falcon train` / `falcon sft` session (and each variant of
/// `falcon ablate`): the config checked for `job`, its tasks, model and
/// sandbox loaded, the run trained (begun as `start` says) with its
/// held-out evaluations. Progress goes to `observer`.
pub fn train(
    cfg: &RunConfig,
    job: Job,
    start: Start,
    observer: &mut dyn Observer,
) -> Result<Outcome, TrainError> {
    let mut loaded = load(cfg, job, observer)?;
    let trained = (|| -> Result<_, TrainError> {
        let mut state = loaded.state(start, observer)?;
        let records = run(&mut state, observer)?;
        Ok((records, state.recipe, state.step, MemorySummary::of(&state)))
    })();
    let run_dir = RunDir::of(cfg);
    let (records, recipe, steps, memory) = trained.map_err(|e| e.or_disk_full(&run_dir))?;
    let t = &cfg.train;
    let read = |step: u64| EvalResult::load(&run_dir.eval(step)).ok();
    let before_after = if t.eval_before && t.eval_after && steps > 0 {
        read(0).zip(read(steps))
    } else {
        None
    };
    Ok(Outcome {
        reward_means: reward_means(&run_dir.metrics()),
        run_dir,
        recipe,
        records,
        steps,
        before_after,
        memory,
    })
}
