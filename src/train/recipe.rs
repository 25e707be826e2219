//! The recipe (torchtune's shape, STYLE.md §5): given a [`TrainState`],
//! run the remaining steps of its [`Recipe`], reading top to bottom:
//! held-out evaluation before, then per step the step function, its line in
//! `metrics.jsonl` and TensorBoard, a checkpoint when due, a periodic
//! evaluation when due, the time budget; and the evaluation after.

use std::time::Instant;

use super::events::{Observer, StepRecord};
use super::metrics::{EventWriter, JsonlWriter};
use super::state::EVAL_TAG_PREFIX;
use super::{step, Recipe, TrainError, TrainState};
use crate::dist::Reduce;
use crate::eval::{evaluate, EvalSpec};
use crate::task::Task;

/// Run the remaining steps of `s`'s recipe, with its evaluations; returns
/// this session's records.
pub fn run(s: &mut TrainState, observer: &mut dyn Observer) -> Result<Vec<StepRecord>, TrainError> {
    let steps = s.cfg.train.steps;
    // A new event file per session: TensorBoard drops points whose step
    // went backwards, so a resumed run needs no trimming here.
    // Rank 0 alone writes the run's files (metrics, TensorBoard, samples,
    // checkpoints, evaluations); every rank computes the same records.
    let main = s.dist.is_main();
    let mut events = if main {
        Some(EventWriter::create(&s.run_dir.tensorboard())?)
    } else {
        None
    };
    let t = &s.cfg.train;
    if (t.eval_before || t.eval_after || t.eval_every > 0) && s.eval_tasks.is_none() {
        // Before training, not after the first hour of it.
        return Err(TrainError::Invalid(
            "[train] eval_before / eval_after / eval_every need [eval] tasks".into(),
        ));
    }
    let eval_every = s.cfg.train.eval_every;
    let periodic = |step: u64| eval_every > 0 && step > 0 && step.is_multiple_of(eval_every);
    // Each evaluation once: a session killed before its result was
    // written evaluates again, one killed after does not.
    let before_due = ((s.cfg.train.eval_before && s.step == 0) || periodic(s.step))
        && !s.run_dir.eval(s.step).exists();
    if rank0_says(s, before_due)? {
        evaluate_into(s, events.as_mut(), observer)?;
    }
    // The time budget counts training only, not the evaluation before,
    // and carries over resumes: time since the last checkpoint of a killed
    // session is lost along with its steps, which are redone.
    let session = Instant::now();
    let before = s.train_seconds;
    let budget = s.cfg.train.max_minutes;
    let spent = |secs: f64| budget > 0.0 && secs >= budget * 60.0;
    let mut eval_seconds = 0.0;
    if spent(before) && s.step < steps {
        observer.on_message(&format!(
            "the {budget} minute budget ([train] max_minutes) was spent before this session \
             ({before:.0} s of training up to step {}); nothing left to train",
            s.step
        ));
    }
    observer.on_start(s.step, steps);
    let (mut metrics, mut samples_log) = if main {
        (
            Some(JsonlWriter::open(&s.run_dir.metrics())?),
            Some(JsonlWriter::open(&s.run_dir.samples())?),
        )
    } else {
        (None, None)
    };
    let mut out = Vec::new();
    while s.step < steps && !spent(s.train_seconds) {
        s.rewards.new_step();
        let rec = match s.recipe {
            Recipe::Rl => step::rl::step(s, &mut samples_log)?,
            Recipe::Meta(_) => step::meta::step(s, &mut samples_log)?,
            Recipe::Sft => step::sft::step(s)?,
        };
        if let (Some(metrics), Some(events)) = (metrics.as_mut(), events.as_mut()) {
            metrics.write(&rec)?;
            events.scalars(
                rec.step as i64,
                &rec.scalars()
                    .iter()
                    .map(|(k, v)| (k.as_str(), *v as f32))
                    .collect::<Vec<_>>(),
            )?;
            events.flush()?;
        }
        observer.on_step(&rec);
        out.push(rec);
        s.step += 1;
        // The slowest rank's clock, so every rank stops at the same step.
        let mut secs = [before + session.elapsed().as_secs_f64() - eval_seconds];
        s.dist.all_reduce_f64(&mut secs, Reduce::Max)?;
        s.train_seconds = secs[0];
        let every = s.cfg.train.checkpoint_every;
        let out_of_time = spent(s.train_seconds);
        if main && (s.step.is_multiple_of(every) || s.step == steps || out_of_time) {
            let d = s.save_checkpoint()?;
            observer.on_message(&format!("checkpoint {}", d.display()));
        }
        if rank0_says(s, periodic(s.step) && !s.run_dir.eval(s.step).exists())? {
            let t0 = Instant::now();
            evaluate_into(s, events.as_mut(), observer)?;
            eval_seconds += t0.elapsed().as_secs_f64();
        }
        if out_of_time && s.step < steps {
            observer.on_message(&format!(
                "stopping after step {}: the {budget} minute budget ([train] max_minutes) is spent",
                s.step
            ));
            break;
        }
    }
    if rank0_says(
        s,
        s.cfg.train.eval_after && !s.run_dir.eval(s.step).exists(),
    )? {
        evaluate_into(s, events.as_mut(), observer)?;
    }
    Ok(out)
}

