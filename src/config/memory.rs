//! `[memory]`: long- and short-term memory, `P_error`'s history, MEMCoder's
//! guideline memory, MemoCoder's fixing knowledge, and who reflects
//! (docs/memory.md).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{Problems, Section};

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
    Openai(OpenAiConfig),
}

/// How memory is shown in a prompt (`[memory] render`), docs/memory.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rendering {
    Full,
    Renamed,
    #[default]
    Brief,
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
    /// How retrieved history and fixes are shown to the model: `full` (the
    /// papers' whole code), `renamed` (whole code, every function it
    /// defines renamed to the current task's entry point) or `brief` (no
    /// foreign code: task, outcome and error; a fix's changed lines).
    pub render: Rendering,
    /// Most characters of retrieved text in one prompt (0: no limit).
    pub render_chars: usize,
    /// Samples the short-term ring buffer holds.
    pub short_term_capacity: usize,
    /// Tokens per short-term sample (longer ones are cut).
    pub short_term_max_len: usize,
    /// How much history `P_error` covers.
    pub p_error: StatsMode,
    /// MEMCoder: `K_doc` documentation APIs retrieved per task.
    pub k_doc: usize,
    /// MEMCoder: `K_task` similar past tasks whose APIs join the candidates.
    pub k_task: usize,
    /// MEMCoder: the library documentation (JSON / JSONL of API entries).
    pub api_docs: Option<PathBuf>,
    /// `[memory.memcoder]`: Eq. 5 weights and retrieval sizes.
    pub memcoder: MemCoderParams,
    /// `[memory.fixes]`: MemoCoder's fixing knowledge and mentor.
    pub fixes: FixesConfig,
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
            // Measured on HumanEval at 135M (docs/results/eval.md): the papers'
            // whole code is copied into the answer, renamed code too.
            render: Rendering::Brief,
            render_chars: 0,
            short_term_capacity: 1024,
            short_term_max_len: 1024,
            p_error: StatsMode::All,
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
            problems.push_rule(&format!("{path}.p_error"), &e);
        }
        if let Err(e) = self.memcoder.validate() {
            problems.push_rule(&format!("{path}.memcoder"), &e);
        }
        if let Err(e) = self.fixes.validate() {
            problems.push_rule(&format!("{path}.fixes"), &e);
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

/// `[memory.p_error]`: how much history `P_error` (FALCON Eq. 11) covers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case", deny_unknown_fields)]
pub enum StatsMode {
    /// Every sample of the run.
    #[default]
    All,
    /// The last `samples` samples.
    Window { samples: usize },
    /// Exponential moving counts: before each sample adds its counts, every
    /// count is multiplied by `lambda` (0 < lambda ≤ 1; 1 is `All`).
    Decay { lambda: f64 },
}

impl StatsMode {
    /// `all`, `window of N samples` or `decay λ = L`.
    pub fn name(&self) -> String {
        match *self {
            StatsMode::All => "all samples".into(),
            StatsMode::Window { samples } => format!("window of {samples} samples"),
            StatsMode::Decay { lambda } => format!("decay, lambda {lambda}"),
        }
    }

    /// Reject settings that cannot work, saying what to change.
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            StatsMode::All => Ok(()),
            StatsMode::Window { samples: 0 } => {
                Err("window.samples is 0; use at least 1 (or mode = \"all\")".into())
            }
            StatsMode::Decay { lambda } if !(lambda > 0.0 && lambda <= 1.0) => {
                Err(format!("decay.lambda is {lambda}; it must be in (0, 1]"))
            }
            _ => Ok(()),
        }
    }
}

/// `[memory.memcoder.weights]`: Eq. 5's constants. The paper (§IV-D) names
/// `w_init`, `Δw+`, `Δw−` and `w_min > 0` but gives no values; these
/// defaults are our choice. Fig. 3 shows integer weights (3, 77), so only
/// ranking, not scale, is comparable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WeightParams {
    pub w_init: f64,
    pub delta_plus: f64,
    pub delta_minus: f64,
    pub w_min: f64,
}

impl Default for WeightParams {
    fn default() -> Self {
        WeightParams {
            w_init: 1.0,
            delta_plus: 0.1,
            delta_minus: 0.1,
            w_min: 0.1,
        }
    }
}

