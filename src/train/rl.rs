//! The single-level RL loop (the baseline the meta-RL outer loop wraps), as
//! a recipe: sample tasks → prompts → G samples each (no grad) → sandbox →
//! rewards by name → advantages → losses → optimizer step → metrics →
//! checkpoint. The same loop runs SFT ([`Mode::Sft`]: cross-entropy on
//! reference solutions, no generation). Every source of randomness is seeded
//! from `(run.seed, step)`, so a run resumed from `step-N/` repeats exactly
//! what an uninterrupted run does (tested on CPU).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::advantage::advantages;
use super::checkpoint::{self, CheckpointError};
use super::losses::{
    fine_grained_loss, kl_penalty, pg_loss, sl_loss, token_logprobs, total_loss, Normalization,
    PgBatch,
};
use super::meta::{MetaMemory, SHORT_TERM_FILE};
use super::metrics::{truncate_after_step, EventWriter, JsonlWriter, MetricsError};
use super::optim::{
    clip_grad_norm, zero_grad, AdamW, AdamWConfig, LrSchedule, OptimError, Optimizer, Sgd,
    SgdConfig,
};
use crate::config::{MetaAlgorithm, OptimizerKind, RunConfig};
use crate::eval::{evaluate, EvalResult, EvalSpec};
use crate::exec::{ExecReport, RewardClass, Sandbox};
use crate::fsutil::WriteError;
use crate::memory::stats::ErrorStats;
use crate::memory::ShortTerm;
use crate::model::autocast::{kind_of, with_autocast};
use crate::model::{weights, ChatMessage, Completion, Generator, ModelError, Policy};
use crate::reward::{
    code_in_completion, composite, error_line_spans, judge_from_config,
    offsets_by_incremental_decode, r_coarse, Aspect, Judge, RewardBreakdown, SampleSignals,
    TokenSpan,
};
use crate::rollout::{
    generation_params, reflection_params, task_prompt, training_strategy, Env, Strategy,
};
use crate::task::{Task, TaskSet};

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Optim(#[from] OptimError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(transparent)]
    Exec(#[from] crate::exec::ExecError),
    #[error(transparent)]
    Reward(#[from] crate::reward::RewardError),
    #[error(transparent)]
    Memory(#[from] crate::memory::MemoryError),
    #[error("{0}")]
    Invalid(String),
}

/// What a checkpoint's `trainer_state.json` holds besides weights and
/// optimizer moments.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct TrainerState {
    format: u32,
    /// Steps completed.
    step: u64,
    seed: u64,
    error_stats: ErrorStats,
    /// `rl` or `sft`; a checkpoint resumes only in its own mode.
    #[serde(default = "rl_mode")]
    mode: Mode,
    /// Seconds spent in the training loop up to this checkpoint, summed over
    /// the sessions that resumed it, so `[train] max_minutes` is one budget
    /// however often the run is killed and resumed (0 in older checkpoints).
    #[serde(default)]
    train_seconds: f64,
}

fn rl_mode() -> Mode {
    Mode::Rl
}

/// What a step does: the RL recipe, or supervised fine-tuning on the task
/// set's reference solutions (`falcon sft`; same checkpoints and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Rl,
    Sft,
}

/// One step's figures, as written to `metrics.jsonl` and shown by observers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StepRecord {
    pub step: u64,
    pub lr: f64,
    /// Raw value of every loss term, and `total`.
    pub loss: BTreeMap<String, f64>,
    /// Mean over scored samples of every reward term, and `total`.
    pub reward: BTreeMap<String, f64>,
    pub pass_rate: f64,
    pub samples: usize,
    pub no_signal: usize,
    pub error_kinds: BTreeMap<String, usize>,
    pub grad_norm: f64,
    pub tokens_generated: usize,
    /// Seconds in generate / exec / reward / update.
    pub seconds: BTreeMap<String, f64>,
}

impl StepRecord {
    /// Every figure as a named scalar (`loss/pg`, `reward/coarse`, `pass_rate`,
    /// `seconds/generate`, ...), for TensorBoard.
    pub fn scalars(&self) -> Vec<(String, f64)> {
        let mut v = vec![
            ("lr".to_owned(), self.lr),
            ("pass_rate".to_owned(), self.pass_rate),
            ("grad_norm".to_owned(), self.grad_norm),
            ("tokens_generated".to_owned(), self.tokens_generated as f64),
            ("no_signal".to_owned(), self.no_signal as f64),
        ];
        for (prefix, map) in [
            ("loss", &self.loss),
            ("reward", &self.reward),
            ("seconds", &self.seconds),
        ] {
            v.extend(map.iter().map(|(k, x)| (format!("{prefix}/{k}"), *x)));
        }
        v.extend(
            self.error_kinds
                .iter()
                .map(|(k, n)| (format!("errors/{k}"), *n as f64)),
        );
        v
    }
}

/// Where the loop reports progress; only the CLI draws anything.
pub trait Observer {
    fn on_start(&mut self, _first_step: u64, _steps: u64) {}
    fn on_step(&mut self, _record: &StepRecord) {}
    fn on_message(&mut self, _message: &str) {}
    /// An evaluation finished (written to `path`).
    fn on_eval(&mut self, _step: u64, _path: &Path, _result: &EvalResult) {}
}

/// An observer that ignores everything.
pub struct Silent;
impl Observer for Silent {}

pub(super) fn mix(seed: u64, step: u64) -> u64 {
    // SplitMix64 finaliser over (seed, step): distinct, well-spread seeds.
    let mut z = seed ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) & (i64::MAX as u64)
}

