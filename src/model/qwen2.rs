//! The Qwen2 family (`model_type = "qwen2"`, Qwen2 / Qwen2.5 / Qwen2.5-Coder):
//! its `config.json` and how it maps onto the shared [`Decoder`]. Qwen2 puts a
//! bias on q/k/v (not on o_proj or the MLP) and has no RoPE scaling in the
//! models we train; sliding-window attention is off in every released
//! checkpoint (`use_sliding_window = false`) and is rejected if switched on.
//!
//! Reference: transformers `models/qwen2/modeling_qwen2.py`.
//!
//! [`Decoder`]: super::Decoder

use serde::Deserialize;

use super::decoder::DecoderConfig;

/// The fields of a Qwen2 `config.json` that shape the network.
#[derive(Debug, Clone, Deserialize)]
pub struct Qwen2Config {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: Option<i64>,
    pub head_dim: Option<i64>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: i64,
    #[serde(default)]
    pub use_sliding_window: bool,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_theta() -> f64 {
    10000.0
}
fn default_max_pos() -> i64 {
    32768
}

impl Qwen2Config {
    pub fn decoder_config(&self) -> Result<DecoderConfig, String> {
        if self.use_sliding_window {
            return Err("use_sliding_window = true is not supported".into());
        }
        // transformers 5 moved rope_theta into `rope_parameters`.
        let rope_theta = self
            .rope_parameters
            .as_ref()
            .and_then(|r| r.get("rope_theta"))
            .and_then(|t| t.as_f64())
            .unwrap_or(self.rope_theta);
        Ok(DecoderConfig {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            num_key_value_heads: self.num_key_value_heads.unwrap_or(self.num_attention_heads),
            head_dim: self
                .head_dim
                .unwrap_or(self.hidden_size / self.num_attention_heads.max(1)),
            rms_norm_eps: self.rms_norm_eps,
            rope_theta,
            rope_scaling: None,
            qkv_bias: true,
            o_bias: false,
            mlp_bias: false,
            tie_word_embeddings: self.tie_word_embeddings,
            max_position_embeddings: self.max_position_embeddings,
        })
    }
}
