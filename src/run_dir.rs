//! The layout of a run directory, `<output_dir>/<name>/`, and of its
//! checkpoints: every file name a run writes is defined here and nowhere
//! else, so a reader (`falcon report`, `falcon memory`, `falcon export`)
//! and the writer (the trainer) cannot disagree.
//!
//! ```text
//! runs/NAME/
//!   config.toml        the resolved config the run was started with
//!   metrics.jsonl      one line per step (the record of truth)
//!   samples.jsonl      every completion with its report and rewards
//!   tb/                TensorBoard event files
//!   eval/step-N.json   held-out evaluations
//!   memory.sqlite      long-term memory, P_error, strategy memories
//!   step-N/            checkpoints (atomic; see train::checkpoint)
//!   report/            `falcon report`'s plots and index.html
//!   ablate-done.json   a finished `falcon ablate` variant's summary row
//! ```

use std::path::{Path, PathBuf};

use crate::config::RunConfig;

/// The resolved config a run was started with.
pub const CONFIG: &str = "config.toml";
/// One JSON line per step.
pub const METRICS: &str = "metrics.jsonl";
/// One JSON line per completion.
pub const SAMPLES: &str = "samples.jsonl";
/// TensorBoard's event files.
pub const TENSORBOARD: &str = "tb";
/// Held-out evaluations, `step-N.json`.
pub const EVAL: &str = "eval";
/// The memory database (SQLite).
pub const MEMORY_DB: &str = "memory.sqlite";
/// `falcon report`'s default output.
pub const REPORT: &str = "report";
/// A finished ablation variant's summary row.
pub const ABLATE_DONE: &str = "ablate-done.json";

/// Files of a checkpoint directory `step-N/`.
pub mod checkpoint {
    /// Sizes and checksums of the other files; written last.
    pub const MANIFEST: &str = "manifest.json";
    /// The trainable tensors (LoRA adapters, or every weight).
    pub const WEIGHTS: &str = "trainable.safetensors";
    /// The optimizer's moments.
    pub const OPTIMIZER: &str = "optimizer.safetensors";
    /// Step, seed, `P_error`, recipe and time spent.
    pub const STATE: &str = "trainer_state.json";
    /// What the rollout strategy learned (`[train] strategy`).
    pub const ROLLOUT_STATE: &str = "rollout_state.json";
    /// The short-term memory's ring buffer (meta-RL runs).
    pub const SHORT_TERM: &str = "short_term.safetensors";
    /// The resolved config, so a checkpoint can be loaded on its own.
    pub const CONFIG: &str = super::CONFIG;
}

/// A run directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDir(PathBuf);

impl RunDir {
    /// The run directory at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        RunDir(path.into())
    }

    /// `<output_dir>/<name>` of `cfg`.
    pub fn of(cfg: &RunConfig) -> Self {
        RunDir(cfg.run.run_dir())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn config(&self) -> PathBuf {
        self.0.join(CONFIG)
    }

    pub fn metrics(&self) -> PathBuf {
        self.0.join(METRICS)
    }

    pub fn samples(&self) -> PathBuf {
        self.0.join(SAMPLES)
    }

    pub fn tensorboard(&self) -> PathBuf {
        self.0.join(TENSORBOARD)
    }

    pub fn eval_dir(&self) -> PathBuf {
        self.0.join(EVAL)
    }

    /// `eval/step-N.json`.
    pub fn eval(&self, step: u64) -> PathBuf {
        self.eval_dir().join(format!("step-{step}.json"))
    }

    pub fn memory_db(&self) -> PathBuf {
        self.0.join(MEMORY_DB)
    }

    pub fn report(&self) -> PathBuf {
        self.0.join(REPORT)
    }

    pub fn ablate_done(&self) -> PathBuf {
        self.0.join(ABLATE_DONE)
    }

    /// `step-N/`.
    pub fn checkpoint(&self, step: u64) -> PathBuf {
        step_dir(&self.0, step)
    }
}

/// `run_dir/step-N`.
pub fn step_dir(run_dir: &Path, step: u64) -> PathBuf {
    run_dir.join(format!("step-{step}"))
}

/// The step of a `step-N` directory name.
pub fn parse_step_dir(name: &str) -> Option<u64> {
    let n = name.strip_prefix("step-")?;
    // `u64::from_str` accepts a leading '+', which no directory we write has.
    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .then(|| n.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_dirs_round_trip_and_reject_other_names() {
        let d = RunDir::new("runs/x");
        assert_eq!(d.checkpoint(12), PathBuf::from("runs/x/step-12"));
        assert_eq!(d.eval(3), PathBuf::from("runs/x/eval/step-3.json"));
        assert_eq!(parse_step_dir("step-12"), Some(12));
        for bad in ["step-", "step-+1", "step-1a", "step12", "step--1"] {
            assert_eq!(parse_step_dir(bad), None, "{bad}");
        }
    }

    #[test]
    fn config_checks_name_the_same_files() {
        // config sits below this module and repeats two names for its file
        // checks; they must stay the ones written here.
        use crate::config::file_names;
        assert_eq!(file_names::MEMORY_DB, MEMORY_DB);
        assert_eq!(file_names::MANIFEST, checkpoint::MANIFEST);
    }
}