/// Tasks of step `step`: walk a per-epoch permutation (seeded) of the task
/// set, `per_step` at a time, so the order needs no state to resume.
fn tasks_for_step(n: usize, per_step: usize, seed: u64, step: u64) -> Vec<usize> {
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

/// Attach the config's LoRA adapters (when enabled) with their random
/// initialisation seeded from `run.seed`, so two fresh runs of one config
/// start from the same weights.
pub fn prepare_policy(cfg: &RunConfig, policy: &mut Policy) -> Result<(), TrainError> {
    if cfg.model.lora.enabled {
        tch::manual_seed(mix(cfg.run.seed, u64::MAX) as i64);
        policy.attach_lora(&cfg.model.lora)?;
    }
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
            TrainError::Invalid(format!("{}: no tensor `{name}`", path.display()))
        })?;
        if t.size() != p.size() {
            return Err(TrainError::Invalid(format!(
                "{}: `{name}` has shape {:?}, the model {:?}",
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
/// directory verified against its manifest. For `falcon export`.
pub fn policy_from_checkpoint(dir: &Path) -> Result<(RunConfig, Policy), TrainError> {
    checkpoint::verify(dir)?;
    let cpath = dir.join(CONFIG_FILE);
    let cfg = RunConfig::from_file(&cpath).map_err(|e| TrainError::Invalid(e.to_string()))?;
    let model_dir = crate::model::hub::resolve(&cfg.model.path)?;
    let mut policy = Policy::load(&model_dir, cfg.model.dtype, Device::Cpu)?;
    prepare_policy(&cfg, &mut policy)?;
    load_trainable(&policy, &dir.join(WEIGHTS_FILE))?;
    Ok((cfg, policy))
}

/// Files of a checkpoint directory.
pub const WEIGHTS_FILE: &str = "trainable.safetensors";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const STATE_FILE: &str = "trainer_state.json";
/// What the rollout strategy learned (`[train] strategy`), as JSON.
pub const ROLLOUT_STATE_FILE: &str = "rollout_state.json";
pub const CONFIG_FILE: &str = "config.toml";

/// A run: where it writes, what it trains, and how far it got.
pub struct Trainer<'a> {
    pub(super) cfg: RunConfig,
    run_dir: PathBuf,
    pub(super) policy: &'a mut Policy,
    pub(super) tasks: &'a TaskSet,
    pub(super) sandbox: &'a Sandbox,
    pub(super) optimizer: Box<dyn Optimizer>,
    pub(super) schedule: LrSchedule,
    error_stats: ErrorStats,
    judge: Box<dyn Judge>,
    pub(super) step: u64,
    /// Training-loop seconds behind `step` (see [`TrainerState`]).
    train_seconds: f64,
    mode: Mode,
    eval_tasks: Option<&'a TaskSet>,
    /// Meta-RL runs only.
    pub(super) memory: Option<MetaMemory>,
    /// The rollout strategy (`[train] strategy`) and what it learned;
    /// `None` for zero-shot.
    strategy: Option<Box<dyn Strategy>>,
}

impl<'a> Trainer<'a> {
    /// Set up a run in `run_dir`. With `resume`, the newest checkpoint that
    /// verifies is loaded (a damaged newer one is skipped with a message)
    /// and `metrics.jsonl` is cut back to it.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: RunConfig,
        mode: Mode,
        run_dir: &Path,
        policy: &'a mut Policy,
        tasks: &'a TaskSet,
        sandbox: &'a Sandbox,
        resume: bool,
        observer: &mut dyn Observer,
    ) -> Result<Self, TrainError> {
        if tasks.is_empty() {
            return Err(TrainError::Invalid("the task set is empty".into()));
        }
        if mode == Mode::Sft {
            if let Some(t) = tasks.iter().find(|t| t.canonical_solution.is_none()) {
                return Err(TrainError::Invalid(format!(
                    "SFT trains on reference solutions, and task {} has none (keep only tasks \
                     with `canonical_solution`, e.g. by [tasks] tags)",
                    t.id
                )));
            }
        }
        if cfg.meta.algorithm != MetaAlgorithm::Off && (mode == Mode::Sft || policy.lora.is_none())
        {
            return Err(TrainError::Invalid(
                "[meta] algorithm: meta-RL adapts fast LoRA weights, so it needs [model.lora] \
                 enabled = true and `falcon train` (not `falcon sft`)"
                    .into(),
            ));
        }
        if cfg.train.loss.kl > 0.0 && policy.lora.is_none() {
            return Err(TrainError::Invalid(
                "[train.loss] kl > 0 needs LoRA: the reference policy is the base model with \
                 the adapters switched off (a frozen full copy is not supported yet)"
                    .into(),
            ));
        }
        let t = &cfg.train;
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
        let error_stats =
            ErrorStats::new(cfg.memory.p_error).map_err(|e| TrainError::Invalid(e.to_string()))?;
        // The LM judge would borrow the policy this loop updates.
        if cfg.reward.judge == crate::config::JudgeKind::Lm {
            return Err(TrainError::Invalid(
                "[reward] judge = \"lm\" is not supported by `falcon train` yet; use \"static\""
                    .into(),
            ));
        }
        let judge = judge_from_config::<Policy>(&cfg.reward, None)?;
        std::fs::create_dir_all(run_dir)
            .map_err(|e| TrainError::Invalid(format!("{}: {e}", run_dir.display())))?;
        let mut me = Trainer {
            cfg,
            run_dir: run_dir.to_path_buf(),
            policy,
            tasks,
            sandbox,
            optimizer,
            schedule,
            error_stats,
            judge,
            step: 0,
            train_seconds: 0.0,
            mode,
            eval_tasks: None,
            memory: None,
            strategy: None,
        };
        for gone in checkpoint::remove_leftovers(run_dir) {
            observer.on_message(&format!(
                "removed an interrupted checkpoint write: {}",
                gone.display()
            ));
        }
        let mut resumed_from = None;
        if resume {
            let found = checkpoint::latest_valid(run_dir, |w| observer.on_message(&w))?;
            match found {
                Some((step, dir)) => {
                    me.load_checkpoint(&dir)?;
                    resumed_from = Some(dir.clone());
                    if me.step != step {
                        return Err(TrainError::Invalid(format!(
                            "{}: trainer state says step {}",
                            dir.display(),
                            me.step
                        )));
                    }
                    observer.on_message(&format!("resumed from {} (step {step})", dir.display()));
                }
                None => observer.on_message("no checkpoint to resume from; starting at step 0"),
            }
        }
        if me.step == 0 {
            if let Some(init) = me.cfg.train.init_from.clone() {
                checkpoint::verify(&init)?;
                load_trainable(me.policy, &init.join(WEIGHTS_FILE))?;
                observer.on_message(&format!("initial weights from {}", init.display()));
            }
        }
        me.strategy = training_strategy(&me.cfg)
            .map_err(|e| TrainError::Invalid(format!("[train] strategy: {e}")))?;
        if let (Some(r), Some(dir)) = (me.strategy.as_mut(), &resumed_from) {
            let path = dir.join(ROLLOUT_STATE_FILE);
            let text = std::fs::read_to_string(&path).map_err(|e| {
                TrainError::Invalid(format!(
                    "{}: {e} (a run with [train] strategy = {:?} saves its rollout state there)",
                    path.display(),
                    me.cfg.train.strategy
                ))
            })?;
            let state = serde_json::from_str(&text)
                .map_err(|e| TrainError::Invalid(format!("{}: {e}", path.display())))?;
            r.load_state(state)
                .map_err(|e| TrainError::Invalid(format!("{}: {e}", path.display())))?;
        }
        if me.cfg.meta.algorithm != MetaAlgorithm::Off {
            let mut mem = MetaMemory::open(&me.cfg, &me.run_dir, me.step)?;
            match resumed_from {
                Some(dir) => {
                    mem.short_term =
                        ShortTerm::load(&dir.join(SHORT_TERM_FILE), me.policy.device())
                            .map_err(|e| TrainError::Invalid(format!("short-term memory: {e}")))?;
                    me.memory = Some(mem);
                }
                None => {
                    me.memory = Some(mem);
                    let n = me.populate_memories()?;
                    if n > 0 {
                        observer.on_message(&format!(
                            "memory: {n} reference solutions as demonstrations (Algorithm 1 line 4)"
                        ));
                    }
                }
            }
        }
        // Lines after the resumed step belong to the lost future.
        truncate_after_step(&me.run_dir.join("metrics.jsonl"), me.step as i64)?;
        truncate_after_step(&me.run_dir.join("samples.jsonl"), me.step as i64)?;
        Ok(me)
    }

    /// Steps completed so far.
    pub fn step(&self) -> u64 {
        self.step
    }

    fn load_checkpoint(&mut self, dir: &Path) -> Result<(), TrainError> {
        load_trainable(self.policy, &dir.join(WEIGHTS_FILE))?;
        let params = trainable(self.policy);
        self.optimizer.load(&dir.join(OPTIMIZER_FILE), &params)?;
        let spath = dir.join(STATE_FILE);
        let text = std::fs::read_to_string(&spath)
            .map_err(|e| TrainError::Invalid(format!("{}: {e}", spath.display())))?;
        let st: TrainerState = serde_json::from_str(&text)
            .map_err(|e| TrainError::Invalid(format!("{}: {e}", spath.display())))?;
        if st.seed != self.cfg.run.seed {
            return Err(TrainError::Invalid(format!(
                "{}: the run was started with seed {}, the config says {}; an exact resume needs the same seed",
                spath.display(),
                st.seed,
                self.cfg.run.seed
            )));
        }
        if st.mode != self.mode {
            return Err(TrainError::Invalid(format!(
                "{}: a {:?} checkpoint cannot resume a {:?} run; start the new run under its own \
                 name with [train] init_from = \"{}\"",
                spath.display(),
                st.mode,
                self.mode,
                dir.display()
            )));
        }
        self.step = st.step;
        self.train_seconds = st.train_seconds;
        self.error_stats = st.error_stats;
        Ok(())
    }

    fn save_checkpoint(&self) -> Result<PathBuf, TrainError> {
        let params = trainable(self.policy);
        let state = TrainerState {
            format: 1,
            step: self.step,
            seed: self.cfg.run.seed,
            error_stats: self.error_stats.clone(),
            mode: self.mode,
            train_seconds: self.train_seconds,
        };
        let cfg_text =
            toml::to_string(&self.cfg).map_err(|e| TrainError::Invalid(format!("config: {e}")))?;
        let dir = checkpoint::write(&self.run_dir, self.step, |d| -> Result<(), TrainError> {
            weights::save_safetensors(&d.join(WEIGHTS_FILE), &params, None)?;
            self.optimizer.save(&d.join(OPTIMIZER_FILE))?;
            crate::fsutil::write_atomic(
                &d.join(STATE_FILE),
                serde_json::to_string_pretty(&state)
                    .expect("state serialises")
                    .as_bytes(),
            )?;
            crate::fsutil::write_atomic(&d.join(CONFIG_FILE), cfg_text.as_bytes())?;
            if let Some(r) = &self.strategy {
                let state = r
                    .save_state()
                    .map_err(|e| TrainError::Invalid(format!("rollout state: {e}")))?
                    .unwrap_or(serde_json::Value::Null);
                let text = serde_json::to_string(&state)
                    .map_err(|e| TrainError::Invalid(format!("rollout state: {e}")))?;
                crate::fsutil::write_atomic(&d.join(ROLLOUT_STATE_FILE), text.as_bytes())?;
            }
            if let Some(m) = &self.memory {
                m.short_term
                    .save(&d.join(SHORT_TERM_FILE))
                    .map_err(|e| TrainError::Invalid(format!("short-term memory: {e}")))?;
            }
            Ok(())
        })?;
        checkpoint::apply_retention(&self.run_dir, self.cfg.train.keep_last)?;
        Ok(dir)
    }

    /// Run the remaining steps.
    pub fn run(&mut self, observer: &mut dyn Observer) -> Result<Vec<StepRecord>, TrainError> {
        let steps = self.cfg.train.steps;
        // A new event file per session: TensorBoard drops points whose step
        // went backwards, so a resumed run needs no trimming here.
        let mut events = EventWriter::create(&self.run_dir.join("tb"))?;
        let t = &self.cfg.train;
        if (t.eval_before || t.eval_after || t.eval_every > 0) && self.eval_tasks.is_none() {
            // Before training, not after the first hour of it.
            return Err(TrainError::Invalid(
                "[train] eval_before / eval_after / eval_every need [eval] tasks".into(),
            ));
        }
        let eval_every = self.cfg.train.eval_every;
        let periodic = |step: u64| eval_every > 0 && step > 0 && step.is_multiple_of(eval_every);
        if (self.cfg.train.eval_before && self.step == 0)
            // A session killed between a checkpoint and its evaluation.
            || (periodic(self.step) && !self.eval_path(self.step).exists())
        {
            self.evaluate_into(&mut events, observer)?;
        }
        // The time budget counts training only, not the evaluation before,
        // and carries over resumes: time since the last checkpoint of a killed
        // session is lost along with its steps, which are redone.
        let session = Instant::now();
        let before = self.train_seconds;
        let budget = self.cfg.train.max_minutes;
        let spent = |secs: f64| budget > 0.0 && secs >= budget * 60.0;
        let mut eval_seconds = 0.0;
        if spent(before) && self.step < steps {
            observer.on_message(&format!(
                "the {budget} minute budget ([train] max_minutes) was spent before this session \
                 ({before:.0} s of training up to step {}); nothing left to train",
                self.step
            ));
        }
        observer.on_start(self.step, steps);
        let mut metrics = JsonlWriter::open(&self.run_dir.join("metrics.jsonl"))?;
        let mut samples_log = JsonlWriter::open(&self.run_dir.join("samples.jsonl"))?;
        let mut out = Vec::new();
        while self.step < steps && !spent(self.train_seconds) {
            let rec = match self.mode {
                Mode::Rl if self.memory.is_some() => self.meta_step(&mut samples_log)?,
                Mode::Rl => self.one_step(&mut samples_log)?,
                Mode::Sft => self.sft_step()?,
            };
            metrics.write(&rec)?;
            events.scalars(
                rec.step as i64,
                &rec.scalars()
                    .iter()
                    .map(|(k, v)| (k.as_str(), *v as f32))
                    .collect::<Vec<_>>(),
            )?;
            events.flush()?;
            observer.on_step(&rec);
            out.push(rec);
            self.step += 1;
            self.train_seconds = before + session.elapsed().as_secs_f64() - eval_seconds;
            let every = self.cfg.train.checkpoint_every;
            let out_of_time = spent(self.train_seconds);
            if self.step.is_multiple_of(every) || self.step == steps || out_of_time {
                let d = self.save_checkpoint()?;
                observer.on_message(&format!("checkpoint {}", d.display()));
            }
            if periodic(self.step) && !self.eval_path(self.step).exists() {
                let t0 = Instant::now();
                self.evaluate_into(&mut events, observer)?;
                eval_seconds += t0.elapsed().as_secs_f64();
            }
            if out_of_time && self.step < steps {
                observer.on_message(&format!(
                    "stopping after step {}: the {budget} minute budget ([train] max_minutes) is spent",
                    self.step
                ));
                break;
            }
        }
        if self.cfg.train.eval_after && !self.eval_path(self.step).exists() {
            self.evaluate_into(&mut events, observer)?;
        }
        Ok(out)
    }

    /// `eval/step-N.json` of this run.
    pub fn eval_path(&self, step: u64) -> PathBuf {
        self.run_dir.join("eval").join(format!("step-{step}.json"))
    }

    /// Evaluate the policy as it is now on `[eval]`'s tasks (set with
    /// [`Trainer::with_eval_tasks`]), write `eval/step-N.json` and the
    /// `eval/*` scalars, and hand the result to the observer.
    fn evaluate_into(
        &mut self,
        events: &mut EventWriter,
        observer: &mut dyn Observer,
    ) -> Result<(), TrainError> {
        let Some(tasks) = self.eval_tasks else {
            return Err(TrainError::Invalid(
                "[train] eval_before / eval_after / eval_every need [eval] tasks".into(),
            ));
        };
        let tasks: Vec<&Task> = tasks.iter().collect();
        let spec = EvalSpec {
            instruction: &self.cfg.train.instruction,
            generation: &self.cfg.generation,
            eval: &self.cfg.eval,
            // One seed for every evaluation of the run, so before and after
            // see the same sampler noise (and `falcon eval` the same too).
            seed: crate::eval::seed_of(&self.cfg),
            prompts: None,
        };
        observer.on_message(&format!(
            "evaluating step {} on {} tasks ({} samples each)",
            self.step,
            tasks.len(),
            self.cfg.eval.n
        ));
        let result = evaluate(&*self.policy, &tasks, self.sandbox, &spec, &mut |_, _| {})
            .map_err(|e| TrainError::Invalid(format!("evaluation: {e}")))?;
        let path = self.eval_path(self.step);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| TrainError::Invalid(format!("{}: {e}", dir.display())))?;
        }
        crate::fsutil::write_atomic(
            &path,
            serde_json::to_string_pretty(&result)
                .expect("eval result serialises")
                .as_bytes(),
        )?;
        let mut scalars: Vec<(String, f32)> = Vec::new();
        for (k, v) in &result.pass_at {
            scalars.push((format!("eval/pass@{k}"), *v as f32));
        }
        for (k, v) in &result.exec_at {
            scalars.push((format!("eval/exec@{k}"), *v as f32));
        }
        events.scalars(
            self.step as i64,
            &scalars
                .iter()
                .map(|(k, v)| (k.as_str(), *v))
                .collect::<Vec<_>>(),
        )?;
        events.flush()?;
        observer.on_eval(self.step, &path, &result);
        Ok(())
    }

    /// The held-out tasks of `eval_before` / `eval_after`.
    pub fn with_eval_tasks(mut self, tasks: &'a TaskSet) -> Self {
        self.eval_tasks = Some(tasks);
        self
    }

    /// One SFT step: cross-entropy on the reference solutions of
    /// `tasks_per_step` tasks, each answer formatted as the RL prompts ask
    /// (one ```python block) and closed by the chat template's end of turn.
    fn sft_step(&mut self) -> Result<StepRecord, TrainError> {
        let t = self.cfg.train.clone();
        let seed = mix(self.cfg.run.seed, self.step);
        tch::manual_seed(seed as i64);
        let picked = tasks_for_step(
            self.tasks.len(),
            t.tasks_per_step,
            self.cfg.run.seed,
            self.step,
        );
        let t0 = Instant::now();
        let mut examples: Vec<(Vec<i64>, Vec<i64>)> = Vec::with_capacity(picked.len());
        for &i in &picked {
            let task = &self.tasks.iter().as_slice()[i];
            let solution = task.canonical_solution.as_deref().unwrap_or_default();
            examples.push(sft_example(
                self.policy,
                &task_prompt(&t.instruction, task),
                &format!("```python\n{}\n```", solution.trim_end()),
            )?);
        }
        let seqs: Vec<UpdateSeq> = examples
            .iter()
            .map(|(p, c)| UpdateSeq {
                prompt_ids: p,
                completion_ids: c,
                advantage: 0.0,
                passed: true,
                spans: &[],
            })
            .collect();
        let lr = self.schedule.lr_at(self.step);
        let weights = crate::config::LossWeights {
            pg: 0.0,
            fine: 0.0,
            sl: 1.0,
            kl: 0.0,
        };
        let (loss, grad_norm) = self.update(&seqs, lr, &weights)?;
        let mut seconds = BTreeMap::new();
        seconds.insert("update".to_owned(), t0.elapsed().as_secs_f64());
        Ok(StepRecord {
            step: self.step,
            lr,
            loss,
            reward: BTreeMap::new(),
            pass_rate: 0.0,
            samples: 0,
            no_signal: 0,
            error_kinds: BTreeMap::new(),
            grad_norm,
            tokens_generated: 0,
            seconds,
        })
    }

    fn one_step(&mut self, samples_log: &mut JsonlWriter) -> Result<StepRecord, TrainError> {
        let t = self.cfg.train.clone();
        let seed = mix(self.cfg.run.seed, self.step);
        // Dropout and anything else on libtorch's global generator.
        tch::manual_seed(seed as i64);
        let tasks = self.step_tasks();
        let prompts: Vec<String> = tasks
            .iter()
            .map(|task| task_prompt(&t.instruction, task))
            .collect();
        let mut seconds = BTreeMap::new();
        let ro = self.sample(&tasks, &prompts, t.group_size, seed, &mut seconds)?;

        let t0 = Instant::now();
        let lr = self.schedule.lr_at(self.step);
        let (loss, grad_norm) = self.update(&ro.seqs(), lr, &t.loss)?;
        seconds.insert("update".to_owned(), t0.elapsed().as_secs_f64());
        self.log_samples(samples_log, &ro, &tasks)?;
        Ok(self.record(lr, loss, grad_norm, &[&ro], seconds))
    }

    /// The tasks of the current step.
    pub(super) fn step_tasks(&self) -> Vec<&'a Task> {
        let t = &self.cfg.train;
        tasks_for_step(
            self.tasks.len(),
            t.tasks_per_step,
            self.cfg.run.seed,
            self.step,
        )
        .into_iter()
        .map(|i| &self.tasks.iter().as_slice()[i])
        .collect()
    }

    /// `g` scored samples per task with the policy as it is now (fast
    /// weights included): from the rollout strategy when `[train] strategy`
    /// names one (it writes its own prompts, so `prompts` is unused), else
    /// one batch of `g` samples per prompt (`prompts[i]` belongs to
    /// `tasks[i]`). Scoring is the sandbox, rewards, group advantages and
    /// fine-grained spans; time goes to `seconds`.
    pub(super) fn sample(
        &mut self,
        tasks: &[&Task],
        prompts: &[String],
        g: usize,
        seed: u64,
        seconds: &mut BTreeMap<String, f64>,
    ) -> Result<Rollout, TrainError> {
        if let Some(mut r) = self.strategy.take() {
            let solved = self.strategy_rollout(r.as_mut(), tasks, g, seed, seconds);
            self.strategy = Some(r);
            let (comps, attempts) = solved?;
            let mut ro = self.score(tasks, comps, g, seconds)?;
            ro.attempts = attempts;
            return Ok(ro);
        }
        let expanded: Vec<String> = prompts
            .iter()
            .flat_map(|p| std::iter::repeat_n(p.clone(), g))
            .collect();
        let params = generation_params(&self.cfg.generation, seed);
        let t0 = Instant::now();
        let comps = self.policy.generate(&expanded, &params)?;
        *seconds.entry("generate".to_owned()).or_insert(0.0) += t0.elapsed().as_secs_f64();
        self.score(tasks, comps, g, seconds)
    }

    /// `g` answers per task from the strategy `r` (its generation, guiding-
    /// test runs and reflections count as `generate`), with each answer's
    /// attempt chain. A repairing strategy takes the step as one chunk, so
    /// what it learns here is retrieved from the next step on; MEMCoder
    /// streams the step's tasks in order, evolving after each.
    fn strategy_rollout(
        &self,
        r: &mut dyn Strategy,
        tasks: &[&Task],
        g: usize,
        seed: u64,
        seconds: &mut BTreeMap<String, f64>,
    ) -> Result<(Vec<Completion>, Vec<Vec<String>>), TrainError> {
        let t0 = Instant::now();
        let params = generation_params(&self.cfg.generation, seed);
        let policy: &Policy = self.policy;
        let env = Env::new(
            policy,
            policy,
            self.sandbox,
            &self.cfg.train.instruction,
            params,
            reflection_params(&self.cfg.generation, seed),
            tasks.len() * g,
            seed,
        );
        let solved = r
            .solve(&env, tasks, g, &mut |_, _| {})
            .map_err(|e| TrainError::Invalid(format!("rollout: {e}")))?;
        let mut comps = Vec::with_capacity(tasks.len() * g);
        let mut attempts = Vec::with_capacity(tasks.len() * g);
        for s in solved.into_iter().flatten() {
            comps.push(s.completion);
            attempts.push(s.attempts);
        }
        *seconds.entry("generate".to_owned()).or_insert(0.0) += t0.elapsed().as_secs_f64();
        Ok((comps, attempts))
    }

    /// Run `comps` (`g` per task, in task order) in the sandbox and score
    /// them: rewards, group advantages and fine-grained spans.
    fn score(
        &mut self,
        tasks: &[&Task],
        comps: Vec<Completion>,
        g: usize,
        seconds: &mut BTreeMap<String, f64>,
    ) -> Result<Rollout, TrainError> {
        let mut add = |k: &str, t0: Instant| {
            *seconds.entry(k.to_owned()).or_insert(0.0) += t0.elapsed().as_secs_f64();
        };

        let t0 = Instant::now();
        let located: Vec<(usize, &str)> =
            comps.iter().map(|c| code_in_completion(&c.text)).collect();
        let jobs: Vec<(&Task, &str)> = located
            .iter()
            .enumerate()
            .map(|(i, (_, code))| (tasks[i / g], *code))
            .collect();
        let reports: Vec<ExecReport> = self.sandbox.run_batch(&jobs);
        add("exec", t0);

        let t0 = Instant::now();
        for r in &reports {
            self.error_stats.observe(r);
        }
        let p_error = self.error_stats.p_error();
        let codes: Vec<&str> = located.iter().map(|(_, c)| *c).collect();
        let judge = &self.judge;
        let style = if self.cfg.reward.style.computed() {
            judge.score(Aspect::Style, &codes)?
        } else {
            vec![None; codes.len()]
        };
        let complexity = if self.cfg.reward.complexity.computed() {
            judge.score(Aspect::Complexity, &codes)?
        } else {
            vec![None; codes.len()]
        };
        let breakdowns: Vec<Option<RewardBreakdown>> = reports
            .iter()
            .enumerate()
            .map(|(i, r)| {
                composite(
                    &self.cfg.reward,
                    &SampleSignals::from_report(r, p_error.clone(), style[i], complexity[i]),
                )
            })
            .collect();
        let totals: Vec<Option<f64>> = breakdowns
            .iter()
            .map(|b| b.as_ref().map(|b| b.total))
            .collect();
        let group: Vec<usize> = (0..comps.len()).map(|i| i / g).collect();
        let t = &self.cfg.train;
        let adv = advantages(t.advantage, &totals, &group, t.normalize_std)
            .map_err(|e| TrainError::Invalid(e.to_string()))?;
        // Fine-grained spans: the tokens of the failing lines get R_coarse.
        let tok = self.policy.tokenizer()?;
        let mut spans: Vec<Vec<TokenSpan>> = Vec::with_capacity(comps.len());
        for (i, c) in comps.iter().enumerate() {
            let r = &reports[i];
            let mut s = Vec::new();
            if let (Some(class), false) = (r.outcome, r.error_lines.is_empty()) {
                if class != RewardClass::Pass {
                    let (text, offsets) =
                        offsets_by_incremental_decode(&c.token_ids, |ids| tok.decode(ids, true))?;
                    let (off, code) = code_in_completion(&text);
                    if let Ok(sp) =
                        error_line_spans(code, off, &r.error_lines, &offsets, r_coarse(class))
                    {
                        s = sp;
                    }
                }
            }
            spans.push(s);
        }
        add("reward", t0);
        Ok(Rollout {
            group: g,
            comps,
            reports,
            breakdowns,
            adv,
            spans,
            attempts: Vec::new(),
        })
    }

    /// Every completion of `ro` (whose samples belong to `tasks` in groups)
    /// with its report, rewards and advantage, to `samples.jsonl`.
    pub(super) fn log_samples(
        &self,
        samples_log: &mut JsonlWriter,
        ro: &Rollout,
        tasks: &[&Task],
    ) -> Result<(), TrainError> {
        for (i, c) in ro.comps.iter().enumerate() {
            samples_log.write(&serde_json::json!({
                "step": self.step,
                "task_id": tasks[i / ro.group].id,
                "completion": c.text,
                "report": ro.reports[i],
                "rewards": ro.breakdowns[i].as_ref().map(|b| b.to_log("")),
                "advantage": ro.adv[i],
                "attempts": ro.attempts.get(i),
            }))?;
        }
        Ok(())
    }

    /// The step's record over the samples of `rollouts`.
    pub(super) fn record(
        &self,
        lr: f64,
        loss: BTreeMap<String, f64>,
        grad_norm: f64,
        rollouts: &[&Rollout],
        seconds: BTreeMap<String, f64>,
    ) -> StepRecord {
        let mut reward: BTreeMap<String, f64> = BTreeMap::new();
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        let mut scored = 0usize;
        let breakdowns = rollouts.iter().flat_map(|r| r.breakdowns.iter());
        for bd in breakdowns.flatten() {
            scored += 1;
            *reward.entry("total".into()).or_insert(0.0) += bd.total;
            for (k, v) in &bd.terms {
                *reward.entry(k.clone()).or_insert(0.0) += v;
                *counts.entry(k.clone()).or_insert(0) += 1;
            }
        }
        for (k, v) in reward.iter_mut() {
            let n = if k == "total" { scored } else { counts[k] };
            *v /= n.max(1) as f64;
        }
        let reports: Vec<&ExecReport> = rollouts.iter().flat_map(|r| r.reports.iter()).collect();
        let mut error_kinds = BTreeMap::new();
        for r in &reports {
            *error_kinds.entry(r.outcome_label()).or_insert(0) += 1;
        }
        let passed = reports
            .iter()
            .filter(|r| r.outcome == Some(RewardClass::Pass))
            .count();
        let signal = reports.iter().filter(|r| r.outcome.is_some()).count();
        StepRecord {
            step: self.step,
            lr,
            loss,
            reward,
            pass_rate: passed as f64 / signal.max(1) as f64,
            samples: reports.len(),
            no_signal: reports.len() - signal,
            error_kinds,
            grad_norm,
            tokens_generated: rollouts
                .iter()
                .flat_map(|r| r.comps.iter())
                .map(|c| c.token_ids.len())
                .sum(),
            seconds,
        }
    }
}

