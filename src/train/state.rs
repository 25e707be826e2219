//! [`TrainState`]: everything a run carries from step to step (the config
//! and recipe, the policy and its optimizer, the reward pipeline, `P_error`,
//! the memories, the rollout strategy's state, the step and the time spent),
//! built in one place, [`TrainState::new`], which also resumes from the
//! newest valid checkpoint or starts from `[train] init_from`; and the
//! checkpoint's contents, saved and loaded here.
//!
//! Every source of randomness is seeded from `(run.seed, step)`
//! ([`TrainState::step_seed`]), so a run resumed from `step-N/` repeats
//! exactly what an uninterrupted run does.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::{Device, Tensor};

use super::checkpoint;
use super::events::Observer;
use super::meta_memory::MetaMemory;
use super::metrics::{keep_before_step, keep_events};
use super::optim::{AdamW, AdamWConfig, LrSchedule, Optimizer, Sgd, SgdConfig};
use super::timer::Timer;
use super::{Recipe, Start, TrainError};
use crate::config::{EngineKind, Job, OptimizerKind, RunConfig, TrainConfig};
use crate::dist::Group;
use crate::exec::{ExecReport, Sandbox};
use crate::memory::stats::ErrorStats;
use crate::memory::ShortTerm;
use crate::model::vllm::{Pending, VllmEngine};
use crate::model::{weights, Generator, ModelSpec, Policy};
use crate::reward::Rewards;
use crate::rollout::{training_strategy, Strategy};
use crate::run_dir::{checkpoint as files, RunDir};
use crate::task::{Task, TaskSet};

/// What a checkpoint's `trainer_state.json` holds besides weights and
/// optimizer moments.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SavedState {
    format: u32,
    /// Steps completed.
    step: u64,
    seed: u64,
    error_stats: ErrorStats,
    /// `rl` or `sft`; a checkpoint resumes only a run of its own kind.
    #[serde(default = "rl_kind")]
    mode: SavedKind,
    /// Seconds spent in the training loop up to this checkpoint, summed over
    /// the sessions that resumed it, so `[train] max_minutes` is one budget
    /// however often the run is killed and resumed (0 in older checkpoints).
    #[serde(default)]
    train_seconds: f64,
}

/// The kind of run a checkpoint belongs to, as `trainer_state.json`
/// spells it: every RL recipe is `rl` (they share weights and optimizer
/// state), SFT is `sft`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum SavedKind {
    Rl,
    Sft,
}

impl SavedKind {
    fn of(recipe: Recipe) -> Self {
        match recipe {
            Recipe::Sft => SavedKind::Sft,
            _ => SavedKind::Rl,
        }
    }

    fn name(self) -> &'static str {
        match self {
            SavedKind::Rl => "an RL",
            SavedKind::Sft => "an SFT",
        }
    }
}

fn rl_kind() -> SavedKind {
    SavedKind::Rl
}

/// A seed for `step` from the run's master seed: SplitMix64's finaliser
/// over (seed, step), so seeds are distinct and well spread.
pub fn mix(seed: u64, step: u64) -> u64 {
    let mut z = seed ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) & (i64::MAX as u64)
}

/// Attach the config's LoRA adapters (when enabled) with their random
/// initialisation seeded from `run.seed`, so two fresh runs of one config
/// start from the same weights.
pub fn prepare_policy(cfg: &RunConfig, policy: &mut Policy) -> Result<(), TrainError> {
    if cfg.model.lora.enabled {
        tch::manual_seed(mix(cfg.run.seed, u64::MAX) as i64);
        policy.attach_lora(&cfg.model.lora)?;
    }
    policy.model.set_fused_logprobs(cfg.train.fused_logprobs);
    Ok(())
}

/// The trainable parameters of the policy, sorted by name.
pub fn trainable(policy: &Policy) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = policy
        .vs
        .variables()
        .into_iter()
        .filter(|(_, t)| t.requires_grad())
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// Copy the trainable tensors saved at `path` into the policy (every one
/// must be there with the right shape).
pub fn load_trainable(policy: &Policy, path: &Path) -> Result<(), TrainError> {
    let saved = weights::read_all(path)?;
    for (name, p) in trainable(policy) {
        let t = saved.get(&name).ok_or_else(|| {
            TrainError::Invalid(format!(
                "{}: no tensor `{name}` (was the checkpoint trained with other [model.lora] settings?)",
                path.display()
            ))
        })?;
        if t.size() != p.size() {
            return Err(TrainError::Invalid(format!(
                "{}: `{name}` has shape {:?}, the model {:?} (was the checkpoint trained with other [model.lora] settings?)",
                path.display(),
                t.size(),
                p.size()
            )));
        }
        tch::no_grad(|| p.shallow_clone().copy_(&t.to_kind(p.kind())));
    }
    Ok(())
}

