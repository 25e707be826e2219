//! The run schema, at the bottom of the crate: one serde struct per module
//! section (one file per large section), loaded from TOML, with defaults (an
//! empty file is a valid config), and the one validation that every command
//! runs. This module imports nothing else from the crate; modules read their
//! section, they do not define it.
//!
//! Shape follows STYLE.md §12 (mistral.rs `config/mod.rs`, TRL's
//! `__post_init__`): parse, validate once, then treat the value as frozen.
//! Every struct carries `#[serde(default, deny_unknown_fields)]` so a typo in
//! a key is an error naming the key, never a silently ignored setting.
//!
//! Two levels of checking:
//! - [`RunConfig::validate`]: every value and every rule between values,
//!   whatever the config is for (what `config show` needs);
//! - [`RunConfig::check`]: that, plus the rules of one [`Job`] (`train`,
//!   `sft`, `eval`) and the files the job will read. `falcon config check`,
//!   `falcon ablate --dry-run` and every command that runs a job call it, so
//!   a config that passes `config check` is not refused later by the trainer.
//!
//! Adding a section: write its struct with a [`Section`] impl in its own file,
//! then add one line to the `sections!` invocation that defines [`RunConfig`].

mod dist;
mod eval;
mod exec;
mod generation;
mod memory;
mod meta;
mod model;
mod overrides;
mod reward;
mod rollout;
mod run;
mod strategy;
mod tasks;
mod train;

pub use dist::DistConfig;
pub use eval::EvalConfig;
pub use exec::*;
pub use generation::GenerationConfig;
pub use memory::*;
pub use meta::{MetaAlgorithm, MetaConfig, MetaPrompt};
pub use model::*;
pub use overrides::{apply_overrides, closest, parse_set, Override};
pub use reward::*;
pub use rollout::{EngineKind, RolloutConfig, VllmConfig};
pub use run::RunSection;
pub use strategy::{Planning, StrategyConfig, StrategyKind};
pub use tasks::{TaskFormat, TasksConfig};
pub use train::*;

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Errors from loading, validating or printing a [`RunConfig`].
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config {}: {source}", path.display())]
    Io {
        /// The file that was being read.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// The text is not valid TOML, or does not fit the schema (unknown key,
    /// wrong type). `message` is toml's own, with line and column.
    #[error("cannot parse config {}: {message}", path.display())]
    Parse {
        /// The file (or source name) that was being parsed.
        path: PathBuf,
        /// toml's message, including line/column and the offending key.
        message: String,
    },
    /// The config parsed but some values are out of range; one problem per entry,
    /// each of the form `key.path = value: what to change`.
    #[error("invalid config:\n  {}", problems.join("\n  "))]
    Invalid {
        /// Every problem found, not just the first.
        problems: Vec<String>,
    },
    /// The config could not be written back as TOML (only possible for values
    /// that TOML cannot hold, such as a seed above `i64::MAX`).
    #[error("cannot write config as TOML: {message}")]
    Serialize {
        /// toml's message.
        message: String,
    },
}

/// Collects validation problems so that `validate` can report all of them at once.
#[derive(Debug, Default)]
pub struct Problems(Vec<String>);

impl Problems {
    /// Records that `key` (a full dotted path) holds `value`, which breaks `rule`.
    pub fn push(&mut self, key: &str, value: impl fmt::Debug, rule: &str) {
        self.0.push(format!("{key} = {value:?}: {rule}"));
    }

    /// The problems recorded so far.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }

    /// Records a problem that is not about one value (a file that is not
    /// there, a rule of the command): `key: rule`.
    pub fn push_rule(&mut self, key: &str, rule: &str) {
        self.0.push(format!("{key}: {rule}"));
    }

    fn into_result(self) -> Result<(), ConfigError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid { problems: self.0 })
        }
    }
}

