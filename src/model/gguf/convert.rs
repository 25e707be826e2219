//! A GGUF file as a Hugging Face model directory: llama.cpp's tensor
//! names and layouts mapped back for `llama`, `qwen2` and `qwen3`, `config.json`
//! and `generation_config.json` from the metadata, and the weights as
//! safetensors, as `transformers` loads the same file.

use crate::fsutil::io_err;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use serde_json::{json, Map, Value};

use super::file::*;
use super::tokenizer::*;
use super::GgufError;

/// Element type of the written `model.safetensors`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutDtype {
    F32,
    BF16,
    F16,
}

impl OutDtype {
    pub(super) fn safetensors_name(self) -> &'static str {
        match self {
            OutDtype::F32 => "F32",
            OutDtype::BF16 => "BF16",
            OutDtype::F16 => "F16",
        }
    }

    pub(super) fn torch_name(self) -> &'static str {
        match self {
            OutDtype::F32 => "float32",
            OutDtype::BF16 => "bfloat16",
            OutDtype::F16 => "float16",
        }
    }

    pub(super) fn size(self) -> u64 {
        match self {
            OutDtype::F32 => 4,
            OutDtype::BF16 | OutDtype::F16 => 2,
        }
    }

    pub(super) fn encode(self, values: &[f32], out: &mut Vec<u8>) {
        out.clear();
        out.reserve(values.len() * self.size() as usize);
        match self {
            OutDtype::F32 => values
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            // half's from_f32 rounds to nearest even, as torch's .to(dtype) does.
            OutDtype::BF16 => values
                .iter()
                .for_each(|v| out.extend_from_slice(&bf16::from_f32(*v).to_le_bytes())),
            OutDtype::F16 => values
                .iter()
                .for_each(|v| out.extend_from_slice(&f16::from_f32(*v).to_le_bytes())),
        }
    }
}

/// What `convert_to_hf` did.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertSummary {
    /// `general.architecture` of the source.
    pub architecture: String,
    /// Number of tensors written to `model.safetensors`.
    pub tensors_written: usize,
    /// Total number of elements written.
    pub parameters: u64,
    /// GGUF tensors with no Hugging Face counterpart, left out (e.g. `rope_freqs.weight`).
    pub skipped_tensors: Vec<String>,
    /// Whether `lm_head` shares the embedding (no `output.weight` in the GGUF).
    pub tie_word_embeddings: bool,
    /// Whether Q/K rows were un-permuted (llama.cpp permutes them for `llama` only).
    pub unpermuted_qk: bool,
    /// The files written, in `out_dir`.
    pub files: Vec<PathBuf>,
}

/// Model families this converter understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arch {
    Llama,
    Qwen2,
    Qwen3,
}

impl Arch {
    pub(super) fn model_type(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
    }

    pub(super) fn class(self) -> &'static str {
        match self {
            Arch::Llama => "LlamaForCausalLM",
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
        }
    }
}

