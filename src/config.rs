//! The run schema: one serde struct per module section, loaded from TOML,
//! with defaults (an empty file is a valid config) and a `validate()` that
//! reports every bad value with its full key path and what to change.
//!
//! Shape follows STYLE.md §12 (mistral.rs `config/mod.rs`, TRL's
//! `__post_init__`): parse, validate once, then treat the value as frozen.
//! Every struct carries `#[serde(default, deny_unknown_fields)]` so a typo in
//! a key is an error naming the key, never a silently ignored setting.
//!
//! Adding a section: write its struct with a [`Section`] impl, then add one
//! line to the `sections!` invocation that defines [`RunConfig`].

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
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// Reads, parses and validates a TOML file: the one call a CLI needs.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let config = Self::from_file(path)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every value; on failure returns [`ConfigError::Invalid`] listing
    /// all problems, one per entry.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Problems::default();
        self.validate_sections(&mut problems);
        for (key, kind) in [
            ("train.strategy", self.train.strategy),
            ("strategy.kind", self.strategy.kind),
        ] {
            if kind.reads_docs() && self.memory.api_docs.is_none() {
                problems.push(
                    key,
                    kind.name(),
                    "documentation strategies need the library's API docs: set [memory] api_docs",
                );
            }
        }
        // A strategy writes its own prompts; silently dropping the Table 7
        // prompt that [meta] asks for would make the run something else.
        if self.train.strategy != StrategyKind::ZeroShot
            && self.meta.algorithm != MetaAlgorithm::Off
            && self.meta.long_term
            && self.meta.prompt == MetaPrompt::Table7
        {
            problems.push(
                "meta.prompt",
                "table7",
                "[train] strategy writes its own prompts, so the Table 7 prompt would go unused: set [meta] prompt = \"zero-shot\" (long-term memory still records samples and supplies demonstrations) or [train] strategy = \"zero-shot\"",
            );
        }
        if problems.0.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                problems: problems.0,
            })
        }
    }

    /// The resolved config (defaults filled in) as TOML, for `falcon config show`
    /// and for the copy saved under `runs/<name>/`.
    pub fn to_toml_string(&self) -> Result<String, ConfigError> {
        toml::to_string(self).map_err(|e| ConfigError::Serialize {
            message: e.to_string(),
        })
    }
}

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

/// `[run]`: identifies a run and where its files go (`<output_dir>/<name>/`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunSection {
    /// Run name; becomes a directory name under `output_dir`.
    pub name: String,
    /// Master seed from which every other seed of the run is derived.
    pub seed: u64,
    /// Parent directory of all runs.
    pub output_dir: PathBuf,
}

impl Default for RunSection {
    fn default() -> Self {
        Self {
            name: "default".to_owned(),
            seed: 0,
            output_dir: PathBuf::from("runs"),
        }
    }
}

impl RunSection {
    /// The directory this run writes to: `<output_dir>/<name>`.
    pub fn run_dir(&self) -> PathBuf {
        self.output_dir.join(&self.name)
    }
}

impl Section for RunSection {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        let name = &self.name;
        // The name is joined onto output_dir, so anything that escapes it or
        // nests directories would scatter run files.
        if name.is_empty() || name == "." || name == ".." {
            problems.push(
                &format!("{path}.name"),
                name,
                "must be a non-empty directory name (not \".\" or \"..\")",
            );
        } else if name.contains(['/', '\\']) {
            problems.push(
                &format!("{path}.name"),
                name,
                "must not contain '/' or '\\'; set output_dir for the parent directory",
            );
        }
        check_seed(&format!("{path}.seed"), self.seed, problems);
        if self.output_dir.as_os_str().is_empty() {
            problems.push(
                &format!("{path}.output_dir"),
                &self.output_dir,
                "must not be empty (default \"runs\")",
            );
        }
    }
}

/// Weight and compute precision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// 32-bit float.
    #[default]
    Fp32,
    /// bfloat16.
    Bf16,
    /// IEEE half precision.
    Fp16,
}

impl Dtype {
    /// The spelling used in configs and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::Fp32 => "fp32",
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "fp16",
        }
    }

    /// The `torch_dtype` spelling of HF configs.
    pub fn hf_name(self) -> &'static str {
        match self {
            Dtype::Fp32 => "float32",
            Dtype::Bf16 => "bfloat16",
            Dtype::Fp16 => "float16",
        }
    }
}

impl std::str::FromStr for Dtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "fp32" | "f32" | "float32" => Ok(Dtype::Fp32),
            "bf16" | "bfloat16" => Ok(Dtype::Bf16),
            "fp16" | "f16" | "float16" | "half" => Ok(Dtype::Fp16),
            other => Err(format!("unknown dtype `{other}`: use fp32, bf16 or fp16")),
        }
    }
}

/// A parsed `model.device` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    /// CUDA device 0 if CUDA is available, else the CPU.
    Auto,
    /// The CPU.
    Cpu,
    /// A CUDA device: `None` for `"cuda"` (device 0), `Some(n)` for `"cuda:n"`.
    Cuda(Option<usize>),
}

impl DeviceSpec {
    /// Parses `auto`, `cpu`, `cuda` or `cuda:N` (N a decimal ordinal).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(None)),
            _ => {
                let ordinal = s.strip_prefix("cuda:").ok_or_else(|| {
                    "must be \"auto\", \"cpu\", \"cuda\" or \"cuda:N\" (N = 0, 1, ...)".to_owned()
                })?;
                // `usize::from_str` accepts a leading '+', which no device name has.
                if ordinal.is_empty() || !ordinal.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(format!(
                        "the ordinal after \"cuda:\" must be a non-negative integer, got {ordinal:?}"
                    ));
                }
                ordinal
                    .parse()
                    .map(|n| Self::Cuda(Some(n)))
                    .map_err(|_| format!("device ordinal {ordinal:?} is too large"))
            }
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(None) => f.write_str("cuda"),
            Self::Cuda(Some(n)) => write!(f, "cuda:{n}"),
        }
    }
}

