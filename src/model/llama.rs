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

use super::decoder::{DecoderConfig, HfDecoderFields, Llama3RopeScaling};

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

pub(super) fn rope_scaling(v: &serde_json::Value) -> Result<Option<Llama3RopeScaling>, String> {
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
        let scaling = match (&self.common.rope_parameters, &self.rope_scaling) {
            (Some(p), _) => rope_scaling(p)?,
            (None, Some(s)) if !s.is_null() => rope_scaling(s)?,
            _ => None,
        };
        Ok(DecoderConfig {
            rope_scaling: scaling,
            qkv_bias: self.attention_bias,
            o_bias: self.attention_bias,
            mlp_bias: self.mlp_bias,
            ..self.common.decoder_config(2048)
        })
    }
}
