//! The memories of a meta-RL run (FALCON §4.3): the short-term ring buffer
//! whose rows join each task's inner mini-batch, and long-term memory, which
//! records every evaluated sample and supplies the Table 7 prompts and the
//! demonstrations; Algorithm 1 line 4 fills both from the reference
//! solutions.

use std::collections::BTreeMap;
use std::path::Path;

use tch::Tensor;

use super::scored::ScoredBatch;
use super::update::{sft_example, UpdateSeq};
use super::TrainError;
use crate::config::RunConfig;
use crate::exec::{RewardClass, Sandbox};
use crate::memory::long_term::{LongTermRecord, Retrieved};
use crate::memory::short_term::{Batch, Sample};
use crate::memory::{open_long_term, Access, LongTermMemory, ShortTerm};
use crate::model::Policy;
use crate::reward::{answer_code, TokenSpan};
use crate::rollout::task_prompt;
use crate::task::{Task, TaskSet};

/// The memories of a meta-RL run: the short-term ring buffer (inner
/// mini-batches) and, when `[meta] long_term`, long-term memory (Table 7
/// prompts, demonstrations).
pub struct MetaMemory {
    pub short_term: ShortTerm,
    pub long_term: Option<LongTermMemory>,
}

impl MetaMemory {
    /// Open the memories whose store is in `dir` (the run directory, or a
    /// data-parallel rank's private copy of its store) on `device`,
    /// forgetting long-term rows of steps after `step` (an interrupted
    /// future that a resume repeats).
    pub fn open(
        cfg: &RunConfig,
        dir: &Path,
        step: u64,
        device: tch::Device,
    ) -> Result<Self, TrainError> {
        let run_dir = dir;
        let short_term = ShortTerm::new(
            cfg.memory.short_term_capacity,
            cfg.memory.short_term_max_len,
            device,
            cfg.run.seed ^ 0x5_7e4d,
        )
        .map_err(TrainError::ShortTerm)?;
        let long_term = if cfg.meta.long_term {
            Some(
                open_long_term(&cfg.memory, run_dir, device, Access::Train { step })
                    .map_err(TrainError::LongTerm)?,
            )
        } else {
            None
        };
        Ok(MetaMemory {
            short_term,
            long_term,
        })
    }

    /// Push a rollout's samples (prompt + completion tokens, the sample's
    /// advantage on every completion token, `R_fine` on its span tokens).
    pub fn remember_samples(&mut self, ro: &ScoredBatch) -> Result<(), TrainError> {
        let mut rows = Vec::with_capacity(ro.comps.len());
        for (i, c) in ro.comps.iter().enumerate() {
            rows.push(OwnedSeq {
                prompt_ids: c.prompt_ids.clone(),
                completion_ids: c.token_ids.clone(),
                advantage: ro.adv[i],
                passed: ro.passed(i),
                spans: ro.spans[i].clone(),
                logprobs: c.logprobs.clone(),
            });
        }
        self.remember(&rows)
    }

    /// The end of a meta-step (Algorithm 1 lines 13 and 15): every sample,
    /// θ's `support` and each θ_i's `queries[i]` (of `tasks[i]`), joins
    /// short-term memory, and long-term memory records the evaluated ones
    /// as step `step`'s: the query samples, or the support samples when
    /// there are none (no inner steps, so θ_i = θ).
    pub fn write_back(
        &mut self,
        step: u64,
        tasks: &[&Task],
        support: &ScoredBatch,
        queries: &[ScoredBatch],
    ) -> Result<(), TrainError> {
        self.remember_samples(support)?;
        for q in queries {
            self.remember_samples(q)?;
        }
        let Some(lt) = self.long_term.as_mut() else {
            return Ok(());
        };
        let evaluated: Vec<(&ScoredBatch, &[&Task])> = if queries.is_empty() {
            vec![(support, tasks)]
        } else {
            queries.iter().zip(tasks.chunks(1)).collect()
        };
        let mut experiences = Vec::new();
        for (batch, ts) in evaluated {
            for (j, c) in batch.comps.iter().enumerate() {
                let task = ts[j / batch.group];
                experiences.push(LongTermRecord::new(
                    step,
                    task.id.clone(),
                    task.prompt.clone(),
                    answer_code(&c.text, c.cut_off()).1.to_owned(),
                    batch.reports[j].clone(),
                    batch.breakdowns[j]
                        .as_ref()
                        .map(|b| b.terms.clone())
                        .unwrap_or_default(),
                ));
            }
        }
        lt.insert(experiences).map_err(TrainError::LongTerm)?;
        Ok(())
    }