/// One batch of generated samples (`group` consecutive ones per prompt) and
/// what the sandbox and the reward module said about each.
pub(super) struct Rollout {
    pub group: usize,
    pub comps: Vec<crate::model::Completion>,
    pub reports: Vec<ExecReport>,
    pub breakdowns: Vec<Option<RewardBreakdown>>,
    pub adv: Vec<f64>,
    pub spans: Vec<Vec<TokenSpan>>,
    /// Each sample's attempt chain on its guiding test (repairing rollouts).
    pub attempts: Vec<Vec<String>>,
}

impl Rollout {
    pub fn passed(&self, i: usize) -> bool {
        self.reports[i].outcome == Some(RewardClass::Pass)
    }

    /// The samples as update sequences.
    pub fn seqs(&self) -> Vec<UpdateSeq<'_>> {
        self.comps
            .iter()
            .enumerate()
            .map(|(i, c)| UpdateSeq {
                prompt_ids: &c.prompt_ids,
                completion_ids: &c.token_ids,
                advantage: self.adv[i],
                passed: self.passed(i),
                spans: &self.spans[i],
            })
            .collect()
    }
}

/// Token ids of one SFT example: the prompt exactly as generation sees it
/// (chat template with the generation prompt), and the answer as the
/// template renders an assistant turn after it, end-of-turn included. A
/// template whose full rendering does not extend the prompt's gets the
/// answer followed by the first end-of-sequence id.
pub fn sft_example(
    policy: &Policy,
    prompt: &str,
    answer: &str,
) -> Result<(Vec<i64>, Vec<i64>), TrainError> {
    let tok = policy.tokenizer()?;
    let user = [ChatMessage::new("user", prompt)];
    let head = tok.apply_chat_template(&user, true)?;
    let full = tok.apply_chat_template(
        &[user[0].clone(), ChatMessage::new("assistant", answer)],
        false,
    )?;
    let prompt_ids = tok.encode(&head, false)?;
    let answer_ids = match full.strip_prefix(&head) {
        Some(rest) => tok.encode(rest.trim_end_matches('\n'), false)?,
        None => {
            let mut ids = tok.encode(answer, false)?;
            ids.extend(tok.eos_ids().iter().next().copied());
            ids
        }
    };
    Ok((prompt_ids, answer_ids))
}

