//! `[rollout]`: which engine generates a training run's rollouts and its
//! evaluations (docs/engines.md): the native engine in the trainer's own
//! process, or vLLM's OpenAI-compatible server, started by falcon
//! (`managed`) or run by the user (`urls`).

use serde::{Deserialize, Serialize};

use super::{Problems, Section};

/// Which engine generates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// The trainer's own decoder (`model::Policy`): nothing to install.
    #[default]
    Native,
    /// vLLM's OpenAI-compatible server; weights follow the policy every step.
    Vllm,
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Native => "native",
            EngineKind::Vllm => "vllm",
        }
    }
}

/// `[rollout]`: the engine, and vLLM's settings when it is the engine.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutConfig {
    pub engine: EngineKind,
    pub vllm: VllmConfig,
}

/// `[rollout.vllm]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VllmConfig {
    /// Servers a user runs (`http://host:port`), requests spread over them.
    /// Empty: falcon starts one server as its child (managed).
    pub urls: Vec<String>,
    /// Managed: the Python that runs vLLM; empty = the virtualenv
    /// `scripts/setup-vllm` installs.
    pub python: String,
    /// Managed: the port; 0 picks a free one.
    pub port: u16,
    /// Managed: seconds the server has to answer `/health` before the run
    /// stops with its log (a start takes 60-100 s on a 2-core CPU).
    pub start_timeout_s: u64,
    /// Seconds one completion request may take, connect to last byte.
    pub request_timeout_s: u64,
    /// Requests in flight at once (vLLM batches them on its side).
    pub max_parallel_requests: usize,
    /// Managed: `--max-model-len`.
    pub max_model_len: usize,
    /// Managed on CPU: GiB of KV cache (`VLLM_CPU_KVCACHE_SPACE`).
    pub cpu_kv_cache_gib: f64,
    /// Managed on CUDA: `--gpu-memory-utilization`, the share of the GPU
    /// vLLM may take (the trainer holds the rest).
    pub gpu_memory_utilization: f64,
    /// Managed: further arguments for vLLM's server, appended as given.
    pub extra_args: Vec<String>,
    /// Send each sampled request a seed (reproducible rollouts). Unset: on,
    /// but off for a managed server on the CPU, whose engine dies on a
    /// seeded request whose prompt is prefilled in chunks (vLLM 0.32's CPU
    /// generator has no offset to rewind).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed_requests: Option<bool>,
    /// One-step off-policy: the servers generate step t+1's rollouts with
    /// θ_t while the trainer updates to θ_{t+1} (single-level RL, one
    /// process, zero-shot rollouts). Pair it with `tis_cap`.
    pub overlap: bool,
    /// Truncated importance sampling of the policy-gradient term against the
    /// rollout/trainer log-prob mismatch: each token's weight
    /// `min(exp(log p_train - log p_vllm), cap)`; 0 turns it off.
    pub tis_cap: f64,
}

impl Default for VllmConfig {
    fn default() -> Self {
        Self {
            urls: Vec::new(),
            python: String::new(),
            port: 0,
            start_timeout_s: 600,
            request_timeout_s: 600,
            max_parallel_requests: 64,
            max_model_len: 4096,
            cpu_kv_cache_gib: 2.0,
            gpu_memory_utilization: 0.3,
            extra_args: Vec::new(),
            seed_requests: None,
            overlap: false,
            tis_cap: 0.0,
        }
    }
}

impl VllmConfig {
    /// falcon starts and stops the server.
    pub fn managed(&self) -> bool {
        self.urls.is_empty()
    }
}

impl Section for RolloutConfig {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        let v = &self.vllm;
        let p = format!("{path}.vllm");
        if !v.urls.is_empty() && self.engine != EngineKind::Vllm {
            problems.push(
                &format!("{p}.urls"),
                &v.urls,
                "name vLLM servers, but the engine is native: set [rollout] engine = \"vllm\" (or remove urls)",
            );
        }
        if v.overlap && self.engine != EngineKind::Vllm {
            problems.push(
                &format!("{p}.overlap"),
                true,
                "overlaps vLLM's generation with the update: set [rollout] engine = \"vllm\" too",
            );
        }
        for (i, url) in v.urls.iter().enumerate() {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                problems.push(
                    &format!("{p}.urls[{i}]"),
                    url,
                    "must start with http:// or https://",
                );
            }
        }
        if v.start_timeout_s == 0 {
            problems.push(
                &format!("{p}.start_timeout_s"),
                0,
                "must be > 0 (default 600)",
            );
        }
        if v.request_timeout_s == 0 {
            problems.push(
                &format!("{p}.request_timeout_s"),
                0,
                "must be > 0 (default 600)",
            );
        }
        if v.max_parallel_requests == 0 {
            problems.push(
                &format!("{p}.max_parallel_requests"),
                0,
                "must be >= 1 (default 64)",
            );
        }
        if v.max_model_len < 16 {
            problems.push(
                &format!("{p}.max_model_len"),
                v.max_model_len,
                "must be >= 16 (default 4096)",
            );
        }
        if !(v.cpu_kv_cache_gib.is_finite() && v.cpu_kv_cache_gib > 0.0) {
            problems.push(
                &format!("{p}.cpu_kv_cache_gib"),
                v.cpu_kv_cache_gib,
                "must be a positive number of GiB (default 2)",
            );
        }
        if !(v.gpu_memory_utilization > 0.0 && v.gpu_memory_utilization < 1.0) {
            problems.push(
                &format!("{p}.gpu_memory_utilization"),
                v.gpu_memory_utilization,
                "must be in (0, 1) (default 0.3)",
            );
        }
        if !(v.tis_cap == 0.0 || (v.tis_cap.is_finite() && v.tis_cap >= 1.0)) {
            problems.push(
                &format!("{p}.tis_cap"),
                v.tis_cap,
                "must be 0 (off) or >= 1 (verl uses 2)",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_native_and_valid() {
        let c = RolloutConfig::default();
        assert_eq!(c.engine, EngineKind::Native);
        let mut p = Problems::default();
        c.validate_into("rollout", &mut p);
        assert!(p.as_slice().is_empty(), "{:?}", p.as_slice());
        assert!(c.vllm.managed());
    }

    #[test]
    fn overlap_without_the_vllm_engine_is_refused_not_ignored() {
        let c: RolloutConfig = toml::from_str("[vllm]\noverlap = true\n").unwrap();
        let mut p = Problems::default();
        c.validate_into("rollout", &mut p);
        assert!(
            p.as_slice().join("\n").contains("rollout.vllm.overlap"),
            "{:?}",
            p.as_slice()
        );
    }

    #[test]
    fn bad_values_are_named() {
        let c: RolloutConfig = toml::from_str(
            "engine = \"vllm\"\n[vllm]\nurls = [\"localhost:8000\"]\ntis_cap = 0.5\nmax_parallel_requests = 0\n",
        )
        .unwrap();
        let mut p = Problems::default();
        c.validate_into("rollout", &mut p);
        let all = p.as_slice().join("\n");
        assert!(all.contains("rollout.vllm.urls[0]"), "{all}");
        assert!(all.contains("rollout.vllm.tis_cap"), "{all}");
        assert!(all.contains("rollout.vllm.max_parallel_requests"), "{all}");
        assert!(toml::from_str::<RolloutConfig>("engine = \"vlm\"").is_err());
    }
}
