//! The meta step: FALCON's Algorithm 1 over one task batch. θ's samples
//! (line 8) and, per task, fast weights θ_i adapted on the task's own
//! samples, short-term rows and long-term demonstrations (lines 9–11), θ_i
//! evaluated on the task (line 12), and the outer update from the query
//! losses (line 14): second-order MAML, first-order MAML or Reptile, as
//! `[meta] algorithm` says; with `[meta] batch_tasks`, the K query losses in
//! one batched pass. The outcomes go to both memories.

use std::collections::BTreeMap;

use tch::Tensor;

use crate::config::{MetaAlgorithm, MetaConfig, MetaPrompt, TrainConfig};
use crate::memory::long_term::Retrieved;
use crate::model::Policy;
use crate::rollout::{falcon_prompts, task_prompt};
use crate::task::Task;
use crate::train::events::StepRecord;
use crate::train::maml::{
    adapt, carry_back, meta_backward, query_gradients, reptile_update, Adapted, InnerLoop,
    PieceLoss, Weights,
};
use crate::train::meta_memory::{demonstrations, OwnedSeq};
use crate::train::metrics::JsonlWriter;
use crate::train::optim::{clip_grad_norm, zero_grad};
use crate::train::scored::ScoredBatch;
use crate::train::scoring::{execute, generate, generate_adapted, log_samples, record, score};
use crate::train::shard;
use crate::train::state::mix;
use crate::train::timer::Timer;
use crate::train::update::{add_terms, seqs_loss, seqs_loss_batched, UpdateSeq};
use crate::train::{trainable, TrainError, TrainState};

/// Prompts of the step: FALCON's Table 7 with the retrieved history when
/// long-term memory is on (unless `[meta] prompt = "zero-shot"`), else
/// zero-shot; and each task's retrieved neighbours (none without long-term
/// memory), which also supply the demonstrations.
fn prompts(
    s: &mut TrainState,
    tasks: &[&Task],
) -> Result<(Vec<String>, Vec<Vec<Retrieved>>), TrainError> {
    let instruction = &s.cfg.train.instruction;
    let zero_shot =
        || -> Vec<String> { tasks.iter().map(|t| task_prompt(instruction, t)).collect() };
    let mem = s.memory.as_mut().expect("meta runs have memory");
    match mem.long_term.as_mut() {
        Some(lt) => {
            let (table7, hits) =
                falcon_prompts(lt, tasks, &s.cfg.memory).map_err(TrainError::LongTerm)?;
            let prompts = match s.cfg.meta.prompt {
                MetaPrompt::Table7 => table7,
                MetaPrompt::ZeroShot => zero_shot(),
            };
            Ok((prompts, hits))
        }
        None => Ok((zero_shot(), vec![Vec::new(); tasks.len()])),
    }
}

/// Line 9 beyond the task's own samples: rows drawn from short-term
/// memory and passing neighbours from long-term memory as demonstrations.
fn inner_extra(
    s: &mut TrainState,
    task: &Task,
    hits: &[Retrieved],
) -> Result<Vec<OwnedSeq>, TrainError> {
    let m = &s.cfg.meta;
    let mut extra = s
        .memory
        .as_mut()
        .expect("meta runs have memory")
        .draw(m.short_term_samples);
    extra.extend(demonstrations(
        s.policy,
        &s.cfg.train.instruction,
        hits,
        task,
        m.long_term_demos,
    )?);
    Ok(extra)
}

/// Line 9's extra rows for every task of the step, in task order: every
/// rank draws them all, so the short-term buffer's draws (and its random
/// stream) are the same whichever rank adapts a task.
fn all_extras(
    s: &mut TrainState,
    tasks: &[&Task],
    hits: &[Vec<Retrieved>],
) -> Result<Vec<Vec<OwnedSeq>>, TrainError> {
    let mut out = Vec::with_capacity(tasks.len());
    for (i, task) in tasks.iter().enumerate() {
        out.push(inner_extra(s, task, &hits[i])?);
    }
    Ok(out)
}

/// A task's inner mini-batch: its own samples, then `extra`.
fn inner_batch<'a>(own: &[UpdateSeq<'a>], extra: &'a [OwnedSeq]) -> Vec<UpdateSeq<'a>> {
    let mut batch = own.to_vec();
    batch.extend(extra.iter().map(OwnedSeq::as_seq));
    batch
}

/// The on-policy loss of `seqs` under `[train]`'s settings, in pieces
/// ([`seqs_loss`]): `L_inner` of Algorithm 1, on support or query samples.
fn loss_of<'a>(seqs: &'a [UpdateSeq<'a>], t: &'a TrainConfig) -> impl PieceLoss + Copy + 'a {
    move |p: &mut Policy, sink: &mut dyn FnMut(Tensor) -> Result<(), TrainError>| {
        seqs_loss(
            p,
            seqs,
            t.micro_batch,
            t.normalization,
            &t.loss,
            t.shared_prefix,
            sink,
        )
    }
}

