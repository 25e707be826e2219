//! The Qwen2 family (`model_type = "qwen2"`, Qwen2 / Qwen2.5 / Qwen2.5-Coder):
//! its `config.json` and how it maps onto the shared [`Decoder`]. Qwen2 puts a
//! bias on q/k/v (not on o_proj or the MLP); RoPE scaling (YaRN in the
//! long-context Qwen2.5 configs) is read as for every family. Sliding-window
//! attention is off in every released checkpoint (`use_sliding_window =
//! false`) and is rejected if switched on.
//!
//! Reference: transformers `models/qwen2/modeling_qwen2.py`.
//!
//! [`Decoder`]: super::Decoder

use serde::Deserialize;

use super::decoder::{DecoderConfig, HfDecoderFields};

/// A Qwen2 `config.json`: the shared fields plus Qwen2's own.
#[derive(Debug, Clone, Deserialize)]
pub struct Qwen2Config {
    #[serde(flatten)]
    pub common: HfDecoderFields,
    #[serde(default)]
    pub use_sliding_window: bool,
    /// transformers < 5 spelling of the scaling (>= 5 uses `rope_parameters`).
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
}

impl Qwen2Config {
    pub fn decoder_config(&self) -> Result<DecoderConfig, String> {
        if self.use_sliding_window {
            return Err("use_sliding_window = true is not supported".into());
        }
        Ok(DecoderConfig {
            rope_scaling: self.common.rope_scaling(self.rope_scaling.as_ref())?,
            qkv_bias: true,
            ..self.common.decoder_config(32768)
        })
    }
}
