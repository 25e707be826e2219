//! `[dist]`: how ranks of a data-parallel run (launched by torchrun or
//! Slurm; see docs/multi-node.md) wait for each other and exchange
//! gradients. A run with one process ignores it.

use serde::{Deserialize, Serialize};

use super::{Problems, Section};

/// `[dist]`: collective timeout and gradient bucket size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DistConfig {
    /// Seconds a rendezvous or collective waits for the other ranks before
    /// the run stops with an error (a dead or stuck rank). Generation and
    /// sandbox runs happen between collectives, so this must exceed the
    /// longest gap between two ranks' arrivals at one.
    pub timeout_s: f64,
    /// Gradients are all-reduced in buckets of about this many MiB (one
    /// collective per bucket, as PyTorch DDP's `bucket_cap_mb`).
    pub bucket_mb: f64,
}

impl Default for DistConfig {
    fn default() -> Self {
        Self {
            timeout_s: 1800.0,
            bucket_mb: 25.0,
        }
    }
}

impl DistConfig {
    /// `bucket_mb` in bytes.
    pub fn bucket_bytes(&self) -> usize {
        (self.bucket_mb * (1 << 20) as f64) as usize
    }
}

impl Section for DistConfig {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        if !(self.timeout_s.is_finite() && self.timeout_s >= 1.0) {
            problems.push(
                &format!("{path}.timeout_s"),
                self.timeout_s,
                "must be at least 1 second (default 1800)",
            );
        }
        if !(self.bucket_mb.is_finite() && self.bucket_mb > 0.0) {
            problems.push(
                &format!("{path}.bucket_mb"),
                self.bucket_mb,
                "must be a positive number of MiB (default 25)",
            );
        }
    }
}