/// One sequence of an update batch: prompt and completion token ids, the
/// sample's advantage, whether it passed (for `L_sl`) and its fine-grained
/// spans in completion-token coordinates.
#[derive(Clone, Copy)]
pub struct UpdateSeq<'s> {
    pub prompt_ids: &'s [i64],
    pub completion_ids: &'s [i64],
    pub advantage: f64,
    pub passed: bool,
    pub spans: &'s [TokenSpan],
}

/// A micro-batch's tensors, padded to its own longest sequence.
struct MicroBatch {
    ids: Tensor,
    valid: Tensor,
    /// Column 0 of the masks and log-probs predicts token `start + 1`.
    start: i64,
    /// `[b, T-1-start]`: column c predicts a completion token.
    mask: Tensor,
    sl_mask: Tensor,
    advantages: Tensor,
    spans: Vec<Vec<TokenSpan>>,
    offsets: Vec<i64>,
    /// Its share of each term's whole-batch normaliser, by term name.
    share: BTreeMap<&'static str, f64>,
    reference: Option<Tensor>,
    old: Option<Tensor>,
    /// Set when samples of the micro-batch share prompts and
    /// `[train] shared_prefix` is on.
    prefix: Option<SharedPrefix>,
}

/// How a micro-batch runs with each distinct prompt once
/// ([`crate::model::Decoder::shared_prefix_logprobs`]).
struct SharedPrefix {
    prompts: Vec<Vec<i64>>,
    /// Row i's prompt is `prompts[rows[i]]`.
    rows: Vec<i64>,
    completions: Vec<Vec<i64>>,
    /// `[b, T-1-start]`: for each column of the micro-batch's layout, the
    /// completion token it predicts (clamped where it predicts none).
    gather: Tensor,
}