/// The policy a checkpoint holds: its config's base model (on the CPU, in
/// the config's dtype) with the checkpoint's trainable weights, after the
/// directory verified against its manifest. For `falcon export` and `falcon
/// eval --checkpoint`.
pub fn checkpoint_policy(dir: &Path) -> Result<(RunConfig, Policy), TrainError> {
    checkpoint::verify(dir)?;
    let cpath = dir.join(files::CONFIG);
    let cfg = RunConfig::from_file(&cpath)?;
    let spec = ModelSpec {
        device: "cpu",
        ..ModelSpec::of(&cfg.model)
    };
    let mut policy = crate::model::open(&spec)?.policy;
    prepare_policy(&cfg, &mut policy)?;
    load_trainable(&policy, &dir.join(files::WEIGHTS))?;
    Ok((cfg, policy))
}

/// Refuse a new run where one is, delete the old one for `Overwrite`, and
/// write the resolved config into the (created) run directory.
fn set_up_run_dir(run_dir: &RunDir, cfg: &RunConfig, start: Start) -> Result<(), TrainError> {
    match start {
        Start::New => {
            if let Some(what) = run_dir.existing_run() {
                return Err(TrainError::RunExists {
                    dir: run_dir.path().to_path_buf(),
                    what,
                });
            }
        }
        Start::Overwrite => run_dir.remove().map_err(|e| {
            TrainError::Invalid(format!(
                "deleting the old run {} (--overwrite): {e}",
                run_dir.path().display()
            ))
        })?,
        Start::Resume => {}
    }
    std::fs::create_dir_all(run_dir.path()).map_err(|e| {
        TrainError::Invalid(format!(
            "creating the run directory {}: {e}",
            run_dir.path().display()
        ))
    })?;
    crate::fsutil::write_atomic(&run_dir.config(), cfg.to_toml_string()?.as_bytes())?;
    Ok(())
}

/// Forget what steps `step` and later wrote, which a run resumed from
/// `step-N` (the state after steps `0..N`) redoes: their lines in
/// `metrics.jsonl` and `samples.jsonl`, their TensorBoard points, and
/// evaluations after `step`, whose results would otherwise be kept from a
/// future that no longer happens. An evaluation's TensorBoard points stay
/// only where its result file does (the file is written last).
fn forget_after(run_dir: &RunDir, step: u64) -> Result<(), TrainError> {
    let n = step as i64;
    keep_before_step(&run_dir.metrics(), n)?;
    keep_before_step(&run_dir.samples(), n)?;
    for e in std::fs::read_dir(run_dir.eval_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        let later = name
            .strip_suffix(".json")
            .and_then(crate::run_dir::parse_step_dir)
            .is_some_and(|s| s > step);
        if later {
            std::fs::remove_file(e.path()).map_err(crate::fsutil::io_err(&e.path(), "remove"))?;
        }
    }
    let evaluated = |s: i64| s <= n && s >= 0 && run_dir.eval(s as u64).is_file();
    keep_events(&run_dir.tensorboard(), |ev| {
        let eval = !ev.scalars.is_empty()
            && ev
                .scalars
                .iter()
                .all(|(t, _)| t.starts_with(EVAL_TAG_PREFIX));
        if eval {
            evaluated(ev.step)
        } else {
            ev.step < n
        }
    })?;
    Ok(())
}

/// The TensorBoard tags of held-out evaluations (`eval/pass@1`, ...).
pub(super) const EVAL_TAG_PREFIX: &str = "eval/";

