//! The Qwen3 family (`model_type = "qwen3"`, the dense Qwen3 models): its
//! `config.json` and how it maps onto the shared [`Decoder`]. Against Qwen2,
//! Qwen3 drops the q/k/v bias (`attention_bias`, false in every release),
//! normalises each head of q and k with an RMSNorm before RoPE
//! (`self_attn.q_norm` / `k_norm`), and sets `head_dim` on its own (128,
//! whatever hidden / heads is). RoPE scaling is read as for every family
//! (linear, llama3, yarn); sliding-window attention is refused.
//!
//! Reference: transformers `models/qwen3/modeling_qwen3.py`.
//!
//! [`Decoder`]: super::Decoder

use serde::Deserialize;

use super::decoder::{DecoderConfig, HfDecoderFields};

/// A Qwen3 `config.json`: the shared fields plus Qwen3's own.
#[derive(Debug, Clone, Deserialize)]
pub struct Qwen3Config {
    #[serde(flatten)]
    pub common: HfDecoderFields,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub use_sliding_window: bool,
    /// transformers < 5 spelling of the scaling (>= 5 uses `rope_parameters`).
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
}

impl Qwen3Config {
    pub fn decoder_config(&self) -> Result<DecoderConfig, String> {
        if self.use_sliding_window {
            return Err("use_sliding_window = true is not supported".into());
        }
        Ok(DecoderConfig {
            rope_scaling: self.common.rope_scaling(self.rope_scaling.as_ref())?,
            qkv_bias: self.attention_bias,
            o_bias: self.attention_bias,
            qk_norm: true,
            ..self.common.decoder_config(40960)
        })
    }
}