/// What a config is about to be used for. Most rules hold for every use;
/// some belong to one command (`falcon sft` trains on reference solutions
/// and has no use for `[meta]`), and each command reads its own files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    /// `falcon train` (and every variant of `falcon ablate`): the RL
    /// recipe `[meta] algorithm` names.
    Train,
    /// `falcon sft`: supervised fine-tuning on reference solutions.
    Sft,
    /// `falcon eval`: a strategy on `[eval]`'s tasks.
    Eval,
}

impl Job {
    /// The subcommand's name (`train`, `sft`, `eval`).
    pub fn name(self) -> &'static str {
        match self {
            Job::Train => "train",
            Job::Sft => "sft",
            Job::Eval => "eval",
        }
    }

    /// Whether the job trains (and so reads `[tasks]`, `[train]`).
    pub fn trains(self) -> bool {
        matches!(self, Job::Train | Job::Sft)
    }
}

/// A config section that can check its own values.
pub trait Section {
    /// Pushes one entry per bad value; `path` is the section's dotted key
    /// (`"model"`, `"model.lora"`) to prefix each key with.
    fn validate_into(&self, path: &str, problems: &mut Problems);
}

// Generates `RunConfig` and its validation walk from one list, so a new
// section cannot be added to the struct yet forgotten by `validate`.
macro_rules! sections {
    ($( $(#[$doc:meta])* $field:ident : $ty:ty, )*) => {
        /// A whole run's configuration: one field per module section.
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct RunConfig {
            $( $(#[$doc])* pub $field: $ty, )*
        }

        impl RunConfig {
            fn validate_sections(&self, problems: &mut Problems) {
                $( self.$field.validate_into(stringify!($field), problems); )*
            }
        }
    };
}

sections! {
    /// `[run]`: naming, seeding and where outputs go.
    run: RunSection,
    /// `[model]`: which checkpoint, precision, device and LoRA adapter.
    model: ModelConfig,
    /// `[generation]`: sampling settings for rollouts.
    generation: GenerationConfig,
    /// `[tasks]`: where the task set comes from and how to read it.
    tasks: TasksConfig,
    /// `[exec]`: the execution sandbox (isolation, limits, pool size, CUDA mode).
    exec: ExecConfig,
    /// `[reward]`: FALCON §4.4 reward terms, weights, modes and judges.
    reward: RewardConfig,
    /// `[memory]`: long/short-term memory, error statistics, MEMCoder and
    /// MemoCoder settings.
    memory: MemoryConfig,
    /// `[train]`: the RL loop (steps, batch, optimizer, losses, checkpoints).
    train: TrainConfig,
    /// `[eval]`: held-out evaluation (which tasks, samples per task, k).
    eval: EvalConfig,
    /// `[meta]`: FALCON's MAML loop (Algorithm 1) or the single-level one.
    meta: MetaConfig,
    /// `[strategy]`: how `falcon eval` prompts (zero-shot, FALCON, doc-RAG,
    /// self-repair, MemoCoder, MEMCoder) and each strategy's settings.
    strategy: StrategyConfig,
    /// `[dist]`: collectives of a data-parallel run (torchrun / Slurm).
    dist: DistConfig,
    /// `[rollout]`: the generation engine (native, or vLLM servers).
    rollout: RolloutConfig,
}

impl RunConfig {
    /// Parses TOML text. `source` names where it came from (a file name) and
    /// appears in error messages. Does not validate; call [`RunConfig::validate`].
    pub fn from_toml_str(text: &str, source: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::from(source),
            message: e.to_string(),
        })
    }

    /// Reads and parses a TOML file. Does not validate; see [`RunConfig::load`].
    /// The paths of `[[reward.custom]]` terms are relative to the file and
    /// come back absolute, so the copy a run saves works from anywhere.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        Self::from_file_with(path, &[])
    }

    /// [`RunConfig::from_file`] with `--set` overrides applied to the file's
    /// keys before they are parsed, so they meet the same schema and checks.
    pub fn from_file_with(path: &Path, set: &[Override]) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let source = path.display().to_string();
        let mut config = if set.is_empty() {
            Self::from_toml_str(&text, &source)?
        } else {
            let mut table: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::Parse {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
            apply_overrides(&mut table, set).map_err(|message| ConfigError::Parse {
                path: PathBuf::from("--set"),
                message,
            })?;
            toml::Value::Table(table)
                .try_into::<RunConfig>()
                .map_err(|e| {
                    let message = e.to_string();
                    match overrides::explain_unknown(&message, set) {
                        Some((key, m)) => ConfigError::Parse {
                            path: PathBuf::from(format!("--set {key}")),
                            message: m,
                        },
                        None => ConfigError::Parse {
                            path: PathBuf::from(format!("{source} with --set")),
                            message: message.trim().replace('\n', " "),
                        },
                    }
                })?
        };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        for term in &mut config.reward.custom {
            term.rebase(&dir);
        }
        Ok(config)
    }

    /// Reads, parses and validates a TOML file (values and the rules
    /// between them; no job's rules, no files). See [`RunConfig::load_for`].
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let config = Self::from_file(path)?;
        config.validate()?;
        Ok(config)
    }

    /// Reads, parses and [checks](RunConfig::check) a TOML file for `job`:
    /// the one call a command that runs a job needs.
    pub fn load_for(path: &Path, job: Job) -> Result<Self, ConfigError> {
        Self::load_for_with(path, &[], job)
    }

    /// [`RunConfig::load_for`] with `--set` overrides.
    pub fn load_for_with(path: &Path, set: &[Override], job: Job) -> Result<Self, ConfigError> {
        let config = Self::from_file_with(path, set)?;
        config.check(job)?;
        Ok(config)
    }

    /// Checks every value and every rule between values; on failure returns
    /// [`ConfigError::Invalid`] listing all problems, one per entry.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Problems::default();
        self.validate_into(&mut problems);
        problems.into_result()
    }

    /// [`RunConfig::validate`], plus the rules of `job` and the files it
    /// reads (task files, `init_from`, API docs, a local model path), each
    /// problem reported at once. The trainer, `falcon sft`, `falcon eval`,
    /// `falcon ablate` and `falcon config check` all call this, so they accept
    /// and refuse the same configs.
    pub fn check(&self, job: Job) -> Result<(), ConfigError> {
        let mut problems = Problems::default();
        self.validate_into(&mut problems);
        checks::job_rules(self, job, &mut problems);
        checks::files(self, job, &mut problems);
        problems.into_result()
    }

    fn validate_into(&self, problems: &mut Problems) {
        self.validate_sections(problems);
        checks::cross_section(self, problems);
    }

    /// The resolved config (defaults filled in) as TOML, for `falcon config show`
    /// and for the copy saved under `runs/<name>/`.
    pub fn to_toml_string(&self) -> Result<String, ConfigError> {
        toml::to_string(self).map_err(|e| ConfigError::Serialize {
            message: e.to_string(),
        })
    }
}

