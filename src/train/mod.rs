//! Training: the RL loop of FALCON (and its single-level baseline), losses,
//! advantages, our own optimizers, checkpoints with exact resume, and
//! metrics (JSONL and TensorBoard event files).
//!
//! Work in progress (issue 5): the metrics writers and checkpoint
//! publishing / verification / retention are in so far; the loop is not.

pub mod checkpoint;
pub mod metrics;
