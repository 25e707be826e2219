//! `[eval]`: held-out evaluation: which tasks, samples per task, k.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{check_sampler, Problems, Section, TaskFormat};

/// `[eval]`: held-out evaluation, used by `falcon train` before and after
/// training (`[train] eval_before` / `eval_after`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalConfig {
    /// Task file; unset means `[tasks] path`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    pub format: TaskFormat,
    /// When the file is a directory: read only this split's data files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split: Option<String>,
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
            split: None,
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
