//! What tests build on, in one place for the crate's unit tests and for
//! `tests/`: a scripted [`Generator`] and random tiny Llamas (one to train in
//! a unit test, one that carries the embedded model's tokenizer and chat
//! template). Not part of the product: hidden from the docs, and nothing
//! outside tests calls it.

use std::path::Path;
use std::sync::Mutex;

use serde_json::{json, Value};

use super::{Completion, FinishReason, GenerationParams, Generator, ModelError, Policy};
use crate::config::{Dtype, LoraConfig};

/// A generator that answers each prompt with `answer(prompt)` and records
/// every prompt and each call's sampling settings. An answer is the model's
/// whole reply: when a call prefills the reply, the answer must start with
/// the prefill (a script that forgets it is a test bug, so it panics), and
/// the completion is what follows it, as a model continues a prefill.
pub struct Scripted<F: Fn(&str) -> String> {
    answer: F,
    seen: Mutex<Vec<String>>,
    params: Mutex<Vec<GenerationParams>>,
}

impl<F: Fn(&str) -> String> Scripted<F> {
    pub fn new(answer: F) -> Self {
        Scripted {
            answer,
            seen: Mutex::new(Vec::new()),
            params: Mutex::new(Vec::new()),
        }
    }

    /// Every prompt so far, in order.
    pub fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }

    /// The sampling settings of every call so far, in order.
    pub fn params(&self) -> Vec<GenerationParams> {
        self.params.lock().unwrap().clone()
    }
}

impl<F: Fn(&str) -> String> Generator for Scripted<F> {
    fn generate(
        &self,
        prompts: &[String],
        params: &GenerationParams,
    ) -> Result<Vec<Completion>, ModelError> {
        self.params.lock().unwrap().push(params.clone());
        let mut seen = self.seen.lock().unwrap();
        Ok(prompts
            .iter()
            .map(|p| {
                seen.push(p.clone());
                Completion::text_only(continued(&(self.answer)(p), params), FinishReason::Eos)
            })
            .collect())
    }
}

/// What a model writes after the prefill of `params` when its whole reply
/// is `answer`; panics when `answer` does not start with the prefill.
pub fn continued(answer: &str, params: &GenerationParams) -> String {
    match answer.strip_prefix(params.prefill.as_str()) {
        Some(rest) => rest.to_owned(),
        None => panic!(
            "answer {answer:?} does not start with the prefill {:?}",
            params.prefill
        ),
    }
}

/// The config of a random Llama `hidden` wide (heads of 8, two query heads
/// per KV head, MLP twice as wide) with `layers` layers, `vocab` tokens and
/// tied embeddings.
pub fn tiny_llama_config(layers: i64, hidden: i64, vocab: i64, max_positions: i64) -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
        "num_attention_heads": hidden / 8, "num_key_value_heads": hidden / 16, "head_dim": 8,
        "vocab_size": vocab, "max_position_embeddings": max_positions, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": true, "hidden_act": "silu",
    })
}

/// A 2-layer, 16-wide Llama (vocab 64) with random weights written to
/// `dir`, in fp32 on the CPU, with LoRA of rank 2 on q/v.
pub fn tiny_lora_policy(dir: &Path) -> Policy {
    super::generate::write_random_model(dir, &tiny_llama_config(2, 16, 64, 64), 11, 0.3).unwrap();
    let mut p = Policy::load(dir, Dtype::Fp32, tch::Device::Cpu).unwrap();
    p.attach_lora(&LoraConfig {
        enabled: true,
        rank: 2,
        alpha: 4.0,
        dropout: 0.0,
        targets: vec!["q_proj".into(), "v_proj".into()],
    })
    .unwrap();
    p
}

/// A 2-layer, 32-wide Llama with random weights (seeded) and SmolLM2's
/// tokenizer files, chat template and special tokens, written to `dir`: a
/// model the whole training loop runs on in seconds.
pub fn tiny_chat_model(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let src = super::hub::resolve("embedded").expect("the embedded model (scripts/setup)");
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
    ] {
        if src.join(f).is_file() {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
    }
    let mut config = tiny_llama_config(2, 32, 49152, 2048);
    for (k, v) in [
        ("bos_token_id", json!(1)),
        ("eos_token_id", json!(2)),
        ("pad_token_id", json!(2)),
        ("attention_bias", json!(false)),
    ] {
        config[k] = v;
    }
    super::generate::write_random_model(dir, &config, 1234, 0.08).unwrap();
}