/// The path value that means "the model embedded in the binary".
pub const EMBEDDED_DEFAULT_MODEL: &str = "embedded:smollm2-135m-instruct";

/// `[model]`: the policy checkpoint and where it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// A local HF-layout directory, or `embedded:<name>` for a bundled model.
    pub path: String,
    /// Precision for weights and compute.
    pub dtype: Dtype,
    /// `auto`, `cpu`, `cuda` or `cuda:N`; see [`DeviceSpec`].
    pub device: String,
    /// `[model.lora]`: optional LoRA adapter.
    pub lora: LoraConfig,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            path: EMBEDDED_DEFAULT_MODEL.to_owned(),
            dtype: Dtype::Fp32,
            device: "auto".to_owned(),
            lora: LoraConfig::default(),
        }
    }
}

impl ModelConfig {
    /// The parsed device; errors carry the same message `validate` reports.
    pub fn device_spec(&self) -> Result<DeviceSpec, String> {
        DeviceSpec::parse(&self.device)
    }
}

impl Section for ModelConfig {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        if self.path.trim().is_empty() {
            problems.push(
                &format!("{path}.path"),
                &self.path,
                &format!("must name a model directory or {EMBEDDED_DEFAULT_MODEL:?}"),
            );
        }
        if let Err(rule) = self.device_spec() {
            problems.push(&format!("{path}.device"), &self.device, &rule);
        }
        self.lora.validate_into(&format!("{path}.lora"), problems);
    }
}

/// Module names a LoRA adapter may wrap (Qwen2 / Llama HF names).
pub const LORA_TARGETS: &[&str] = &[
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// `[model.lora]`: a low-rank adapter on selected projections.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraConfig {
    /// Train an adapter instead of the full weights.
    pub enabled: bool,
    /// Rank `r` of the update `B·A`.
    pub rank: usize,
    /// Scale numerator: the update is multiplied by `alpha / rank`.
    pub alpha: f64,
    /// Dropout on the adapter input, in `[0, 1)`.
    pub dropout: f64,
    /// Which projections get an adapter; names from [`LORA_TARGETS`].
    pub targets: Vec<String>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            rank: 8,
            alpha: 16.0,
            dropout: 0.0,
            targets: vec!["q_proj".to_owned(), "v_proj".to_owned()],
        }
    }
}

impl Section for LoraConfig {
    // Checked even when disabled: a config that breaks only once someone
    // flips `enabled` on is a trap.
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        if self.rank < 1 {
            problems.push(&format!("{path}.rank"), self.rank, "must be >= 1");
        }
        if !(self.alpha > 0.0 && self.alpha.is_finite()) {
            problems.push(&format!("{path}.alpha"), self.alpha, "must be > 0");
        }
        if !(0.0..1.0).contains(&self.dropout) {
            problems.push(
                &format!("{path}.dropout"),
                self.dropout,
                "must be in [0, 1)",
            );
        }
        let key = format!("{path}.targets");
        if self.targets.is_empty() {
            problems.push(
                &key,
                &self.targets,
                &format!("must list at least one of {}", LORA_TARGETS.join(", ")),
            );
        }
        for (i, target) in self.targets.iter().enumerate() {
            if !LORA_TARGETS.contains(&target.as_str()) {
                problems.push(
                    &format!("{key}[{i}]"),
                    target,
                    &format!("must be one of {}", LORA_TARGETS.join(", ")),
                );
            } else if self.targets[..i].contains(target) {
                problems.push(
                    &format!("{key}[{i}]"),
                    target,
                    "is listed twice; remove one",
                );
            }
        }
    }
}

/// `[generation]`: how rollouts sample from the policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GenerationConfig {
    /// Tokens generated per completion at most.
    pub max_new_tokens: usize,
    /// Softmax temperature; 0 means greedy decoding.
    pub temperature: f64,
    /// Keep only the k most likely tokens; 0 turns the filter off.
    pub top_k: usize,
    /// Nucleus sampling mass in (0, 1]; 1 turns the filter off.
    pub top_p: f64,
    /// Generation stops once the completion contains any of these strings.
    pub stop: Vec<String>,
    /// Sampler seed; `None` derives it from `run.seed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        Self {
            max_new_tokens: 256,
            temperature: 0.8,
            top_k: 0,
            top_p: 1.0,
            stop: Vec::new(),
            seed: None,
        }
    }
}

impl Section for GenerationConfig {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        if self.max_new_tokens < 1 {
            problems.push(
                &format!("{path}.max_new_tokens"),
                self.max_new_tokens,
                "must be >= 1",
            );
        }
        check_sampler(path, self.temperature, self.top_p, problems);
        for (i, stop) in self.stop.iter().enumerate() {
            // An empty stop string matches at once and would end every completion.
            if stop.is_empty() {
                problems.push(
                    &format!("{path}.stop[{i}]"),
                    stop,
                    "must not be empty; remove it",
                );
            }
        }
        if let Some(seed) = self.seed {
            check_seed(&format!("{path}.seed"), seed, problems);
        }
    }
}

/// On-disk layout of a task file; see `docs/tasks.md`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskFormat {
    /// Detect from the file's first record (and reject gzip with a hint).
    #[default]
    Auto,
    /// falcon-rl's own JSONL, one `Task` per line.
    Jsonl,
    /// OpenAI HumanEval JSONL (`task_id`, `prompt`, `test`, `entry_point`, ...).
    Humaneval,
    /// MBPP: full `mbpp.jsonl` or sanitized `mbpp-sanitized.json`.
    Mbpp,
    /// PriCoder benchmarks (NumbaEval, NdonnxEval) JSONL.
    Pricoder,
}

