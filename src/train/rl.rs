//! The single-level RL loop (the baseline the meta-RL outer loop wraps), as
//! a recipe: sample tasks → prompts → G samples each (no grad) → sandbox →
//! rewards by name → advantages → losses → optimizer step → metrics →
//! checkpoint. Every source of randomness is seeded from `(run.seed, step)`,
//! so a run resumed from `step-N/` repeats exactly what an uninterrupted run
//! does (tested on CPU).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::advantage::advantages;
use super::checkpoint::{self, CheckpointError};
use super::losses::{fine_grained_loss, pg_loss, sl_loss, token_logprobs, total_loss, PgBatch};
use super::metrics::{truncate_after_step, EventWriter, JsonlWriter, MetricsError};
use super::optim::{
    clip_grad_norm, zero_grad, AdamW, AdamWConfig, LrSchedule, OptimError, Optimizer, Sgd,
    SgdConfig,
};
use crate::config::{OptimizerKind, RunConfig};
use crate::exec::{ExecReport, RewardClass, Sandbox};
use crate::fsutil::WriteError;
use crate::memory::stats::ErrorStats;
use crate::model::sampling::Sampler;
use crate::model::{weights, GenerationParams, Generator, ModelError, Policy};
use crate::reward::{
    code_in_completion, composite, error_line_spans, judge_from_config,
    offsets_by_incremental_decode, r_coarse, Aspect, Judge, SampleSignals, TokenSpan,
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
}

/// An observer that ignores everything.
pub struct Silent;
impl Observer for Silent {}

