//! A step's samples as free functions the steps call in plain sight:
//! [`generate`] (the policy, the vLLM engine or the rollout strategy) →
//! [`execute`] (the sandbox; a data-parallel rank runs its share and the
//! ranks gather the whole) → [`score`] (rewards by name, group advantages,
//! fine-grained spans) → a [`ScoredBatch`] (`scored`). Also a meta-step's
//! samples with fast weights
//! ([`generate_adapted`]), the overlapped next generation ([`start_next`])
//! the step's lines in `samples.jsonl` ([`log_samples`]) and its
//! [`record`].

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Instant;

use super::advantage::advantages;
use super::events::StepRecord;
use super::maml::Weights;
use super::metrics::JsonlWriter;
use super::scored::{Executed, ScoredBatch};
use super::shard;
use super::state::TrainState;
use super::timer::Timer;
use super::TrainError;
use crate::exec::{ExecReport, RewardClass};
use crate::model::{Completion, Generator};
use crate::reward::{
    answer_code, execute as run_in_sandbox, CustomSample, CustomScores, CustomValue, Rewards,
};
use crate::rollout::{generation_params, reflection_params, task_prompt, Env, Strategy};
use crate::task::Task;

/// Completions not yet run: `group` per task for the tasks `share` of the
/// step's (all of them, except on a rank of a data-parallel run), with each
/// one's attempt chain when a repairing strategy wrote them.
pub struct Generated {
    pub group: usize,
    pub share: Range<usize>,
    pub comps: Vec<Completion>,
    pub attempts: Vec<Vec<String>>,
}

/// `g` completions per task of `tasks[share]` with the policy as it is now
/// (fast weights included), `prompts[i]` being `tasks[i]`'s: one batch of
/// `g` per prompt, row `k` of the whole step drawing from its own stream
/// wherever it runs. The rollout strategy, when `[train] strategy` names
/// one, writes its own prompts and answers every task; a generation the
/// previous step started for this one ([`start_next`]) is collected
/// instead.
pub fn generate(
    s: &mut TrainState,
    tasks: &[&Task],
    prompts: &[String],
    g: usize,
    seed: u64,
    share: Range<usize>,
    timer: &mut Timer,
) -> Result<Generated, TrainError> {
    let all = 0..tasks.len();
    if let Some((step, p)) = s.pending.take() {
        if step == s.step {
            let comps = timer.time("generate", || p.wait())?;
            return Ok(generated(g, all, comps));
        }
    }
    if let Some(mut r) = s.strategy.take() {
        let synced = s.sync_engine(timer);
        let solved = synced.and_then(|_| strategy_rollout(s, r.as_mut(), tasks, g, seed, timer));
        s.strategy = Some(r);
        let (comps, attempts) = solved?;
        return Ok(Generated {
            group: g,
            share: all,
            comps,
            attempts,
        });
    }
    let expanded: Vec<String> = prompts[share.clone()]
        .iter()
        .flat_map(|p| std::iter::repeat_n(p.clone(), g))
        .collect();
    let mut params = generation_params(&s.cfg.generation, seed);
    params.row_offset = (share.start * g) as u64;
    s.sync_engine(timer)?;
    let t0 = Instant::now();
    let comps = match s.engine.as_mut() {
        Some(e) => e.generate_or_restart(s.policy, s.step, &expanded, &params)?,
        None => s.policy.generate(&expanded, &params)?,
    };
    timer.add_since("generate", t0);
    Ok(generated(g, share, comps))
}

fn generated(group: usize, share: Range<usize>, comps: Vec<Completion>) -> Generated {
    Generated {
        group,
        share,
        comps,
        attempts: Vec::new(),
    }
}

/// `g` answers per task from the strategy `r` (its generation, guiding-
/// test runs and reflections count as `generate`), with each answer's
/// attempt chain. A repairing strategy takes the step as one chunk, so
/// what it learns here is retrieved from the next step on; MEMCoder
/// streams the step's tasks in order, evolving after each.
fn strategy_rollout(
    s: &TrainState,
    r: &mut dyn Strategy,
    tasks: &[&Task],
    g: usize,
    seed: u64,
    timer: &mut Timer,
) -> Result<(Vec<Completion>, Vec<Vec<String>>), TrainError> {
    let t0 = Instant::now();
    let params = generation_params(&s.cfg.generation, seed);
    let generator = s.generator();
    let env = Env::new(
        generator,
        generator,
        s.sandbox,
        &s.cfg.train.instruction,
        params,
        reflection_params(&s.cfg.generation, seed),
        tasks.len() * g,
        seed,
    );
    let solved = r.solve(&env, tasks, g, &mut |_, _| {})?;
    let mut comps = Vec::with_capacity(tasks.len() * g);
    let mut attempts = Vec::with_capacity(tasks.len() * g);
    for s in solved.into_iter().flatten() {
        comps.push(s.completion);
        attempts.push(s.attempts);
    }
    timer.add_since("generate", t0);
    Ok((comps, attempts))
}