impl fmt::Display for TaskFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Jsonl => "jsonl",
            Self::Humaneval => "humaneval",
            Self::Mbpp => "mbpp",
            Self::Pricoder => "pricoder",
        })
    }
}

/// `[tasks]`: the task set a run trains or evaluates on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TasksConfig {
    /// Task file; `None` means the command must be given one (or uses its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// How to read `path`.
    pub format: TaskFormat,
    /// Skip (and count) malformed records instead of failing the load.
    pub skip_invalid: bool,
    /// Keep only tasks carrying at least one of these tags; empty keeps all.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

impl Section for TasksConfig {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        if let Some(p) = &self.path {
            if p.as_os_str().is_empty() {
                problems.push(
                    &format!("{path}.path"),
                    p,
                    "must not be empty; remove the key to leave it unset",
                );
            }
        }
    }
}

/// Default wall-clock limit per test, seconds.
pub const EXEC_DEFAULT_TIMEOUT_S: f64 = 5.0;
/// Default address-space limit of the process running candidate code, MiB.
pub const EXEC_DEFAULT_MEMORY_MB: u64 = 2048;
/// Default limit on the size of any one file the candidate writes (stdout included), MiB.
pub const EXEC_DEFAULT_FILE_SIZE_MB: u64 = 16;
/// Default size of each worker's private writable tmpfs (the job directory), MiB.
pub const EXEC_DEFAULT_DISK_MB: u64 = 64;
/// Default limit on open file descriptors of the candidate process.
pub const EXEC_DEFAULT_OPEN_FILES: u64 = 64;
/// Default limit on processes and threads of the candidate's uid.
pub const EXEC_DEFAULT_PROCESSES: u64 = 32;
/// Default number of bytes of stdout/stderr kept per sample (the tail).
pub const EXEC_DEFAULT_OUTPUT_BYTES: usize = 4096;
/// Default largest answer (one message) the trusted side accepts from candidate code, MiB.
pub const EXEC_DEFAULT_MAX_RESULT_MB: u64 = 16;
/// Default first uid of the candidate processes; worker `i` uses `uid_base + i`.
pub const EXEC_DEFAULT_UID_BASE: u32 = 61000;
/// Modules imported once by every worker before it forks (missing ones are skipped).
/// Share of GPU memory one numba candidate may take in `cuda = "device"` mode.
pub const EXEC_DEFAULT_CUDA_MEMORY_FRACTION: f64 = 0.05;
pub const EXEC_DEFAULT_PRELOAD: &[&str] = &[
    "math",
    "re",
    "collections",
    "itertools",
    "functools",
    "heapq",
    "bisect",
    "string",
    "typing",
    "fractions",
    "decimal",
    "statistics",
    "random",
    "operator",
    "copy",
    "datetime",
    "hashlib",
    "numpy",
];

/// How strongly candidate code is isolated from the host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// bubblewrap: network, pid and mount namespaces, read-only system, private tmpfs.
    #[default]
    Bwrap,
    /// No namespaces (rlimits, uid drop when root, timeouts only). Warns loudly once.
    None,
}

/// Where `numba_cuda` tasks run their kernels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CudaMode {
    /// The device when `/dev/nvidia0` exists, else the simulator.
    #[default]
    Auto,
    /// numba's CUDA simulator (`NUMBA_ENABLE_CUDASIM=1`).
    Sim,
    /// The GPU (the NVIDIA device nodes are bound into the sandbox).
    Device,
}

/// The clock `[exec] timeout_s` is measured on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecClock {
    /// CPU seconds of the candidate process. The same code times out the
    /// same way however busy the machine is, so a sample's reward (and a
    /// rerun) does not depend on what else runs; `wall_timeout_s` catches
    /// code that sleeps or blocks.
    #[default]
    Cpu,
    /// Wall-clock seconds: a sample near the limit may pass on an idle
    /// machine and time out on a busy one.
    Wall,
}

/// `[exec]`: the sandbox that runs candidate code (see docs/sandbox.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExecConfig {
    /// `"bwrap"` (default) or `"none"` (weaker; warns once).
    pub isolation: Isolation,
    /// Warm workers in the pool; 0 = one per CPU.
    pub workers: usize,
    /// Python interpreter (a name on PATH or a path); resolved once on the host.
    pub python: String,
    /// The bubblewrap binary.
    pub bwrap: String,
    /// Limit per test, seconds on `clock`.
    pub timeout_s: f64,
    /// What `timeout_s` measures: `"cpu"` (default) or `"wall"`.
    pub clock: ExecClock,
    /// `clock = "cpu"`: wall-clock limit per test for code that sleeps or
    /// blocks; 0 = 3 × `timeout_s` + 10 s. Unused with `clock = "wall"`.
    pub wall_timeout_s: f64,
    /// CPU-seconds limit per test; 0 = `ceil(timeout_s) + 1`.
    pub cpu_s: u64,
    /// Address-space limit of the candidate process, MiB.
    pub memory_mb: u64,
    /// Largest file the candidate may write (stdout/stderr included), MiB.
    pub file_size_mb: u64,
    /// Size of each worker's writable tmpfs, MiB.
    pub disk_mb: u64,
    /// Open file descriptors of the candidate process.
    pub open_files: u64,
    /// Processes/threads of the candidate's uid.
    pub processes: u64,
    /// Bytes of stdout/stderr tail kept per sample.
    pub output_bytes: usize,
    /// Largest single answer accepted from candidate code, MiB.
    pub max_result_mb: u64,
    /// First uid for candidate processes (worker i uses uid_base + i); needs root.
    pub uid_base: u32,
    /// numba_cuda tasks: `"auto"`, `"sim"` or `"device"`.
    pub cuda: CudaMode,
    /// Modules each worker imports before forking (missing ones are skipped).
    pub preload: Vec<String>,
    /// `cuda = "device"`: the share of the GPU's memory one candidate process
    /// may allocate through numba; the rest stays with the trainer.
    pub cuda_memory_fraction: f64,
    /// Run a job's tests in one candidate process while they pass (a failing,
    /// crashing or timed-out test gets a fresh process for the next test).
    /// `false` forks a fresh process for every test.
    pub reuse_child: bool,
}

