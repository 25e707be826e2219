//! The one way from a completion to its reward, shared by training,
//! evaluation and `falcon exec`: the code is cut out of the completion and
//! run against its task ([`execute`]), the user's own terms give their values
//! ([`Rewards::custom`]), the execution report becomes FALCON's terms and,
//! with the custom values, their weighted composite ([`Rewards::score`]), and
//! the failing lines become token spans for the fine-grained loss
//! ([`Rewards::spans`]).
//! `P_error` (Eq. 11) is the caller's: it is a statistic over the run's
//! history, which memory keeps.

use std::collections::BTreeMap;

use super::{
    answer_code, composite, error_line_spans, judge_from_config, offsets_by_incremental_decode,
    r_coarse, Aspect, Budgeted, CustomSample, CustomScores, CustomTerms, Judge, LmJudge,
    RewardBreakdown, RewardError, SampleSignals, TokenSpan,
};
use crate::config::RewardConfig;
use crate::exec::{ErrorKind, ExecReport, RewardClass, Sandbox};
use crate::model::{Completion, Generator, TextTokenizer};
use crate::task::Task;

/// Runs the code each completion holds ([`answer_code`]) against its
/// task, in one sandbox batch: `jobs[i]` is (task, completion).
pub fn execute(sandbox: &Sandbox, jobs: &[(&Task, &Completion)]) -> Vec<ExecReport> {
    let code: Vec<(&Task, &str)> = jobs
        .iter()
        .map(|(t, c)| (*t, answer_code(&c.text, c.cut_off()).1))
        .collect();
    sandbox.run_batch(&code)
}

/// `[reward]` with its judge and custom terms: scores execution reports.
pub struct Rewards<'j> {
    cfg: RewardConfig,
    judge: Box<dyn Judge + 'j>,
    custom: CustomTerms,
}

impl<'j> Rewards<'j> {
    /// The rewards `cfg` describes; `judge_model` is needed only by the LM
    /// judge (`[reward] judge = "lm"`).
    pub fn new<G: Generator + ?Sized>(
        cfg: &RewardConfig,
        judge_model: Option<&'j G>,
    ) -> Result<Self, RewardError> {
        Ok(Rewards {
            cfg: cfg.clone(),
            judge: judge_from_config(cfg, judge_model)?,
            custom: CustomTerms::new(&cfg.custom)?,
        })
    }

    /// The rewards of a training run: with `judge = "lm"` (and style or
    /// complexity computed), the judge is `[reward.lm_judge] model`, opened
    /// here on `device`, behind a cache and the per-step budget
    /// ([`Budgeted`]).
    pub fn for_training(cfg: &RewardConfig, device: &str) -> Result<Rewards<'static>, RewardError> {
        let judged = cfg.style.computed() || cfg.complexity.computed();
        if cfg.judge != crate::config::JudgeKind::Lm || !judged {
            return Rewards::new::<crate::model::Policy>(cfg, None);
        }
        if cfg.lm_judge.model.trim().is_empty() {
            return Err(RewardError::NoJudgeModel);
        }
        let spec = crate::model::ModelSpec {
            model: &cfg.lm_judge.model,
            dtype: crate::model::Dtype::Fp32,
            device,
            adapter: None,
        };
        let opened = crate::model::open(&spec)?;
        let model: Box<dyn Generator> = Box::new(opened.policy);
        let judge = Box::new(LmJudge::new(model, &cfg.lm_judge));
        Ok(Rewards {
            cfg: cfg.clone(),
            judge: Box::new(Budgeted::new(judge, cfg.lm_judge.max_requests_per_step)),
            custom: CustomTerms::new(&cfg.custom)?,
        })
    }

    /// A training step begins: the judge's per-step budget is renewed.
    pub fn new_step(&self) {
        self.judge.new_step();
    }

    /// What a checkpoint keeps of the judge (its cache), if anything.
    pub fn judge_state(&self) -> Option<serde_json::Value> {
        self.judge.state()
    }

    /// Takes back [`Rewards::judge_state`].
    pub fn restore_judge(&self, state: &serde_json::Value) -> Result<(), String> {
        self.judge.restore(state)
    }

    /// Whether `[[reward.custom]]` has a term to compute.
    pub fn has_custom(&self) -> bool {
        !self.custom.is_empty()
    }

    /// The custom terms' values of each sample at training step `step`
    /// (empty maps when there are no custom terms).
    pub fn custom(&self, step: u64, samples: &[CustomSample<'_>]) -> Vec<CustomScores> {
        self.custom.score(step, samples)
    }

    /// Each sample's reward, term by term (`None`: no signal), from its
    /// report, its code (for the style and complexity judges), the run's
    /// `P_error` and its [custom values](Rewards::custom) (`custom` may be
    /// empty when there are no custom terms).
    pub fn score(
        &self,
        reports: &[ExecReport],
        codes: &[&str],
        p_error: &BTreeMap<ErrorKind, f64>,
        custom: &[CustomScores],
    ) -> Result<Vec<Option<RewardBreakdown>>, RewardError> {
        let judged = |on: bool, aspect| {
            if on {
                self.judge.score(aspect, codes)
            } else {
                Ok(vec![None; codes.len()])
            }
        };
        let style = judged(self.cfg.style.computed(), Aspect::Style)?;
        let complexity = judged(self.cfg.complexity.computed(), Aspect::Complexity)?;
        Ok(reports
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut signals =
                    SampleSignals::from_report(r, p_error.clone(), style[i], complexity[i]);
                if let Some(c) = custom.get(i) {
                    signals.custom = c.clone();
                }
                composite(&self.cfg, &signals)
            })
            .collect())
    }

    /// The fine-grained spans of each completion (Eq. 2): the tokens of the
    /// lines a failing run points at get `R_coarse` of its outcome; passing
    /// samples, samples without signal and lines that cannot be mapped to
    /// tokens get none.
    pub fn spans(
        tok: &TextTokenizer,
        comps: &[Completion],
        reports: &[ExecReport],
    ) -> Result<Vec<Vec<TokenSpan>>, RewardError> {
        let mut out = Vec::with_capacity(comps.len());
        for (c, r) in comps.iter().zip(reports) {
            let mut s = Vec::new();
            if let (Some(class), false) = (r.outcome, r.error_lines.is_empty()) {
                if class != RewardClass::Pass {
                    let (text, offsets) =
                        offsets_by_incremental_decode(&c.token_ids, |ids| tok.decode(ids, true))
                            .map_err(RewardError::Decode)?;
                    let (off, code) = answer_code(&text, c.cut_off());
                    if let Ok(sp) =
                        error_line_spans(code, off, &r.error_lines, &offsets, r_coarse(class))
                    {
                        s = sp;
                    }
                }
            }
            out.push(s);
        }
        Ok(out)
    }
}
