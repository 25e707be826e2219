//! The composite reward of FALCON §3: `R = α·T + β·S + γ·C + δ·E`, with
//! every term reported by name (STYLE.md §6, after TRL's
//! `_calculate_rewards`; trl#5352 logged a total that ignored the weights).
//!
//! Terms and their names (Algorithm 1's loss names):
//! - `coarse` = R_coarse (Eq. 9) and `error` = R_error (Eq. 10). Together they
//!   are the unit-test term: `T = R_coarse + R_error`. The paper's inner loss
//!   (Algorithm 1, line 10) sums a `coarse` and an `error` loss, so both count,
//!   each once; switching one to `off` or `log_only` leaves T as the other.
//! - `style` = S and `complexity` = C, judge scores on FALCON's −1..2 scale.
//! - `negative` = E = R_negative (Eq. 11).
//!
//! Each term has a [`TermMode`]: `on` (weighted), `log_only` (reported with
//! weight 0), `off` (neither computed nor reported). The breakdown records the
//! weight each reported term carries, so `total` is exactly
//! `Σ weights[name] · terms[name]` over the reported terms.
//!
//! After them come the user's `[[reward.custom]]` terms, in config order,
//! each with its own weight and the same modes. A custom value that does
//! not apply (`None` from a TRL function) leaves the term out of that
//! sample, as TRL does; one without signal counts like a judge without
//! signal (`on_missing`).
//!
//! A sample without signal (`outcome == None`: the sandbox broke) gets no
//! reward at all, never a fake runtime error (verl#4074).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::custom::{CustomScores, CustomValue};
use super::terms::{r_coarse, r_error, r_negative};
use crate::config::{OnMissingTerm, RewardConfig, TermMode};
use crate::exec::outcome::{ErrorKind, ExecReport, RewardClass};

/// Names of the terms, as logged (and as Algorithm 1 names the losses).
pub const TERM_NAMES: [&str; 5] = ["coarse", "error", "style", "complexity", "negative"];

/// Everything the composite needs about one sample, gathered by the caller.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleSignals {
    /// FALCON's feedback class; `None` means the run gave no signal.
    pub outcome: Option<RewardClass>,
    /// `N_pass` of Eq. 10.
    pub n_pass: usize,
    /// `N_fail` of Eq. 10 (failures and errors alike).
    pub n_fail: usize,
    /// `N_error` of Eq. 11: tests that ended in each error kind.
    pub n_error: BTreeMap<ErrorKind, usize>,
    /// `P_error` of Eq. 11, from the caller's long-term statistics.
    pub p_error: BTreeMap<ErrorKind, f64>,
    /// S from a judge, `None` when the judge gave no signal or was not run.
    pub style: Option<f64>,
    /// C from a judge, `None` when the judge gave no signal or was not run.
    pub complexity: Option<f64>,
    /// The `[[reward.custom]]` terms' values, by name.
    pub custom: CustomScores,
}

impl SampleSignals {
    /// Gathers the execution counts from a sandbox report; the judges' scores
    /// and `P_error` come from the caller.
    pub fn from_report(
        report: &ExecReport,
        p_error: BTreeMap<ErrorKind, f64>,
        style: Option<f64>,
        complexity: Option<f64>,
    ) -> Self {
        SampleSignals {
            outcome: report.outcome,
            n_pass: report.n_pass(),
            n_fail: report.n_fail(),
            n_error: report.error_counts(),
            p_error,
            style,
            complexity,
            custom: CustomScores::new(),
        }
    }
}

/// One sample's reward, term by term.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewardBreakdown {
    /// The raw value of every reported term (`on` and `log_only`), by name.
    pub terms: BTreeMap<String, f64>,
    /// The weight each reported term carries in `total`: α for `coarse` and
    /// `error`, β `style`, γ `complexity`, δ `negative` when `on`; 0 when `log_only`.
    pub weights: BTreeMap<String, f64>,
    /// `T`: the sum of the `on` unit-test terms; `None` when neither is on.
    pub unit_test: Option<f64>,
    /// Computed terms that had no signal (only under `on_missing = "skip_term"`).
    pub missing: Vec<String>,
    /// Custom terms that do not apply to this sample (left out, not missing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_applicable: Vec<String>,
    /// `R = Σ weights[name] · terms[name]`.
    pub total: f64,
}

