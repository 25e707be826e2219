//! falcon-rl: a Rust, GPU-native trainer that fine-tunes code language models
//! with reinforcement learning from execution feedback (FALCON), carrying the
//! MEMCoder and MemoCoder memory systems as rollout strategies and baselines.
//!
//! Data flows down the module list (see `../shared/DESIGN.md`): a module may
//! import from the ones above it, never below.

pub mod config;
pub mod eval;
pub mod exec;
pub mod fsutil;
pub mod memory;
pub mod model;
pub mod reward;
pub mod rollout;
pub mod task;
pub mod train;
