//! The Llama family (`model_type = "llama"`: Llama 2/3, SmolLM2, CodeLlama,
//! DeepSeek-Coder v1): its `config.json` and how it maps onto the shared
//! [`Decoder`]. Llama has optional biases (`attention_bias` on q/k/v/o,
//! `mlp_bias`) and optional RoPE frequency scaling (linear, llama3, yarn); other scaling
//! types are rejected rather than silently ignored.
//!
//! Reference: transformers `models/llama/modeling_llama.py`.
//!
//! [`Decoder`]: super::Decoder

use serde::Deserialize;

use super::decoder::{DecoderConfig, HfDecoderFields};

/// A Llama `config.json`: the shared fields plus Llama's own.
#[derive(Debug, Clone, Deserialize)]
pub struct LlamaConfig {
    #[serde(flatten)]
    pub common: HfDecoderFields,
    /// transformers < 5 spelling of the scaling (>= 5 uses `rope_parameters`).
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
}

impl LlamaConfig {
    pub fn decoder_config(&self) -> Result<DecoderConfig, String> {
        Ok(DecoderConfig {
            rope_scaling: self.common.rope_scaling(self.rope_scaling.as_ref())?,
            qkv_bias: self.attention_bias,
            o_bias: self.attention_bias,
            mlp_bias: self.mlp_bias,
            ..self.common.decoder_config(2048)
        })
    }
}
