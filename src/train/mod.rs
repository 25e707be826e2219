//! Training: the RL loop of FALCON (and its single-level baseline), losses,
//! advantages, our own optimizers, checkpoints with exact resume, and
//! metrics (JSONL and TensorBoard event files).
//!
//! - [`rl`]: the single-level loop behind `falcon train` (docs/train.md).
//! - [`losses`], [`advantage`], [`optim`]: FALCON's loss terms, advantage
//!   estimators, our AdamW / SGD and LR schedules.
//! - [`checkpoint`]: atomic `step-N/` directories, verification, retention.
//! - [`metrics`]: `metrics.jsonl` and TensorBoard event files.
//!
//! Not yet here (issue 5 / 6): SFT, the MAML outer loop, KL to a reference
//! policy and PPO epochs in the loop, mixed precision.

pub mod advantage;
pub mod checkpoint;
pub mod losses;
pub mod metrics;
pub mod optim;
pub mod rl;
