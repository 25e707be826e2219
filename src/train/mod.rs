//! Training: the RL loop of FALCON (and its single-level baseline), losses,
//! advantages, our own optimizers, checkpoints with exact resume, and
//! metrics (JSONL and TensorBoard event files).
//!
//! Work in progress (issue 5): the metrics writers, checkpoint publishing /
//! verification / retention, FALCON's losses, the advantage estimators and
//! our AdamW / SGD with LR schedules are in so far; the loop is not.

pub mod advantage;
pub mod checkpoint;
pub mod losses;
pub mod metrics;
pub mod optim;
pub mod rl;