impl Default for ExecConfig {
    fn default() -> Self {
        Self {
            isolation: Isolation::Bwrap,
            workers: 0,
            python: "python3".to_owned(),
            bwrap: "bwrap".to_owned(),
            timeout_s: EXEC_DEFAULT_TIMEOUT_S,
            clock: ExecClock::Cpu,
            wall_timeout_s: 0.0,
            cpu_s: 0,
            memory_mb: EXEC_DEFAULT_MEMORY_MB,
            file_size_mb: EXEC_DEFAULT_FILE_SIZE_MB,
            disk_mb: EXEC_DEFAULT_DISK_MB,
            open_files: EXEC_DEFAULT_OPEN_FILES,
            processes: EXEC_DEFAULT_PROCESSES,
            output_bytes: EXEC_DEFAULT_OUTPUT_BYTES,
            max_result_mb: EXEC_DEFAULT_MAX_RESULT_MB,
            uid_base: EXEC_DEFAULT_UID_BASE,
            cuda: CudaMode::Auto,
            preload: EXEC_DEFAULT_PRELOAD
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            cuda_memory_fraction: EXEC_DEFAULT_CUDA_MEMORY_FRACTION,
            reuse_child: true,
        }
    }
}

impl ExecConfig {
    /// The wall-clock seconds a test may take before the worker kills it.
    pub fn wall_limit_s(&self) -> f64 {
        match self.clock {
            ExecClock::Wall => self.timeout_s,
            ExecClock::Cpu if self.wall_timeout_s > 0.0 => self.wall_timeout_s,
            // Roomy, so that a CPU-bound test on a loaded machine (a quarter
            // of a core) still ends on its CPU limit, not on this one.
            ExecClock::Cpu => 3.0 * self.timeout_s + 10.0,
        }
    }
}

impl Section for ExecConfig {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        if !(self.timeout_s > 0.0 && self.timeout_s <= 3600.0) {
            problems.push(
                &format!("{path}.timeout_s"),
                self.timeout_s,
                "must be in (0, 3600] seconds",
            );
        }
        // A backstop below the CPU limit would make the clock choice moot.
        if self.wall_timeout_s != 0.0
            && !(self.wall_timeout_s >= self.timeout_s && self.wall_timeout_s <= 3.0 * 3600.0)
        {
            problems.push(
                &format!("{path}.wall_timeout_s"),
                self.wall_timeout_s,
                "must be 0 (= 3 x timeout_s + 10) or in [timeout_s, 10800] seconds",
            );
        }
        if !(self.cuda_memory_fraction > 0.0 && self.cuda_memory_fraction <= 1.0) {
            problems.push(
                &format!("{path}.cuda_memory_fraction"),
                self.cuda_memory_fraction,
                "must be in (0, 1]",
            );
        }
        if self.workers > 1024 {
            problems.push(
                &format!("{path}.workers"),
                self.workers,
                "must be at most 1024 (0 = one per CPU)",
            );
        }
        for (key, value, min) in [
            ("memory_mb", self.memory_mb, 64),
            ("file_size_mb", self.file_size_mb, 1),
            ("disk_mb", self.disk_mb, 1),
            ("open_files", self.open_files, 16),
            ("processes", self.processes, 1),
            ("max_result_mb", self.max_result_mb, 1),
        ] {
            if value < min {
                problems.push(
                    &format!("{path}.{key}"),
                    value,
                    &format!("must be >= {min}"),
                );
            }
        }
        if self.python.trim().is_empty() {
            problems.push(
                &format!("{path}.python"),
                &self.python,
                "must name a Python 3 interpreter",
            );
        }
        if self.bwrap.trim().is_empty() {
            problems.push(
                &format!("{path}.bwrap"),
                &self.bwrap,
                "must name the bubblewrap binary",
            );
        }
        if self.uid_base == 0
            || self
                .uid_base
                .checked_add(self.workers.max(1024) as u32)
                .is_none()
        {
            problems.push(
                &format!("{path}.uid_base"),
                self.uid_base,
                "must be > 0 and leave room for one uid per worker",
            );
        }
    }
}

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
    /// The ruff executable; "auto" looks in `$VIRTUAL_ENV/bin`, `./.venv/bin`, then `PATH`.
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
mod reward_section_tests {
    use super::*;

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
        let meta = "[train]\nstrategy = \"self-repair\"\n[meta]\nalgorithm = \"fomaml\"\n";
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

// ------------------------------------------------------------------ memory

/// Which embedder turns texts into memory vectors (see `memory::embed`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EmbedderKind {
    /// all-MiniLM-L6-v2 (384-d), installed by scripts/setup.
    #[default]
    Minilm,
    /// Mean-pooled hidden states of the policy.
    Policy,
    /// Hashed n-grams; no model (tests, tiny runs).
    Hash,
}

/// Which vector index serves long-term retrieval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexKind {
    /// Exact inner product on the training device.
    #[default]
    Exact,
    /// FAISS from `faiss_factory` (needs the `faiss` feature, on by default).
    Faiss,
}

