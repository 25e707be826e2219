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
use super::state::{mix, TrainState};
use super::TrainError;
use crate::exec::{ExecReport, RewardClass};
use crate::model::{Completion, Generator, Policy};
use crate::reward::{code_in_completion, execute, Rewards};
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
    pub fn sample(
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
    /// them through the reward pipeline: rewards (with the run's `P_error`,
    /// updated by these reports first), group advantages and fine-grained
    /// spans.
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
        let jobs: Vec<(&Task, &str)> = comps
            .iter()
            .enumerate()
            .map(|(i, c)| (tasks[i / g], c.text.as_str()))
            .collect();
        let reports: Vec<ExecReport> = execute(self.sandbox, &jobs);
        add("exec", t0);

        let t0 = Instant::now();
        for r in &reports {
            self.error_stats.observe(r);
        }
        let codes: Vec<&str> = comps
            .iter()
            .map(|c| code_in_completion(&c.text).1)
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

    /// Every completion of `ro` (whose samples belong to `tasks` in groups)
    /// with its report, rewards and advantage, to `samples.jsonl`.
    pub fn log_samples(
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
