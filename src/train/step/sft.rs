//! The SFT step (`falcon sft`): cross-entropy on the reference solutions of
//! the step's tasks, each answer formatted as the RL prompts ask (one
//! ```python block) and closed by the chat template's end of turn. Nothing
//! is generated or scored.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::config::LossWeights;
use crate::rollout::task_prompt;
use crate::train::events::StepRecord;
use crate::train::update::{sft_example, update, UpdateSeq};
use crate::train::{TrainError, TrainState};

/// The loss weights of SFT: `L_sl` alone, on every example.
const SFT_LOSS: LossWeights = LossWeights {
    pg: 0.0,
    fine: 0.0,
    sl: 1.0,
    kl: 0.0,
};

/// One SFT step over `tasks_per_step` reference solutions.
pub fn step(s: &mut TrainState) -> Result<StepRecord, TrainError> {
    let t = s.cfg.train.clone();
    tch::manual_seed(s.step_seed() as i64);
    let tasks = s.step_tasks();
    let t0 = Instant::now();
    let mut examples: Vec<(Vec<i64>, Vec<i64>)> = Vec::with_capacity(tasks.len());
    for task in &tasks {
        let solution = task.canonical_solution.as_deref().unwrap_or_default();
        examples.push(sft_example(
            s.policy,
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
            rollout_logprobs: &[],
        })
        .collect();
    let lr = s.schedule.lr_at(s.step);
    let up = update(
        s.policy,
        s.optimizer.as_mut(),
        &t,
        &seqs,
        lr,
        &SFT_LOSS,
        s.dist,
        s.cfg.dist.bucket_bytes(),
        0.0,
    )?;
    let (loss, grad_norm) = (up.loss, up.grad_norm);
    let mut seconds = BTreeMap::new();
    seconds.insert("update".to_owned(), t0.elapsed().as_secs_f64());
    Ok(StepRecord {
        step: s.step,
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
        mismatch: BTreeMap::new(),
    })
}