/// The Hugging Face name of a llama.cpp tensor, for the decoder-only layout shared by `llama`
/// and `qwen2`; `None` for tensors that have no counterpart.
pub(super) fn hf_tensor_name(gguf_name: &str) -> Option<String> {
    match gguf_name {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (module, kind) = rest.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    let hf_module = match module {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf_module}.{kind}"))
}

/// Inverse of llama.cpp's convert-time `permute(w, n_head, n_head_kv)`, which views the rows as
/// `(n_head, 2, half, ...)` and swaps the middle axes so that rotary pairs sit side by side as
/// llama.cpp's kernel wants; Hugging Face keeps the two rotary halves apart. `data` is row-major
/// with `rows` rows; `None` when `rows` does not split into `n_head` heads of even size.
pub(super) fn unpermute_rows(data: &[f32], rows: usize, n_head: usize) -> Option<Vec<f32>> {
    if n_head == 0
        || rows == 0
        || !rows.is_multiple_of(2 * n_head)
        || !data.len().is_multiple_of(rows)
    {
        return None;
    }
    let cols = data.len() / rows;
    let half = rows / n_head / 2;
    let mut out = vec![0f32; data.len()];
    for h in 0..n_head {
        for j in 0..2 {
            for i in 0..half {
                let hf_row = h * 2 * half + j * half + i;
                let gguf_row = h * 2 * half + i * 2 + j;
                out[hf_row * cols..(hf_row + 1) * cols]
                    .copy_from_slice(&data[gguf_row * cols..(gguf_row + 1) * cols]);
            }
        }
    }
    Some(out)
}

/// Hyperparameters read from `{arch}.*` metadata.
pub(super) struct Hparams {
    pub(super) hidden: u64,
    pub(super) intermediate: u64,
    pub(super) layers: u64,
    pub(super) heads: u64,
    pub(super) kv_heads: u64,
    pub(super) rms_eps: f64,
    pub(super) rope_theta: f64,
    pub(super) context: Option<u64>,
    pub(super) head_dim: Option<u64>,
    pub(super) key_length: Option<u64>,
    pub(super) vocab_size: Option<u64>,
}

pub(super) fn read_hparams(g: &GgufFile, arch: &str) -> Result<Hparams, GgufError> {
    let key = |k: &str| format!("{arch}.{k}");
    let heads = g.req_u64(&key("attention.head_count"))?;
    if heads == 0 {
        return Err(g.bad_metadata(
            &key("attention.head_count"),
            "a positive integer",
            &MetaValue::U64(0),
        ));
    }
    let kv_heads = g.opt_u64(&key("attention.head_count_kv"))?.unwrap_or(heads);
    Ok(Hparams {
        hidden: g.req_u64(&key("embedding_length"))?,
        intermediate: g.req_u64(&key("feed_forward_length"))?,
        layers: g.req_u64(&key("block_count"))?,
        heads,
        kv_heads,
        // transformers' LlamaConfig / Qwen2Config default when the key is absent.
        rms_eps: g
            .opt_f64(&key("attention.layer_norm_rms_epsilon"))?
            .unwrap_or(1e-6),
        rope_theta: g.opt_f64(&key("rope.freq_base"))?.unwrap_or(10000.0),
        context: g.opt_u64(&key("context_length"))?,
        head_dim: g.opt_u64(&key("rope.dimension_count"))?,
        key_length: g.opt_u64(&key("attention.key_length"))?,
        vocab_size: g.opt_u64(&key("vocab_size"))?,
    })
}

pub(super) fn build_config(
    arch: Arch,
    hp: &Hparams,
    ids: &SpecialIds,
    vocab_size: u64,
    tie: bool,
    attention_bias: bool,
    dtype: OutDtype,
) -> Value {
    let mut c = Map::new();
    c.insert("architectures".into(), json!([arch.class()]));
    c.insert("model_type".into(), json!(arch.model_type()));
    c.insert("hidden_size".into(), json!(hp.hidden));
    c.insert("intermediate_size".into(), json!(hp.intermediate));
    c.insert("num_hidden_layers".into(), json!(hp.layers));
    c.insert("num_attention_heads".into(), json!(hp.heads));
    c.insert("num_key_value_heads".into(), json!(hp.kv_heads));
    // transformers takes head_dim from rope.dimension_count for llama only.
    if arch == Arch::Llama {
        if let Some(hd) = hp.head_dim {
            c.insert("head_dim".into(), json!(hd));
        }
        c.insert("attention_bias".into(), json!(attention_bias));
    }
    if arch == Arch::Qwen3 {
        // llama.cpp writes Qwen3's head size as attention.key_length;
        // transformers reads no key for it and keeps Qwen3Config's 128.
        c.insert("head_dim".into(), json!(hp.key_length.unwrap_or(128)));
        c.insert("attention_bias".into(), json!(attention_bias));
    }
    c.insert("hidden_act".into(), json!("silu"));
    c.insert("rms_norm_eps".into(), json!(hp.rms_eps));
    // transformers 5 keeps rope settings in `rope_parameters`; `rope_theta` stays for readers
    // written against the older flat layout.
    c.insert("rope_theta".into(), json!(hp.rope_theta));
    c.insert(
        "rope_parameters".into(),
        json!({"rope_type": "default", "rope_theta": hp.rope_theta}),
    );
    if let Some(ctx) = hp.context {
        c.insert("max_position_embeddings".into(), json!(ctx));
    }
    c.insert("vocab_size".into(), json!(vocab_size));
    c.insert("tie_word_embeddings".into(), json!(tie));
    for (name, id) in [
        ("bos_token_id", ids.bos),
        ("eos_token_id", ids.eos),
        ("pad_token_id", ids.pad),
        ("unk_token_id", ids.unk),
    ] {
        if let Some(id) = id {
            c.insert(name.into(), json!(id));
        }
    }
    // transformers 5 reads `dtype`; older readers and our own tooling look for `torch_dtype`.
    c.insert("torch_dtype".into(), json!(dtype.torch_name()));
    c.insert("dtype".into(), json!(dtype.torch_name()));
    Value::Object(c)
}

/// One tensor of the output checkpoint, before its data is produced.
pub(super) struct OutTensor<'a> {
    pub(super) hf_name: String,
    pub(super) info: &'a TensorInfo,
    pub(super) shape: Vec<usize>,
    /// Heads to un-permute rows over (llama Q/K), if any.
    pub(super) unpermute_heads: Option<usize>,
}