impl SharedPrefix {
    /// `None` when no two sequences share a prompt (nothing to save).
    fn plan(seqs: &[&UpdateSeq], start: usize, w: usize, device: Device) -> Option<Self> {
        let (distinct, rows) =
            crate::model::decoder::distinct_rows(seqs.iter().map(|s| s.prompt_ids));
        if distinct.len() == seqs.len() || seqs.iter().any(|s| s.prompt_ids.is_empty()) {
            return None;
        }
        let l = seqs
            .iter()
            .map(|s| s.completion_ids.len())
            .max()
            .unwrap_or(0)
            .max(1);
        let b = seqs.len();
        let mut gather = vec![0i64; b * w];
        for (i, s) in seqs.iter().enumerate() {
            // Column c predicts token c + start + 1 of the full sequence,
            // which is completion token c + start + 1 - p.
            let p = s.prompt_ids.len() as i64;
            for c in 0..w {
                let j = c as i64 + start as i64 + 1 - p;
                gather[i * w + c] = j.clamp(0, l as i64 - 1);
            }
        }
        let (b, w) = (b as i64, w as i64);
        Some(SharedPrefix {
            prompts: distinct.iter().map(|p| p.to_vec()).collect(),
            rows,
            completions: seqs.iter().map(|s| s.completion_ids.to_vec()).collect(),
            gather: Tensor::from_slice(&gather).view([b, w]).to_device(device),
        })
    }
}

