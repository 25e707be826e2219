//! `[meta]`: FALCON's MAML loop (Algorithm 1) over fast LoRA weights, or
//! the single-level loop.

use serde::{Deserialize, Serialize};

use super::{Problems, Section};

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

impl MetaAlgorithm {
    /// The name a config file uses (`"fomaml"`).
    pub fn name(self) -> &'static str {
        match self {
            MetaAlgorithm::Off => "off",
            MetaAlgorithm::Maml => "maml",
            MetaAlgorithm::Fomaml => "fomaml",
            MetaAlgorithm::Reptile => "reptile",
        }
    }
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
    /// models copy a retrieved neighbour's code (docs/results/train.md), which this
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
    /// Evaluate the K tasks' fast weights in one batched pass (stacked
    /// adapters, a gather-matmul per row) instead of one pass per task: the
    /// same losses and gradients up to rounding, fewer and larger kernels
    /// on a GPU. Holds up to K micro-batches' activations at once and does
    /// not share prompts across samples (`[train] shared_prefix`) in that
    /// pass. Not for Reptile or `inner_steps = 0`, which ignore it.
    pub batch_tasks: bool,
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
            batch_tasks: false,
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
