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
    /// `[[reward.custom]]`: the user's own terms, beside FALCON's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub custom: Vec<CustomTermConfig>,
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
            custom: Vec::new(),
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
        let mut names = std::collections::BTreeSet::new();
        for (i, c) in self.custom.iter().enumerate() {
            let at = format!("{path}.custom[{i}]");
            c.validate_into(&at, problems);
            if !names.insert(c.name.as_str()) {
                problems.push(
                    &format!("{at}.name"),
                    &c.name,
                    "is already the name of another [[reward.custom]] term",
                );
            }
        }
    }
}

/// Where a custom term's values come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CustomKind {
    /// A function in a Python file, run in a pool of Python processes.
    Python,
    /// An executable: one JSON object per sample in, one result per line out.
    Command,
    /// A server speaking OpenRLHF's remote reward model protocol.
    Http,
}

/// Which trainer's calling convention a Python reward function follows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardSignature {
    /// TRL: `f(prompts, completions, completion_ids, **columns) -> list[float | None]`.
    #[default]
    Trl,
    /// verl: `compute_score(data_source, solution_str, ground_truth, extra_info)`
    /// per sample, a float or a dict with a `score`.
    Verl,
    /// OpenRLHF: `reward_func(queries, prompts, labels)`, a list, tensor or a
    /// dict with `rewards`.
    Openrlhf,
}

/// How completions reach a TRL-style function: text, or the chat messages
/// of a conversational dataset (`[{"role": "assistant", "content": ...}]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompletionFormat {
    #[default]
    Standard,
    Conversational,
}

/// The names no custom term may take: FALCON's terms and the composite's
/// own entries.
pub const RESERVED_TERM_NAMES: [&str; 7] = [
    "coarse",
    "error",
    "style",
    "complexity",
    "negative",
    "unit_test",
    "total",
];

/// One `[[reward.custom]]` term (docs/rewards.md, "Your own reward").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CustomTermConfig {
    /// Logged as `reward/<name>`; unique, not a built-in term's name.
    pub name: String,
    pub kind: CustomKind,
    /// The term's weight in the composite.
    pub weight: f64,
    /// `on`, `log_only` or `off`, as for FALCON's terms.
    pub mode: TermMode,
    /// python: the file (relative to the config file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<std::path::PathBuf>,
    /// python: the callable's name (default: `compute_score` for verl,
    /// `reward_func` for openrlhf, the term's name for trl).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub function: String,
    /// python: whose calling convention the function follows.
    pub signature: RewardSignature,
    /// python, trl: completions as text or as chat messages.
    pub completions: CompletionFormat,
    /// python: the interpreter; "auto" looks in the project's virtualenvs,
    /// then on `PATH`.
    pub python: String,
    /// python: extra keyword arguments for every call (verl's
    /// `custom_reward_function.reward_kwargs`).
    #[serde(skip_serializing_if = "toml::Table::is_empty")]
    pub kwargs: toml::Table,
    /// python: processes in the pool; a step's batch is split between them
    /// in contiguous slices (1: the function sees the whole batch, as in TRL).
    pub workers: usize,
    /// command: the program and its arguments, run in the config file's
    /// directory.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// command: the working directory (filled in with the config file's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<std::path::PathBuf>,
    /// http: the servers' full URLs (OpenRLHF's `/get_reward`), tried in
    /// turn on failure.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<String>,
    /// http: the environment variable holding a bearer token (unset or empty:
    /// no `Authorization` header).
    pub token_env: String,
    /// http: requests in flight per server.
    pub concurrency: usize,
    /// http: tries after the first, on the next server, with backoff.
    pub retries: u32,
    /// http: samples per request (0: the whole batch in one request).
    pub batch_size: usize,
    /// openrlhf (python and http): the task field sent as `labels`.
    pub label_key: String,
    /// Seconds one call may take (a Python call, a command's batch, an HTTP
    /// request) before its samples get no signal.
    pub timeout_s: f64,
    /// python and command: run the process under bubblewrap, as a
    /// candidate runs: no network, its own process namespace, a read-only
    /// filesystem and a private `/tmp`. For a reward that executes the
    /// completion itself; the file and the worker stay readable.
    pub sandbox: bool,
}

impl Default for CustomTermConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            kind: CustomKind::Python,
            weight: 1.0,
            mode: TermMode::On,
            path: None,
            function: String::new(),
            signature: RewardSignature::Trl,
            completions: CompletionFormat::Standard,
            python: "auto".to_owned(),
            kwargs: toml::Table::new(),
            workers: 1,
            command: Vec::new(),
            cwd: None,
            urls: Vec::new(),
            token_env: "FALCON_REWARD_TOKEN".to_owned(),
            concurrency: 4,
            retries: 2,
            batch_size: 0,
            label_key: "tests".to_owned(),
            timeout_s: 60.0,
            sandbox: false,
        }
    }
}

impl CustomTermConfig {
    /// The callable a python term calls.
    pub fn function_name(&self) -> &str {
        match (self.function.is_empty(), self.signature) {
            (false, _) => &self.function,
            (true, RewardSignature::Verl) => "compute_score",
            (true, RewardSignature::Openrlhf) => "reward_func",
            (true, RewardSignature::Trl) => &self.name,
        }
    }