/// Line 12: `q` samples of each `(θ_i, task, prompt, seed)`, by this rank
/// alone, run and scored with `P_error` as θ's samples left it (the step
/// observes every task's afterwards, once every rank's are in).
fn query_samples(
    s: &mut TrainState,
    each: &[(&Weights, &Task, &String, u64)],
    q: usize,
    timer: &mut Timer,
) -> Result<Vec<ScoredBatch>, TrainError> {
    let generated = generate_adapted(s, each, q, timer)?;
    let mut out = Vec::with_capacity(each.len());
    for (gen, (_, task, _, _)) in generated.into_iter().zip(each) {
        let (gen, ran) = execute(s, &[task], gen, timer)?;
        out.push(score(s, gen, ran, timer)?);
    }
    Ok(out)
}

/// How this step runs Algorithm 1 (`[meta]`): the inner loop, the query
/// size, and whether the K query losses go in one batched pass.
struct Plan {
    inner: InnerLoop,
    q: usize,
    second_order: bool,
    reptile: bool,
    /// `[meta] batch_tasks`: every θ_i first, then one batched meta-loss
    /// (Reptile and `inner_steps = 0` have no query loss to batch).
    batched: bool,
    /// Batched on the vLLM engine: the K query generations wait for every
    /// θ_i and go to the servers as one batch of K adapters.
    defer_queries: bool,
}

impl Plan {
    fn of(m: &MetaConfig, group: usize, on_engine: bool) -> Self {
        let batched = m.batch_tasks && m.inner_steps > 0 && m.algorithm != MetaAlgorithm::Reptile;
        Plan {
            inner: InnerLoop {
                steps: m.inner_steps,
                lr: m.inner_lr,
            },
            q: if m.query_size == 0 {
                group
            } else {
                m.query_size
            },
            second_order: m.algorithm == MetaAlgorithm::Maml,
            reptile: m.algorithm == MetaAlgorithm::Reptile,
            batched,
            defer_queries: batched && on_engine,
        }
    }
}

