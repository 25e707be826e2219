//! A GGUF writer for tests: just enough of the format to build fixtures
//! byte by byte, and the tiny llama the converter tests share.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use serde_json::Value;

use super::file::*;

/// Test-only GGUF writer: just enough of the format to build fixtures byte by byte.
pub(super) struct Writer {
    pub(super) version: u32,
    pub(super) alignment: usize,
    pub(super) kv: Vec<u8>,
    pub(super) n_kv: u64,
    pub(super) infos: Vec<u8>,
    pub(super) n_tensors: u64,
    pub(super) data: Vec<u8>,
}

pub(super) fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

impl Writer {
    pub(super) fn new() -> Self {
        Writer {
            version: 3,
            alignment: 32,
            kv: Vec::new(),
            n_kv: 0,
            infos: Vec::new(),
            n_tensors: 0,
            data: Vec::new(),
        }
    }

    pub(super) fn key(&mut self, key: &str, value_type: u32) -> &mut Vec<u8> {
        self.n_kv += 1;
        put_str(&mut self.kv, key);
        self.kv.extend_from_slice(&value_type.to_le_bytes());
        &mut self.kv
    }

    pub(super) fn u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.key(key, 4).extend_from_slice(&v.to_le_bytes());
        self
    }

    pub(super) fn f32(&mut self, key: &str, v: f32) -> &mut Self {
        self.key(key, 6).extend_from_slice(&v.to_le_bytes());
        self
    }

    pub(super) fn bool(&mut self, key: &str, v: bool) -> &mut Self {
        self.key(key, 7).push(u8::from(v));
        self
    }

    pub(super) fn str(&mut self, key: &str, v: &str) -> &mut Self {
        put_str(self.key(key, 8), v);
        self
    }

    pub(super) fn str_array(&mut self, key: &str, items: &[&str]) -> &mut Self {
        let buf = self.key(key, 9);
        buf.extend_from_slice(&8u32.to_le_bytes());
        buf.extend_from_slice(&(items.len() as u64).to_le_bytes());
        for s in items {
            put_str(buf, s);
        }
        self
    }

    pub(super) fn i32_array(&mut self, key: &str, items: &[i32]) -> &mut Self {
        let buf = self.key(key, 9);
        buf.extend_from_slice(&5u32.to_le_bytes());
        buf.extend_from_slice(&(items.len() as u64).to_le_bytes());
        for v in items {
            buf.extend_from_slice(&v.to_le_bytes());
        }
        self
    }

    pub(super) fn tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        type_id: u32,
        bytes: &[u8],
    ) -> &mut Self {
        while !self.data.len().is_multiple_of(self.alignment) {
            self.data.push(0);
        }
        self.n_tensors += 1;
        put_str(&mut self.infos, name);
        self.infos
            .extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            self.infos.extend_from_slice(&d.to_le_bytes());
        }
        self.infos.extend_from_slice(&type_id.to_le_bytes());
        self.infos
            .extend_from_slice(&(self.data.len() as u64).to_le_bytes());
        self.data.extend_from_slice(bytes);
        self
    }

    pub(super) fn f32_tensor(&mut self, name: &str, dims: &[u64], values: &[f32]) -> &mut Self {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, dims, TYPE_F32, &bytes)
    }

    pub(super) fn finish(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.n_tensors.to_le_bytes());
        out.extend_from_slice(&self.n_kv.to_le_bytes());
        out.extend_from_slice(&self.kv);
        out.extend_from_slice(&self.infos);
        while !out.len().is_multiple_of(self.alignment) {
            out.push(0);
        }
        out.extend_from_slice(&self.data);
        out
    }
}

pub(super) fn write_file(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).expect("write fixture");
    path
}

pub(super) fn f16_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