/// Line 12 of Algorithm 1 for several tasks: `q` completions of each
/// `(θ_i, task, prompt, seed)` with its fast weights, by this rank alone.
/// On the vLLM engine each θ_i is an adapter of its own and all are
/// sampled in one batch; otherwise each is swapped into the policy in
/// turn.
pub fn generate_adapted(
    s: &mut TrainState,
    each: &[(&Weights, &Task, &String, u64)],
    q: usize,
    timer: &mut Timer,
) -> Result<Vec<Generated>, TrainError> {
    if let Some(engine) = s.engine.as_mut() {
        let params = generation_params(&s.cfg.generation, 0);
        let rows: Vec<crate::model::vllm::FastRow> = each
            .iter()
            .map(|(fast, _, prompt, seed)| (fast.as_slice(), prompt.as_str(), *seed))
            .collect();
        let tag = format!("s{}", s.step);
        let t0 = Instant::now();
        let mut comps = engine.generate_adapted(s.policy, &rows, q, &params, &tag)?;
        timer.add_since("generate", t0);
        let mut out = Vec::with_capacity(each.len());
        for _ in each {
            let rest = comps.split_off(q);
            out.push(generated(q, 0..1, comps));
            comps = rest;
        }
        return Ok(out);
    }
    let mut out = Vec::with_capacity(each.len());
    for (fast, task, prompt, seed) in each {
        let mut slot: Weights = fast
            .iter()
            .map(|(n, x)| (n.clone(), x.shallow_clone()))
            .collect();
        s.policy.swap_adapters(&mut slot)?;
        let one = generate(
            s,
            &[task],
            std::slice::from_ref(prompt),
            q,
            *seed,
            0..1,
            timer,
        );
        s.policy.swap_adapters(&mut slot)?;
        out.push(one?);
    }
    Ok(out)
}

/// Run `gen`'s completions in the sandbox, and through the custom reward
/// terms, and, when they are this rank's share of the step, gather every
/// rank's: all `tasks.len() × group` completions with their reports and
/// custom values, in task order.
pub fn execute(
    s: &TrainState,
    tasks: &[&Task],
    gen: Generated,
    timer: &mut Timer,
) -> Result<(Generated, Executed), TrainError> {
    let g = gen.group;
    let first = gen.share.start;
    let jobs: Vec<(&Task, &Completion)> = gen
        .comps
        .iter()
        .enumerate()
        .map(|(i, c)| (tasks[first + i / g], c))
        .collect();
    let reports = timer.time("exec", || run_in_sandbox(s.sandbox, &jobs));
    let custom = if s.rewards.has_custom() {
        let samples = CustomSample::batch(&jobs, &reports);
        timer.time("custom_reward", || s.rewards.custom(s.step, &samples))
    } else {
        vec![CustomScores::new(); reports.len()]
    };
    if gen.share.len() == tasks.len() {
        return Ok((gen, Executed { reports, custom }));
    }
    let t0 = Instant::now();
    let mine = gen.comps.into_iter().zip(reports.into_iter().zip(custom));
    let all = shard::gather(s.dist, mine.collect())?;
    timer.add_since("gather", t0);
    let (comps, ran): (Vec<Completion>, Vec<(ExecReport, CustomScores)>) = all.into_iter().unzip();
    let (reports, custom) = ran.into_iter().unzip();
    let whole = Generated {
        share: 0..tasks.len(),
        comps,
        ..gen
    };
    Ok((whole, Executed { reports, custom }))
}

/// Score every completion of `gen` (all of the tasks', in task order) from
/// its report: rewards with the run's `P_error` as it is now, group
/// advantages, and the tokens of failing lines.
pub fn score(
    s: &TrainState,
    gen: Generated,
    ran: Executed,
    timer: &mut Timer,
) -> Result<ScoredBatch, TrainError> {
    let Executed { reports, custom } = ran;
    let t0 = Instant::now();
    let g = gen.group;
    let comps = gen.comps;
    debug_assert_eq!(comps.len(), reports.len());
    let codes: Vec<&str> = comps
        .iter()
        .map(|c| answer_code(&c.text, c.cut_off()).1)
        .collect();
    let breakdowns = s
        .rewards
        .score(&reports, &codes, &s.error_stats.p_error(), &custom)?;
    let totals: Vec<Option<f64>> = breakdowns
        .iter()
        .map(|b| b.as_ref().map(|b| b.total))
        .collect();
    let group: Vec<usize> = (0..comps.len()).map(|i| i / g).collect();
    let t = &s.cfg.train;
    let adv = advantages(t.advantage, &totals, &group, t.normalize_std)?;
    let spans = Rewards::spans(s.policy.tokenizer()?, &comps, &reports)?;
    timer.add_since("reward", t0);
    Ok(ScoredBatch {
        group: g,
        comps,
        reports,
        breakdowns,
        adv,
        spans,
        attempts: gen.attempts,
        custom,
    })
}