/// Which model answers: the in-process policy or an OpenAI-compatible
/// server. Used for MEMCoder's reflector / MemoCoder's mentor
/// (`[memory.reflector]`) and for `falcon eval`'s answers (`[strategy.generator]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum GeneratorSource {
    /// The policy itself.
    #[default]
    Policy,
    /// An OpenAI-compatible server (vLLM, TGI, ...).
    Openai(crate::model::openai::OpenAiConfig),
}

/// `[memory]`: see docs/memory.md.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    pub embedder: EmbedderKind,
    /// Dimension of the `hash` embedder.
    pub hash_dim: usize,
    /// The MiniLM model directory; empty = where scripts/setup puts it.
    pub minilm_dir: String,
    pub index: IndexKind,
    /// FAISS index factory string (inner-product metric).
    pub faiss_factory: String,
    /// IVF lists searched per query.
    pub nprobe: usize,
    /// Vectors collected before an IVF index is trained (exact until then).
    pub faiss_train_size: usize,
    /// Past entries retrieved into FALCON's Table 7 prompt.
    pub top_k: usize,
    /// Samples the short-term ring buffer holds.
    pub short_term_capacity: usize,
    /// Tokens per short-term sample (longer ones are cut).
    pub short_term_max_len: usize,
    /// How much history `P_error` covers.
    pub p_error: crate::memory::stats::StatsMode,
    /// MEMCoder: `K_doc` documentation APIs retrieved per task.
    pub k_doc: usize,
    /// MEMCoder: `K_task` similar past tasks whose APIs join the candidates.
    pub k_task: usize,
    /// MEMCoder: the library documentation (JSON / JSONL of API entries).
    pub api_docs: Option<PathBuf>,
    /// `[memory.memcoder]`: Eq. 5 weights and retrieval sizes.
    pub memcoder: crate::memory::memcoder::MemCoderParams,
    /// `[memory.fixes]`: MemoCoder's fixing knowledge and mentor.
    pub fixes: crate::memory::fixes::FixesConfig,
    /// `[memory.reflector]`: `kind = "policy"` or `kind = "openai"` with
    /// `base_url`, `model`, `api_key_env`.
    pub reflector: GeneratorSource,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            embedder: EmbedderKind::Minilm,
            hash_dim: 384,
            minilm_dir: String::new(),
            index: IndexKind::Exact,
            faiss_factory: "IVF1024,Flat".into(),
            nprobe: 16,
            faiss_train_size: 50_000,
            top_k: 3,
            short_term_capacity: 1024,
            short_term_max_len: 1024,
            p_error: crate::memory::stats::StatsMode::All,
            // MEMCoder §V-F: top-5 documentation APIs; K_task is not stated.
            k_doc: 5,
            k_task: 3,
            api_docs: None,
            memcoder: Default::default(),
            fixes: Default::default(),
            reflector: GeneratorSource::Policy,
        }
    }
}

impl Section for MemoryConfig {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        for (key, value, min) in [
            ("hash_dim", self.hash_dim, 1),
            ("nprobe", self.nprobe, 1),
            ("faiss_train_size", self.faiss_train_size, 1),
            ("short_term_capacity", self.short_term_capacity, 1),
            ("short_term_max_len", self.short_term_max_len, 1),
        ] {
            if value < min {
                problems.push(
                    &format!("{path}.{key}"),
                    value,
                    &format!("must be >= {min}"),
                );
            }
        }
        if self.faiss_factory.trim().is_empty() {
            problems.push(
                &format!("{path}.faiss_factory"),
                &self.faiss_factory,
                "must be a FAISS index factory string such as \"IVF1024,Flat\" or \"HNSW32,Flat\"",
            );
        }
        if self.index == IndexKind::Faiss && !cfg!(feature = "faiss") {
            problems.push(
                &format!("{path}.index"),
                "faiss",
                "this build has no FAISS (feature `faiss`); use \"exact\"",
            );
        }
        if let Err(e) = self.p_error.validate() {
            problems.push(&format!("{path}.p_error"), self.p_error, &e.to_string());
        }
        if let Err(e) = self.memcoder.validate() {
            problems.push(&format!("{path}.memcoder"), "", &e.to_string());
        }
        if let Err(e) = self.fixes.validate() {
            problems.push(&format!("{path}.fixes"), "", &e.to_string());
        }
        self.reflector
            .validate_into(&format!("{path}.reflector"), problems);
    }
}

impl Section for GeneratorSource {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        if let GeneratorSource::Openai(o) = self {
            if o.base_url.trim().is_empty() || o.model.trim().is_empty() {
                problems.push(
                    path,
                    &o.base_url,
                    "kind = \"openai\" needs base_url and model",
                );
            }
        }
    }
}

// ------------------------------------------------------------------- train

/// Which optimizer updates the trainable weights.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    #[default]
    Adamw,
    Sgd,
}

/// Weights of the loss terms (FALCON Algorithm 1 line 10 adds them; a
/// weight of 0 still logs the term).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LossWeights {
    /// Policy gradient on the composite reward's advantages.
    pub pg: f64,
    /// Fine-grained loss on the tokens of failing lines (Eqs. 2, 8).
    pub fine: f64,
    /// Cross-entropy on passing samples (L_sl, Eq. 3).
    pub sl: f64,
    /// KL penalty to the frozen reference policy (the base model under
    /// LoRA); 0 = off, and the reference forward is skipped.
    pub kl: f64,
}

impl Default for LossWeights {
    fn default() -> Self {
        LossWeights {
            pg: 1.0,
            fine: 1.0,
            sl: 0.0,
            kl: 0.0,
        }
    }
}