/// The normalisers of the loss terms for a set of sequences: completion
/// tokens (`pg` token mean, `kl`), sequences with any completion token
/// (`pg` sequence mean), passing-completion tokens (`sl`) and span terms
/// (`fine`).
fn normalisers(seqs: &[&UpdateSeq], norm: Normalization) -> BTreeMap<&'static str, f64> {
    let tokens: usize = seqs.iter().map(|s| s.completion_ids.len()).sum();
    let nonempty = seqs.iter().filter(|s| !s.completion_ids.is_empty()).count();
    let sl: usize = seqs
        .iter()
        .filter(|s| s.passed)
        .map(|s| s.completion_ids.len())
        .sum();
    let spans: Vec<Vec<TokenSpan>> = seqs.iter().map(|s| s.spans.to_vec()).collect();
    let offsets: Vec<i64> = seqs.iter().map(|s| s.prompt_ids.len() as i64 - 1).collect();
    let t = seqs
        .iter()
        .map(|s| s.prompt_ids.len() + s.completion_ids.len())
        .max()
        .unwrap_or(2)
        .max(2) as i64
        - 1;
    let fine = super::losses::fine_grained_terms(&spans, &offsets, t);
    let pg = match norm {
        Normalization::TokenMean => tokens,
        Normalization::SequenceMean => nonempty,
    };
    BTreeMap::from([
        ("pg", pg as f64),
        ("kl", tokens as f64),
        ("sl", sl as f64),
        ("fine", fine as f64),
    ])
}