    /// Relative paths made absolute against `dir` (the config file's).
    pub fn rebase(&mut self, dir: &std::path::Path) {
        if let Some(p) = &self.path {
            if p.is_relative() {
                self.path = Some(dir.join(p));
            }
        }
        if self.kind == CustomKind::Command {
            match &self.cwd {
                Some(c) if c.is_relative() => self.cwd = Some(dir.join(c)),
                None => self.cwd = Some(dir.to_path_buf()),
                Some(_) => {}
            }
        }
    }
}

impl Section for CustomTermConfig {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        let name_ok = !self.name.is_empty()
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !name_ok {
            problems.push(
                &format!("{path}.name"),
                &self.name,
                "must be a non-empty name of letters, digits, `_` and `-` (it is logged as reward/<name>)",
            );
        } else if RESERVED_TERM_NAMES.contains(&self.name.as_str()) {
            problems.push(
                &format!("{path}.name"),
                &self.name,
                "is a built-in term's name; set that term with [reward] instead, or pick another name",
            );
        }
        if !(self.weight >= 0.0 && self.weight.is_finite()) {
            problems.push(
                &format!("{path}.weight"),
                self.weight,
                "must be a finite number >= 0 (turn a term off with its mode, not a negative weight)",
            );
        }
        if !(self.timeout_s > 0.0 && self.timeout_s <= 3600.0) {
            problems.push(
                &format!("{path}.timeout_s"),
                self.timeout_s,
                "must be in (0, 3600] seconds",
            );
        }
        let mut not_for = |key: &str, set: bool| {
            if set {
                problems.push(
                    &format!("{path}.{key}"),
                    "(set)",
                    &format!("does not apply to kind = \"{}\"", kind_name(self.kind)),
                );
            }
        };
        match self.kind {
            CustomKind::Python => {
                not_for("command", !self.command.is_empty());
                not_for("urls", !self.urls.is_empty());
                if self.path.is_none() {
                    problems.push(
                        &format!("{path}.path"),
                        "(unset)",
                        "must name the Python file that defines the function",
                    );
                }
                if self.workers == 0 || self.workers > 64 {
                    problems.push(
                        &format!("{path}.workers"),
                        self.workers,
                        "must be in 1..=64",
                    );
                }
                if self.python.trim().is_empty() {
                    problems.push(
                        &format!("{path}.python"),
                        &self.python,
                        "must name an executable or be \"auto\"",
                    );
                }
            }
            CustomKind::Command => {
                not_for("path", self.path.is_some());
                not_for("urls", !self.urls.is_empty());
                if self.command.first().is_none_or(|c| c.trim().is_empty()) {
                    problems.push(
                        &format!("{path}.command"),
                        format!("{:?}", self.command),
                        "must name the program to run, then its arguments",
                    );
                }
            }
            CustomKind::Http => {
                not_for("path", self.path.is_some());
                not_for("command", !self.command.is_empty());
                if self.urls.is_empty() {
                    problems.push(
                        &format!("{path}.urls"),
                        "[]",
                        "must list at least one server URL (http://host:port/get_reward)",
                    );
                }
                for (i, u) in self.urls.iter().enumerate() {
                    if let Err(why) = check_url(u) {
                        problems.push(&format!("{path}.urls[{i}]"), u, &why);
                    }
                }
                if self.concurrency == 0 {
                    problems.push(&format!("{path}.concurrency"), 0, "must be >= 1");
                }
            }
        }
    }
}

fn kind_name(k: CustomKind) -> &'static str {
    match k {
        CustomKind::Python => "python",
        CustomKind::Command => "command",
        CustomKind::Http => "http",
    }
}

/// `http://host[:port]/path` or `https://...`, with a host.
fn check_url(u: &str) -> Result<(), String> {
    let Some(rest) = u
        .strip_prefix("http://")
        .or_else(|| u.strip_prefix("https://"))
    else {
        return Err("must start with http:// or https://".into());
    };
    let host = rest.split(['/', '?']).next().unwrap_or("");
    if host.is_empty() || host.starts_with(':') {
        return Err("has no host".into());
    }
    if let Some((_, port)) = host.rsplit_once(':') {
        if !host.ends_with(']') && port.parse::<u16>().is_err() {
            return Err(format!("port {port:?} is not a number in 0..=65535"));
        }
    }
    Ok(())
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

/// `[reward.lm_judge]`: the LM judge (FALCON Tables 8 and 9). `falcon exec`
/// takes its model from `--judge-model`; `falcon train` from `model`, a
/// model of its own (the policy changes every step).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LmJudgeConfig {
    /// Tokens the judge may write per answer.
    pub max_new_tokens: usize,
    /// Wrap each prompt in the judge model's chat template.
    pub chat: bool,
    /// The judge model in training: a local HF directory, a `.gguf`, a
    /// cached repo id or `embedded[:NAME]`.
    pub model: String,
    /// In training, at most this many answers the judge writes per step
    /// (style and complexity together; 0 = no limit). Code it has judged
    /// before is answered from a cache by code hash, free; code beyond the
    /// budget gets no style or complexity signal that step.
    pub max_requests_per_step: usize,
}

impl Default for LmJudgeConfig {
    fn default() -> Self {
        Self {
            max_new_tokens: 64,
            chat: true,
            model: String::new(),
            max_requests_per_step: 64,
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
