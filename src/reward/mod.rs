//! The rewards of FALCON §4.4, one small pure function each, their weighted
//! composite with per-term logging, the style and complexity judges, and the
//! mapping of error lines to token spans for the fine-grained loss (Eq. 2).
//!
//! - [`terms`]: `R_coarse` (Eq. 9), `R_error` (Eq. 10), `R_negative` (Eq. 11).
//! - [`composite`]: `R = α·T + β·S + γ·C + δ·E`, each term on / off / log-only
//!   and reported by name; no signal in, no reward out.
//! - [`static_judge`]: S from ruff's findings, C from McCabe complexity (default).
//! - [`lm_judge`]: S and C from a language model with FALCON's Table 8 and 9
//!   templates, and the strict score parser.
//! - [`custom`]: the user's own terms (`[[reward.custom]]`): a Python
//!   function in TRL's, verl's or OpenRLHF's convention, a command, or an
//!   OpenRLHF-style reward server.
//! - [`spans`]: error lines → `(start_token, end_token, reward)` spans.
//! - [`pipeline`]: the one path from a completion to its reward, used by
//!   training, evaluation and `falcon exec`: [`execute`], then
//!   [`Rewards::score`] and [`Rewards::spans`].
//!
//! See docs/rewards.md for the formulas, scales and modes.

pub mod composite;
pub mod custom;
pub mod judge_budget;
pub mod lm_judge;
pub mod pipeline;
mod process;
pub mod spans;
pub mod static_judge;
pub mod terms;

use serde::{Deserialize, Serialize};

pub use composite::{composite, RewardBreakdown, SampleSignals, TERM_NAMES};
pub use custom::{CustomSample, CustomScores, CustomTerms, CustomValue};
pub use judge_budget::Budgeted;
pub use lm_judge::{parse_score, prompt, LmJudge};
pub use pipeline::{execute, Rewards};
pub use spans::{
    answer_code, coarse_span, code_in_completion, error_line_spans, offsets_by_incremental_decode,
    TokenSpan,
};
pub use static_judge::{complexity_score, style_score, Finding, McCabe, StaticJudge};
pub use terms::{r_coarse, r_error, r_negative};

use crate::config::{JudgeKind, RewardConfig};
use crate::model::{Generator, ModelError};

/// Errors of the reward module. A sample that merely cannot be scored is not
/// an error: it gives `None` (no signal). These are the failures a run
/// cannot carry on without fixing.
#[derive(Debug, thiserror::Error)]
pub enum RewardError {
    /// A judge's helper tool is not installed.
    #[error("{tool} not found (looked for {tried}): run scripts/setup, which installs it from scripts/requirements.txt, or set [reward.static_judge] {key} to its path")]
    ToolMissing {
        /// `ruff` or `python3`.
        tool: String,
        /// The config key that names it (`ruff` or `python`).
        key: &'static str,
        /// Every path tried.
        tried: String,
    },
    /// A judge's helper tool is installed but fails on a trivial program.
    #[error("{tool} does not work: {reason}; run scripts/setup to reinstall it")]
    ToolBroken {
        /// The tool and its path.
        tool: String,
        /// What went wrong on the probe.
        reason: String,
    },
    /// The LM judge's generator failed (not a bad answer: the model call itself).
    #[error("LM judge generation failed: {0}")]
    Generator(#[from] ModelError),
    /// The LM judge returned a different number of answers than prompts.
    #[error("LM judge returned {got} answers for {expected} prompts")]
    AnswerCount {
        /// Prompts sent.
        expected: usize,
        /// Completions received.
        got: usize,
    },
    /// `[reward] judge = "lm"` but the caller passed no generator to judge with.
    #[error("[reward] judge = \"lm\" needs a judge model, but none was given; set judge = \"static\" or pass a Generator")]
    NoJudgeModel,
    /// A completion's tokens could not be decoded to map error lines to them.
    #[error("decoding a completion's tokens: {0}")]
    Decode(ModelError),
    /// Error lines or token offsets that do not fit the code.
    #[error(transparent)]
    Span(#[from] spans::SpanError),
    /// A `[[reward.custom]]` term cannot be used at all.
    #[error(transparent)]
    Custom(#[from] custom::CustomError),
}

/// What a judge scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Aspect {
    /// Coding style, FALCON Table 8.
    Style,
    /// Complexity, FALCON Table 9.
    Complexity,
}

/// How many scores a judge gave and why the others gave no signal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JudgeStats {
    /// Samples that got a score.
    pub scored: usize,
    /// LM answers with no unambiguous score.
    pub unparseable: usize,
    /// Tool runs past the timeout.
    pub timeouts: usize,
    /// Tool runs that failed otherwise.
    pub failures: usize,
    /// Code left unjudged by the LM judge's per-step budget in training.
    #[serde(default)]
    pub over_budget: usize,
}

impl JudgeStats {
    /// Samples that got no score.
    pub fn no_signal(&self) -> usize {
        self.unparseable + self.timeouts + self.failures + self.over_budget
    }
}

/// Scores code on FALCON's −1..2 scale for one [`Aspect`].
pub trait Judge {
    /// One score per code, in order; `None` is no signal (and is counted in
    /// [`Judge::stats`]). `Err` only when the judge itself cannot work.
    fn score(&self, aspect: Aspect, codes: &[&str]) -> Result<Vec<Option<f64>>, RewardError>;

