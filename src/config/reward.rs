//! `[reward]`: FALCON §4.4's reward terms, their weights and modes, and the
//! judges of style and complexity (docs/rewards.md).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{Problems, Section};

/// How one reward term takes part in the composite.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TermMode {
    /// Computed, reported, and weighted into the total.
    #[default]
    On,
    /// Not computed (its judge is not even run) and not reported.
    Off,
    /// Computed and reported under its name, but weighted 0 in the total.
    LogOnly,
}

impl TermMode {
    /// Whether the term must be computed (`on` or `log_only`).
    pub fn computed(self) -> bool {
        self != TermMode::Off
    }
}

/// Which judge scores style `S` and complexity `C`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JudgeKind {
    /// ruff findings (style) and McCabe complexity (complexity); no model needed.
    #[default]
    Static,
    /// A language model through the `Generator` trait with FALCON's Table 8 / 9 templates.
    Lm,
}

/// What to do with a sample when a computed term has no signal (a judge
/// timed out, an LM judge's answer could not be parsed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnMissingTerm {
    /// The whole sample gets no reward (nothing is guessed).
    #[default]
    SkipSample,
    /// The term is left out of that sample's total and listed as missing.
    SkipTerm,
}

impl fmt::Display for TermMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TermMode::On => "on",
            TermMode::Off => "off",
            TermMode::LogOnly => "log_only",
        })
    }
}

/// `[reward]`: the composite R = α·T + β·S + γ·C + δ·E of FALCON §4.4, where
/// T = R_coarse + R_error (Eq. 9, 10; Algorithm 1 sums both losses), S the
/// style score, C the complexity score, and E = R_negative (Eq. 11).
/// See docs/rewards.md.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RewardConfig {
    /// α: weight of the unit-test term T (applies to both R_coarse and R_error).
    pub alpha: f64,
    /// β: weight of the style term S.
    pub beta: f64,
    /// γ: weight of the complexity term C.
    pub gamma: f64,
    /// δ: weight of the error-type term E = R_negative.
    pub delta: f64,
    /// R_coarse (Eq. 9), one half of T.
    pub coarse: TermMode,
    /// R_error (Eq. 10), the other half of T.
    pub error: TermMode,
    /// Style S on −1..2.
    pub style: TermMode,
    /// Complexity C on −1..2.
    pub complexity: TermMode,
    /// R_negative (Eq. 11).
    pub negative: TermMode,
    /// A computed term without signal: skip the sample, or skip the term.
    pub on_missing: OnMissingTerm,
    /// Which judge scores S and C.
    pub judge: JudgeKind,
    /// `[reward.static_judge]`: ruff and McCabe settings.
    pub static_judge: StaticJudgeConfig,
    /// `[reward.lm_judge]`: LM judge settings.
    pub lm_judge: LmJudgeConfig,
}

impl Default for RewardConfig {
    fn default() -> Self {
        Self {
            alpha: 1.0,
            beta: 0.2,
            gamma: 0.2,
            delta: 0.2,
            coarse: TermMode::On,
            error: TermMode::On,
            style: TermMode::On,
            complexity: TermMode::On,
            negative: TermMode::On,
            on_missing: OnMissingTerm::SkipSample,
            judge: JudgeKind::Static,
            static_judge: StaticJudgeConfig::default(),
            lm_judge: LmJudgeConfig::default(),
        }
    }
}

impl Section for RewardConfig {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        for (key, w) in [
            ("alpha", self.alpha),
            ("beta", self.beta),
            ("gamma", self.gamma),
            ("delta", self.delta),
        ] {
            if !(w >= 0.0 && w.is_finite()) {
                problems.push(
                    &format!("{path}.{key}"),
                    w,
                    "must be a finite number >= 0 (turn a term off with its mode, not a negative weight)",
                );
            }
        }
        self.static_judge
            .validate_into(&format!("{path}.static_judge"), problems);
        self.lm_judge
            .validate_into(&format!("{path}.lm_judge"), problems);
    }
}

/// `[reward.static_judge]`: style from ruff's findings, complexity from McCabe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StaticJudgeConfig {
    /// The ruff executable; "auto" looks in the project's virtualenvs, then
    /// on `PATH` (see `config::locate_tool`).
    pub ruff: String,
    /// The Python that computes McCabe complexity with `ast` (never runs the code);
    /// "auto" searches like `ruff` for `python3`.
    pub python: String,
    /// ruff rule prefixes passed to `--select`.
    pub ruff_select: Vec<String>,
    /// Wall-clock limit for one ruff or Python run, in seconds.
    pub timeout_s: f64,
    /// Findings per 10 non-blank lines at which S reaches −1 (S = 2 at none, linear between).
    pub style_findings_per_10_lines_at_worst: f64,
    /// Largest McCabe complexity that still scores C = 2.
    pub complexity_simple: f64,
    /// McCabe complexity at and above which C = −1 (linear between).
    pub complexity_worst: f64,
}

impl Default for StaticJudgeConfig {
    fn default() -> Self {
        Self {
            ruff: "auto".to_owned(),
            python: "auto".to_owned(),
            ruff_select: ["E", "W", "F", "N", "B", "UP", "SIM"]
                .map(str::to_owned)
                .to_vec(),
            timeout_s: 10.0,
            style_findings_per_10_lines_at_worst: 4.0,
            complexity_simple: 5.0,
            complexity_worst: 20.0,
        }
    }
}