/// `[train]`: see docs/train.md.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Policy updates in the run.
    pub steps: u64,
    /// Tasks per step.
    pub tasks_per_step: usize,
    /// Samples generated per task (G).
    pub group_size: usize,
    pub optimizer: OptimizerKind,
    /// Peak learning rate.
    pub lr: f64,
    pub weight_decay: f64,
    pub warmup_steps: u64,
    pub schedule: crate::train::optim::ScheduleKind,
    /// Final learning rate as a fraction of `lr` (cosine / linear).
    pub min_lr_ratio: f64,
    /// Global gradient-norm clip; 0 = off.
    pub grad_clip: f64,
    pub advantage: crate::train::advantage::AdvantageKind,
    /// Divide group-mean advantages by the group's standard deviation (GRPO).
    pub normalize_std: bool,
    pub normalization: crate::train::losses::Normalization,
    pub loss: LossWeights,
    /// Write `step-N/` every this many steps (and after the last).
    pub checkpoint_every: u64,
    /// Checkpoints kept (the newest); 0 keeps all.
    pub keep_last: usize,
    /// The instruction put before each task in the user message.
    pub instruction: String,
    /// The rollout: `zero-shot`, or a strategy (`self-repair`, `memocoder`,
    /// `doc-rag`, `memcoder`, `memcoder-accum`, with `[strategy]`'s
    /// settings) whose final answers, under the prompts that produced them,
    /// are what the policy learns from. Single-level loop only.
    pub strategy: StrategyKind,
    /// Optimizer steps on each generated batch (PPO-style reuse). Above 1
    /// the policy-gradient term uses the clipped ratio with `clip_eps`.
    pub ppo_epochs: usize,
    pub clip_eps: f64,
    /// Sequences per forward/backward pass; the gradients of a step's
    /// micro-batches are accumulated (exactly: each term keeps the whole
    /// batch's normalisation). 0 = the whole batch at once.
    pub micro_batch: usize,
    /// In the update and the meta-loop's passes, run each prompt once for
    /// the samples of a micro-batch that share it (a GRPO group) instead of
    /// once per sample: the same losses and gradients up to float rounding
    /// (second-order MAML included), less compute.
    pub shared_prefix: bool,
    /// Mixed precision for the update's forward passes: `"bf16"` or
    /// `"fp16"` autocast (matmuls in the low precision; weights, gradients,
    /// optimizer state and log-softmax in fp32) on the model's device, CPU
    /// included. The meta-loop's passes stay in the model's dtype.
    pub autocast: Autocast,
    /// Start from the trainable weights of this checkpoint directory
    /// (`runs/NAME/step-N`, e.g. of a `falcon sft` run); its LoRA settings
    /// must match `[model.lora]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_from: Option<PathBuf>,
    /// Evaluate on `[eval]`'s tasks before the first step / after the last.
    pub eval_before: bool,
    pub eval_after: bool,
    /// Also evaluate on `[eval]`'s tasks after every this many steps (0 =
    /// off), for held-out curves; that time is not counted in
    /// `max_minutes`.
    pub eval_every: u64,
    /// Stop (with a checkpoint, then `eval_after`) after the step during
    /// which this many minutes of training have passed, counted over all
    /// the sessions of a resumed run; 0 = no limit. For comparisons at
    /// equal wall-clock budgets.
    pub max_minutes: f64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            steps: 20,
            tasks_per_step: 4,
            group_size: 4,
            optimizer: OptimizerKind::Adamw,
            lr: 1e-4,
            weight_decay: 0.0,
            warmup_steps: 0,
            schedule: crate::train::optim::ScheduleKind::Constant,
            min_lr_ratio: 0.1,
            grad_clip: 1.0,
            advantage: Default::default(),
            normalize_std: false,
            normalization: Default::default(),
            loss: LossWeights::default(),
            checkpoint_every: 5,
            keep_last: 3,
            instruction: "Write a Python function for the task below. Answer with the complete code in one ```python block.".into(),
            strategy: StrategyKind::ZeroShot,
            ppo_epochs: 1,
            clip_eps: 0.2,
            micro_batch: 0,
            shared_prefix: true,
            autocast: Autocast::Off,
            init_from: None,
            eval_before: false,
            eval_after: false,
            eval_every: 0,
            max_minutes: 0.0,
        }
    }
}

/// `[train] autocast`: mixed precision of the update.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Autocast {
    /// The model's own dtype throughout.
    #[default]
    Off,
    Bf16,
    Fp16,
}

/// How the meta-update of FALCON's Algorithm 1 uses the adapted weights.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetaAlgorithm {
    /// The single-level policy-gradient loop (the ablation baseline).
    #[default]
    Off,
    /// Second-order MAML: the meta-gradient flows through the inner steps.
    Maml,
    /// First-order MAML: the query gradient at θ_i is applied to θ.
    Fomaml,
    /// Reptile: θ ← θ + ε · mean_i(θ_i − θ).
    Reptile,
}

/// What the meta-loop prompts with while long-term memory is on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MetaPrompt {
    /// FALCON's Table 7: the task with its retrieved history.
    #[default]
    Table7,
    /// The zero-shot prompt; long-term memory still records every evaluated
    /// sample and supplies the inner mini-batches' demonstrations. Small
    /// models copy a retrieved neighbour's code (docs/train.md), which this
    /// avoids without giving up the memory.
    ZeroShot,
}