    /// Counters since the judge was built.
    fn stats(&self) -> JudgeStats;

    /// A training step begins (a budgeted judge's budget is renewed).
    fn new_step(&self) {}

    /// What a resumed run needs to judge as this one would (a cache), if anything.
    fn state(&self) -> Option<serde_json::Value> {
        None
    }

    /// Takes back [`Judge::state`]; why not, when it cannot.
    fn restore(&self, _state: &serde_json::Value) -> Result<(), String> {
        Ok(())
    }
}

/// The judge `[reward] judge` asks for: the static judge, or an LM judge
/// over `generator` (which must be given when `judge = "lm"`).
pub fn judge_from_config<'g, G: Generator + ?Sized>(
    cfg: &RewardConfig,
    generator: Option<&'g G>,
) -> Result<Box<dyn Judge + 'g>, RewardError> {
    match (cfg.judge, generator) {
        (JudgeKind::Static, _) => Ok(Box::new(StaticJudge::new(&cfg.static_judge)?)),
        (JudgeKind::Lm, Some(g)) => Ok(Box::new(LmJudge::new(g, &cfg.lm_judge))),
        (JudgeKind::Lm, None) => Err(RewardError::NoJudgeModel),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Completion, GenerationParams};

    struct Never;
    impl Generator for Never {
        fn generate(
            &self,
            _: &[String],
            _: &GenerationParams,
        ) -> Result<Vec<Completion>, ModelError> {
            Err(ModelError::Invalid("judge model offline".into()))
        }
    }

    #[test]
    fn judge_kind_from_config() {
        let mut cfg = RewardConfig::default();
        let judge = judge_from_config::<Never>(&cfg, None)
            .unwrap_or_else(|e| panic!("{e}\n(run scripts/setup)"));
        assert_eq!(
            judge.score(Aspect::Style, &["x = 1\n"]).unwrap(),
            vec![Some(2.0)]
        );
        cfg.judge = JudgeKind::Lm;
        assert!(matches!(
            judge_from_config::<Never>(&cfg, None),
            Err(RewardError::NoJudgeModel)
        ));
        let lm = judge_from_config(&cfg, Some(&Never)).unwrap();
        // A broken judge model is an error of the run, not a sample without signal.
        assert!(matches!(
            lm.score(Aspect::Style, &["x = 1\n"]),
            Err(RewardError::Generator(_))
        ));
    }
}