/// Converts the GGUF at `gguf` into a Hugging Face model directory `out_dir` (created if needed):
/// `model.safetensors` (HF names and shapes, `dtype`, `{"format":"pt"}` metadata), `config.json`,
/// `generation_config.json`, `tokenizer.json`, `tokenizer_config.json` and
/// `special_tokens_map.json`. Each file is written atomically. Supports the `llama`, `qwen2` and `qwen3`
/// architectures with a `gpt2` (byte-level BPE) tokenizer.
pub fn convert_to_hf(
    gguf: &Path,
    out_dir: &Path,
    dtype: OutDtype,
) -> Result<ConvertSummary, GgufError> {
    let g = GgufFile::open(gguf)?;
    let arch_name = g
        .opt_str("general.architecture")?
        .ok_or_else(|| GgufError::MissingMetadata {
            path: g.path.clone(),
            key: "general.architecture".into(),
        })?
        .to_string();
    let arch = match arch_name.as_str() {
        "llama" => Arch::Llama,
        "qwen2" => Arch::Qwen2,
        "qwen3" => Arch::Qwen3,
        other => {
            return Err(GgufError::Unsupported {
                path: g.path.clone(),
                what: format!("architecture '{other}' (supported: llama, qwen2, qwen3)"),
            })
        }
    };
    let hp = read_hparams(&g, &arch_name)?;
    let ids = read_special_ids(&g)?;

    // Build the tokenizer files first: they are cheap and fail fast on unsupported vocabularies.
    let tok = build_tokenizer_files(&g, &ids)?;

    let tie = g.tensor("output.weight").is_none();
    let (plan, skipped) = plan_tensors(&g, arch, &hp, tie)?;
    let embd = g.require_tensor("token_embd.weight")?;
    let vocab_size = hp
        .vocab_size
        .or(tok.vocab_len)
        .unwrap_or_else(|| embd.dims.get(1).copied().unwrap_or(0));
    let attention_bias = g.tensor("blk.0.attn_q.bias").is_some();
    let config = build_config(arch, &hp, &ids, vocab_size, tie, attention_bias, dtype);

    let mut generation = Map::new();
    generation.insert("_from_model_config".into(), json!(true));
    for (name, id) in [
        ("bos_token_id", ids.bos),
        ("eos_token_id", ids.eos),
        ("pad_token_id", ids.pad),
    ] {
        if let Some(id) = id {
            generation.insert(name.into(), json!(id));
        }
    }

    std::fs::create_dir_all(out_dir).map_err(io_err(out_dir, "cannot create directory"))?;
    let mut files = Vec::new();
    let st_path = out_dir.join("model.safetensors");
    let parameters = crate::fsutil::write_atomic_with(&st_path, |w, tmp| {
        write_safetensors(&g, &plan, dtype, w, tmp)
    })?;
    files.push(st_path);
    for (name, text) in [
        ("config.json", pretty(&config)),
        ("generation_config.json", pretty(&Value::Object(generation))),
        ("tokenizer.json", tok.tokenizer_json),
        ("tokenizer_config.json", pretty(&tok.tokenizer_config)),
        ("special_tokens_map.json", pretty(&tok.special_tokens_map)),
    ] {
        let path = out_dir.join(name);
        crate::fsutil::write_atomic_with(&path, |w, tmp| {
            w.write_all(text.as_bytes())
                .map_err(io_err(tmp, "cannot write"))
        })?;
        files.push(path);
    }

    Ok(ConvertSummary {
        architecture: arch_name,
        tensors_written: plan.len(),
        parameters,
        skipped_tensors: skipped,
        tie_word_embeddings: tie,
        unpermuted_qk: arch == Arch::Llama,
        files,
    })
}