    pub fn remember(&mut self, rows: &[OwnedSeq]) -> Result<(), TrainError> {
        let flat: Vec<[Vec<f32>; 3]> = rows.iter().map(OwnedSeq::per_token).collect();
        let ids: Vec<Vec<i64>> = rows
            .iter()
            .map(|r| [r.prompt_ids.as_slice(), r.completion_ids.as_slice()].concat())
            .collect();
        let samples: Vec<Sample> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| Sample {
                token_ids: &ids[i],
                rewards: &flat[i][0],
                logprobs: &flat[i][1],
                advantages: &flat[i][2],
                prompt_len: r.prompt_ids.len(),
                passed: r.passed,
            })
            .collect();
        self.short_term
            .push(&samples)
            .map_err(TrainError::ShortTerm)
    }

    /// `n` rows drawn from the short-term buffer, back on the host.
    pub fn draw(&mut self, n: usize) -> Vec<OwnedSeq> {
        if n == 0 || self.short_term.is_empty() {
            return Vec::new();
        }
        OwnedSeq::from_batch(&self.short_term.sample(n))
    }

    /// Algorithm 1 line 4: the reference solutions of the task set, run in
    /// the sandbox, become long-term entries (step 0) and passing
    /// short-term rows. Done once, at the start of a fresh run; returns how
    /// many rows it added.
    pub fn populate(
        &mut self,
        policy: &Policy,
        tasks: &TaskSet,
        sandbox: &Sandbox,
        instruction: &str,
    ) -> Result<usize, TrainError> {
        let demos: Vec<&Task> = tasks
            .iter()
            .filter(|t| t.canonical_solution.is_some())
            .collect();
        if demos.is_empty() {
            return Ok(0);
        }
        let jobs: Vec<(&Task, &str)> = demos
            .iter()
            .map(|t| (*t, t.canonical_solution.as_deref().unwrap_or_default()))
            .collect();
        let reports = sandbox.run_batch(&jobs);
        let mut rows = Vec::new();
        let mut experiences = Vec::new();
        for (t, r) in demos.iter().zip(&reports) {
            let passed = r.outcome == Some(RewardClass::Pass);
            let solution = t.canonical_solution.as_deref().unwrap_or_default();
            let answer = format!("```python\n{}\n```", solution.trim_end());
            let (p, c) = sft_example(policy, &task_prompt(instruction, t), &answer)?;
            rows.push(OwnedSeq {
                logprobs: vec![0.0; c.len()],
                prompt_ids: p,
                completion_ids: c,
                advantage: 0.0,
                passed,
                spans: Vec::new(),
            });
            experiences.push(LongTermRecord::new(
                0,
                t.id.clone(),
                t.prompt.clone(),
                solution.to_owned(),
                r.clone(),
                BTreeMap::new(),
            ));
        }
        self.remember(&rows)?;
        if let Some(lt) = self.long_term.as_mut() {
            if lt.is_empty().unwrap_or(true) {
                lt.insert(experiences).map_err(TrainError::LongTerm)?;
            }
        }
        Ok(rows.len())
    }
}

/// Passing neighbours from long-term memory (other tasks than `task`), as
/// demonstrations for `L_sl`: at most `n`.
pub fn demonstrations(
    policy: &Policy,
    instruction: &str,
    hits: &[Retrieved],
    task: &Task,
    n: usize,
) -> Result<Vec<OwnedSeq>, TrainError> {
    let mut out = Vec::new();
    for h in hits {
        if out.len() == n {
            break;
        }
        let r = &h.record;
        if r.task_id == task.id || r.report.outcome != Some(RewardClass::Pass) {
            continue;
        }
        let prompt = format!("{instruction}\n\n{}", r.task_text.trim_end());
        let answer = format!("```python\n{}\n```", r.code.trim_end());
        let (p, c) = sft_example(policy, &prompt, &answer)?;
        out.push(OwnedSeq {
            logprobs: vec![0.0; c.len()],
            prompt_ids: p,
            completion_ids: c,
            advantage: 0.0,
            passed: true,
            spans: Vec::new(),
        });
    }
    Ok(out)
}

/// An update sequence that owns its tokens (rows from memory).
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedSeq {
    pub prompt_ids: Vec<i64>,
    pub completion_ids: Vec<i64>,
    pub advantage: f64,
    pub passed: bool,
    pub spans: Vec<TokenSpan>,
    /// One per completion token (0 where unknown, e.g. demonstrations).
    pub logprobs: Vec<f32>,
}

