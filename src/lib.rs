//! falcon-rl: a Rust, GPU-native trainer that fine-tunes code language models
//! with reinforcement learning from execution feedback (FALCON), carrying the
//! MEMCoder and MemoCoder memory systems as rollout strategies and baselines.
//!
//! Data flows down the module list, which is the order of
//! docs/architecture.md: a module may import from the ones above it, never
//! below (`tests/layers.rs` fails on any edge against this order). `config`,
//! `fsutil` and `text` are the bottom layer and import nothing of the crate
//! but each other's names where said.

// The bottom layer: the run schema and its one validation; file and text helpers.
pub mod config;
pub mod fsutil;
pub mod text;

// The layout of a run directory.
pub mod run_dir;

// Task formats and loaders.
pub mod task;

// The process group of a data-parallel run (c10d through a C++ shim).
pub mod dist;

// Custom CUDA kernels (NVRTC at run time) and their libtorch references.
pub mod kernels;

// The policy model, its loading and export, and the generation engines.
pub mod model;

// The sandbox that runs model-written code.
pub mod exec;

// FALCON's rewards and the one pipeline from a completion to its reward.
pub mod reward;

// Long- and short-term memory, P_error, MEMCoder and MemoCoder memories.
pub mod memory;

// Prompts and rollout strategies.
pub mod rollout;

// Evaluation, then training (whose held-out hooks call evaluation).
pub mod eval;

pub mod train;

// Plots, pages and ablation summaries drawn from what training and
// evaluation wrote.
pub mod report;
