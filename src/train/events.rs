//! What the training loop emits (STYLE.md §9): one [`StepRecord`] per step,
//! written to `metrics.jsonl` and TensorBoard, and the [`Observer`] the
//! caller hands in; only the CLI draws anything.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::eval::EvalResult;

/// One step's figures, as written to `metrics.jsonl` and shown by observers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StepRecord {
    pub step: u64,
    pub lr: f64,
    /// Raw value of every loss term, and `total`.
    pub loss: BTreeMap<String, f64>,
    /// Mean over scored samples of every reward term, and `total`.
    pub reward: BTreeMap<String, f64>,
    pub pass_rate: f64,
    pub samples: usize,
    pub no_signal: usize,
    pub error_kinds: BTreeMap<String, usize>,
    pub grad_norm: f64,
    pub tokens_generated: usize,
    /// Seconds in generate / exec / reward / update (and `sync`: weights
    /// to a vLLM engine).
    pub seconds: BTreeMap<String, f64>,
    /// The rollout engine's log-probs against the update's own (vLLM only):
    /// `abs_mean`, `abs_max` of |Δ log p| and `kl`, a k3 estimate of
    /// KL(π_rollout ‖ π_train) per token.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mismatch: BTreeMap<String, f64>,
}

impl StepRecord {
    /// Every figure as a named scalar (`loss/pg`, `reward/coarse`, `pass_rate`,
    /// `seconds/generate`, ...), for TensorBoard.
    pub fn scalars(&self) -> Vec<(String, f64)> {
        let mut v = vec![
            ("lr".to_owned(), self.lr),
            ("pass_rate".to_owned(), self.pass_rate),
            ("grad_norm".to_owned(), self.grad_norm),
            ("tokens_generated".to_owned(), self.tokens_generated as f64),
            ("no_signal".to_owned(), self.no_signal as f64),
        ];
        for (prefix, map) in [
            ("loss", &self.loss),
            ("reward", &self.reward),
            ("seconds", &self.seconds),
            ("mismatch", &self.mismatch),
        ] {
            v.extend(map.iter().map(|(k, x)| (format!("{prefix}/{k}"), *x)));
        }
        v.extend(
            self.error_kinds
                .iter()
                .map(|(k, n)| (format!("errors/{k}"), *n as f64)),
        );
        v
    }
}

/// Where the loop reports progress; only the CLI draws anything.
pub trait Observer {
    fn on_start(&mut self, _first_step: u64, _steps: u64) {}
    fn on_step(&mut self, _record: &StepRecord) {}
    fn on_message(&mut self, _message: &str) {}
    /// An evaluation finished (written to `path`).
    fn on_eval(&mut self, _step: u64, _path: &Path, _result: &EvalResult) {}
}

/// An observer that ignores everything.
pub struct Silent;
impl Observer for Silent {}