impl Section for StaticJudgeConfig {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        for (key, value) in [("ruff", &self.ruff), ("python", &self.python)] {
            if value.trim().is_empty() {
                problems.push(
                    &format!("{path}.{key}"),
                    value,
                    "must name an executable or be \"auto\"",
                );
            }
        }
        if self.ruff_select.is_empty() {
            problems.push(
                &format!("{path}.ruff_select"),
                &self.ruff_select,
                "must list at least one rule prefix (default E, W, F, N, B, UP, SIM)",
            );
        }
        for (i, rule) in self.ruff_select.iter().enumerate() {
            let letters = rule.trim_end_matches(|c: char| c.is_ascii_digit());
            if letters.is_empty() || !letters.bytes().all(|b| b.is_ascii_uppercase()) {
                problems.push(
                    &format!("{path}.ruff_select[{i}]"),
                    rule,
                    "must be a ruff rule prefix: capital letters then optional digits (E, UP, SIM101)",
                );
            }
        }
        if !(self.timeout_s > 0.0 && self.timeout_s <= 3600.0) {
            problems.push(
                &format!("{path}.timeout_s"),
                self.timeout_s,
                "must be in (0, 3600] seconds",
            );
        }
        let worst = self.style_findings_per_10_lines_at_worst;
        if !(worst > 0.0 && worst.is_finite()) {
            problems.push(
                &format!("{path}.style_findings_per_10_lines_at_worst"),
                worst,
                "must be a finite number > 0",
            );
        }
        if !(self.complexity_simple >= 1.0 && self.complexity_simple.is_finite()) {
            problems.push(
                &format!("{path}.complexity_simple"),
                self.complexity_simple,
                "must be >= 1 (the smallest McCabe complexity)",
            );
        }
        if !(self.complexity_worst > self.complexity_simple && self.complexity_worst.is_finite()) {
            problems.push(
                &format!("{path}.complexity_worst"),
                self.complexity_worst,
                "must be finite and greater than complexity_simple",
            );
        }
    }
}

/// `[reward.lm_judge]`: the LM judge (FALCON Tables 8 and 9). The caller
/// supplies the `Generator` (the policy itself or a separate judge model).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LmJudgeConfig {
    /// Tokens the judge may write per answer.
    pub max_new_tokens: usize,
    /// Wrap each prompt in the judge model's chat template.
    pub chat: bool,
}

impl Default for LmJudgeConfig {
    fn default() -> Self {
        Self {
            max_new_tokens: 64,
            chat: true,
        }
    }
}

impl Section for LmJudgeConfig {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        if self.max_new_tokens < 1 {
            problems.push(
                &format!("{path}.max_new_tokens"),
                self.max_new_tokens,
                "must be >= 1",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigError, RunConfig};

    fn problems_of(text: &str) -> Vec<String> {
        match RunConfig::from_toml_str(text, "t.toml").unwrap().validate() {
            Ok(()) => Vec::new(),
            Err(ConfigError::Invalid { problems }) => problems,
            Err(other) => panic!("unexpected error {other}"),
        }
    }

    #[test]
    fn reward_defaults_and_modes_parse() {
        let c = RunConfig::from_toml_str("", "t.toml").unwrap().reward;
        assert_eq!(c, RewardConfig::default());
        assert_eq!((c.alpha, c.beta, c.gamma, c.delta), (1.0, 0.2, 0.2, 0.2));
        assert_eq!(c.judge, JudgeKind::Static);
        let c = RunConfig::from_toml_str(
            "[reward]\nstyle = \"log_only\"\ncomplexity = \"off\"\njudge = \"lm\"\n\
             on_missing = \"skip_term\"\n[reward.static_judge]\ntimeout_s = 2.5\n",
            "t.toml",
        )
        .unwrap()
        .reward;
        assert_eq!(c.style, TermMode::LogOnly);
        assert_eq!(c.complexity, TermMode::Off);
        assert_eq!(c.judge, JudgeKind::Lm);
        assert_eq!(c.on_missing, OnMissingTerm::SkipTerm);
        assert_eq!(c.static_judge.timeout_s, 2.5);
        let text = RunConfig {
            reward: c.clone(),
            ..RunConfig::default()
        }
        .to_toml_string()
        .unwrap();
        assert_eq!(RunConfig::from_toml_str(&text, "t.toml").unwrap().reward, c);
    }

    #[test]
    fn reward_typos_and_bad_values_are_named() {
        let msg = RunConfig::from_toml_str("[reward]\nstyle = \"logonly\"\n", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("logonly"), "{msg}");
        assert!(RunConfig::from_toml_str("[reward]\nbeeta = 1.0\n", "t.toml").is_err());
        let problems = problems_of(
            "[reward]\nbeta = -1.0\ndelta = nan\n[reward.static_judge]\nruff_select = [\"e\"]\n\
             timeout_s = 0.0\ncomplexity_simple = 10.0\ncomplexity_worst = 10.0\n\
             style_findings_per_10_lines_at_worst = 0.0\n[reward.lm_judge]\nmax_new_tokens = 0\n",
        );
        let keys: Vec<&str> = problems
            .iter()
            .map(|p| p.split(" = ").next().unwrap())
            .collect();
        assert_eq!(
            keys,
            [
                "reward.beta",
                "reward.delta",
                "reward.static_judge.ruff_select[0]",
                "reward.static_judge.timeout_s",
                "reward.static_judge.style_findings_per_10_lines_at_worst",
                "reward.static_judge.complexity_worst",
                "reward.lm_judge.max_new_tokens",
            ],
            "{problems:#?}"
        );
    }
}
