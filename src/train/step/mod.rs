//! The step functions of the recipe, siblings over one [`TrainState`]:
//! [`rl`] (the single-level policy-gradient step), [`meta`] (FALCON's
//! Algorithm 1: MAML, first-order MAML, Reptile) and [`sft`] (cross-entropy
//! on reference solutions). Each reads the state, takes one optimizer step
//! and returns the step's record; none imports another.
//!
//! [`TrainState`]: super::TrainState

pub mod meta;
pub mod rl;
pub mod sft;