pub(super) fn pretty(v: &Value) -> String {
    // Serializing a Value built from strings and numbers cannot fail; fall back to compact.
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()) + "\n"
}

/// Decides which tensors go into the checkpoint, under which names and shapes, and checks that
/// every tensor the architecture needs is present with a consistent shape.
pub(super) fn plan_tensors<'a>(
    g: &'a GgufFile,
    arch: Arch,
    hp: &Hparams,
    tie: bool,
) -> Result<(Vec<OutTensor<'a>>, Vec<String>), GgufError> {
    let mut required = vec![
        "token_embd.weight".to_string(),
        "output_norm.weight".to_string(),
    ];
    for l in 0..hp.layers {
        for m in [
            "attn_norm",
            "ffn_norm",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ] {
            required.push(format!("blk.{l}.{m}.weight"));
        }
    }
    for name in &required {
        g.require_tensor(name)?;
    }

    let mut plan = Vec::new();
    let mut skipped = Vec::new();
    for info in &g.tensors {
        let Some(hf_name) = hf_tensor_name(&info.name) else {
            skipped.push(info.name.clone());
            continue;
        };
        if tie && hf_name == "lm_head.weight" {
            continue;
        }
        // Layers past block_count would not be loaded by transformers either.
        if let Some(layer) = info
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|l| l.parse::<u64>().ok())
        {
            if layer >= hp.layers {
                skipped.push(info.name.clone());
                continue;
            }
        }
        let is_q = info.name.contains(".attn_q.");
        let is_k = info.name.contains(".attn_k.");
        let unpermute_heads = match (arch, is_q, is_k) {
            (Arch::Llama, true, _) => Some(hp.heads as usize),
            (Arch::Llama, _, true) => Some(hp.kv_heads as usize),
            _ => None,
        };
        let shape = info.hf_shape();
        if let Some(heads) = unpermute_heads {
            let rows = shape.first().copied().unwrap_or(0);
            if heads == 0 || !rows.is_multiple_of(2 * heads) {
                return Err(GgufError::BadTensorShape {
                    path: g.path.clone(),
                    tensor: info.name.clone(),
                    what: format!(
                        "{rows} rows do not split into {heads} heads of even size, so the rotary permutation cannot be undone"
                    ),
                });
            }
        }
        if !can_dequantize(info.type_id) {
            return Err(GgufError::UnsupportedTensorType {
                path: g.path.clone(),
                tensor: info.name.clone(),
                type_name: info.type_name,
                type_id: info.type_id,
            });
        }
        plan.push(OutTensor {
            hf_name,
            info,
            shape,
            unpermute_heads,
        });
    }
    plan.sort_by(|a, b| a.hf_name.cmp(&b.hf_name));
    Ok((plan, skipped))
}