/// Evaluate the policy as it is now on `[eval]`'s tasks (set with
/// [`TrainState::with_eval_tasks`]), write `eval/step-N.json` and the
/// `eval/*` scalars, and hand the result to the observer.
/// Rank 0's `answer`, on every rank: whether an evaluation is due reads
/// rank 0's run directory, which the others may see late (or not at all),
/// and every rank must take the same branch to meet at its barrier.
fn rank0_says(s: &TrainState, answer: bool) -> Result<bool, TrainError> {
    if s.dist.world() == 1 {
        return Ok(answer);
    }
    let all = s.dist.all_gather_bytes(&[answer as u8])?;
    Ok(all[0].first() == Some(&1))
}

/// In a data-parallel run rank 0 evaluates (the others wait for it, within
/// `[dist] timeout_s`); `events` is rank 0's.
fn evaluate_into(
    s: &mut TrainState,
    events: Option<&mut EventWriter>,
    observer: &mut dyn Observer,
) -> Result<(), TrainError> {
    let done = match events {
        Some(events) => evaluate_main(s, events, observer),
        None => Ok(()),
    };
    // One collective on every rank: the others wait here for rank 0, and
    // learn whether its evaluation failed.
    super::shard::agree(s.dist, done, "the evaluation")
}

fn evaluate_main(
    s: &mut TrainState,
    events: &mut EventWriter,
    observer: &mut dyn Observer,
) -> Result<(), TrainError> {
    let Some(tasks) = s.eval_tasks else {
        return Err(TrainError::Invalid(
            "[train] eval_before / eval_after / eval_every need [eval] tasks".into(),
        ));
    };
    let tasks: Vec<&Task> = tasks.iter().collect();
    // Evaluated where rollouts are generated (the vLLM engine, synced).
    s.sync_engine(&mut Default::default())?;
    let spec = EvalSpec {
        instruction: &s.cfg.train.instruction,
        generation: &s.cfg.generation,
        eval: &s.cfg.eval,
        // One seed for every evaluation of the run, so before and after
        // see the same sampler noise (and `falcon eval` the same too).
        seed: crate::eval::seed_of(&s.cfg),
        prompts: None,
    };
    observer.on_message(&format!(
        "evaluating step {} on {} tasks ({} samples each)",
        s.step,
        tasks.len(),
        s.cfg.eval.n
    ));
    let result = evaluate(s.generator(), &tasks, s.sandbox, &spec, &mut |_, _| {})?;
    let path = s.run_dir.eval(s.step);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
    }
    // TensorBoard first, the result file last: a resume keeps an
    // evaluation's points only where its result is (see state::forget_after).
    let mut scalars: Vec<(String, f32)> = Vec::new();
    for (k, v) in &result.pass_at {
        scalars.push((format!("{EVAL_TAG_PREFIX}pass@{k}"), *v as f32));
    }
    for (k, v) in &result.exec_at {
        scalars.push((format!("{EVAL_TAG_PREFIX}exec@{k}"), *v as f32));
    }
    events.scalars(
        s.step as i64,
        &scalars
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect::<Vec<_>>(),
    )?;
    events.flush()?;
    crate::fsutil::write_atomic(
        &path,
        serde_json::to_string_pretty(&result)
            .expect("eval result serialises")
            .as_bytes(),
    )?;
    observer.on_eval(s.step, &path, &result);
    Ok(())
}