impl RewardBreakdown {
    /// Flat scalars for a metrics line: `{prefix}{name}` per term,
    /// `{prefix}unit_test` (T) when it exists, and `{prefix}total`.
    pub fn to_log(&self, prefix: &str) -> BTreeMap<String, f64> {
        let mut out: BTreeMap<String, f64> = self
            .terms
            .iter()
            .map(|(name, v)| (format!("{prefix}{name}"), *v))
            .collect();
        if let Some(t) = self.unit_test {
            out.insert(format!("{prefix}unit_test"), t);
        }
        out.insert(format!("{prefix}total"), self.total);
        out
    }
}

/// The mode and composite weight of a term, by name.
fn mode_and_weight(cfg: &RewardConfig, name: &str) -> (TermMode, f64) {
    match name {
        "coarse" => (cfg.coarse, cfg.alpha),
        "error" => (cfg.error, cfg.alpha),
        "style" => (cfg.style, cfg.beta),
        "complexity" => (cfg.complexity, cfg.gamma),
        "negative" => (cfg.negative, cfg.delta),
        other => unreachable!("unknown reward term {other}"),
    }
}

/// The composite reward of one sample, or `None` when it has no signal:
/// the run itself gave none (`outcome == None`), or a computed term has none
/// and `on_missing = "skip_sample"`.
pub fn composite(cfg: &RewardConfig, s: &SampleSignals) -> Option<RewardBreakdown> {
    let outcome = s.outcome?;
    let mut b = RewardBreakdown {
        terms: BTreeMap::new(),
        weights: BTreeMap::new(),
        unit_test: None,
        missing: Vec::new(),
        not_applicable: Vec::new(),
        total: 0.0,
    };
    for name in TERM_NAMES {
        let (mode, weight) = mode_and_weight(cfg, name);
        if !mode.computed() {
            continue;
        }
        let value = match name {
            "coarse" => Some(r_coarse(outcome)),
            "error" => r_error(s.n_pass, s.n_fail),
            "style" => s.style,
            "complexity" => s.complexity,
            "negative" => Some(r_negative(&s.n_error, &s.p_error)),
            _ => unreachable!(),
        };
        // A non-finite judge score is as good as none.
        let Some(value) = value.filter(|v| v.is_finite()) else {
            match cfg.on_missing {
                OnMissingTerm::SkipSample => return None,
                OnMissingTerm::SkipTerm => {
                    b.missing.push(name.to_owned());
                    continue;
                }
            }
        };
        let weight = if mode == TermMode::On { weight } else { 0.0 };
        if mode == TermMode::On && (name == "coarse" || name == "error") {
            *b.unit_test.get_or_insert(0.0) += value;
        }
        b.terms.insert(name.to_owned(), value);
        b.weights.insert(name.to_owned(), weight);
        b.total += weight * value;
    }
    for term in cfg.custom.iter().filter(|t| t.mode.computed()) {
        let name = term.name.as_str();
        let value = match s.custom.get(name) {
            Some(CustomValue::Value(v)) if v.is_finite() => *v,
            Some(CustomValue::NotApplicable) => {
                b.not_applicable.push(name.to_owned());
                continue;
            }
            _ => match cfg.on_missing {
                OnMissingTerm::SkipSample => return None,
                OnMissingTerm::SkipTerm => {
                    b.missing.push(name.to_owned());
                    continue;
                }
            },
        };
        let weight = if term.mode == TermMode::On {
            term.weight
        } else {
            0.0
        };
        b.terms.insert(name.to_owned(), value);
        b.weights.insert(name.to_owned(), weight);
        b.total += weight * value;
    }
    Some(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    fn signals() -> SampleSignals {
        SampleSignals {
            outcome: Some(RewardClass::Failure),
            n_pass: 1,
            n_fail: 3,
            n_error: BTreeMap::from([(ErrorKind::WrongAnswer, 2), (ErrorKind::TypeError, 1)]),
            p_error: BTreeMap::from([(ErrorKind::WrongAnswer, 0.5), (ErrorKind::TypeError, 0.2)]),
            style: Some(1.5),
            complexity: Some(-0.5),
            custom: CustomScores::new(),
        }
    }

    fn cfg() -> RewardConfig {
        RewardConfig {
            alpha: 1.0,
            beta: 0.5,
            gamma: 0.25,
            delta: 2.0,
            ..RewardConfig::default()
        }
    }

    /// The logged total is the weighted sum of the logged terms.
    fn assert_total_is_weighted_sum(b: &RewardBreakdown) {
        assert_eq!(
            b.terms.keys().collect::<Vec<_>>(),
            b.weights.keys().collect::<Vec<_>>()
        );
        let sum: f64 = b.terms.iter().map(|(k, v)| b.weights[k] * v).sum();
        assert!(close(sum, b.total), "{b:?}");
        let log = b.to_log("reward/");
        assert_eq!(log["reward/total"], b.total);
        for (k, v) in &b.terms {
            assert_eq!(log[&format!("reward/{k}")], *v);
        }
    }

    #[test]
    fn composite_by_hand() {
        let b = composite(&cfg(), &signals()).unwrap();
        // coarse −0.3; error −0.3 + 1.3/4 = 0.025; T = −0.275
        // negative −(2·0.5 + 1·0.2) = −1.2
        // R = 1·(−0.275) + 0.5·1.5 + 0.25·(−0.5) + 2·(−1.2) = −2.05
        assert!(close(b.terms["coarse"], -0.3));
        assert!(close(b.terms["error"], 0.025));
        assert!(close(b.unit_test.unwrap(), -0.275));
        assert!(close(b.terms["style"], 1.5));
        assert!(close(b.terms["complexity"], -0.5));
        assert!(close(b.terms["negative"], -1.2));
        assert!(close(b.total, -2.05), "{}", b.total);
        assert_eq!(b.weights["coarse"], 1.0);
        assert_eq!(b.weights["negative"], 2.0);
        assert!(b.missing.is_empty());
        assert_total_is_weighted_sum(&b);
        let log = b.to_log("reward/");
        assert!(close(log["reward/unit_test"], -0.275));
        assert_eq!(log.len(), 7);
    }

    #[test]
    fn log_only_is_reported_with_weight_zero_and_off_is_absent() {
        let c = RewardConfig {
            style: TermMode::LogOnly,
            error: TermMode::LogOnly,
            complexity: TermMode::Off,
            ..cfg()
        };
        let b = composite(&c, &signals()).unwrap();
        assert!(close(b.terms["style"], 1.5));
        assert_eq!(b.weights["style"], 0.0);
        assert!(close(b.terms["error"], 0.025));
        assert_eq!(b.weights["error"], 0.0);
        assert!(!b.terms.contains_key("complexity"));
        assert!(!b.to_log("").contains_key("complexity"));
        // T is R_coarse alone; R = −0.3 + 2·(−1.2) = −2.7
        assert!(close(b.unit_test.unwrap(), -0.3));
        assert!(close(b.total, -2.7), "{}", b.total);
        assert_total_is_weighted_sum(&b);
    }

    #[test]
    fn pass_with_defaults() {
        let s = SampleSignals {
            outcome: Some(RewardClass::Pass),
            n_pass: 3,
            n_fail: 0,
            n_error: BTreeMap::new(),
            p_error: BTreeMap::new(),
            style: Some(2.0),
            complexity: Some(2.0),
            custom: CustomScores::new(),
        };
        let b = composite(&RewardConfig::default(), &s).unwrap();
        // T = 1 + 1; R = 2 + 0.2·2 + 0.2·2 + 0.2·0 = 2.8
        assert!(close(b.total, 2.8));
        assert_eq!(b.terms["negative"].to_bits(), 0.0f64.to_bits(), "not −0.0");
        assert_total_is_weighted_sum(&b);
    }

    #[test]
    fn no_signal_gives_no_reward() {
        let s = SampleSignals {
            outcome: None,
            ..signals()
        };
        assert_eq!(composite(&cfg(), &s), None);
        // The same through a sandbox report that says "no signal".
        let report = ExecReport::no_signal("pool broken");
        let s = SampleSignals::from_report(&report, BTreeMap::new(), Some(2.0), Some(2.0));
        assert_eq!(composite(&RewardConfig::default(), &s), None);
    }

    #[test]
    fn missing_judge_score_skips_sample_or_term() {
        let s = SampleSignals {
            style: None,
            ..signals()
        };
        assert_eq!(composite(&cfg(), &s), None, "skip_sample is the default");
        let c = RewardConfig {
            on_missing: OnMissingTerm::SkipTerm,
            ..cfg()
        };
        let b = composite(&c, &s).unwrap();
        assert_eq!(b.missing, vec!["style".to_owned()]);
        assert!(!b.terms.contains_key("style"));
        // −0.275 + 0.25·(−0.5) + 2·(−1.2) = −2.8
        assert!(close(b.total, -2.8), "{}", b.total);
        assert_total_is_weighted_sum(&b);
        // A term that is off needs no score at all.
        let c = RewardConfig {
            style: TermMode::Off,
            ..cfg()
        };
        assert!(composite(&c, &s).is_some());
        // NaN from a judge counts as no signal.
        let s = SampleSignals {
            complexity: Some(f64::NAN),
            ..signals()
        };
        assert_eq!(composite(&cfg(), &s), None);
    }

    #[test]
    fn from_report_reads_counts() {
        use crate::exec::outcome::{TestResult, TestStatus};
        let t = |index, status| TestResult {
            index,
            status,
            error_lines: vec![],
            seconds: 0.0,
        };
        let report = ExecReport::from_tests(
            vec![
                t(0, TestStatus::Pass),
                t(
                    1,
                    TestStatus::Error {
                        kind: ErrorKind::IndexError,
                        message: String::new(),
                    },
                ),
            ],
            String::new(),
            0.0,
        );
        let p = BTreeMap::from([(ErrorKind::IndexError, 0.4)]);
        let s = SampleSignals::from_report(&report, p, Some(1.0), Some(1.0));
        let b = composite(&RewardConfig::default(), &s).unwrap();
        // runtime error: coarse −0.6; error −0.3 + 0.65 = 0.35; negative −0.4
        assert!(close(b.terms["coarse"], -0.6));
        assert!(close(b.terms["error"], 0.35));
        assert!(close(b.terms["negative"], -0.4));
        // R = −0.25 + 0.2 + 0.2 − 0.08 = 0.07
        assert!(close(b.total, 0.07), "{}", b.total);
    }

    #[test]
    fn custom_terms_weigh_in_and_none_means_does_not_apply() {
        use crate::config::{CustomTermConfig, OnMissingTerm};
        let mut cfg = cfg();
        let term = |name: &str, weight: f64, mode: TermMode| CustomTermConfig {
            name: name.into(),
            weight,
            mode,
            ..CustomTermConfig::default()
        };
        cfg.custom = vec![
            term("doc", 0.5, TermMode::On),
            term("judge", 3.0, TermMode::LogOnly),
            term("na", 1.0, TermMode::On),
            term("gone", 1.0, TermMode::Off),
        ];
        let mut s = signals();
        let base = composite(&self::cfg(), &s).map(|b| b.total);
        s.custom = CustomScores::from([
            ("doc".to_owned(), CustomValue::Value(2.0)),
            ("judge".to_owned(), CustomValue::Value(-1.0)),
            ("na".to_owned(), CustomValue::NotApplicable),
        ]);
        let b = composite(&cfg, &s).unwrap();
        assert_total_is_weighted_sum(&b);
        assert!(close(b.total, base.unwrap() + 0.5 * 2.0), "{b:?}");
        assert_eq!((b.terms["judge"], b.weights["judge"]), (-1.0, 0.0));
        assert!(!b.terms.contains_key("na") && !b.terms.contains_key("gone"));
        assert_eq!(b.not_applicable, ["na"]);
        assert!(b.missing.is_empty());
        // No signal from a custom term is like a judge's: skip the sample, or the term.
        s.custom
            .insert("doc".into(), CustomValue::NoSignal("f() raised".into()));
        assert_eq!(composite(&cfg, &s), None);
        cfg.on_missing = OnMissingTerm::SkipTerm;
        let b = composite(&cfg, &s).unwrap();
        assert_eq!(b.missing, ["doc"]);
        assert!(close(b.total, base.unwrap()));
    }
}