/// A run: its config and recipe, where it writes, what it trains with, and
/// how far it got. The step functions (`step::rl`, `step::meta`,
/// `step::sft`) read and advance it; nothing else does.
pub struct TrainState<'a> {
    pub cfg: RunConfig,
    pub recipe: Recipe,
    pub run_dir: RunDir,
    pub policy: &'a mut Policy,
    pub tasks: &'a TaskSet,
    pub sandbox: &'a Sandbox,
    /// The ranks of a data-parallel run (one process: collectives are the
    /// identity). Every rank holds the same weights and optimizer state;
    /// rank 0 alone writes the run directory.
    pub dist: &'a Group,
    pub optimizer: Box<dyn Optimizer>,
    pub schedule: LrSchedule,
    pub rewards: Rewards<'static>,
    /// `P_error` over the run (Eq. 11), checkpointed with the weights.
    pub error_stats: ErrorStats,
    /// Short- and long-term memory: meta-RL recipes only.
    pub memory: Option<MetaMemory>,
    /// The rollout strategy (`[train] strategy`) and what it learned;
    /// `None` for zero-shot.
    pub strategy: Option<Box<dyn Strategy>>,
    /// Steps completed.
    pub step: u64,
    /// Training-loop seconds behind `step` (see [`SavedState`]).
    pub train_seconds: f64,
    /// `[eval]`'s tasks, for the held-out evaluations.
    pub eval_tasks: Option<&'a TaskSet>,
    /// A data-parallel rank's private directory (its copy of the memory
    /// store), removed with the state.
    scratch: Option<PathBuf>,
    /// `[rollout] engine = "vllm"`: the servers rollouts and evaluations go
    /// to (a managed one stops when the state is dropped); `None`: the
    /// policy generates.
    pub engine: Option<VllmEngine>,
    /// With `[rollout.vllm] overlap`: the next step's rollouts, generating
    /// while this step updates (the step they are for).
    pub pending: Option<(u64, Pending)>,
}