/// `[meta]`: FALCON's inner/outer loop over fast LoRA weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetaConfig {
    pub algorithm: MetaAlgorithm,
    /// SGD steps on each task's fast weights (Algorithm 1 line 11). 0 (with
    /// `maml`/`fomaml`): no adaptation and no second generation; the update
    /// is the single-level one on the same memory-built mini-batches
    /// (FALCON without the meta-loop).
    pub inner_steps: usize,
    /// α, the inner learning rate (plain SGD). The outer rate β is
    /// `[train] lr`. LoRA gradients are small per parameter (RMS ~1e-4 with
    /// token-mean losses on SmolLM2), so an SGD step comparable to one of
    /// Adam at lr 5e-4 needs α of order 1.
    pub inner_lr: f64,
    /// Reptile's ε.
    pub reptile_eps: f64,
    /// Short-term memory rows added to each task's inner mini-batch.
    pub short_term_samples: usize,
    /// Keep long-term memory: record every evaluated sample there, and
    /// retrieve from it for the prompt (`prompt`) and the demonstrations.
    /// Off: zero-shot prompts and no demonstrations.
    pub long_term: bool,
    /// With `long_term`: Table 7 prompts, or zero-shot ones.
    pub prompt: MetaPrompt,
    /// Passing neighbours retrieved from long-term memory that join each
    /// inner mini-batch as demonstrations (`L_sl`).
    pub long_term_demos: usize,
    /// Samples generated with θ_i on T_i for the meta-loss (line 12); 0 =
    /// `[train] group_size`.
    pub query_size: usize,
}

impl Default for MetaConfig {
    fn default() -> Self {
        MetaConfig {
            algorithm: MetaAlgorithm::Off,
            inner_steps: 1,
            inner_lr: 1.0,
            reptile_eps: 0.5,
            short_term_samples: 4,
            long_term: true,
            prompt: MetaPrompt::Table7,
            long_term_demos: 2,
            query_size: 0,
        }
    }
}

impl Section for MetaConfig {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        if self.inner_steps == 0 && self.algorithm == MetaAlgorithm::Reptile {
            problems.push(
                &format!("{path}.inner_steps"),
                0,
                "Reptile needs >= 1 (with 0 steps θ_i = θ and θ never moves)",
            );
        }
        if !(self.inner_lr.is_finite() && self.inner_lr > 0.0) {
            problems.push(
                &format!("{path}.inner_lr"),
                self.inner_lr,
                "must be a positive number",
            );
        }
        if !(self.reptile_eps.is_finite() && self.reptile_eps > 0.0 && self.reptile_eps <= 1.0) {
            problems.push(
                &format!("{path}.reptile_eps"),
                self.reptile_eps,
                "must be in (0, 1]",
            );
        }
    }
}

/// `[eval]`: held-out evaluation, used by `falcon train` before and after
/// training (`[train] eval_before` / `eval_after`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalConfig {
    /// Task file; unset means `[tasks] path`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    pub format: TaskFormat,
    /// Keep only tasks carrying at least one of these tags; empty keeps all.
    pub tags: Vec<String>,
    /// At most this many tasks (file order); 0 = all.
    pub max_tasks: usize,
    /// Samples per task.
    pub n: usize,
    /// The k of pass@k / exec@k; each must be <= n.
    pub k: Vec<usize>,
    /// 0 = greedy (with n = 1, the usual greedy pass@1).
    pub temperature: f64,
    pub top_p: f64,
    /// Prompts per generation call.
    pub batch_size: usize,
    /// `falcon eval`: go this many tasks at a time and, with `--out FILE`,
    /// keep each finished group in `FILE.partial/`, so that a killed
    /// evaluation resumes where it stopped; 0 = all tasks at once, nothing
    /// kept before the end. Groups batch samples differently, so results
    /// with another value differ sample by sample (not in distribution).
    pub checkpoint_tasks: usize,
}

impl Default for EvalConfig {
    fn default() -> Self {
        EvalConfig {
            path: None,
            format: TaskFormat::Auto,
            tags: Vec::new(),
            max_tasks: 0,
            n: 1,
            k: vec![1],
            temperature: 0.0,
            top_p: 1.0,
            batch_size: 32,
            checkpoint_tasks: 0,
        }
    }
}

impl Section for EvalConfig {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        for (key, v) in [("n", self.n), ("batch_size", self.batch_size)] {
            if v == 0 {
                problems.push(&format!("{path}.{key}"), v, "must be >= 1");
            }
        }
        if self.k.is_empty() {
            problems.push(&format!("{path}.k"), "[]", "list at least one k");
        }
        for (i, &k) in self.k.iter().enumerate() {
            if k == 0 || k > self.n {
                problems.push(
                    &format!("{path}.k[{i}]"),
                    k,
                    &format!("must be in 1..=n (n = {})", self.n),
                );
            }
        }
        check_sampler(path, self.temperature, self.top_p, problems);
        if self.n > 1 && self.temperature == 0.0 {
            problems.push(
                &format!("{path}.temperature"),
                self.temperature,
                "n > 1 greedy samples would all be the same; set a temperature > 0",
            );
        }
    }
}

