//! `[generation]`: how rollouts sample from the policy.

use serde::{Deserialize, Serialize};

use super::{check_sampler, check_seed, Problems, Section};

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
    /// Generation stops where the answer's first code block closes (the
    /// closing fence is kept, so the code extractor sees a finished block).
    pub stop_at_code_end: bool,
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
            stop_at_code_end: true,
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