/// One meta-step of Algorithm 1 over the step's task batch; its samples
/// (θ's and each θ_i's) go to `samples_log`.
pub fn step(
    s: &mut TrainState,
    samples_log: &mut Option<JsonlWriter>,
) -> Result<StepRecord, TrainError> {
    let t = s.cfg.train.clone();
    let m = s.cfg.meta.clone();
    let seed = s.step_seed();
    tch::manual_seed(seed as i64);
    let tasks = s.step_tasks();
    let (prompts, hits) = prompts(s, &tasks)?;
    let mut timer = Timer::default();
    let g = t.group_size;
    let plan = Plan::of(&m, g, s.engine.is_some());

    // Line 8: samples of every task with θ; P_error sees them first.
    let share = shard::local(s.dist, tasks.len());
    let generated = generate(s, &tasks, &prompts, g, seed, share, &mut timer)?;
    let (generated, ran) = execute(s, &tasks, generated, &mut timer)?;
    s.observe_errors(&ran.reports);
    let support = score(s, generated, ran, &mut timer)?;

    let theta = trainable(s.policy);
    zero_grad(&theta);
    let update = timer.span();
    // Line 9: each task's inner mini-batch, its own samples, short-term
    // rows and passing neighbours from long-term memory (this step's
    // samples join memory at its end, so the rows come from earlier steps).
    let extras = all_extras(s, &tasks, &hits)?;
    let support_seqs = support.seqs();
    let local = shard::local(s.dist, tasks.len());
    let batches: Vec<Vec<UpdateSeq>> = local
        .clone()
        .map(|i| inner_batch(&support_seqs[i * g..(i + 1) * g], &extras[i]))
        .collect();
    let inner_loss_of = |k: usize| loss_of(&batches[k], &t);
    let mut loss: BTreeMap<String, f64> = BTreeMap::new();
    let mut inner_first = 0.0;
    let mut ads: Vec<Adapted> = Vec::new();
    let mut queries: Vec<ScoredBatch> = Vec::with_capacity(tasks.len());
    let mut reptile_fast: Vec<Weights> = Vec::new();
    for (k, i) in local.clone().enumerate() {
        if plan.inner.steps == 0 {
            // θ_i = θ: FALCON's memories and rewards in a single-level
            // update (the "without the meta-loop" arm); no query samples.
            let identity = Adapted::identity(&theta);
            let inner = inner_loss_of(k);
            let parts = meta_backward(
                s.policy,
                &theta,
                &identity,
                &plan.inner,
                false,
                inner,
                inner,
            )?;
            add_terms(&mut loss, parts);
            continue;
        }
        // Lines 10–11: θ_i from θ on the inner mini-batch.
        let ad = adapt(s.policy, &theta, &plan.inner, inner_loss_of(k))?;
        inner_first += ad.losses.first().copied().unwrap_or(0.0) / tasks.len() as f64;
        if plan.defer_queries {
            ads.push(ad);
            continue;
        }
        // Line 12: evaluate θ_i on T_i.
        let each = [(&ad.fast, tasks[i], &prompts[i], mix(seed, i as u64 + 1))];
        let query = query_samples(s, &each, plan.q, &mut timer)?.remove(0);
        if !plan.batched {
            // Line 14 for this task: L_inner(θ_i) on its query samples.
            let qs = query.seqs();
            let losses = (inner_loss_of(k), loss_of(&qs, &t));
            let parts = task_meta_loss(s, &plan, &theta, ad, losses, &mut reptile_fast)?;
            add_terms(&mut loss, parts);
        } else {
            ads.push(ad);
        }
        queries.push(query);
    }
    if plan.defer_queries {
        let each: Vec<(&Weights, &Task, &String, u64)> = local
            .clone()
            .zip(&ads)
            .map(|(i, ad)| (&ad.fast, tasks[i], &prompts[i], mix(seed, i as u64 + 1)))
            .collect();
        queries = query_samples(s, &each, plan.q, &mut timer)?;
    }
    if plan.batched {
        // Line 14: L_meta = Σ_i L_inner(θ_i), every task's query loss at its
        // θ_i in one batched pass, each carried back to θ.
        let qs: Vec<Vec<UpdateSeq>> = queries.iter().map(ScoredBatch::seqs).collect();
        let qrefs: Vec<&[UpdateSeq]> = qs.iter().map(Vec::as_slice).collect();
        let ad_refs: Vec<&Adapted> = ads.iter().collect();
        let (vs, parts) = query_gradients(s.policy, &ad_refs, |p, fast, sink| {
            seqs_loss_batched(
                p,
                &qrefs,
                fast,
                t.micro_batch,
                t.normalization,
                &t.loss,
                sink,
            )
        })?;
        for (k, v) in vs.into_iter().enumerate() {
            let (inner, order) = (&plan.inner, plan.second_order);
            carry_back(s.policy, &theta, &ads[k], inner, order, inner_loss_of(k), v)?;
        }
        for p in parts {
            add_terms(&mut loss, p);
        }
    }
    if plan.inner.steps > 0 {
        loss.insert("inner".into(), inner_first);
    }
    // The ranks' tasks together: the loss terms and gradients add up to the
    // one-process step's; every rank then holds every task's query samples.
    let loss = shard::sum_terms(s.dist, loss)?;
    let queries = shard::gather(s.dist, queries)?;
    // Line 12's outcomes join `P_error` now, in task order (each task's
    // query rewards used it as the support samples left it).
    for qr in &queries {
        s.observe_errors(&qr.reports);
    }

    // Line 14: the outer update.
    let lr = s.schedule.lr_at(s.step);
    let grad_norm = if plan.reptile {
        reptile_update(&theta, &reptile_fast, m.reptile_eps)?;
        0.0
    } else {
        shard::sum_grads(s.dist, &theta, s.cfg.dist.bucket_bytes())?;
        let n = clip_grad_norm(&theta, t.grad_clip);
        if n.is_finite() {
            s.optimizer.step(&theta, lr)?;
        }
        zero_grad(&theta);
        n
    };
    timer.end_span("update", update);

    // Outcomes go to both memories.
    let mem = s.memory.as_mut().expect("meta runs have memory");
    mem.write_back(s.step + 1, &tasks, &support, &queries)?;
    let mut logged: Vec<(&ScoredBatch, &[&Task])> = vec![(&support, &tasks)];
    logged.extend(queries.iter().zip(tasks.chunks(1)));
    log_samples(s.step, samples_log, &logged)?;
    let mut all: Vec<&ScoredBatch> = vec![&support];
    all.extend(queries.iter());
    Ok(record(s.step, lr, loss, grad_norm, &all, timer))
}

/// Line 14 for one task: its query loss at θ_i carried back to θ (first or
/// second order); Reptile only logs the query loss and keeps θ_i, for its
/// move of θ toward the mean θ_i.
fn task_meta_loss(
    s: &mut TrainState,
    plan: &Plan,
    theta: &[(String, Tensor)],
    ad: Adapted,
    (inner_loss, mut query_loss): (impl PieceLoss, impl PieceLoss),
    reptile_fast: &mut Vec<Weights>,
) -> Result<BTreeMap<String, f64>, TrainError> {
    if plan.reptile {
        let parts = tch::no_grad(|| {
            s.policy
                .with_adapters(&ad.fast, |p| query_loss(p, &mut |_| Ok(())))
        })??;
        reptile_fast.push(ad.fast);
        return Ok(parts);
    }
    let (inner, order) = (&plan.inner, plan.second_order);
    meta_backward(s.policy, theta, &ad, inner, order, inner_loss, query_loss)
}