impl WeightParams {
    /// Rejects values under which Eq. 5 stops meaning what the paper says.
    pub fn validate(&self) -> Result<(), String> {
        let all = [self.w_init, self.delta_plus, self.delta_minus, self.w_min];
        if all.iter().any(|v| !v.is_finite()) {
            return Err(format!(
                "weights must be finite (w_init {}, delta_plus {}, delta_minus {}, w_min {})",
                self.w_init, self.delta_plus, self.delta_minus, self.w_min
            ));
        }
        if self.w_min <= 0.0 {
            return Err(format!("w_min must be > 0 (Eq. 5), got {}", self.w_min));
        }
        if self.w_init < self.w_min {
            return Err(format!(
                "w_init ({}) must be at least w_min ({})",
                self.w_init, self.w_min
            ));
        }
        if self.delta_plus < 0.0 || self.delta_minus < 0.0 {
            return Err(format!(
                "delta_plus and delta_minus must be >= 0, got {} and {}",
                self.delta_plus, self.delta_minus
            ));
        }
        Ok(())
    }
}

/// `[memory.memcoder]`: MEMCoder's retrieval sizes and the memory's own
/// bounds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemCoderParams {
    pub weights: WeightParams,
    /// Guidelines injected per candidate API (§V-F: 3).
    pub guidelines_per_api: usize,
    /// Successful snippets injected per candidate API (§V-F: 1).
    pub snippets_per_api: usize,
    /// Snippets kept per API, newest kept; bounds `C_a`, which the paper
    /// leaves unbounded.
    pub max_snippets: usize,
}

impl Default for MemCoderParams {
    fn default() -> Self {
        MemCoderParams {
            weights: WeightParams::default(),
            guidelines_per_api: 3,
            snippets_per_api: 1,
            max_snippets: 8,
        }
    }
}

impl MemCoderParams {
    /// Rejects settings that cannot work, saying what to change.
    pub fn validate(&self) -> Result<(), String> {
        self.weights.validate()?;
        if self.max_snippets < self.snippets_per_api {
            return Err(format!(
                "max_snippets ({}) must be at least snippets_per_api ({})",
                self.max_snippets, self.snippets_per_api
            ));
        }
        Ok(())
    }
}

/// `[memory.fixes]`: MemoCoder's fixing knowledge and mentor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FixesConfig {
    /// How many fixes retrieval returns (paper: ten).
    pub top_k: usize,
    /// New fixes of a class that trigger a rewrite of its suggestions (paper: 20).
    pub rewrite_threshold: usize,
    /// Most suggestions a rewrite may return.
    pub max_suggestions: usize,
    /// Most new fixes shown in a rewrite prompt (the newest ones).
    pub max_fixes_in_prompt: usize,
    /// Each code or message in a rewrite prompt is cut to this many characters.
    pub max_field_chars: usize,
}

impl Default for FixesConfig {
    fn default() -> Self {
        FixesConfig {
            top_k: 10,
            rewrite_threshold: 20,
            max_suggestions: 5,
            max_fixes_in_prompt: 20,
            max_field_chars: 1500,
        }
    }
}

impl FixesConfig {
    /// Reject settings that cannot work, saying what to change.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("top_k", self.top_k),
            ("rewrite_threshold", self.rewrite_threshold),
            ("max_suggestions", self.max_suggestions),
            ("max_fixes_in_prompt", self.max_fixes_in_prompt),
            ("max_field_chars", self.max_field_chars),
        ] {
            if v == 0 {
                return Err(format!("{name} is 0; use at least 1"));
            }
        }
        Ok(())
    }
}

/// Where and how to reach an OpenAI-compatible server (vLLM, TGI, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiConfig {
    /// Scheme, host and port, e.g. `http://127.0.0.1:8000`; a trailing `/v1`
    /// is accepted too.
    pub base_url: String,
    /// The `model` field of each request (vLLM: the served model name).
    pub model: String,
    /// Name of the environment variable holding the API key; `None` sends no
    /// `Authorization` header (a local server).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Limit on each whole request, connect to last byte.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
}

fn default_timeout_secs() -> u64 {
    120
}