/// With `[rollout.vllm] overlap`, start generating the next step's
/// rollouts with the weights as they are now (θ_t), to collect at the next
/// step while this one updates; nothing on the last step.
pub fn start_next(s: &mut TrainState, timer: &mut Timer) -> Result<(), TrainError> {
    let next = s.step + 1;
    if !s.cfg.rollout.vllm.overlap || s.engine.is_none() || next >= s.cfg.train.steps {
        return Ok(());
    }
    s.sync_engine(timer)?;
    let t = &s.cfg.train;
    let expanded: Vec<String> = s
        .tasks_at(next)
        .into_iter()
        .flat_map(|task| std::iter::repeat_n(task_prompt(&t.instruction, task), t.group_size))
        .collect();
    let params = generation_params(&s.cfg.generation, s.seed_at(next));
    let engine = s.engine.as_ref().expect("checked above");
    s.pending = Some((next, engine.spawn_generate(&expanded, &params)?));
    Ok(())
}

/// Every completion of each batch (whose samples belong to its tasks in
/// groups) with its report, rewards and advantage, to `samples.jsonl`, as
/// one append: a step's samples land whole or not at all. Only rank 0
/// holds a writer.
pub fn log_samples(
    step: u64,
    samples_log: &mut Option<JsonlWriter>,
    parts: &[(&ScoredBatch, &[&Task])],
) -> Result<(), TrainError> {
    let Some(samples_log) = samples_log else {
        return Ok(());
    };
    let mut lines = Vec::new();
    for (ro, tasks) in parts {
        for (i, c) in ro.comps.iter().enumerate() {
            let logged: BTreeMap<&str, f64> = ro
                .custom
                .get(i)
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| match v {
                    CustomValue::Value(x) if k.contains('/') => Some((k.as_str(), *x)),
                    _ => None,
                })
                .collect();
            let mut line = serde_json::json!({
                "step": step,
                "task_id": tasks[i / ro.group].id,
                "completion": c.text,
                "report": ro.reports[i],
                "rewards": ro.breakdowns[i].as_ref().map(|b| b.to_log("")),
                "advantage": ro.adv[i],
                "attempts": ro.attempts.get(i),
            });
            if !logged.is_empty() {
                line["reward_logs"] = serde_json::json!(logged);
            }
            lines.push(line);
        }
    }
    samples_log.write_all(&lines)?;
    Ok(())
}

/// The step's record over the samples of `batches`.
pub fn record(
    step: u64,
    lr: f64,
    loss: BTreeMap<String, f64>,
    grad_norm: f64,
    batches: &[&ScoredBatch],
    timer: Timer,
) -> StepRecord {
    let mut reward: BTreeMap<String, f64> = BTreeMap::new();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut scored = 0usize;
    let breakdowns = batches.iter().flat_map(|r| r.breakdowns.iter());
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
    // Custom terms also say how many samples they gave no value, and log
    // the mean of each number they asked to log (`NAME/KEY`).
    let mut extras: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    for scores in batches.iter().flat_map(|r| r.custom.iter()) {
        for (name, v) in scores {
            if name.contains('/') {
                if let CustomValue::Value(x) = v {
                    let e = extras.entry(name).or_insert((0.0, 0));
                    e.0 += x;
                    e.1 += 1;
                }
                continue;
            }
            let no_signal = matches!(v, CustomValue::NoSignal(_));
            *reward.entry(format!("{name}/no_signal")).or_insert(0.0) +=
                f64::from(u8::from(no_signal));
        }
    }
    for (name, (sum, n)) in extras {
        reward.insert(name.to_owned(), sum / n.max(1) as f64);
    }
    let reports: Vec<&ExecReport> = batches.iter().flat_map(|r| r.reports.iter()).collect();
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
        step,
        lr,
        loss,
        reward,
        pass_rate: passed as f64 / signal.max(1) as f64,
        samples: reports.len(),
        no_signal: reports.len() - signal,
        error_kinds,
        grad_norm,
        tokens_generated: batches
            .iter()
            .flat_map(|r| r.comps.iter())
            .map(|c| c.token_ids.len())
            .sum(),
        seconds: timer.into_seconds(),
        mismatch: BTreeMap::new(),
    }
}