mod checks;

pub use checks::file_names;

// TOML integers are signed 64-bit, so a larger seed could never be written
// back into the resolved config that a run saves.
const MAX_TOML_INT: u64 = i64::MAX as u64;

/// `temperature` and `top_p` of a section that samples.
fn check_sampler(path: &str, temperature: f64, top_p: f64, problems: &mut Problems) {
    // TOML allows `nan` and `inf`; the negated comparisons reject NaN too.
    if !(temperature >= 0.0 && temperature.is_finite()) {
        problems.push(
            &format!("{path}.temperature"),
            temperature,
            "must be >= 0 (0 = greedy)",
        );
    }
    if !(top_p > 0.0 && top_p <= 1.0) {
        problems.push(
            &format!("{path}.top_p"),
            top_p,
            "must be in (0, 1] (1 = off)",
        );
    }
}

fn check_seed(key: &str, seed: u64, problems: &mut Problems) {
    if seed > MAX_TOML_INT {
        problems.push(
            key,
            seed,
            "must be at most 9223372036854775807 (TOML integers are signed 64-bit)",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems_of(text: &str) -> Vec<String> {
        let config = RunConfig::from_toml_str(text, "test.toml").expect("parses");
        match config.validate() {
            Ok(()) => Vec::new(),
            Err(ConfigError::Invalid { problems }) => problems,
            Err(other) => panic!("unexpected error {other}"),
        }
    }

    #[test]
    fn empty_file_is_the_default_config_and_valid() {
        let config = RunConfig::from_toml_str("", "empty.toml").unwrap();
        assert_eq!(config, RunConfig::default());
        config.validate().unwrap();
        assert_eq!(config.run.name, "default");
        assert_eq!(config.run.output_dir, PathBuf::from("runs"));
        assert_eq!(config.model.path, EMBEDDED_DEFAULT_MODEL);
        assert_eq!(config.model.dtype, Dtype::Fp32);
        assert_eq!(config.model.device_spec(), Ok(DeviceSpec::Auto));
        assert!(!config.model.lora.enabled);
        assert_eq!(config.model.lora.targets, ["q_proj", "v_proj"]);
        assert_eq!(config.generation.max_new_tokens, 256);
        assert_eq!(config.generation.seed, None);
        assert_eq!(config.tasks.format, TaskFormat::Auto);
        assert_eq!(config.tasks.path, None);
    }

    #[test]
    fn partial_sections_keep_other_defaults() {
        let config = RunConfig::from_toml_str(
            "[model.lora]\nenabled = true\n[generation]\ntop_k = 40\n",
            "t.toml",
        )
        .unwrap();
        assert!(config.model.lora.enabled);
        assert_eq!(config.model.lora.rank, 8);
        assert_eq!(config.generation.top_k, 40);
        assert_eq!(config.generation.temperature, 0.8);
    }

    #[test]
    fn unknown_key_is_rejected_with_its_name_and_file() {
        let err = RunConfig::from_toml_str("[generation]\ntopp = 0.9\n", "my.toml").unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ConfigError::Parse { .. }));
        assert!(msg.contains("my.toml"), "{msg}");
        assert!(msg.contains("topp"), "{msg}");
        assert!(msg.contains("line 2"), "{msg}");

        let msg = RunConfig::from_toml_str("[modle]\n", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("modle"), "{msg}");
        let msg = RunConfig::from_toml_str("[model.lora]\nranks = 4\n", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("ranks"), "{msg}");
    }

    #[test]
    fn syntax_error_keeps_line_and_column() {
        let msg = RunConfig::from_toml_str("[run]\nname = \"x\"\nseed = = 3\n", "bad.toml")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("bad.toml"), "{msg}");
        assert!(msg.contains("line 3, column"), "{msg}");
    }

    #[test]
    fn wrong_type_and_bad_enum_are_parse_errors() {
        let msg = RunConfig::from_toml_str("[generation]\nmax_new_tokens = \"many\"\n", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("max_new_tokens"), "{msg}");
        let msg = RunConfig::from_toml_str("[model]\ndtype = \"fp8\"\n", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("fp8") && msg.contains("bf16"), "{msg}");
        let msg = RunConfig::from_toml_str("[run]\nseed = -1\n", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("seed") || msg.contains("line 2"), "{msg}");
    }

    #[test]
    fn training_strategies_need_their_inputs() {
        assert_eq!(
            problems_of("[train]\nstrategy = \"memcoder\"\n"),
            ["train.strategy = \"memcoder\": documentation strategies need the library's API docs: set [memory] api_docs"]
        );
        assert!(problems_of(
            "[memory]\napi_docs = \"d.jsonl\"\n[train]\nstrategy = \"memcoder-accum\"\n"
        )
        .is_empty());
        let p = problems_of("[train]\nstrategy = \"falcon\"\n");
        assert!(p.len() == 1 && p[0].contains("[meta]"), "{p:?}");
        assert!(problems_of("[train]\nstrategy = \"self-repair\"\n").is_empty());
        // In the meta-loop a strategy's prompts replace Table 7, so that
        // prompt must be turned off by name.
        let meta = "[model.lora]\nenabled = true\n[train]\nstrategy = \"self-repair\"\n[meta]\nalgorithm = \"fomaml\"\n";
        let p = problems_of(meta);
        assert!(p.len() == 1 && p[0].starts_with("meta.prompt"), "{p:?}");
        assert!(problems_of(&format!("{meta}prompt = \"zero-shot\"\n")).is_empty());
        assert!(problems_of(&format!("{meta}long_term = false\n")).is_empty());
    }

    #[test]
    fn validate_reports_key_path_value_and_rule() {
        let problems = problems_of("[generation]\ntop_p = 1.5\n");
        assert_eq!(
            problems,
            ["generation.top_p = 1.5: must be in (0, 1] (1 = off)"]
        );
    }

    #[test]
    fn exec_cuda_memory_fraction_must_be_a_share() {
        for bad in ["0.0", "1.5", "-0.1"] {
            let problems = problems_of(&format!("[exec]\ncuda_memory_fraction = {bad}\n"));
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert!(problems[0].starts_with("exec.cuda_memory_fraction = "));
        }
        assert!(
            problems_of("[exec]\ncuda_memory_fraction = 1.0\nreuse_child = false\n").is_empty()
        );
    }

    #[test]
    fn exec_clock_and_wall_backstop() {
        let c = RunConfig::from_toml_str("[exec]\ntimeout_s = 2.0\n", "t.toml").unwrap();
        assert_eq!(
            (c.exec.clock, c.exec.wall_limit_s()),
            (ExecClock::Cpu, 16.0)
        );
        let c = RunConfig::from_toml_str(
            "[exec]\ntimeout_s = 2.0\nclock = \"wall\"\nwall_timeout_s = 9.0\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(
            (c.exec.clock, c.exec.wall_limit_s()),
            (ExecClock::Wall, 2.0)
        );
        let c =
            RunConfig::from_toml_str("[exec]\ntimeout_s = 2.0\nwall_timeout_s = 9.0\n", "t.toml")
                .unwrap();
        assert_eq!(c.exec.wall_limit_s(), 9.0);
        let problems = problems_of("[exec]\ntimeout_s = 2.0\nwall_timeout_s = 1.0\n");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("exec.wall_timeout_s = 1"),
            "{problems:?}"
        );
        assert!(RunConfig::from_toml_str("[exec]\nclock = \"monotonic\"\n", "t.toml").is_err());
    }

    #[test]
    fn validate_collects_every_problem() {
        let problems = problems_of(
            r#"
            [run]
            name = "../x"
            [model]
            device = "gpu"
            [model.lora]
            rank = 0
            alpha = 0.0
            dropout = 1.0
            targets = ["q_proj", "qkv", "q_proj"]
            [generation]
            max_new_tokens = 0
            temperature = -0.1
            top_p = 0.0
            stop = ["", "\n\n"]
            "#,
        );
        let expected_keys = [
            "run.name",
            "model.device",
            "model.lora.rank",
            "model.lora.alpha",
            "model.lora.dropout",
            "model.lora.targets[1]",
            "model.lora.targets[2]",
            "generation.max_new_tokens",
            "generation.temperature",
            "generation.top_p",
            "generation.stop[0]",
        ];
        assert_eq!(problems.len(), expected_keys.len(), "{problems:#?}");
        for (problem, key) in problems.iter().zip(expected_keys) {
            assert!(problem.starts_with(&format!("{key} = ")), "{problem}");
        }
        let err = ConfigError::Invalid { problems };
        assert_eq!(err.to_string().lines().count(), 1 + expected_keys.len());
    }

    #[test]
    fn nan_and_infinity_are_rejected() {
        let problems = problems_of("[generation]\ntemperature = nan\ntop_p = nan\n");
        assert_eq!(problems.len(), 2, "{problems:?}");
        let problems = problems_of("[generation]\ntemperature = inf\n[model.lora]\nalpha = inf\n");
        assert_eq!(problems.len(), 2, "{problems:?}");
    }

    #[test]
    fn empty_lora_targets_are_rejected() {
        let problems = problems_of("[model.lora]\ntargets = []\n");
        assert_eq!(problems.len(), 1);
        assert!(problems[0].starts_with("model.lora.targets = []: must list"));
    }

    #[test]
    fn device_syntax() {
        assert_eq!(DeviceSpec::parse("auto"), Ok(DeviceSpec::Auto));
        assert_eq!(DeviceSpec::parse("cpu"), Ok(DeviceSpec::Cpu));
        assert_eq!(DeviceSpec::parse("cuda"), Ok(DeviceSpec::Cuda(None)));
        assert_eq!(DeviceSpec::parse("cuda:3"), Ok(DeviceSpec::Cuda(Some(3))));
        for bad in [
            "", "CUDA", "gpu", "cuda:", "cuda:-1", "cuda:+1", "cuda:x", "cuda:0:1",
        ] {
            assert!(DeviceSpec::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(DeviceSpec::parse("cuda:99999999999999999999999").is_err());
        for ok in ["auto", "cpu", "cuda", "cuda:12"] {
            assert_eq!(DeviceSpec::parse(ok).unwrap().to_string(), ok);
        }
    }

    #[test]
    fn seeds_above_i64_max_are_rejected() {
        let mut config = RunConfig::default();
        config.run.seed = u64::MAX;
        config.generation.seed = Some(u64::MAX);
        let Err(ConfigError::Invalid { problems }) = config.validate() else {
            panic!("accepted")
        };
        assert_eq!(problems.len(), 2);
        assert!(config.to_toml_string().is_err());
    }

    #[test]
    fn toml_round_trip_keeps_every_value() {
        let mut config = RunConfig::default();
        config.run.name = "ablation-1".into();
        config.model.device = "cuda:1".into();
        config.model.dtype = Dtype::Bf16;
        config.model.lora.enabled = true;
        config.model.lora.targets = vec!["o_proj".into()];
        config.generation.stop = vec!["\ndef ".into()];
        config.generation.seed = Some(7);
        config.tasks.path = Some(PathBuf::from("data/mbpp.jsonl"));
        config.tasks.format = TaskFormat::Mbpp;
        let text = config.to_toml_string().unwrap();
        assert_eq!(
            RunConfig::from_toml_str(&text, "shown.toml").unwrap(),
            config
        );

        let default_text = RunConfig::default().to_toml_string().unwrap();
        assert!(default_text.contains("[model.lora]"), "{default_text}");
        assert!(!default_text.contains("seed = ") || default_text.contains("[run]"));
        assert_eq!(
            RunConfig::from_toml_str(&default_text, "d.toml").unwrap(),
            RunConfig::default()
        );
    }

    #[test]
    fn missing_file_is_io_error_with_path() {
        let err = RunConfig::from_file(Path::new("/nonexistent/falcon.toml")).unwrap_err();
        assert!(matches!(err, ConfigError::Io { .. }));
        assert!(err.to_string().contains("/nonexistent/falcon.toml"));
    }

    // STYLE.md §12: every shipped config must parse and validate.
    #[test]
    fn every_file_in_configs_loads_and_validates() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            // `ablate-*.toml` are grids, not run configs: the CLI test
            // checks them with `falcon ablate --dry-run`.
            let grid = path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("ablate-"));
            if path.extension().is_some_and(|e| e == "toml") && !grid {
                RunConfig::load(&path).unwrap_or_else(|e| panic!("{e}"));
                seen += 1;
            }
        }
        assert!(
            seen >= 2,
            "expected at least default.toml and lora-smoke.toml in {}",
            dir.display()
        );
    }

    #[test]
    fn default_toml_matches_built_in_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/default.toml");
        assert_eq!(RunConfig::load(&path).unwrap(), RunConfig::default());
    }
}
