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
//!   falcon.lock        held by the one process that writes the run
//!                      (pid, host, start time and command inside)
//!   vllm/              [rollout] engine = "vllm": the managed server's log
//!                      (server.log) and what the servers read (base model,
//!                      the current adapter or weights)
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
/// The vLLM engine's directory.
pub const VLLM: &str = "vllm";
/// The memory database (SQLite).
pub const MEMORY_DB: &str = "memory.sqlite";
/// `falcon report`'s default output.
pub const REPORT: &str = "report";
/// A finished ablation variant's summary row.
pub const ABLATE_DONE: &str = "ablate-done.json";
/// The writer's lock: every command that writes the run holds it for its
/// whole life (`fsutil::lock`).
pub const LOCK: &str = "falcon.lock";

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
    /// The LM judge's cache by code hash (`judge = "lm"` in training).
    pub const JUDGE_CACHE: &str = "judge_cache.json";
    /// The resolved config, so a checkpoint can be loaded on its own.
    pub const CONFIG: &str = super::CONFIG;
}

/// How a command begins where an earlier one may have written: a run
/// directory, or an evaluation's result file and its partial groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Start anew; refused when there is already something there, so a
    /// rerun never appends to an old run or result by accident.
    New,
    /// Continue what is there (a new start when there is nothing).
    Resume,
    /// Delete what is there, then start anew.
    Overwrite,
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

    /// `vllm/` (rank 0) or `vllm/rank-R/`: what the vLLM servers read.
    pub fn vllm(&self, rank: usize) -> PathBuf {
        match rank {
            0 => self.0.join(VLLM),
            r => self.0.join(VLLM).join(format!("rank-{r}")),
        }
    }

    /// The managed vLLM server's log.
    pub fn vllm_log(&self, rank: usize) -> PathBuf {
        self.vllm(rank).join("server.log")
    }

    /// `step-N/`.
    pub fn checkpoint(&self, step: u64) -> PathBuf {
        step_dir(&self.0, step)
    }

    /// What a run has left here (steps, checkpoints, evaluations, memory),
    /// in words; `None` when the directory holds no run: it is missing, or
    /// holds at most the resolved config a run writes before its first step.
    pub fn existing_run(&self) -> Option<String> {
        let mut found = Vec::new();
        let lines = std::fs::read_to_string(self.metrics())
            .map(|t| t.lines().filter(|l| !l.trim().is_empty()).count())
            .unwrap_or(0);
        if lines > 0 {
            found.push(format!("{lines} steps in {METRICS}"));
        } else if self.metrics().exists() || self.samples().exists() {
            found.push(format!("{METRICS} or {SAMPLES}"));
        }
        let mut steps: Vec<u64> = std::fs::read_dir(&self.0)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| parse_step_dir(&e.file_name().to_string_lossy()))
            .collect();
        steps.sort_unstable();
        match steps.as_slice() {
            [] => {}
            [one] => found.push(format!("checkpoint step-{one}")),
            [first, .., last] => found.push(format!("checkpoints step-{first} to step-{last}")),
        }
        let evals = std::fs::read_dir(self.eval_dir())
            .map(|d| d.count())
            .unwrap_or(0);
        if evals > 0 {
            found.push(format!("{evals} held-out evaluations in {EVAL}/"));
        }
        if self.memory_db().exists() {
            found.push(format!("a memory database ({MEMORY_DB})"));
        }
        (!found.is_empty()).then(|| found.join(", "))
    }

    /// Delete everything in the run directory (`--overwrite`) but its
    /// lock, which the process deleting holds; the directory itself goes
    /// too where there is no lock.
    pub fn remove(&self) -> std::io::Result<()> {
        let entries = match std::fs::read_dir(&self.0) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            r => r?,
        };
        let mut locked = false;
        for e in entries {
            let e = e?;
            if e.file_name() == LOCK {
                locked = true;
            } else if e.file_type()?.is_dir() {
                std::fs::remove_dir_all(e.path())?;
            } else {
                std::fs::remove_file(e.path())?;
            }
        }
        if !locked {
            std::fs::remove_dir(&self.0)?;
        }
        Ok(())
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
    fn an_existing_run_is_described_and_a_fresh_directory_is_not() {
        let tmp = std::env::temp_dir().join(format!("falcon-run-dir-{}", std::process::id()));
        let d = RunDir::new(&tmp);
        assert_eq!(d.existing_run(), None, "missing");
        std::fs::create_dir_all(&tmp).unwrap();
        std::fs::write(d.config(), "").unwrap();
        assert_eq!(d.existing_run(), None, "only the config a run writes first");
        std::fs::write(d.metrics(), "{}\n{}\n").unwrap();
        std::fs::create_dir_all(d.checkpoint(2)).unwrap();
        std::fs::create_dir_all(d.checkpoint(4)).unwrap();
        let what = d.existing_run().unwrap();
        assert!(
            what.contains("2 steps in metrics.jsonl") && what.contains("step-2 to step-4"),
            "{what}"
        );
        d.remove().unwrap();
        assert!(!tmp.exists());
        d.remove().unwrap();
        // --overwrite under the lock: everything goes but the lock, which
        // the deleting process holds.
        use crate::fsutil::lock::{lock, Unlockable};
        let held = lock(&tmp, LOCK, Unlockable::Refuse).unwrap().unwrap();
        std::fs::write(d.metrics(), "{}\n").unwrap();
        std::fs::create_dir_all(d.checkpoint(1)).unwrap();
        d.remove().unwrap();
        let left: Vec<_> = std::fs::read_dir(&tmp)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, [LOCK]);
        assert_eq!(d.existing_run(), None, "a lock alone is no run");
        assert!(lock(&tmp, LOCK, Unlockable::Refuse).is_err(), "still held");
        drop(held);
        std::fs::remove_dir_all(&tmp).unwrap();
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
