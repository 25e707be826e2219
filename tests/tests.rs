//! The one integration-test binary (every test binary links libtorch, so
//! there is exactly one; ripgrep's tests/tests.rs shape). Each module guards
//! one area; tests are named after what they guard.

mod ablate;
mod bundled_tasks;
mod cli;
mod common;
mod config_check;
mod crash;
mod custom_rewards;
mod dist;
mod docs;
mod exec_adversarial;
mod exec_reference;
mod first_hour;
mod gguf_quants;
mod gguf_smollm2;
mod golden;
mod kernels;
mod layers;
mod memory;
mod model_io;
mod model_parity;
mod program_tasks;
mod python_roundtrip;
mod run_lock;
mod sandbox_service;
mod strategies;
mod task_files;
mod train;
mod vllm;