fn micro_batch(seqs: &[&UpdateSeq], device: Device, shared_prefix: bool) -> MicroBatch {
    let b = seqs.len();
    let tmax = seqs
        .iter()
        .map(|s| s.prompt_ids.len() + s.completion_ids.len())
        .max()
        .unwrap_or(2)
        .max(2);
    // Predictions before the shortest prompt's last token are never scored,
    // so the vocabulary projection (and its log-softmax) skips them.
    let start = seqs
        .iter()
        .map(|s| s.prompt_ids.len().saturating_sub(1))
        .min()
        .unwrap_or(0)
        .min(tmax - 2);
    let w = tmax - 1 - start;
    let mut ids = vec![0i64; b * tmax];
    let mut valid = vec![false; b * tmax];
    let mut mask = vec![false; b * w];
    let mut sl_mask = vec![false; b * w];
    for (i, s) in seqs.iter().enumerate() {
        let (p, n) = (s.prompt_ids.len(), s.completion_ids.len());
        for (j, &id) in s.prompt_ids.iter().chain(s.completion_ids).enumerate() {
            ids[i * tmax + j] = id;
            valid[i * tmax + j] = true;
        }
        for j in p.saturating_sub(1)..(p + n).saturating_sub(1) {
            mask[i * w + j - start] = true;
            sl_mask[i * w + j - start] = s.passed;
        }
    }
    let (b, t, w) = (b as i64, tmax as i64, w as i64);
    let adv: Vec<f64> = seqs.iter().map(|s| s.advantage).collect();
    MicroBatch {
        ids: Tensor::from_slice(&ids).view([b, t]).to_device(device),
        valid: Tensor::from_slice(&valid).view([b, t]).to_device(device),
        start: start as i64,
        mask: Tensor::from_slice(&mask).view([b, w]).to_device(device),
        sl_mask: Tensor::from_slice(&sl_mask).view([b, w]).to_device(device),
        advantages: Tensor::from_slice(&adv)
            .to_kind(Kind::Float)
            .to_device(device),
        spans: seqs.iter().map(|s| s.spans.to_vec()).collect(),
        offsets: seqs
            .iter()
            .map(|s| s.prompt_ids.len() as i64 - 1 - start as i64)
            .collect(),
        share: BTreeMap::new(),
        reference: None,
        old: None,
        prefix: if shared_prefix {
            SharedPrefix::plan(seqs, start, w as usize, device)
        } else {
            None
        },
    }
}

/// `log p` of the next tokens `start+1..T` of the micro-batch, `[b, T-1-start]`.
fn batch_logprobs(policy: &Policy, mb: &MicroBatch, train: bool) -> Result<Tensor, TrainError> {
    if let Some(sp) = &mb.prefix {
        let prompts: Vec<&[i64]> = sp.prompts.iter().map(Vec::as_slice).collect();
        let comps: Vec<&[i64]> = sp.completions.iter().map(Vec::as_slice).collect();
        let by_token = policy
            .model
            .shared_prefix_logprobs(&prompts, &sp.rows, &comps, train)?;
        // Into the micro-batch's layout; columns that predict no completion
        // token are masked by every term, and 0 keeps them finite.
        let cols = by_token.gather(1, &sp.gather, false);
        return Ok(cols.where_self(&mb.mask, &cols.zeros_like()));
    }
    let t = mb.ids.size()[1];
    let w = t - 1 - mb.start;
    let logits = policy.model.forward(
        &mb.ids,
        Some(&mb.valid),
        None,
        crate::model::LogitsFor::From(mb.start),
        train,
    )?;
    Ok(token_logprobs(
        &logits.narrow(1, 0, w),
        &mb.ids.narrow(1, mb.start + 1, w),
    ))
}