impl OwnedSeq {
    pub fn as_seq(&self) -> UpdateSeq<'_> {
        UpdateSeq {
            prompt_ids: &self.prompt_ids,
            completion_ids: &self.completion_ids,
            advantage: self.advantage,
            passed: self.passed,
            spans: &self.spans,
            rollout_logprobs: &[],
        }
    }

    /// Per-token rewards (`R_fine` on span tokens), log-probs and
    /// advantages over prompt + completion; the prompt's are 0.
    fn per_token(&self) -> [Vec<f32>; 3] {
        let (p, n) = (self.prompt_ids.len(), self.completion_ids.len());
        let mut rewards = vec![0f32; p + n];
        for s in &self.spans {
            for t in s.start_token.min(n)..s.end_token.min(n) {
                rewards[p + t] = s.reward as f32;
            }
        }
        let mut logprobs = vec![0f32; p + n];
        for (t, &l) in self.logprobs.iter().take(n).enumerate() {
            logprobs[p + t] = l;
        }
        let mut adv = vec![0f32; p + n];
        adv[p..].fill(self.advantage as f32);
        [rewards, logprobs, adv]
    }

    /// The rows of a short-term batch: prompt and completion split where
    /// `scored` starts, the advantage of the first completion token, and
    /// spans from the runs of equal non-zero per-token rewards.
    pub fn from_batch(b: &Batch) -> Vec<OwnedSeq> {
        let host = |t: &Tensor, k: tch::Kind| t.to_device(tch::Device::Cpu).to_kind(k);
        let ids = host(&b.token_ids, tch::Kind::Int64);
        let mask = host(&b.mask, tch::Kind::Int64);
        let scored = host(&b.scored, tch::Kind::Int64);
        let rewards = host(&b.rewards, tch::Kind::Float);
        let logprobs = host(&b.logprobs, tch::Kind::Float);
        let adv = host(&b.advantages, tch::Kind::Float);
        let passed: Vec<i64> = Vec::try_from(host(&b.passed, tch::Kind::Int64)).unwrap_or_default();
        let row = |t: &Tensor, r: usize| -> Vec<f64> {
            Vec::try_from(t.get(r as i64).to_kind(tch::Kind::Double)).unwrap_or_default()
        };
        (0..b.slots.len())
            .map(|r| {
                let toks: Vec<i64> = Vec::try_from(ids.get(r as i64)).unwrap_or_default();
                let len = row(&mask, r).iter().filter(|&&m| m > 0.0).count();
                let sc = row(&scored, r);
                let p = sc[..len].iter().position(|&s| s > 0.0).unwrap_or(len);
                let rw = row(&rewards, r);
                let mut spans: Vec<TokenSpan> = Vec::new();
                for (t, &v) in rw.iter().enumerate().take(len).skip(p) {
                    if v == 0.0 {
                        continue;
                    }
                    match spans.last_mut() {
                        Some(s) if s.end_token == t - p && s.reward == v => s.end_token += 1,
                        _ => spans.push(TokenSpan {
                            start_token: t - p,
                            end_token: t - p + 1,
                            reward: v,
                        }),
                    }
                }
                OwnedSeq {
                    prompt_ids: toks[..p].to_vec(),
                    completion_ids: toks[p..len].to_vec(),
                    advantage: if p < len { row(&adv, r)[p] } else { 0.0 },
                    passed: passed.get(r).is_some_and(|&x| x != 0),
                    spans,
                    logprobs: row(&logprobs, r)[p..len]
                        .iter()
                        .map(|&x| x as f32)
                        .collect(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_term_rows_come_back_as_the_sequences_pushed() {
        let mut mem = MetaMemory {
            short_term: ShortTerm::new(8, 16, tch::Device::Cpu, 3).unwrap(),
            long_term: None,
        };
        let row = OwnedSeq {
            prompt_ids: vec![4, 5, 6],
            completion_ids: vec![7, 8, 9, 10, 11],
            advantage: -0.25,
            passed: false,
            spans: vec![
                TokenSpan {
                    start_token: 1,
                    end_token: 3,
                    reward: -0.5,
                },
                TokenSpan {
                    start_token: 3,
                    end_token: 4,
                    reward: -1.0,
                },
            ],
            logprobs: vec![-0.5, -1.0, -1.5, -2.0, -2.5],
        };
        let other = OwnedSeq {
            passed: true,
            spans: vec![],
            advantage: 0.5,
            ..row.clone()
        };
        mem.remember(&[row.clone(), other.clone()]).unwrap();
        let mut back = mem.draw(5);
        back.sort_by_key(|s| s.passed);
        assert_eq!(back, vec![row, other]);
    }
}