impl Drop for TrainState<'_> {
    fn drop(&mut self) {
        if let Some(d) = self.scratch.take() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// A fresh private directory for rank `rank`'s copy of the memory store.
fn rank_scratch(rank: usize) -> Result<PathBuf, TrainError> {
    let d = std::env::temp_dir().join(format!("falcon-rank{rank}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).map_err(|e| TrainError::io(&d, e))?;
    Ok(d)
}

/// Copy the run's memory database (and its SQLite journal files, which a
/// killed session leaves) into `to`; nothing when the run has none yet.
fn copy_store(run_dir: &RunDir, to: &Path) -> Result<(), TrainError> {
    let db = run_dir.memory_db();
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let from = PathBuf::from(format!("{}{suffix}", db.display()));
        if from.is_file() {
            let name = from.file_name().expect("a file name");
            std::fs::copy(&from, to.join(name)).map_err(|e| {
                TrainError::Invalid(format!(
                    "copying {} for this rank: {e} (the run directory must be on a filesystem \
                     every node shares)",
                    from.display()
                ))
            })?;
        }
    }
    Ok(())
}

/// What a run needs beyond its config's own rules: every rank with the
/// same config, tasks to train on (with reference solutions for SFT), the
/// policy prepared as the config says, and the device memory it asks for.
fn check_run(
    cfg: &RunConfig,
    recipe: Recipe,
    policy: &Policy,
    tasks: &TaskSet,
    sandbox: &Sandbox,
    dist: &Group,
) -> Result<(), TrainError> {
    // Before anything is written: ranks with different configs would
    // silently train different things.
    dist.require_same("configs", cfg.to_toml_string()?.as_bytes())?;
    if tasks.is_empty() {
        return Err(TrainError::Invalid("the task set is empty".into()));
    }
    if recipe == Recipe::Sft {
        if let Some(t) = tasks.iter().find(|t| t.canonical_solution.is_none()) {
            return Err(TrainError::Invalid(format!(
                "SFT trains on reference solutions, and task {} has none (keep only tasks \
                 with `canonical_solution`, e.g. by [tasks] tags)",
                t.id
            )));
        }
    }
    if cfg.model.lora.enabled != policy.lora.is_some() {
        return Err(TrainError::Invalid(
            "[model.lora] enabled does not match the policy: call prepare_policy first".into(),
        ));
    }
    super::device_memory::check(cfg, recipe, policy, tasks, sandbox.workers())
}

/// The optimizer and learning-rate schedule `[train]` names.
fn optimizer_of(t: &TrainConfig) -> Result<(Box<dyn Optimizer>, LrSchedule), TrainError> {
    let optimizer: Box<dyn Optimizer> = match t.optimizer {
        OptimizerKind::Adamw => Box::new(AdamW::new(AdamWConfig {
            weight_decay: t.weight_decay,
            ..AdamWConfig::default()
        })?),
        OptimizerKind::Sgd => Box::new(Sgd::new(SgdConfig {
            momentum: 0.0,
            weight_decay: t.weight_decay,
        })?),
    };
    let schedule = LrSchedule {
        base_lr: t.lr,
        warmup_steps: t.warmup_steps,
        total_steps: t.steps,
        min_lr_ratio: t.min_lr_ratio,
        kind: t.schedule,
    };
    schedule.validate()?;
    Ok((optimizer, schedule))
}

impl<'a> TrainState<'a> {
    /// Set up the run `cfg` describes for `job` in its run directory, after
    /// checking the config for `job` (and for the ranks, in a data-parallel
    /// run). With [`Start::Resume`], the newest checkpoint that verifies is
    /// loaded (a damaged newer one is skipped with a message) and the logs
    /// are cut back to it; a new run ([`Start::New`], refused where a run
    /// already is, or [`Start::Overwrite`], which deletes it first) starts
    /// from `[train] init_from` when set. The resolved config is written to
    /// the run directory. A meta-RL run opens its memories here and, when
    /// fresh, fills them from the reference solutions (Algorithm 1 line 4).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: RunConfig,
        job: Job,
        policy: &'a mut Policy,
        tasks: &'a TaskSet,
        sandbox: &'a Sandbox,
        dist: &'a Group,
        start: Start,
        observer: &mut dyn Observer,
    ) -> Result<Self, TrainError> {
        cfg.check(job)?;
        if dist.world() > 1 {
            super::shard::check(&cfg, Recipe::of(&cfg, job)?, dist.world())?;
        }
        Self::open(cfg, job, policy, tasks, sandbox, dist, start, observer)
    }

    /// [`TrainState::new`] for a config already checked for `job` (and for
    /// the ranks), as [`super::load`] does before the model loads.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn open(
        cfg: RunConfig,
        job: Job,
        policy: &'a mut Policy,
        tasks: &'a TaskSet,
        sandbox: &'a Sandbox,
        dist: &'a Group,
        start: Start,
        observer: &mut dyn Observer,
    ) -> Result<Self, TrainError> {
        let recipe = Recipe::of(&cfg, job)?;
        check_run(&cfg, recipe, policy, tasks, sandbox, dist)?;
        let (optimizer, schedule) = optimizer_of(&cfg.train)?;
        let error_stats = ErrorStats::new(cfg.memory.p_error)?;
        let rewards = Rewards::for_training(&cfg.reward, &cfg.model.device)?;
        let run_dir = RunDir::of(&cfg);
        // Rank 0 alone sets up the run directory; the others learn whether
        // it could.
        let setup = if dist.is_main() {
            set_up_run_dir(&run_dir, &cfg, start)
        } else {
            Ok(())
        };
        super::shard::agree(dist, setup, "setting up the run directory")?;
        let mut me = TrainState {
            cfg,
            recipe,
            run_dir,
            policy,
            tasks,
            sandbox,
            dist,
            optimizer,
            schedule,
            rewards,
            error_stats,
            memory: None,
            strategy: None,
            step: 0,
            train_seconds: 0.0,
            eval_tasks: None,
            scratch: None,
            engine: None,
            pending: None,
        };
        if me.dist.is_main() {
            for gone in checkpoint::remove_leftovers(me.run_dir.path()) {
                observer.on_message(&format!(
                    "cleared what an interrupted write left: {}",
                    gone.display()
                ));
            }
        }
        let resumed_from = match start {
            Start::Resume => me.resume(observer)?,
            _ => None,
        };
        // Every rank must start from the same step (a run directory on a
        // filesystem that all nodes share).
        me.dist.require_same(
            &format!(
                "checkpoints to resume (this rank found step {}; the run directory {} must be \
                 on a filesystem every node shares)",
                me.step,
                me.run_dir.path().display()
            ),
            &me.step.to_le_bytes(),
        )?;
        if me.step == 0 {
            me.init_from(observer)?;
        }
        me.open_strategy(resumed_from.as_deref())?;
        if let Recipe::Meta(_) = me.recipe {
            me.open_memory(resumed_from.as_deref(), observer)?;
        }
        if me.dist.is_main() {
            forget_after(&me.run_dir, me.step)?;
        }
        if me.cfg.rollout.engine == EngineKind::Vllm && me.recipe != Recipe::Sft {
            me.start_engine(observer)?;
        }
        Ok(me)
    }

    /// Load the newest checkpoint that verifies (`None`: there is none, and
    /// the run starts at step 0).
    fn resume(&mut self, observer: &mut dyn Observer) -> Result<Option<PathBuf>, TrainError> {
        let found = checkpoint::latest_valid(self.run_dir.path(), |w| observer.on_message(&w))?;
        let resumed_from = match found {
            Some((step, dir)) => {
                self.load_checkpoint(&dir)?;
                if self.step != step {
                    return Err(TrainError::Invalid(format!(
                        "{}: trainer state says step {}",
                        dir.display(),
                        self.step
                    )));
                }
                observer.on_message(&format!("resumed from {} (step {step})", dir.display()));
                Some(dir)
            }
            None => {
                observer.on_message("no checkpoint to resume from; starting at step 0");
                None
            }
        };
        Ok(resumed_from)
    }

    /// A fresh run's weights from `[train] init_from`, when set.
    fn init_from(&mut self, observer: &mut dyn Observer) -> Result<(), TrainError> {
        if let Some(init) = self.cfg.train.init_from.clone() {
            checkpoint::verify(&init)?;
            load_trainable(self.policy, &init.join(files::WEIGHTS))?;
            observer.on_message(&format!("initial weights from {}", init.display()));
        }
        Ok(())
    }

    /// The rollout strategy of `[train] strategy`, with what it learned
    /// before the checkpoint `resumed_from`.
    fn open_strategy(&mut self, resumed_from: Option<&Path>) -> Result<(), TrainError> {
        self.strategy = training_strategy(&self.cfg).map_err(TrainError::Strategy)?;
        let (Some(r), Some(dir)) = (self.strategy.as_mut(), resumed_from) else {
            return Ok(());
        };
        let path = dir.join(files::ROLLOUT_STATE);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            TrainError::Invalid(format!(
                "{}: {e} (a run with [train] strategy = \"{}\" saves its rollout state there)",
                path.display(),
                self.cfg.train.strategy.name()
            ))
        })?;
        let state = serde_json::from_str(&text).map_err(|e| TrainError::bad_json(&path, e))?;
        r.load_state(state).map_err(|e| TrainError::RolloutState {
            path,
            source: Box::new(e),
        })
    }

    /// A meta-RL run's memories: short-term rows from the checkpoint
    /// `resumed_from`, or, for a fresh run, both memories filled from the
    /// reference solutions (Algorithm 1 line 4).
    fn open_memory(
        &mut self,
        resumed_from: Option<&Path>,
        observer: &mut dyn Observer,
    ) -> Result<(), TrainError> {
        // Rank 0 keeps the run's store; every other rank a private copy
        // taken before rank 0 opens (and may write) it, which then receives
        // the same inserts (every rank inserts every task's samples,
        // gathered).
        let dir = if self.dist.is_main() {
            self.run_dir.path().to_path_buf()
        } else {
            let d = rank_scratch(self.dist.rank())?;
            copy_store(&self.run_dir, &d)?;
            self.scratch = Some(d.clone());
            d
        };
        self.dist.barrier()?;
        let mut mem = MetaMemory::open(&self.cfg, &dir, self.step, self.policy.device())?;
        match resumed_from {
            Some(dir) => {
                mem.short_term =
                    ShortTerm::load(&dir.join(files::SHORT_TERM), self.policy.device())
                        .map_err(TrainError::ShortTerm)?;
            }
            None => {
                let n = mem.populate(
                    self.policy,
                    self.tasks,
                    self.sandbox,
                    &self.cfg.train.instruction,
                )?;
                if n > 0 {
                    observer.on_message(&format!(
                        "memory: {n} reference solutions as demonstrations (Algorithm 1 line 4)"
                    ));
                }
            }
        }
        self.memory = Some(mem);
        Ok(())
    }

    /// Start (or reach) the vLLM servers this rank's rollouts go to.
    fn start_engine(&mut self, observer: &mut dyn Observer) -> Result<(), TrainError> {
        let rank = self.dist.rank();
        let mut engine = VllmEngine::start(
            &self.cfg.rollout.vllm,
            self.policy,
            self.step,
            // A meta-step's K fast adapters, and θ's.
            self.cfg.train.tasks_per_step + 1,
            &self.run_dir.vllm(rank),
            &self.run_dir.vllm_log(rank),
            &mut |m| observer.on_message(m),
        )?;
        if self.cfg.rollout.vllm.overlap {
            if self.dist.world() > 1 {
                self.engine = Some(engine);
                return Err(TrainError::Invalid(
                    "[rollout.vllm] overlap runs in one process only for now".into(),
                ));
            }
            // The adapter of the generation in flight outlives one sync.
            engine.keep_previous(1);
        }
        self.engine = Some(engine);
        Ok(())
    }

    /// The held-out tasks of `eval_before` / `eval_after` / `eval_every`.
    pub fn with_eval_tasks(mut self, tasks: &'a TaskSet) -> Self {
        self.eval_tasks = Some(tasks);
        self
    }

    /// Steps completed so far.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The seed of the current step: the sampler's, and libtorch's global
    /// generator's (dropout) once the step starts.
    pub fn step_seed(&self) -> u64 {
        self.seed_at(self.step)
    }

    /// The seed of step `step`.
    pub(super) fn seed_at(&self, step: u64) -> u64 {
        mix(self.cfg.run.seed, step)
    }

    /// The tasks of the current step.
    pub fn step_tasks(&self) -> Vec<&'a Task> {
        self.tasks_at(self.step)
    }

    /// The tasks of step `step` ([`tasks_for_step`]).
    pub(super) fn tasks_at(&self, step: u64) -> Vec<&'a Task> {
        let t = &self.cfg.train;
        tasks_for_step(self.tasks.len(), t.tasks_per_step, self.cfg.run.seed, step)
            .into_iter()
            .map(|i| &self.tasks.iter().as_slice()[i])
            .collect()
    }

    /// Let `P_error` see `reports` (in order).
    pub fn observe_errors<'r>(&mut self, reports: impl IntoIterator<Item = &'r ExecReport>) {
        for r in reports {
            self.error_stats.observe(r);
        }
    }

    /// What generates now: the vLLM engine, else the policy itself.
    pub fn generator(&self) -> &dyn Generator {
        match &self.engine {
            Some(e) => e,
            None => &*self.policy,
        }
    }

    /// Bring a vLLM engine's servers to the policy as it is now (version:
    /// the step), its seconds as `sync`. Nothing without an engine.
    pub fn sync_engine(&mut self, timer: &mut Timer) -> Result<(), TrainError> {
        if let Some(e) = self.engine.as_mut() {
            let secs = e.sync(self.policy, self.step)?;
            timer.add("sync", secs);
        }
        Ok(())
    }

    fn load_checkpoint(&mut self, dir: &Path) -> Result<(), TrainError> {
        load_trainable(self.policy, &dir.join(files::WEIGHTS))?;
        let params = trainable(self.policy);
        self.optimizer.load(&dir.join(files::OPTIMIZER), &params)?;
        let spath = dir.join(files::STATE);
        let text = std::fs::read_to_string(&spath).map_err(|e| TrainError::io(&spath, e))?;
        let st: SavedState =
            serde_json::from_str(&text).map_err(|e| TrainError::bad_json(&spath, e))?;
        if st.seed != self.cfg.run.seed {
            return Err(TrainError::Invalid(format!(
                "{}: the run was started with seed {}, the config says {}; an exact resume needs the same seed",
                spath.display(),
                st.seed,
                self.cfg.run.seed
            )));
        }
        let kind = SavedKind::of(self.recipe);
        if st.mode != kind {
            return Err(TrainError::Invalid(format!(
                "{}: {} checkpoint cannot resume {} run; start the new run under its own \
                 name with [train] init_from = \"{}\"",
                spath.display(),
                st.mode.name(),
                kind.name(),
                dir.display()
            )));
        }
        let jpath = dir.join(files::JUDGE_CACHE);
        if jpath.is_file() {
            let text = std::fs::read_to_string(&jpath).map_err(|e| TrainError::io(&jpath, e))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| TrainError::bad_json(&jpath, e))?;
            self.rewards
                .restore_judge(&v)
                .map_err(|why| TrainError::Invalid(format!("{}: {why}", jpath.display())))?;
        }
        self.step = st.step;
        self.train_seconds = st.train_seconds;
        self.error_stats = st.error_stats;
        Ok(())
    }

    /// Write `step-N/` for the current step (atomically) and apply the
    /// retention policy. A run with long-term memory also keeps its
    /// `P_error` in the memory database, where `falcon memory stats` reads
    /// it (the checkpoint's copy is the one a resume loads).
    pub fn save_checkpoint(&mut self) -> Result<PathBuf, TrainError> {
        if let Some(lt) = self.memory.as_mut().and_then(|m| m.long_term.as_mut()) {
            self.error_stats
                .save(lt.entries.store_mut(), self.step)
                .map_err(|e| TrainError::Memory(e.into()))?;
        }
        let params = trainable(self.policy);
        let state = SavedState {
            format: 1,
            step: self.step,
            seed: self.cfg.run.seed,
            error_stats: self.error_stats.clone(),
            mode: SavedKind::of(self.recipe),
            train_seconds: self.train_seconds,
        };
        let cfg_text = self.cfg.to_toml_string()?;
        let dir = checkpoint::write(
            self.run_dir.path(),
            self.step,
            |d| -> Result<(), TrainError> {
                weights::save_safetensors(&d.join(files::WEIGHTS), &params, None)?;
                self.optimizer.save(&d.join(files::OPTIMIZER))?;
                crate::fsutil::write_atomic(
                    &d.join(files::STATE),
                    serde_json::to_string_pretty(&state)
                        .expect("state serialises")
                        .as_bytes(),
                )?;
                crate::fsutil::write_atomic(&d.join(files::CONFIG), cfg_text.as_bytes())?;
                if let Some(r) = &self.strategy {
                    let state = r.save_state()?.unwrap_or(serde_json::Value::Null);
                    let path = d.join(files::ROLLOUT_STATE);
                    let text = serde_json::to_string(&state)
                        .map_err(|e| TrainError::bad_json(&path, e))?;
                    crate::fsutil::write_atomic(&path, text.as_bytes())?;
                }
                if let Some(judge) = self.rewards.judge_state() {
                    let text = serde_json::to_string(&judge).expect("the cache serialises");
                    crate::fsutil::write_atomic(&d.join(files::JUDGE_CACHE), text.as_bytes())?;
                }
                if let Some(m) = &self.memory {
                    m.short_term
                        .save(&d.join(files::SHORT_TERM))
                        .map_err(TrainError::ShortTerm)?;
                }
                Ok(())
            },
        )?;
        checkpoint::apply_retention(self.run_dir.path(), self.cfg.train.keep_last)?;
        Ok(dir)
    }

    /// The device the policy is on.
    pub fn device(&self) -> Device {
        self.policy.device()
    }
}