/// The weighted loss of one micro-batch from its log-probs (`old`: those
/// of the policy that generated it, for the PPO ratio), each term scaled by
/// the micro-batch's share of the whole batch's normaliser; and every term's
/// value.
fn mb_loss(
    mb: &MicroBatch,
    logp: &Tensor,
    old: Tensor,
    clip: Option<f64>,
    norm: Normalization,
    w: &crate::config::LossWeights,
) -> Result<(Tensor, BTreeMap<String, f64>), TrainError> {
    let batch = PgBatch {
        old_logprobs: old,
        logprobs: logp.shallow_clone(),
        ref_logprobs: None,
        mask: mb.mask.shallow_clone(),
        advantages: mb.advantages.shallow_clone(),
    };
    let pg = pg_loss(&batch, clip, norm) * mb.share["pg"];
    let fine = fine_grained_loss(logp, &mb.spans, &mb.offsets)
        .map_err(|e| TrainError::Invalid(e.to_string()))?
        * mb.share["fine"];
    let sl = sl_loss(logp, &mb.sl_mask) * mb.share["sl"];
    let mut terms = vec![("pg", pg, w.pg), ("fine", fine, w.fine), ("sl", sl, w.sl)];
    if let Some(r) = &mb.reference {
        terms.push(("kl", kl_penalty(logp, r, &mb.mask) * mb.share["kl"], w.kl));
    }
    Ok(total_loss(&terms))
}

/// `seqs` in micro-batches of at most `size` sequences (0 = one), each
/// with its share of every term's whole-batch normaliser, so that their
/// losses add up to the one-pass loss; with `kl`, each also carries the
/// base model's log-probs (the reference: the same weights with every
/// adapter switched off).
fn micro_batches(
    policy: &mut Policy,
    seqs: &[UpdateSeq],
    size: usize,
    norm: Normalization,
    kl: bool,
    shared_prefix: bool,
) -> Result<Vec<MicroBatch>, TrainError> {
    let all: Vec<&UpdateSeq> = seqs.iter().collect();
    let whole = normalisers(&all, norm);
    let size = if size == 0 { all.len() } else { size }.max(1);
    let mut out = Vec::new();
    for chunk in all.chunks(size) {
        let mut mb = micro_batch(chunk, policy.device(), shared_prefix);
        mb.share = normalisers(chunk, norm)
            .iter()
            .map(|(k, v)| (*k, v / whole[k].max(1.0)))
            .collect();
        if kl {
            policy.set_lora_enabled(false);
            let r = tch::no_grad(|| batch_logprobs(policy, &mb, false));
            policy.set_lora_enabled(true);
            mb.reference = Some(r?);
        }
        out.push(mb);
    }
    Ok(out)
}

/// The on-policy loss of `seqs` (no ratio clipping) with the policy as it
/// is now (fast weights included), in micro-batches of at most `size`
/// sequences: `piece` gets each micro-batch's loss with its graph (they add
/// up to the one-pass loss), and the summed term values, `total` included,
/// come back. MAML's `L_inner`, whose passes then hold one micro-batch's
/// activations at a time.
#[allow(clippy::too_many_arguments)]
pub(super) fn seqs_loss(
    policy: &mut Policy,
    seqs: &[UpdateSeq],
    size: usize,
    norm: Normalization,
    w: &crate::config::LossWeights,
    shared_prefix: bool,
    piece: &mut dyn FnMut(Tensor) -> Result<(), TrainError>,
) -> Result<BTreeMap<String, f64>, TrainError> {
    let mut sum: BTreeMap<String, f64> = BTreeMap::new();
    for mb in micro_batches(policy, seqs, size, norm, w.kl > 0.0, shared_prefix)? {
        let logp = batch_logprobs(policy, &mb, true)?;
        let old = logp.detach();
        let (l, parts) = mb_loss(&mb, &logp, old, None, norm, w)?;
        *sum.entry("total".into()).or_insert(0.0) += l.double_value(&[]);
        for (k, v) in parts {
            *sum.entry(k).or_insert(0.0) += v;
        }
        piece(l)?;
    }
    Ok(sum)
}

impl Trainer<'_> {
    /// The policy update on one generated batch: `ppo_epochs` optimizer
    /// steps, each accumulating the gradients of the batch's micro-batches.
    /// Every term is scaled by its micro-batch's share of the whole batch's
    /// normaliser, so the accumulated loss and gradient equal those of the
    /// batch in one pass. Returns the first epoch's loss terms (the
    /// on-policy values) and gradient norm.
    fn update(
        &mut self,
        seqs: &[UpdateSeq],
        lr: f64,
        w: &crate::config::LossWeights,
    ) -> Result<(BTreeMap<String, f64>, f64), TrainError> {
        let t = self.cfg.train.clone();
        // Forward passes only: backward replays the dtypes they recorded.
        let (dev, ac) = (self.policy.device(), kind_of(t.autocast));
        let mut micro = with_autocast(dev, ac, || {
            micro_batches(
                self.policy,
                seqs,
                t.micro_batch,
                t.normalization,
                w.kl > 0.0,
                t.shared_prefix,
            )
        })??;
        let clip = (t.ppo_epochs > 1).then_some(t.clip_eps);
        let params = trainable(self.policy);
        let mut first: Option<(BTreeMap<String, f64>, f64)> = None;
        for _epoch in 0..t.ppo_epochs {
            zero_grad(&params);
            let mut loss: BTreeMap<String, f64> = BTreeMap::new();
            for mb in micro.iter_mut() {
                let logp = with_autocast(dev, ac, || batch_logprobs(self.policy, mb, true))??;
                let old = mb.old.get_or_insert_with(|| logp.detach()).shallow_clone();
                let (total, parts) = mb_loss(mb, &logp, old, clip, t.normalization, w)?;
                *loss.entry("total".into()).or_insert(0.0) += total.double_value(&[]);
                for (k, v) in parts {
                    *loss.entry(k).or_insert(0.0) += v;
                }
                if total.requires_grad() {
                    total.backward();
                }
            }
            let grad_norm = clip_grad_norm(&params, t.grad_clip);
            // A step whose gradient is not finite is skipped, not applied.
            if grad_norm.is_finite() {
                self.optimizer.step(&params, lr)?;
            }
            zero_grad(&params);
            first.get_or_insert((loss, grad_norm));
        }
        Ok(first.expect("ppo_epochs >= 1"))
    }
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
