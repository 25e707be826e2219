//! The meta step: FALCON's Algorithm 1 over one task batch. θ's samples
//! (line 8) and, per task, fast weights θ_i adapted on the task's own
//! samples, short-term rows and long-term demonstrations (lines 9–11), θ_i
//! evaluated on the task (line 12), and the outer update from the query
//! losses (line 14): second-order MAML, first-order MAML or Reptile, as
//! `[meta] algorithm` says; with `[meta] batch_tasks`, the K query losses in
//! one batched pass. The outcomes go to both memories.

use std::collections::BTreeMap;
use std::time::Instant;

use tch::Tensor;

use crate::config::{MetaAlgorithm, MetaPrompt, TrainConfig};
use crate::memory::long_term::{Experience, Retrieved};
use crate::model::vllm::{row_seed, Row};
use crate::model::Policy;
use crate::reward::answer_code;
use crate::rollout::{falcon_prompts, task_prompt};
use crate::task::Task;
use crate::train::batch::Rollout;
use crate::train::events::StepRecord;
use crate::train::maml::{
    adapt, carry_back, meta_backward, query_gradients, reptile_update, Adapted, InnerLoop,
    PieceLoss, Weights,
};
use crate::train::memories::{demonstrations, OwnedSeq};
use crate::train::metrics::JsonlWriter;
use crate::train::optim::{clip_grad_norm, zero_grad};
use crate::train::shard;
use crate::train::state::mix;
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
            let (table7, hits) = falcon_prompts(lt, tasks, &s.cfg.memory)
                .map_err(|e| TrainError::Invalid(format!("long-term memory: {e}")))?;
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

/// Line 12: `q` samples of `task` (from `seed`) with its fast weights
/// swapped in, by this rank alone and scored with `P_error` as θ's samples
/// left it (the step observes every task's afterwards); the seconds they
/// took are added to `outside` (they are not the update's).
fn sample_at(
    s: &mut TrainState,
    fast: &Weights,
    task: &Task,
    prompts: &[String],
    (q, seed): (usize, u64),
    seconds: &mut BTreeMap<String, f64>,
    outside: &mut f64,
) -> Result<Rollout, TrainError> {
    let before: f64 = seconds.values().sum();
    let qr = if s.engine.is_some() {
        // The vLLM engine serves θ_i as an adapter of its own.
        sample_all_on_engine(s, &[(fast, task, prompts, seed)], q, seconds).map(|mut v| v.remove(0))
    } else {
        let mut slot: Weights = fast
            .iter()
            .map(|(n, x)| (n.clone(), x.shallow_clone()))
            .collect();
        s.policy.swap_adapters(&mut slot)?;
        let qr = s.sample_alone(&[task], prompts, q, seed, seconds);
        s.policy.swap_adapters(&mut slot)?;
        qr
    };
    *outside += seconds.values().sum::<f64>() - before;
    qr
}

