//! The vLLM engine behind the [`Generator`] seam (docs/engines.md): a
//! managed server (vLLM's OpenAI-compatible server as falcon's child), a
//! client for servers at given URLs, and the engine that keeps a server's
//! weights on the policy's and generates from it.
//!
//! Prompts are encoded here with the policy's own tokenizer and sent as
//! token ids to `/v1/completions`, so the trainer scores exactly the ids the
//! server generated from, and each completion comes back with its token ids
//! and the log-prob of each sampled token under the model's own
//! distribution (vLLM's `raw_logprobs`, before temperature and top-k/p: the
//! log-probs the trainer recomputes, so the two can be compared).
//!
//! A managed server runs in its own process group with a parent-death
//! signal, so it goes when falcon goes, however falcon goes (error, Ctrl-C,
//! SIGKILL). Its log is a file the caller names; every start failure quotes
//! it.
//!
//! [`server`] runs vLLM, [`client`] talks to servers, [`engine`] keeps them
//! on the policy (as TRL keeps `vllm_serve.py` apart from `vllm_client.py`).

use std::path::PathBuf;

mod client;
mod engine;
mod server;

pub use client::{row_seed, Row, VllmClient};
pub use engine::{FastRow, Pending, VllmEngine};
pub use server::{ServerSpec, VllmServer};

/// How much of a response body or a log an error message quotes.
const EXCERPT_CHARS: usize = 600;
/// vLLM accepts only these `--max-lora-rank` values.
const VLLM_LORA_RANKS: [usize; 9] = [1, 8, 16, 32, 64, 128, 256, 320, 512];
/// The process-group leader of a managed server: runs the server, and on
/// SIGTERM (falcon's stop, or falcon's death through the parent-death
/// signal) passes it on, waits up to 15 s, then SIGKILLs the group.
const GROUP_GUARD: &str = r#"trap 'kill -TERM "$pid" 2>/dev/null; i=0; while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 150 ]; do sleep 0.1; i=$((i+1)); done; kill -KILL 0' TERM INT
"$@" &
pid=$!
wait "$pid"
"#;
/// The name the managed server serves the base model under.
const BASE_NAME: &str = "base";

/// Where `scripts/setup-vllm` puts its virtualenv's Python.
pub fn default_python() -> PathBuf {
    crate::config::cache_dir().join("venv-vllm-0.32.0/bin/python")
}
