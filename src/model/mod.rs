//! The policy model: a decoder LM for the Qwen2, Qwen3 and Llama families on libtorch
//! (through `tch`), HF checkpoint loading and export, LoRA, the tokenizer with
//! its chat template, batched sampling with a caller-owned KV cache,
//! shared-prefix scoring of completions (`Decoder::shared_prefix_logprobs`,
//! through the fused log-prob of `crate::kernels` where it applies),
//! mixed precision (`autocast`), the [`Generator`] trait that rollouts
//! and judges call with its other engines (an OpenAI-compatible client,
//! vLLM servers managed or given by URL), and [`open`], the one loader
//! every command uses. `testing` holds the fakes and tiny models that the
//! crate's tests and `tests/` share.
//!
//! Parameter names in the `VarStore` are the HF safetensors keys, so loading
//! and exporting need no renaming table (STYLE.md §1).

pub mod autocast;
pub mod decoder;
pub mod device;
pub mod export;
pub mod generate;
pub mod gguf;
pub mod hub;
pub mod llama;
pub mod lora;
pub mod open;
pub mod openai;
pub mod qwen2;
pub mod qwen3;
pub mod sampling;
#[doc(hidden)]
pub mod testing;
pub mod tokenizer;
pub mod vllm;
pub mod weights;

mod error;

pub use decoder::{Decoder, DecoderConfig, KvCache, LogitsFor};
pub use error::ModelError;
pub use generate::{Completion, FinishReason, GenerationParams, Generator, Policy};
pub use open::{open, ModelSpec, Opened};
pub use tokenizer::{ChatMessage, TextTokenizer};

pub use crate::config::{Dtype, LoraConfig};

/// The libtorch element type of a [`Dtype`].
pub trait TorchKind {
    fn kind(self) -> tch::Kind;
}

impl TorchKind for Dtype {
    fn kind(self) -> tch::Kind {
        match self {
            Dtype::Fp32 => tch::Kind::Float,
            Dtype::Bf16 => tch::Kind::BFloat16,
            Dtype::Fp16 => tch::Kind::Half,
        }
    }
}