impl Section for TrainConfig {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        if self.strategy == StrategyKind::Falcon {
            problems.push(
                &format!("{path}.strategy"),
                self.strategy.name(),
                "FALCON's prompt comes from [meta]'s long-term memory: use zero-shot with a [meta] algorithm",
            );
        }
        for (key, value) in [
            ("steps", self.steps),
            ("tasks_per_step", self.tasks_per_step as u64),
            ("group_size", self.group_size as u64),
            ("checkpoint_every", self.checkpoint_every),
            ("ppo_epochs", self.ppo_epochs as u64),
        ] {
            if value == 0 {
                problems.push(&format!("{path}.{key}"), value, "must be >= 1");
            }
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            problems.push(&format!("{path}.lr"), self.lr, "must be a positive number");
        }
        for (key, v) in [
            ("weight_decay", self.weight_decay),
            ("grad_clip", self.grad_clip),
            ("loss.pg", self.loss.pg),
            ("loss.fine", self.loss.fine),
            ("loss.sl", self.loss.sl),
            ("loss.kl", self.loss.kl),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                problems.push(&format!("{path}.{key}"), v, "must be a finite number >= 0");
            }
        }
        if !(self.clip_eps.is_finite() && self.clip_eps > 0.0 && self.clip_eps < 1.0) {
            problems.push(
                &format!("{path}.clip_eps"),
                self.clip_eps,
                "must be in (0, 1)",
            );
        }
        if let Some(p) = &self.init_from {
            if p.as_os_str().is_empty() {
                problems.push(
                    &format!("{path}.init_from"),
                    p,
                    "must not be empty; remove the key to leave it unset",
                );
            }
        }
        if !(self.max_minutes.is_finite() && self.max_minutes >= 0.0) {
            problems.push(
                &format!("{path}.max_minutes"),
                self.max_minutes,
                "must be a finite number >= 0 (0 = no limit)",
            );
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            problems.push(
                &format!("{path}.min_lr_ratio"),
                self.min_lr_ratio,
                "must be in [0, 1]",
            );
        }
    }
}

/// The rollout strategies of `rollout` (see docs/eval.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StrategyKind {
    /// One prompt: the instruction and the task.
    #[default]
    ZeroShot,
    /// FALCON's Table 7 prompt from a run's long-term memory
    /// (`[strategy] memory_run` or `falcon eval --memory`).
    Falcon,
    /// The top `[memory] k_doc` API docs by embedding similarity, then the task.
    DocRag,
    /// Zero-shot, then up to `max_attempts - 1` revisions from the guiding
    /// test's error.
    SelfRepair,
    /// MemoCoder: planner, code writer, guiding test, mentor, repair loop.
    Memocoder,
    /// MEMCoder: guidelines from task- and API-level memory, evolved after
    /// every task of the stream.
    Memcoder,
    /// MEMCoder-Accum: raw trajectories kept first-in-first-out, no reflector.
    MemcoderAccum,
}

impl StrategyKind {
    /// The name a config file uses (`"memcoder-accum"`).
    pub fn name(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    /// Doc-RAG, MEMCoder and MEMCoder-Accum: they need `[memory] api_docs`.
    pub fn reads_docs(self) -> bool {
        matches!(
            self,
            StrategyKind::DocRag | StrategyKind::Memcoder | StrategyKind::MemcoderAccum
        )
    }
}

/// `[strategy]`: which strategy and its knobs. Defaults follow the papers
/// where they say (MemoCoder: 3 plans, 10 retrieved fixes in
/// `[memory.fixes]`); attempt counts are kept small for CPU runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StrategyConfig {
    pub kind: StrategyKind,
    /// Self-repair / MemoCoder: attempts per sample, the first included.
    pub max_attempts: usize,
    /// MemoCoder: plans the planner writes.
    pub plans: usize,
    /// MemoCoder ablations: the planner, the fixes retrieved into repair
    /// prompts, the mentor's suggestions and rewrites.
    pub planning: bool,
    pub retrieval: bool,
    pub mentor: bool,
    /// MemoCoder: retrieved fixes shown in a repair prompt (small models
    /// have short contexts; retrieval still ranks `[memory.fixes] top_k`).
    pub fixes_shown: usize,
    /// MemoCoder's online adaptation: rounds over the samples whose code
    /// still fails the guiding test (1 = a single pass).
    pub rounds: usize,
    /// MemoCoder: accumulate fixing knowledge on this task file first
    /// (format by extension), then evaluate with what was learned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accumulate_on: Option<PathBuf>,
    /// At most this many accumulation tasks (file order); 0 = all.
    pub accumulate_max_tasks: usize,
    /// MEMCoder ablations: task-level memory (similar past tasks with their
    /// guidelines) and API-level memory (snippets and weighted guidelines).
    pub task_memory: bool,
    pub api_memory: bool,
    /// MEMCoder-Accum: trajectories kept (oldest dropped first).
    pub accum_capacity: usize,
    /// FALCON: the run directory whose `memory.sqlite` is retrieved from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_run: Option<PathBuf>,
    /// `[strategy.generator]`: who writes the answers in `falcon eval`:
    /// `kind = "policy"` (the `[model]` or checkpoint) or `kind = "openai"`
    /// with `base_url`, `model`, `api_key_env`.
    pub generator: GeneratorSource,
}

impl Default for StrategyConfig {
    fn default() -> Self {
        StrategyConfig {
            kind: StrategyKind::ZeroShot,
            max_attempts: 3,
            plans: 3,
            planning: true,
            retrieval: true,
            mentor: true,
            fixes_shown: 3,
            rounds: 1,
            accumulate_on: None,
            accumulate_max_tasks: 0,
            task_memory: true,
            api_memory: true,
            accum_capacity: 50,
            memory_run: None,
            generator: GeneratorSource::Policy,
        }
    }
}

impl Section for StrategyConfig {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        for (key, v) in [
            ("max_attempts", self.max_attempts),
            ("plans", self.plans),
            ("rounds", self.rounds),
            ("accum_capacity", self.accum_capacity),
        ] {
            if v == 0 {
                problems.push(&format!("{path}.{key}"), v, "must be >= 1");
            }
        }
        self.generator
            .validate_into(&format!("{path}.generator"), problems);
        if self.kind == StrategyKind::MemcoderAccum && !(self.task_memory && self.api_memory) {
            problems.push(
                &format!("{path}.kind"),
                "memcoder-accum",
                "task_memory / api_memory ablate `memcoder`; Accum has neither",
            );
        }
    }
}