/// Writes the safetensors layout (u64 header length, JSON header padded with spaces to 8 bytes,
/// then the tensors back to back) one tensor at a time, so peak memory is one dequantized tensor
/// rather than the whole model. Returns the number of elements written.
pub(super) fn write_safetensors(
    g: &GgufFile,
    plan: &[OutTensor<'_>],
    dtype: OutDtype,
    w: &mut BufWriter<File>,
    path: &Path,
) -> Result<u64, GgufError> {
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0u64;
    for t in plan {
        let len = t.info.n_elements() * dtype.size();
        header.insert(
            t.hf_name.clone(),
            json!({
                "dtype": dtype.safetensors_name(),
                "shape": t.shape,
                "data_offsets": [offset, offset + len],
            }),
        );
        offset += len;
    }
    let mut header_bytes = Value::Object(header).to_string().into_bytes();
    while !header_bytes.len().is_multiple_of(8) {
        header_bytes.push(b' ');
    }
    let write_err = io_err(path, "cannot write");
    w.write_all(&(header_bytes.len() as u64).to_le_bytes())
        .and_then(|_| w.write_all(&header_bytes))
        .map_err(write_err)?;

    let mut parameters = 0u64;
    let mut buf = Vec::new();
    for t in plan {
        let mut values = g.dequantize(t.info)?;
        if let Some(heads) = t.unpermute_heads {
            let rows = t.shape.first().copied().unwrap_or(0);
            values =
                unpermute_rows(&values, rows, heads).ok_or_else(|| GgufError::BadTensorShape {
                    path: g.path.clone(),
                    tensor: t.info.name.clone(),
                    what: format!("cannot un-permute {rows} rows over {heads} heads"),
                })?;
        }
        dtype.encode(&values, &mut buf);
        w.write_all(&buf).map_err(io_err(path, "cannot write"))?;
        parameters += values.len() as u64;
    }
    Ok(parameters)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // llama.cpp's permute with 2 heads of 4 rows: within each head, HF rows [a0 a1 b0 b1]
        // (the two rotary halves) are stored interleaved as [a0 b0 a1 b1].
        let gguf_rows: Vec<f32> = vec![0., 1., 2., 3., 4., 5., 6., 7.];
        let hf = unpermute_rows(&gguf_rows, 8, 2).expect("valid shape");
        assert_eq!(hf, vec![0., 2., 1., 3., 4., 6., 5., 7.]);

        // With two columns the whole row moves.
        let gguf_2col: Vec<f32> = vec![0., 10., 1., 11., 2., 12., 3., 13.];
        let hf = unpermute_rows(&gguf_2col, 4, 1).expect("valid shape");
        assert_eq!(hf, vec![0., 10., 2., 12., 1., 11., 3., 13.]);

        // One head of six rows (half = 3): stored [a0 b0 a1 b1 a2 b2].
        let hf = unpermute_rows(&[0., 1., 2., 3., 4., 5.], 6, 1).expect("valid shape");
        assert_eq!(hf, vec![0., 2., 4., 1., 3., 5.]);

        assert!(unpermute_rows(&[0.; 6], 6, 2).is_none());
    }

    #[test]
    fn maps_tensor_names() {
        assert_eq!(
            hf_tensor_name("blk.12.attn_q.bias").as_deref(),
            Some("model.layers.12.self_attn.q_proj.bias")
        );
        assert_eq!(
            hf_tensor_name("blk.0.ffn_norm.weight").as_deref(),
            Some("model.layers.0.post_attention_layernorm.weight")
        );
        assert_eq!(
            hf_tensor_name("output.weight").as_deref(),
            Some("lm_head.weight")
        );
        assert_eq!(hf_tensor_name("rope_freqs.weight"), None);
        assert_eq!(hf_tensor_name("blk.x.attn_q.weight"), None);
    }

    #[test]
    fn converts_tiny_llama() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = write_file(&dir, "tiny.gguf", &tiny_llama(TINY).finish());
        let out = dir.path().join("hf");
        let summary = convert_to_hf(&src, &out, OutDtype::F32).expect("convert");
        assert!(summary.tie_word_embeddings && summary.unpermuted_qk);
        assert_eq!(
            summary.skipped_tensors,
            vec!["rope_freqs.weight".to_string()]
        );
        assert_eq!(summary.tensors_written, 11);

        let bytes = std::fs::read(out.join("model.safetensors")).expect("read safetensors");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("valid safetensors");
        let get = |name: &str| -> (Vec<usize>, Vec<f32>) {
            let t = st.tensor(name).expect(name);
            let v = t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (t.shape().to_vec(), v)
        };
        assert!(st.tensor("lm_head.weight").is_err(), "tied: no lm_head");
        assert_eq!(get("model.embed_tokens.weight").0, vec![7, 4]);
        assert_eq!(get("model.layers.0.mlp.down_proj.weight").0, vec![4, 8]);
        let (shape, q) = get("model.layers.0.self_attn.q_proj.weight");
        assert_eq!(shape, vec![4, 4]);
        // With head_dim 2 each rotary half is one row, so the permutation is the identity.
        assert_eq!(q[4..8], [10., 11., 12., 13.]);
        let (kshape, k) = get("model.layers.0.self_attn.k_proj.weight");
        assert_eq!(kshape, vec![2, 4]);
        assert_eq!(k, (0..8).map(|i| i as f32).collect::<Vec<_>>());

        let config = read_json(&out.join("config.json"));
        assert_eq!(config["architectures"], json!(["LlamaForCausalLM"]));
        assert_eq!(config["num_key_value_heads"], json!(1));
        assert_eq!(config["head_dim"], json!(2));
        assert_eq!(config["vocab_size"], json!(7));
        assert_eq!(config["tie_word_embeddings"], json!(true));
        assert_eq!(config["rope_theta"], json!(100000.0));
        assert_eq!(config["max_position_embeddings"], json!(64));
        assert_eq!(config["bos_token_id"], json!(1));
        let tc = read_json(&out.join("tokenizer_config.json"));
        assert_eq!(tc["bos_token"], json!("<|im_start|>"));
        assert_eq!(tc["eos_token"], json!("<|endoftext|>"));
        assert_eq!(tc["chat_template"], json!("{{ messages }}"));

        let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).expect("load");
        let enc = tok.encode("ab ab<|im_start|>", false).expect("encode");
        assert_eq!(enc.get_ids(), &[4, 6, 1]);
        assert_eq!(tok.decode(&[4, 6], false).expect("decode"), "ab ab");
    }

    #[test]
    fn untied_model_keeps_lm_head_and_unpermutes_wider_heads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = write_file(
            &dir,
            "untied.gguf",
            &tiny_llama(Tiny {
                tied: false,
                n_head: 1,
                ..TINY
            })
            .finish(),
        );
        let out = dir.path().join("hf");
        let summary = convert_to_hf(&src, &out, OutDtype::BF16).expect("convert");
        assert!(!summary.tie_word_embeddings);
        let bytes = std::fs::read(out.join("model.safetensors")).expect("read");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("valid");
        let lm = st.tensor("lm_head.weight").expect("lm_head present");
        assert_eq!(lm.dtype(), safetensors::Dtype::BF16);
        assert_eq!(lm.shape(), &[7, 4]);
        // One head of 4 rows (half 2): GGUF rows [r0 r1 r2 r3] hold HF rows [r0 r2 r1 r3].
        let q: Vec<f32> = st
            .tensor("model.layers.0.self_attn.q_proj.weight")
            .expect("q")
            .data()
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .step_by(4)
            .collect();
        assert_eq!(q, vec![0., 20., 10., 30.]);
        let config = read_json(&out.join("config.json"));
        assert_eq!(config["torch_dtype"], json!("bfloat16"));
        assert_eq!(config["tie_word_embeddings"], json!(false));
    }

    #[test]
    fn unsupported_architecture_and_tokenizer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut w = Writer::new();
        w.str("general.architecture", "mamba");
        let src = write_file(&dir, "mamba.gguf", &w.finish());
        let err = convert_to_hf(&src, &dir.path().join("o"), OutDtype::F32).expect_err("arch");
        assert!(
            matches!(&err, GgufError::Unsupported { what, .. } if what.contains("mamba")),
            "{err}"
        );

        let src = write_file(
            &dir,
            "spm.gguf",
            &tiny_llama(Tiny {
                tokenizer_model: "bert",
                ..TINY
            })
            .finish(),
        );
        let err = convert_to_hf(&src, &dir.path().join("o"), OutDtype::F32).expect_err("tok");
        assert!(
            matches!(&err, GgufError::Unsupported { what, .. } if what.contains("'bert'")),
            "{err}"
        );
    }

    #[test]
    fn missing_layer_tensor_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let w = tiny_llama(Tiny {
            block_count: 2,
            ..TINY
        });
        let src = write_file(&dir, "short.gguf", &w.finish());
        let err = convert_to_hf(&src, &dir.path().join("o"), OutDtype::F32).expect_err("missing");
        assert!(
            matches!(&err, GgufError::MissingTensor { tensor, .. } if tensor == "blk.1.attn_norm.weight"),
            "{err}"
        );
    }
}