/// One tensor of each supported type with hand-computable values.
pub(super) fn typed_fixture() -> Writer {
    let mut w = Writer::new();
    w.str("general.architecture", "llama")
        .u32("general.alignment", 32)
        .str_array("general.languages", &["en", "fr"])
        .i32_array("some.ints", &[-1, 7])
        .bool("some.flag", true)
        .f32("some.eps", 1e-5);
    w.f32_tensor("f32", &[2, 2], &[1.5, -2.0, 0.25, 8.0]);
    let f16s: Vec<u8> = [1.0f32, -0.5, 65504.0]
        .iter()
        .flat_map(|&v| f16_bytes(v))
        .collect();
    w.tensor("f16", &[3], TYPE_F16, &f16s);
    let bf16s: Vec<u8> = [3.0f32, -1.25]
        .iter()
        .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
        .collect();
    w.tensor("bf16", &[2], TYPE_BF16, &bf16s);
    // Q8_0: d = 0.5, q = i - 16 for i in 0..32.
    let mut q8 = f16_bytes(0.5).to_vec();
    q8.extend((0..32).map(|i| (i as i8 - 16) as u8));
    w.tensor("q8_0", &[32], TYPE_Q8_0, &q8);
    // Q4_0: d = 2, byte j holds low nibble j and high nibble 15 - j.
    let mut q4 = f16_bytes(2.0).to_vec();
    q4.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    w.tensor("q4_0", &[32], TYPE_Q4_0, &q4);
    // Q4_1: d = 0.5, m = -1, same nibbles.
    let mut q41 = f16_bytes(0.5).to_vec();
    q41.extend_from_slice(&f16_bytes(-1.0));
    q41.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    w.tensor("q4_1", &[32], TYPE_Q4_1, &q41);
    w
}

/// A one-layer llama, hidden size 4, one KV head, with a tiny byte-level vocabulary.
pub(super) struct Tiny {
    pub(super) tied: bool,
    pub(super) n_head: u32,
    pub(super) block_count: u32,
    pub(super) tokenizer_model: &'static str,
}

pub(super) const TINY: Tiny = Tiny {
    tied: true,
    n_head: 2,
    block_count: 1,
    tokenizer_model: "gpt2",
};

pub(super) fn tiny_llama(opts: Tiny) -> Writer {
    let Tiny {
        tied,
        n_head,
        block_count,
        tokenizer_model,
    } = opts;
    let head_dim = 4 / u64::from(n_head);
    let mut w = Writer::new();
    let tokens = [
        "<|endoftext|>",
        "<|im_start|>",
        "a",
        "b",
        "ab",
        "\u{120}",
        "\u{120}ab",
    ];
    w.str("general.architecture", "llama")
        .u32("llama.block_count", block_count)
        .u32("llama.context_length", 64)
        .u32("llama.embedding_length", 4)
        .u32("llama.feed_forward_length", 8)
        .u32("llama.attention.head_count", n_head)
        .u32("llama.attention.head_count_kv", 1)
        .f32("llama.rope.freq_base", 100000.0)
        .f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .u32("llama.rope.dimension_count", head_dim as u32)
        .str("tokenizer.ggml.model", tokenizer_model)
        .str("tokenizer.ggml.pre", "smollm")
        .str_array("tokenizer.ggml.tokens", &tokens)
        .i32_array("tokenizer.ggml.token_type", &[3, 3, 1, 1, 1, 1, 1])
        .str_array("tokenizer.ggml.merges", &["a b", "\u{120} ab"])
        .u32("tokenizer.ggml.bos_token_id", 1)
        .u32("tokenizer.ggml.eos_token_id", 0)
        .bool("tokenizer.ggml.add_bos_token", false)
        .str("tokenizer.chat_template", "{{ messages }}");
    let seq = |n: usize| -> Vec<f32> { (0..n).map(|i| i as f32).collect() };
    w.f32_tensor("token_embd.weight", &[4, 7], &seq(28));
    w.f32_tensor("output_norm.weight", &[4], &[1.0; 4]);
    if !tied {
        w.f32_tensor("output.weight", &[4, 7], &seq(28));
    }
    w.f32_tensor("blk.0.attn_norm.weight", &[4], &[1.0; 4]);
    w.f32_tensor("blk.0.ffn_norm.weight", &[4], &[1.0; 4]);
    // Row r of q (4 rows of 4) holds r*10 + column, so moved rows are easy to spot.
    let q: Vec<f32> = (0..16).map(|i| ((i / 4) * 10 + i % 4) as f32).collect();
    w.f32_tensor("blk.0.attn_q.weight", &[4, 4], &q);
    let kv = (4 * head_dim) as usize;
    w.f32_tensor("blk.0.attn_k.weight", &[4, head_dim], &seq(kv));
    w.f32_tensor("blk.0.attn_v.weight", &[4, head_dim], &seq(kv));
    w.f32_tensor("blk.0.attn_output.weight", &[4, 4], &seq(16));
    w.f32_tensor("blk.0.ffn_gate.weight", &[4, 8], &seq(32));
    w.f32_tensor("blk.0.ffn_up.weight", &[4, 8], &seq(32));
    w.f32_tensor("blk.0.ffn_down.weight", &[8, 4], &seq(32));
    w.f32_tensor("rope_freqs.weight", &[1], &[1.0]);
    w
}

pub(super) fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("read json");
    serde_json::from_str(&text).expect("parse json")
}
