//! The single-level RL step (the baseline the meta-step wraps): the step's
//! tasks → zero-shot prompts (or the rollout strategy's) → `group_size`
//! samples each → sandbox → rewards by name → advantages → losses →
//! optimizer step.

use std::time::Instant;

use crate::rollout::task_prompt;
use crate::train::events::StepRecord;
use crate::train::metrics::JsonlWriter;
use crate::train::scoring::{execute, generate, log_samples, record, score, start_next};
use crate::train::shard;
use crate::train::timer::Timer;
use crate::train::update::update;
use crate::train::{TrainError, TrainState};

/// One single-level step; its samples go to `samples_log`.
pub fn step(
    s: &mut TrainState,
    samples_log: &mut Option<JsonlWriter>,
) -> Result<StepRecord, TrainError> {
    let t = s.cfg.train.clone();
    let seed = s.step_seed();
    // Dropout and anything else on libtorch's global generator.
    tch::manual_seed(seed as i64);
    let tasks = s.step_tasks();
    let prompts: Vec<String> = tasks
        .iter()
        .map(|task| task_prompt(&t.instruction, task))
        .collect();
    let mut timer = Timer::default();
    let share = shard::local(s.dist, tasks.len());
    let generated = generate(s, &tasks, &prompts, t.group_size, seed, share, &mut timer)?;
    let (generated, ran) = execute(s, &tasks, generated, &mut timer)?;
    s.observe_errors(&ran.reports);
    let batch = score(s, generated, ran, &mut timer)?;
    // Overlap: the servers generate the next step's rollouts with these
    // weights while this step updates them.
    start_next(s, &mut timer)?;

    let t0 = Instant::now();
    let lr = s.schedule.lr_at(s.step);
    // Completions from vLLM carry its log-probs: compared with the update's
    // own every step (and the policy gradient reweighted with a TIS cap).
    let checked = s.engine.is_some();
    let up = update(
        s.policy,
        s.optimizer.as_mut(),
        &t,
        &batch.seqs_with(checked),
        lr,
        &t.loss,
        s.dist,
        s.cfg.dist.bucket_bytes(),
        s.cfg.rollout.vllm.tis_cap,
    )?;
    timer.add_since("update", t0);
    log_samples(s.step, samples_log, &[(&batch, &tasks)])?;
    let mut rec = record(s.step, lr, up.loss, up.grad_norm, &[&batch], timer);
    rec.mismatch = up.mismatch;
    Ok(rec)
}