/// Tasks of step `step`: walk a per-epoch permutation (seeded) of the task
/// set, `per_step` at a time, so the order needs no state to resume.
pub(super) fn tasks_for_step(n: usize, per_step: usize, seed: u64, step: u64) -> Vec<usize> {
    let perm = |epoch: u64| -> Vec<usize> {
        let mut order: Vec<usize> = (0..n).collect();
        let mut s = mix(seed ^ 0x7a5c, epoch);
        for i in (1..n).rev() {
            s = mix(s, i as u64);
            order.swap(i, (s % (i as u64 + 1)) as usize);
        }
        order
    };
    let start = step * per_step as u64;
    (start..start + per_step as u64)
        .map(|k| perm(k / n as u64)[(k % n as u64) as usize])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_order_is_a_seeded_permutation_per_epoch() {
        let all: Vec<usize> = (0..5).flat_map(|s| tasks_for_step(10, 2, 7, s)).collect();
        let mut sorted = all.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (0..10).collect::<Vec<_>>(),
            "one epoch covers every task once"
        );
        assert_eq!(tasks_for_step(10, 2, 7, 3), tasks_for_step(10, 2, 7, 3));
        assert_ne!(
            all,
            (0..5)
                .flat_map(|s| tasks_for_step(10, 2, 8, s))
                .collect::<Vec<_>>()
        );
        // Steps that straddle epochs still work.
        assert_eq!(tasks_for_step(3, 2, 1, 1).len(), 2);
    }
}
