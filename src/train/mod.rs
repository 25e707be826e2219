//! Training: the RL loop of FALCON (and its single-level baseline), losses,
//! advantages, our own optimizers, checkpoints with exact resume, and
//! metrics (JSONL and TensorBoard event files).
//!
//! - [`rl`]: the single-level loop behind `falcon train` and its SFT mode
//!   behind `falcon sft` (docs/train.md), with KL to the base model, PPO
//!   epochs, exact gradient accumulation and held-out evaluation hooks.
//! - [`losses`], [`advantage`], [`optim`]: FALCON's loss terms, advantage
//!   estimators, our AdamW / SGD and LR schedules.
//! - [`meta`]: FALCON's MAML loop (Algorithm 1) over fast LoRA weights, with
//!   short-term memory in the inner mini-batches and long-term memory in the
//!   prompts; second-order, first-order and Reptile meta-updates.
//! - [`checkpoint`]: atomic `step-N/` directories, verification, retention.
//! - [`metrics`]: `metrics.jsonl` and TensorBoard event files.
//! - [`ablate`]: `falcon ablate` grids (variants of a base config), the
//!   finished-variant marker and the summary table and plots.
//!
//! Not yet here: bf16 autocast.

pub mod ablate;
pub mod advantage;
pub mod checkpoint;
pub mod losses;
pub mod meta;
pub mod metrics;
pub mod optim;
pub mod rl;