fn mix(seed: u64, step: u64) -> u64 {
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

/// The user message for a task. MBPP-style statements do not name the
/// function the tests call, so the name is added when the prompt lacks it
/// (without showing any test).
pub fn task_prompt(instruction: &str, task: &Task) -> String {
    let mut p = format!("{instruction}\n\n{}", task.prompt.trim_end());
    if !task.entry_point.is_empty() && !task.prompt.contains(&task.entry_point) {
        p.push_str(&format!(
            "\nThe function must be named `{}`.",
            task.entry_point
        ));
    }
    p
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
pub const CONFIG_FILE: &str = "config.toml";

/// A run: where it writes, what it trains, and how far it got.
pub struct Trainer<'a> {
    cfg: RunConfig,
    run_dir: PathBuf,
    policy: &'a mut Policy,
    tasks: &'a TaskSet,
    sandbox: &'a Sandbox,
    optimizer: Box<dyn Optimizer>,
    schedule: LrSchedule,
    error_stats: ErrorStats,
    judge: Box<dyn Judge>,
    step: u64,
}

impl<'a> Trainer<'a> {
    /// Set up a run in `run_dir`. With `resume`, the newest checkpoint that
    /// verifies is loaded (a damaged newer one is skipped with a message)
    /// and `metrics.jsonl` is cut back to it.
    pub fn new(
        cfg: RunConfig,
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
        };
        for gone in checkpoint::remove_leftovers(run_dir) {
            observer.on_message(&format!(
                "removed an interrupted checkpoint write: {}",
                gone.display()
            ));
        }
        if resume {
            let found = checkpoint::latest_valid(run_dir, |w| observer.on_message(&w))?;
            match found {
                Some((step, dir)) => {
                    me.load_checkpoint(&dir)?;
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
        self.step = st.step;
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
            Ok(())
        })?;
        checkpoint::apply_retention(&self.run_dir, self.cfg.train.keep_last)?;
        Ok(dir)
    }

    /// Run the remaining steps.
    pub fn run(&mut self, observer: &mut dyn Observer) -> Result<Vec<StepRecord>, TrainError> {
        let steps = self.cfg.train.steps;
        observer.on_start(self.step, steps);
        let mut metrics = JsonlWriter::open(&self.run_dir.join("metrics.jsonl"))?;
        let mut samples_log = JsonlWriter::open(&self.run_dir.join("samples.jsonl"))?;
        // A new event file per session: TensorBoard drops points whose step
        // went backwards, so a resumed run needs no trimming here.
        let mut events = EventWriter::create(&self.run_dir.join("tb"))?;
        let mut out = Vec::new();
        while self.step < steps {
            let rec = self.one_step(&mut samples_log)?;
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
            let every = self.cfg.train.checkpoint_every;
            if self.step.is_multiple_of(every) || self.step == steps {
                let d = self.save_checkpoint()?;
                observer.on_message(&format!("checkpoint {}", d.display()));
            }
        }
        Ok(out)
    }

    fn one_step(&mut self, samples_log: &mut JsonlWriter) -> Result<StepRecord, TrainError> {
        let t = self.cfg.train.clone();
        let seed = mix(self.cfg.run.seed, self.step);
        // Dropout and anything else on libtorch's global generator.
        tch::manual_seed(seed as i64);
        let g = t.group_size;
        let picked = tasks_for_step(
            self.tasks.len(),
            t.tasks_per_step,
            self.cfg.run.seed,
            self.step,
        );
        let tasks: Vec<&Task> = picked
            .iter()
            .map(|&i| &self.tasks.iter().as_slice()[i])
            .collect();
        let mut prompts = Vec::with_capacity(tasks.len() * g);
        for task in &tasks {
            for _ in 0..g {
                prompts.push(task_prompt(&t.instruction, task));
            }
        }
        let gen = &self.cfg.generation;
        let params = GenerationParams {
            max_new_tokens: gen.max_new_tokens,
            sampler: Sampler {
                temperature: gen.temperature,
                top_k: gen.top_k as i64,
                top_p: gen.top_p,
            },
            seed: Some(seed),
            stop: gen.stop.clone(),
            chat: true,
            system: None,
            ignore_eos: false,
        };
        let mut seconds = BTreeMap::new();
        let t0 = Instant::now();
        let comps = self.policy.generate(&prompts, &params)?;
        seconds.insert("generate".to_owned(), t0.elapsed().as_secs_f64());

        let t0 = Instant::now();
        let located: Vec<(usize, &str)> =
            comps.iter().map(|c| code_in_completion(&c.text)).collect();
        let jobs: Vec<(&Task, &str)> = located
            .iter()
            .enumerate()
            .map(|(i, (_, code))| (tasks[i / g], *code))
            .collect();
        let reports: Vec<ExecReport> = self.sandbox.run_batch(&jobs);
        seconds.insert("exec".to_owned(), t0.elapsed().as_secs_f64());

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
        let breakdowns: Vec<_> = reports
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
        seconds.insert("reward".to_owned(), t0.elapsed().as_secs_f64());

        // ---- update
        let t0 = Instant::now();
        let device = self.policy.device();
        let lens: Vec<(usize, usize)> = comps
            .iter()
            .map(|c| (c.prompt_ids.len(), c.token_ids.len()))
            .collect();
        let tmax = lens.iter().map(|(p, c)| p + c).max().unwrap_or(1).max(2);
        let b = comps.len();
        let mut ids = vec![0i64; b * tmax];
        let mut valid = vec![false; b * tmax];
        // mask[b, j] marks the prediction of token j+1 when it is a completion token.
        let mut mask = vec![false; b * (tmax - 1)];
        let mut sl_mask = vec![false; b * (tmax - 1)];
        for (i, c) in comps.iter().enumerate() {
            let (p, n) = lens[i];
            for (j, &id) in c.prompt_ids.iter().chain(c.token_ids.iter()).enumerate() {
                ids[i * tmax + j] = id;
                valid[i * tmax + j] = true;
            }
            let passed = reports[i].outcome == Some(RewardClass::Pass);
            for j in p.saturating_sub(1)..(p + n).saturating_sub(1) {
                mask[i * (tmax - 1) + j] = true;
                sl_mask[i * (tmax - 1) + j] = passed;
            }
        }
        let ids = Tensor::from_slice(&ids)
            .view([b as i64, tmax as i64])
            .to_device(device);
        let valid_t = Tensor::from_slice(&valid)
            .view([b as i64, tmax as i64])
            .to_device(device);
        let mask_t = Tensor::from_slice(&mask)
            .view([b as i64, tmax as i64 - 1])
            .to_device(device);
        let sl_mask_t = Tensor::from_slice(&sl_mask)
            .view([b as i64, tmax as i64 - 1])
            .to_device(device);
        let adv_t = Tensor::from_slice(&adv)
            .to_kind(Kind::Float)
            .to_device(device);
        let logits = self.policy.model.forward(
            &ids,
            Some(&valid_t),
            None,
            crate::model::LogitsFor::All,
            true,
        )?;
        let logp = token_logprobs(
            &logits.narrow(1, 0, tmax as i64 - 1),
            &ids.narrow(1, 1, tmax as i64 - 1),
        );
        drop(logits);
        let batch = PgBatch {
            old_logprobs: logp.detach(),
            logprobs: logp.shallow_clone(),
            ref_logprobs: None,
            mask: mask_t,
            advantages: adv_t,
        };
        let pg = pg_loss(&batch, None, t.normalization);
        let offsets: Vec<i64> = lens.iter().map(|(p, _)| *p as i64 - 1).collect();
        let fine = fine_grained_loss(&logp, &spans, &offsets)
            .map_err(|e| TrainError::Invalid(e.to_string()))?;
        let sl = sl_loss(&logp, &sl_mask_t);
        let (total, mut loss) = total_loss(&[
            ("pg", pg, t.loss.pg),
            ("fine", fine, t.loss.fine),
            ("sl", sl, t.loss.sl),
        ]);
        loss.insert("total".to_owned(), total.double_value(&[]));
        let params = trainable(self.policy);
        zero_grad(&params);
        total.backward();
        let grad_norm = clip_grad_norm(&params, t.grad_clip);
        let lr = self.schedule.lr_at(self.step);
        if grad_norm.is_finite() {
            self.optimizer.step(&params, lr)?;
        }
        zero_grad(&params);
        seconds.insert("update".to_owned(), t0.elapsed().as_secs_f64());

        // ---- metrics
        let mut reward: BTreeMap<String, f64> = BTreeMap::new();
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        let mut scored = 0usize;
        for bd in breakdowns.iter().flatten() {
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
        let mut error_kinds = BTreeMap::new();
        for r in &reports {
            let key = match (r.outcome, r.error_kind) {
                (None, _) => "no_signal".to_owned(),
                (Some(_), None) => "pass".to_owned(),
                (Some(_), Some(k)) => format!("{k:?}"),
            };
            *error_kinds.entry(key).or_insert(0) += 1;
        }
        let passed = reports
            .iter()
            .filter(|r| r.outcome == Some(RewardClass::Pass))
            .count();
        let signal = reports.iter().filter(|r| r.outcome.is_some()).count();
        for (i, c) in comps.iter().enumerate() {
            samples_log.write(&serde_json::json!({
                "step": self.step,
                "task_id": tasks[i / g].id,
                "completion": c.text,
                "report": reports[i],
                "rewards": breakdowns[i].as_ref().map(|b| b.to_log("")),
                "advantage": adv[i],
            }))?;
        }
        Ok(StepRecord {
            step: self.step,
            lr,
            loss,
            reward,
            pass_rate: passed as f64 / signal.max(1) as f64,
            samples: comps.len(),
            no_signal: comps.len() - signal,
            error_kinds,
            grad_norm,
            tokens_generated: comps.iter().map(|c| c.token_ids.len()).sum(),
            seconds,
        })
    }
}

/// The device a run config asks for, after `auto`.
pub fn device_of(cfg: &RunConfig) -> Device {
    crate::model::device::parse_device(&cfg.model.device.to_string()).unwrap_or(Device::Cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_name_the_function_when_the_task_does_not() {
        let mut t = Task {
            id: "mbpp/1".into(),
            prompt: "Find the smallest n items.".into(),
            entry_point: "small_nnum".into(),
            tests: vec!["assert small_nnum([1], 1) == [1]".into()],
            kind: Default::default(),
            canonical_solution: None,
            docs: None,
            tags: vec![],
            test_setup: None,
        };
        let p = task_prompt("Solve:", &t);
        assert_eq!(
            p,
            "Solve:\n\nFind the smallest n items.\nThe function must be named `small_nnum`."
        );
        assert!(!p.contains("assert"), "no test is shown");
        t.prompt = "def small_nnum(xs, n):\n    \"\"\"...\"\"\"\n".into();
        assert!(!task_prompt("Solve:", &t).contains("must be named"));
    }

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