/// Line 12 for several tasks on the vLLM engine: each task's fast weights
/// θ_i loaded as its own adapter, and every task's `q` samples (task i's
/// seeded from its `seed`) sent together, so the server batches the K
/// adapters at once; then unloaded. Run and scored by this rank alone,
/// as [`sample_at`].
fn sample_all_on_engine(
    s: &mut TrainState,
    each: &[(&Weights, &Task, &[String], u64)],
    q: usize,
    seconds: &mut BTreeMap<String, f64>,
) -> Result<Vec<Rollout>, TrainError> {
    let params = crate::rollout::generation_params(&s.cfg.generation, 0);
    let t0 = Instant::now();
    let step = s.step;
    let engine = s.engine.as_mut().expect("called with an engine");
    let mut names = Vec::with_capacity(each.len());
    let mut ids = Vec::with_capacity(each.len());
    for (k, (fast, _, prompts, _)) in each.iter().enumerate() {
        let name = format!("fast-s{step}-t{k}");
        engine.load_extra(s.policy, fast, &name)?;
        names.push(name);
        ids.push(engine.encode(prompts, &params)?);
    }
    let mut rows = Vec::with_capacity(each.len() * q);
    for (k, (_, _, _, seed)) in each.iter().enumerate() {
        for j in 0..q {
            rows.push(Row {
                model: &names[k],
                prompt: &ids[k][0],
                seed: Some(row_seed(*seed, j as u64)),
            });
        }
    }
    let comps = engine.generate_rows(&rows, &params);
    let unloaded = engine.unload_extra();
    let mut comps = comps?;
    unloaded?;
    *seconds.entry("generate".to_owned()).or_insert(0.0) += t0.elapsed().as_secs_f64();
    let mut out = Vec::with_capacity(each.len());
    for (_, task, _, _) in each.iter() {
        let rest = comps.split_off(q);
        out.push(s.score_alone(&[task], comps, q, seconds)?);
        comps = rest;
    }
    Ok(out)
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
    let mut seconds = BTreeMap::new();
    let g = t.group_size;
    // Line 8: generate with θ and record in short-term memory (after the
    // inner mini-batches are drawn, so they come from earlier steps).
    let support = s.sample(&tasks, &prompts, g, seed, &mut seconds)?;
    let q = if m.query_size == 0 { g } else { m.query_size };
    let inner = InnerLoop {
        steps: m.inner_steps,
        lr: m.inner_lr,
    };
    let second_order = m.algorithm == MetaAlgorithm::Maml;
    let theta = trainable(s.policy);
    zero_grad(&theta);
    let t_update = Instant::now();
    let mut loss: BTreeMap<String, f64> = BTreeMap::new();
    let mut inner_first = 0.0;
    let mut adapted = Vec::new();
    let mut queries: Vec<Rollout> = Vec::with_capacity(tasks.len());
    let support_seqs = support.seqs();
    let mut outside = 0.0;
    // This rank's tasks (all of them on one process).
    let local = shard::local(s.dist, tasks.len());
    if m.batch_tasks && m.inner_steps > 0 && m.algorithm != MetaAlgorithm::Reptile {
        // Line 9 for every task first: what short-term memory and the
        // demonstrations give a task does not depend on other tasks'
        // adaptations, so the draws are the loop's own.
        let extras = all_extras(s, &tasks, &hits)?;
        let batches: Vec<Vec<UpdateSeq>> = local
            .clone()
            .map(|i| inner_batch(&support_seqs[i * g..(i + 1) * g], &extras[i]))
            .collect();
        let inner_loss_of = |i: usize| loss_of(&batches[i - local.start], &t);
        // Lines 10–12 per task: adapt, then sample with θ_i.
        let mut ads: Vec<Adapted> = Vec::with_capacity(local.len());
        let on_engine = s.engine.is_some();
        if on_engine {
            // On vLLM, every θ_i first, then their samples in one batch.
            for i in local.clone() {
                let ad = adapt(s.policy, &theta, &inner, inner_loss_of(i))?;
                inner_first += ad.losses.first().copied().unwrap_or(0.0) / tasks.len() as f64;
                ads.push(ad);
            }
            let before: f64 = seconds.values().sum();
            let each: Vec<(&Weights, &Task, &[String], u64)> = local
                .clone()
                .zip(&ads)
                .map(|(i, ad)| (&ad.fast, tasks[i], &prompts[i..=i], mix(seed, i as u64 + 1)))
                .collect();
            queries = sample_all_on_engine(s, &each, q, &mut seconds)?;
            outside += seconds.values().sum::<f64>() - before;
        }
        for i in local.clone().filter(|_| !on_engine) {
            let task = tasks[i];
            let ad = adapt(s.policy, &theta, &inner, inner_loss_of(i))?;
            inner_first += ad.losses.first().copied().unwrap_or(0.0) / tasks.len() as f64;
            let seed_i = mix(seed, i as u64 + 1);
            let qr = sample_at(
                s,
                &ad.fast,
                task,
                &prompts[i..=i],
                (q, seed_i),
                &mut seconds,
                &mut outside,
            )?;
            queries.push(qr);
            ads.push(ad);
        }
        // Line 14: every task's query loss at its θ_i in one batched pass.
        let qs: Vec<Vec<UpdateSeq>> = queries.iter().map(Rollout::seqs).collect();
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
            carry_back(
                s.policy,
                &theta,
                &ads[k],
                &inner,
                second_order,
                inner_loss_of(local.start + k),
                v,
            )?;
        }
        for p in parts {
            add_terms(&mut loss, p);
        }
    } else {
        // Line 9: the task's own samples, short-term rows, and passing
        // neighbours from long-term memory.
        let extras = all_extras(s, &tasks, &hits)?;
        for i in local.clone() {
            let task = tasks[i];
            let batch = inner_batch(&support_seqs[i * g..(i + 1) * g], &extras[i]);
            let inner_loss = loss_of(&batch, &t);
            if m.inner_steps == 0 {
                // No adaptation (θ_i = θ): FALCON's memories and rewards in
                // a single-level update, the "without the meta-loop" arm.
                let parts = meta_backward(
                    s.policy,
                    &theta,
                    &Adapted::identity(&theta),
                    &inner,
                    false,
                    inner_loss,
                    inner_loss,
                )?;
                add_terms(&mut loss, parts);
                continue;
            }
            // Lines 10–11.
            let ad = adapt(s.policy, &theta, &inner, inner_loss)?;
            inner_first += ad.losses.first().copied().unwrap_or(0.0) / tasks.len() as f64;
            // Line 12: evaluate θ_i on T_i.
            let seed_i = mix(seed, i as u64 + 1);
            let qr = sample_at(
                s,
                &ad.fast,
                task,
                &prompts[i..=i],
                (q, seed_i),
                &mut seconds,
                &mut outside,
            )?;
            // Line 14: L_meta = Σ_i L_inner(θ_i) on the evaluation samples.
            let qs = qr.seqs();
            let mut query_loss = loss_of(&qs, &t);
            let parts = match m.algorithm {
                MetaAlgorithm::Reptile => {
                    // Logged only: Reptile's update does not use the query loss.
                    let parts = tch::no_grad(|| {
                        s.policy
                            .with_adapters(&ad.fast, |p| query_loss(p, &mut |_| Ok(())))
                    })??;
                    adapted.push(ad.fast);
                    parts
                }
                _ => meta_backward(
                    s.policy,
                    &theta,
                    &ad,
                    &inner,
                    second_order,
                    inner_loss,
                    query_loss,
                )?,
            };
            drop(qs);
            add_terms(&mut loss, parts);
            queries.push(qr);
        }
    }
    if m.inner_steps > 0 {
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
    let lr = s.schedule.lr_at(s.step);
    let grad_norm = if m.algorithm == MetaAlgorithm::Reptile {
        reptile_update(&theta, &adapted, m.reptile_eps)?;
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
    seconds.insert(
        "update".to_owned(),
        (t_update.elapsed().as_secs_f64() - outside).max(0.0),
    );
    // Outcomes go to both memories.
    let mem = s.memory.as_mut().expect("meta runs have memory");
    mem.remember_samples(&support)?;
    for qr in &queries {
        mem.remember_samples(qr)?;
    }
    // Long-term memory records the evaluated samples: θ_i's, or θ's own
    // when there is no adaptation (inner_steps = 0).
    let evaluated: Vec<(&Rollout, &[&Task])> = if queries.is_empty() {
        vec![(&support, &tasks[..])]
    } else {
        queries
            .iter()
            .enumerate()
            .map(|(i, qr)| (qr, &tasks[i..=i]))
            .collect()
    };
    let mut experiences = Vec::new();
    for (ro, ts) in evaluated {
        for (j, c) in ro.comps.iter().enumerate() {
            let task = ts[j / ro.group];
            experiences.push(Experience {
                step: s.step + 1,
                task_id: task.id.clone(),
                task_text: task.prompt.clone(),
                code: answer_code(&c.text, c.cut_off()).1.to_owned(),
                report: ro.reports[j].clone(),
                rewards: ro.breakdowns[j]
                    .as_ref()
                    .map(|b| b.terms.clone())
                    .unwrap_or_default(),
            });
        }
    }
    if let Some(lt) = mem.long_term.as_mut() {
        lt.insert(&experiences)
            .map_err(|e| TrainError::Invalid(format!("long-term memory: {e}")))?;
    }
    let mut logged: Vec<(&Rollout, &[&Task])> = vec![(&support, &tasks)];
    logged.extend(
        queries
            .iter()
            .enumerate()
            .map(|(i, qr)| (qr, &tasks[i..=i])),
    );
    s.log_samples(samples_log, &logged)?;
    let mut all: Vec<&Rollout> = vec![&support];
    all.extend(queries.iter());
    Ok(s.record(lr, loss, grad_norm, &all, seconds))
}
