//! The Llama family (`model_type = "llama"`: Llama 2/3, SmolLM2, CodeLlama,
//! DeepSeek-Coder v1): its `config.json` and how it maps onto the shared
//! [`Decoder`]. Llama has optional biases (`attention_bias` on q/k/v/o,
//! `mlp_bias`) and optional llama3 RoPE frequency scaling; other scaling
//! types are rejected rather than silently ignored.
//!
//! Reference: transformers `models/llama/modeling_llama.py`.
//!
//! [`Decoder`]: super::Decoder

use serde::Deserialize;

use super::decoder::{DecoderConfig, Llama3RopeScaling};

/// The fields of a Llama `config.json` that shape the network.
#[derive(Debug, Clone, Deserialize)]
pub struct LlamaConfig {
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
    /// transformers < 5 spelling.
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    /// transformers >= 5 spelling (holds rope_theta and the scaling together).
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: i64,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_theta() -> f64 {
    10000.0
}
fn default_max_pos() -> i64 {
    2048
}

fn rope_scaling(v: &serde_json::Value) -> Result<Option<Llama3RopeScaling>, String> {
    let ty = v
        .get("rope_type")
        .or_else(|| v.get("type"))
        .and_then(|t| t.as_str())
        .unwrap_or("default");
    let num = |k: &str| {
        v.get(k)
            .and_then(|x| x.as_f64())
            .ok_or_else(|| format!("rope scaling `{ty}` needs a numeric `{k}`"))
    };
    match ty {
        "default" => Ok(None),
        "llama3" => Ok(Some(Llama3RopeScaling {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_max_position_embeddings: num("original_max_position_embeddings")?,
        })),
        other => Err(format!(
            "rope scaling type `{other}` is not supported (default and llama3 are)"
        )),
    }
}

impl LlamaConfig {
    pub fn decoder_config(&self) -> Result<DecoderConfig, String> {
        let (theta, scaling) = match (&self.rope_parameters, &self.rope_scaling) {
            (Some(p), _) => (
                p.get("rope_theta")
                    .and_then(|t| t.as_f64())
                    .unwrap_or(self.rope_theta),
                rope_scaling(p)?,
            ),
            (None, Some(s)) if !s.is_null() => (self.rope_theta, rope_scaling(s)?),
            _ => (self.rope_theta, None),
        };
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
            rope_theta: theta,
            rope_scaling: scaling,
            qkv_bias: self.attention_bias,
            o_bias: self.attention_bias,
            mlp_bias: self.mlp_bias,
            tie_word_embeddings: self.tie_word_embeddings,
            max_position_embeddings: self.max_position_embeddings,
        })
    }
}
