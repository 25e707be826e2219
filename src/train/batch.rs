//! One batch of generated samples and what the sandbox and the reward
//! pipeline said about each: what a step learns from and what memory keeps.

use super::update::UpdateSeq;
use crate::exec::{ExecReport, RewardClass};
use crate::reward::{RewardBreakdown, TokenSpan};

/// One batch of generated samples (`group` consecutive ones per prompt) and
/// what the sandbox and the reward module said about each. Serialisable:
/// the ranks of a data-parallel run gather each other's.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Rollout {
    pub group: usize,
    pub comps: Vec<crate::model::Completion>,
    pub reports: Vec<ExecReport>,
    pub breakdowns: Vec<Option<RewardBreakdown>>,
    pub adv: Vec<f64>,
    pub spans: Vec<Vec<TokenSpan>>,
    /// Each sample's attempt chain on its guiding test (repairing rollouts).
    pub attempts: Vec<Vec<String>>,
}

impl Rollout {
    pub fn passed(&self, i: usize) -> bool {
        self.reports[i].outcome == Some(RewardClass::Pass)
    }

    /// The samples as update sequences.
    pub fn seqs(&self) -> Vec<UpdateSeq<'_>> {
        self.seqs_with(false)
    }

    /// [`Rollout::seqs`], with each completion's log-probs from the engine
    /// that sampled it when `checked`, for the update to compare.
    pub fn seqs_with(&self, checked: bool) -> Vec<UpdateSeq<'_>> {
        self.comps
            .iter()
            .enumerate()
            .map(|(i, c)| UpdateSeq {
                prompt_ids: &c.prompt_ids,
                completion_ids: &c.token_ids,
                advantage: self.adv[i],
                passed: self.passed(i),
                spans: &self.spans[i],
                rollout_logprobs: if checked { &c.logprobs } else { &[] },
            })
            .collect()
    }
}
