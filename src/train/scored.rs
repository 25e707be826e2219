//! A step's scored samples as one typed value, like torchtune's
//! `GRPOTrajectory`: what `scoring` builds, what the update and the
//! memories read. It names nothing of the training state, so both sides
//! can import it.

use crate::exec::{ExecReport, RewardClass};
use crate::model::Completion;
use crate::reward::{CustomScores, RewardBreakdown, TokenSpan};

use super::update::UpdateSeq;

/// One batch of scored samples: `B = tasks × group` completions, `group`
/// consecutive ones per task, and what the sandbox and the reward pipeline
/// said about each. What a step learns from and what memory keeps;
/// serialisable, since the ranks of a data-parallel run gather each
/// other's.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct ScoredBatch {
    /// Samples per task.
    pub group: usize,
    /// `[B]` prompt and completion token ids, text, engine log-probs.
    pub comps: Vec<Completion>,
    /// `[B]` what the sandbox saw.
    pub reports: Vec<ExecReport>,
    /// `[B]` reward terms by name and their total; `None`: no signal.
    pub breakdowns: Vec<Option<RewardBreakdown>>,
    /// `[B]` group advantage of each sample.
    pub adv: Vec<f64>,
    /// `[B][spans]` token spans of failing lines, with `R_fine`.
    pub spans: Vec<Vec<TokenSpan>>,
    /// `[B][attempts]` each sample's attempt chain on its guiding test
    /// (repairing rollouts; empty otherwise).
    pub attempts: Vec<Vec<String>>,
    /// `[B]` the `[[reward.custom]]` terms' values by name (empty maps
    /// without custom terms).
    #[serde(default)]
    pub custom: Vec<CustomScores>,
}

/// What was learned by running a batch's completions, `[B]` each: the
/// sandbox's reports and the custom reward terms' values.
pub struct Executed {
    pub reports: Vec<ExecReport>,
    pub custom: Vec<CustomScores>,
}

impl ScoredBatch {
    pub fn passed(&self, i: usize) -> bool {
        self.reports[i].outcome == Some(RewardClass::Pass)
    }

    /// The samples as update sequences.
    pub fn seqs(&self) -> Vec<UpdateSeq<'_>> {
        self.seqs_with(false)
    }

    /// [`ScoredBatch::seqs`], with each completion's log-probs from the
    /// engine that sampled it when `checked`, for the update to compare.
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
