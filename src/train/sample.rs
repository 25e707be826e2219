//! A step's samples, shared by every RL recipe: the step's tasks (a seeded
//! walk over the task set), `g` completions per task from the policy as it
//! is now (or from the rollout strategy `[train] strategy` names), each run
//! in the sandbox and scored by the reward pipeline ([`Rollout`]); their
//! lines in `samples.jsonl`; and the step's [`StepRecord`].

use std::collections::BTreeMap;
use std::time::Instant;

use super::advantage::advantages;
use super::batch::Rollout;
use super::events::StepRecord;
use super::metrics::JsonlWriter;
use super::shard;
use super::state::{mix, TrainState};
use super::TrainError;
use crate::exec::{ExecReport, RewardClass};
use crate::model::{Completion, Generator};
use crate::reward::{answer_code, execute, Rewards};
use crate::rollout::{generation_params, reflection_params, Env, Strategy};
use crate::task::Task;

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

impl<'a> TrainState<'a> {
    /// The tasks of the current step.
    pub fn step_tasks(&self) -> Vec<&'a Task> {
        self.tasks_at(self.step)
    }

    /// The tasks of step `step`.
    fn tasks_at(&self, step: u64) -> Vec<&'a Task> {
        let t = &self.cfg.train;
        tasks_for_step(self.tasks.len(), t.tasks_per_step, self.cfg.run.seed, step)
            .into_iter()
            .map(|i| &self.tasks.iter().as_slice()[i])
            .collect()
    }

    /// `g` scored samples per task with the policy as it is now (fast
    /// weights included): from the rollout strategy when `[train] strategy`
    /// names one (it writes its own prompts, so `prompts` is unused), else
    /// one batch of `g` samples per prompt (`prompts[i]` belongs to
    /// `tasks[i]`). In a data-parallel run each rank generates and runs its
    /// share of the tasks ([`shard::local`]) and every rank scores the
    /// gathered whole. Scoring is the sandbox, rewards, group advantages and
    /// fine-grained spans; time goes to `seconds`.
    pub fn sample(
        &mut self,
        tasks: &[&Task],
        prompts: &[String],
        g: usize,
        seed: u64,
        seconds: &mut BTreeMap<String, f64>,
    ) -> Result<Rollout, TrainError> {
        let share = shard::local(self.dist, tasks.len());
        self.sample_share(tasks, prompts, g, seed, share, true, seconds)
    }

    /// [`TrainState::sample`] by this process alone, whatever the ranks
    /// (a meta-step's per-task query samples, each task on its own rank),
    /// scored with `P_error` as it is, which these reports do not update:
    /// the caller observes them ([`TrainState::observe_errors`]) once every
    /// rank's are in, so no rank's rewards depend on another's timing.
    pub fn sample_alone(
        &mut self,
        tasks: &[&Task],
        prompts: &[String],
        g: usize,
        seed: u64,
        seconds: &mut BTreeMap<String, f64>,
    ) -> Result<Rollout, TrainError> {
        self.sample_share(tasks, prompts, g, seed, 0..tasks.len(), false, seconds)
    }

    /// [`TrainState::sample_alone`] for completions generated elsewhere
    /// (`g` per task, in task order): run and scored the same way.
    pub fn score_alone(
        &mut self,
        tasks: &[&Task],
        comps: Vec<Completion>,
        g: usize,
        seconds: &mut BTreeMap<String, f64>,
    ) -> Result<Rollout, TrainError> {
        let reports = self.run(tasks, &comps, g, 0, seconds);
        self.score(tasks, comps, reports, g, false, seconds)
    }

    /// The step's samples from a generation started during the previous
    /// step ([`TrainState::start_next`]), or a fresh [`TrainState::sample`]
    /// when none is waiting (the first step, a resumed run).
    pub fn sample_or_collect(
        &mut self,
        tasks: &[&Task],
        prompts: &[String],
        g: usize,
        seed: u64,
        seconds: &mut BTreeMap<String, f64>,
    ) -> Result<Rollout, TrainError> {
        match self.pending.take() {
            Some((step, p)) if step == self.step => {
                let t0 = Instant::now();
                let comps = p.wait()?;
                *seconds.entry("generate".to_owned()).or_insert(0.0) += t0.elapsed().as_secs_f64();
                let reports = self.run(tasks, &comps, g, 0, seconds);
                self.score(tasks, comps, reports, g, true, seconds)
            }
            _ => self.sample(tasks, prompts, g, seed, seconds),
        }
    }

    /// With `[rollout.vllm] overlap`, start generating the next step's
    /// rollouts with the weights as they are now (θ_t), to collect at the
    /// next step while this one updates; nothing on the last step.
    pub fn start_next(&mut self, seconds: &mut BTreeMap<String, f64>) -> Result<(), TrainError> {
        let next = self.step + 1;
        if !self.cfg.rollout.vllm.overlap || self.engine.is_none() || next >= self.cfg.train.steps {
            return Ok(());
        }
        self.sync_engine(seconds)?;
        let t = &self.cfg.train;
        let expanded: Vec<String> = self
            .tasks_at(next)
            .into_iter()
            .flat_map(|task| {
                std::iter::repeat_n(
                    crate::rollout::task_prompt(&t.instruction, task),
                    t.group_size,
                )
            })
            .collect();
        let params = generation_params(&self.cfg.generation, self.seed_at(next));
        let engine = self.engine.as_ref().expect("checked above");
        self.pending = Some((next, engine.spawn_generate(&expanded, &params)?));
        Ok(())
    }

    /// Let `P_error` see `reports` (in order).
    pub fn observe_errors<'r>(&mut self, reports: impl IntoIterator<Item = &'r ExecReport>) {
        for r in reports {
            self.error_stats.observe(r);
        }
    }

    /// Generate and run the samples of `tasks[share]`, gather the whole
    /// batch when `share` is a part of it, and score it (`observe`: the
    /// reports update `P_error` first).
    #[allow(clippy::too_many_arguments)]
    fn sample_share(
        &mut self,
        tasks: &[&Task],
        prompts: &[String],
        g: usize,
        seed: u64,
        share: std::ops::Range<usize>,
        observe: bool,
        seconds: &mut BTreeMap<String, f64>,
    ) -> Result<Rollout, TrainError> {
        if let Some(mut r) = self.strategy.take() {
            let synced = self.sync_engine(seconds);
            let solved =
                synced.and_then(|_| self.strategy_rollout(r.as_mut(), tasks, g, seed, seconds));
            self.strategy = Some(r);
            let (comps, attempts) = solved?;
            let reports = self.run(tasks, &comps, g, 0, seconds);
            let mut ro = self.score(tasks, comps, reports, g, observe, seconds)?;
            ro.attempts = attempts;
            return Ok(ro);
        }
        let expanded: Vec<String> = prompts[share.clone()]
            .iter()
            .flat_map(|p| std::iter::repeat_n(p.clone(), g))
            .collect();
        let mut params = generation_params(&self.cfg.generation, seed);
        // Row k of the whole batch draws from its own stream wherever it runs.
        params.row_offset = (share.start * g) as u64;
        self.sync_engine(seconds)?;
        let t0 = Instant::now();
        let comps = match self.engine.as_mut() {
            Some(e) => e.generate_or_restart(self.policy, self.step, &expanded, &params)?,
            None => self.policy.generate(&expanded, &params)?,
        };
        *seconds.entry("generate".to_owned()).or_insert(0.0) += t0.elapsed().as_secs_f64();
        let reports = self.run(tasks, &comps, g, share.start, seconds);
        let (comps, reports) = if share.len() == tasks.len() {
            (comps, reports)
        } else {
            let t0 = Instant::now();
            let both = shard::gather(self.dist, comps.into_iter().zip(reports).collect())?;
            *seconds.entry("gather".to_owned()).or_insert(0.0) += t0.elapsed().as_secs_f64();
            both.into_iter().unzip()
        };
        self.score(tasks, comps, reports, g, observe, seconds)
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
        let generator = self.generator();
        let env = Env::new(
            generator,
            generator,
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

    /// What generates now: the vLLM engine, else the policy itself.
    pub fn generator(&self) -> &dyn Generator {
        match &self.engine {
            Some(e) => e,
            None => &*self.policy,
        }
    }

    /// Bring a vLLM engine's servers to the policy as it is now (version:
    /// the step), its seconds as `sync`. Nothing without an engine.
    pub fn sync_engine(&mut self, seconds: &mut BTreeMap<String, f64>) -> Result<(), TrainError> {
        if let Some(e) = self.engine.as_mut() {
            let secs = e.sync(self.policy, self.step)?;
            *seconds.entry("sync".to_owned()).or_insert(0.0) += secs;
        }
        Ok(())
    }

    /// Run `comps` (`g` per task, in task order, from task `first` on) in
    /// the sandbox.
    fn run(
        &self,
        tasks: &[&Task],
        comps: &[Completion],
        g: usize,
        first: usize,
        seconds: &mut BTreeMap<String, f64>,
    ) -> Vec<ExecReport> {
        let t0 = Instant::now();
        let jobs: Vec<(&Task, &Completion)> = comps
            .iter()
            .enumerate()
            .map(|(i, c)| (tasks[first + i / g], c))
            .collect();
        let reports = execute(self.sandbox, &jobs);
        *seconds.entry("exec".to_owned()).or_insert(0.0) += t0.elapsed().as_secs_f64();
        reports
    }

    /// Score `comps` (`g` per task, in task order) from their `reports`
    /// through the reward pipeline: rewards (with the run's `P_error`,
    /// updated by these reports first when `observe`), group advantages and
    /// fine-grained spans.
    fn score(
        &mut self,
        tasks: &[&Task],
        comps: Vec<Completion>,
        reports: Vec<ExecReport>,
        g: usize,
        observe: bool,
        seconds: &mut BTreeMap<String, f64>,
    ) -> Result<Rollout, TrainError> {
        let mut add = |k: &str, t0: Instant| {
            *seconds.entry(k.to_owned()).or_insert(0.0) += t0.elapsed().as_secs_f64();
        };
        debug_assert_eq!(comps.len(), tasks.len() * g);

        let t0 = Instant::now();
        if observe {
            self.observe_errors(&reports);
        }
        let codes: Vec<&str> = comps
            .iter()
            .map(|c| answer_code(&c.text, c.cut_off()).1)
            .collect();
        let breakdowns = self
            .rewards
            .score(&reports, &codes, &self.error_stats.p_error())?;
        let totals: Vec<Option<f64>> = breakdowns
            .iter()
            .map(|b| b.as_ref().map(|b| b.total))
            .collect();
        let group: Vec<usize> = (0..comps.len()).map(|i| i / g).collect();
        let t = &self.cfg.train;
        let adv = advantages(t.advantage, &totals, &group, t.normalize_std)
            .map_err(|e| TrainError::Invalid(e.to_string()))?;
        let spans = Rewards::spans(self.policy.tokenizer()?, &comps, &reports)?;
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

    /// Every completion of each rollout (whose samples belong to its tasks
    /// in groups) with its report, rewards and advantage, to
    /// `samples.jsonl`, as one append: a step's samples land whole or not
    /// at all. Only rank 0 holds a writer.
    pub fn log_samples(
        &self,
        samples_log: &mut Option<JsonlWriter>,
        parts: &[(&Rollout, &[&Task])],
    ) -> Result<(), TrainError> {
        let Some(samples_log) = samples_log else {
            return Ok(());
        };
        let mut lines = Vec::new();
        for (ro, tasks) in parts {
            for (i, c) in ro.comps.iter().enumerate() {
                lines.push(serde_json::json!({
                    "step": self.step,
                    "task_id": tasks[i / ro.group].id,
                    "completion": c.text,
                    "report": ro.reports[i],
                    "rewards": ro.breakdowns[i].as_ref().map(|b| b.to_log("")),
                    "advantage": ro.adv[i],
                    "attempts": ro.attempts.get(i),
                }));
            }
        }
        samples_log.write_all(&lines)?;
        Ok(())
    }

    /// The step's record over the samples of `rollouts`.
    pub fn record(
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
            mismatch: BTreeMap::new(),
        }
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
