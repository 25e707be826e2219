//! The single-level RL step (the baseline the meta-step wraps): the step's
//! tasks → zero-shot prompts (or the rollout strategy's) → `group_size`
//! samples each → sandbox → rewards by name → advantages → losses →
//! optimizer step.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::rollout::task_prompt;
use crate::train::events::StepRecord;
use crate::train::metrics::JsonlWriter;
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
    let mut seconds = BTreeMap::new();
    let ro = s.sample_or_collect(&tasks, &prompts, t.group_size, seed, &mut seconds)?;
    // Overlap: the servers generate the next step's rollouts with these
    // weights while this step updates them.
    s.start_next(&mut seconds)?;

    let t0 = Instant::now();
    let lr = s.schedule.lr_at(s.step);
    // Completions from vLLM carry its log-probs: compared with the update's
    // own every step (and the policy gradient reweighted with a TIS cap).
    let checked = s.engine.is_some();
    let up = update(
        s.policy,
        s.optimizer.as_mut(),
        &t,
        &ro.seqs_with(checked),
        lr,
        &t.loss,
        s.dist,
        s.cfg.dist.bucket_bytes(),
        s.cfg.rollout.vllm.tis_cap,
    )?;
    seconds.insert("update".to_owned(), t0.elapsed().as_secs_f64());
    s.log_samples(samples_log, &[(&ro, &tasks)])?;
    let mut rec = s.record(lr, up.loss, up.grad_norm, &[&ro], seconds);
    rec.mismatch = up.mismatch;
    Ok(rec)
}
