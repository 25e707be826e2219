//! The decoder-only transformer shared by the Qwen2, Qwen3 and Llama
//! families: RMSNorm, rotary position embeddings (HF's rotate-half layout,
//! with the config's theta and optional llama3 frequency scaling),
//! grouped-query attention through libtorch's `scaled_dot_product_attention`,
//! and a SwiGLU MLP. The families differ only in which projections carry a
//! bias, whether q and k get a per-head RMSNorm (Qwen3), and their
//! `config.json` fields; `qwen2.rs`, `qwen3.rs` and `llama.rs` own those
//! mappings.
//!
//! Follows transformers' `modeling_qwen2.py` / `modeling_llama.py` op for op
//! (RMSNorm in fp32 then cast back; cos/sin in fp32 then cast), so fp32
//! logits match the reference to ~1e-5.
//!
//! Padding is on the left; each sequence's positions start at 0 at its first
//! real token, as `generate` in transformers computes them.
//!
//! One coherent thing over ~1,200 lines: the forward pass, its KV cache and
//! the tests that pin them belong together.

use tch::nn::Path;
use tch::{Device, Kind, Tensor};

use super::lora::{Fused, LoraLinear};
use super::ModelError;

/// Llama-3 style RoPE frequency scaling (`rope_scaling.rope_type = "llama3"`).
#[derive(Debug, Clone, PartialEq)]
pub struct Llama3RopeScaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: f64,
}

/// YaRN RoPE scaling (`rope_type = "yarn"`: long-context Qwen2.5, Qwen3).
#[derive(Debug, Clone, PartialEq)]
pub struct YarnRopeScaling {
    pub factor: f64,
    pub original_max_position_embeddings: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    /// What cos and sin are multiplied by.
    pub attention_factor: f64,
    pub truncate: bool,
}

/// The RoPE frequency scalings read from `rope_parameters` / `rope_scaling`.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    Llama3(Llama3RopeScaling),
    /// Positions divided by `factor` (DeepSeek-Coder, CodeLlama's long
    /// variants): every inverse frequency over `factor`.
    Linear {
        factor: f64,
    },
    Yarn(YarnRopeScaling),
}

/// A `rope_parameters` / `rope_scaling` object as transformers reads it;
/// `None` for the default RoPE, an error naming the type or the field for
/// anything not implemented. `max_positions` is the config's
/// `max_position_embeddings` (YaRN derives a missing factor from it).
pub fn parse_rope_scaling(
    v: &serde_json::Value,
    max_positions: Option<i64>,
) -> Result<Option<RopeScaling>, String> {
    let ty = v
        .get("rope_type")
        .or_else(|| v.get("type"))
        .and_then(|t| t.as_str())
        .unwrap_or("default");
    let opt = |k: &str| v.get(k).and_then(|x| x.as_f64());
    let num = |k: &str| opt(k).ok_or_else(|| format!("rope scaling `{ty}` needs a numeric `{k}`"));
    if let Some(p) = opt("partial_rotary_factor").filter(|p| *p != 1.0) {
        return Err(format!(
            "partial_rotary_factor = {p} is not supported (rotary over the whole head only)"
        ));
    }
    match ty {
        "default" => Ok(None),
        "llama3" => Ok(Some(RopeScaling::Llama3(Llama3RopeScaling {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_max_position_embeddings: num("original_max_position_embeddings")?,
        }))),
        "linear" => Ok(Some(RopeScaling::Linear {
            factor: num("factor")?,
        })),
        "yarn" => {
            let original = num("original_max_position_embeddings")?;
            let factor = match opt("factor") {
                Some(f) => f,
                None => {
                    max_positions.ok_or("rope scaling `yarn` needs `factor`")? as f64 / original
                }
            };
            // transformers' `get_mscale`.
            let mscale = |scale: f64, m: f64| {
                if scale <= 1.0 {
                    1.0
                } else {
                    0.1 * m * scale.ln() + 1.0
                }
            };
            let attention_factor = match (
                opt("attention_factor"),
                opt("mscale"),
                opt("mscale_all_dim"),
            ) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                    mscale(factor, m) / mscale(factor, all)
                }
                _ => mscale(factor, 1.0),
            };
            // `or`: transformers takes a 0 as unset too.
            let beta = |k: &str, d: f64| opt(k).filter(|b| *b != 0.0).unwrap_or(d);
            Ok(Some(RopeScaling::Yarn(YarnRopeScaling {
                factor,
                original_max_position_embeddings: original,
                beta_fast: beta("beta_fast", 32.0),
                beta_slow: beta("beta_slow", 1.0),
                attention_factor,
                truncate: v.get("truncate").and_then(|t| t.as_bool()).unwrap_or(true),
            })))
        }
        other => Err(format!(
            "rope scaling type `{other}` is not supported (default, linear, llama3 and yarn are)"
        )),
    }
}

/// Architecture hyper-parameters, family-independent.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderConfig {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub head_dim: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    /// Bias on q_proj, k_proj, v_proj.
    pub qkv_bias: bool,
    /// Bias on o_proj.
    pub o_bias: bool,
    /// Bias on gate_proj, up_proj, down_proj.
    pub mlp_bias: bool,
    /// An RMSNorm over each head of q and of k before RoPE (Qwen3's
    /// `q_norm` / `k_norm`, weights of size `head_dim`).
    pub qk_norm: bool,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: i64,
}

impl DecoderConfig {
    /// Structural checks that would otherwise surface as shape panics deep in libtorch.
    pub fn check(&self) -> Result<(), String> {
        let pos = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ];
        for (k, v) in pos {
            if v <= 0 {
                return Err(format!("{k} = {v}: must be positive"));
            }
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(format!(
                "num_attention_heads = {} is not a multiple of num_key_value_heads = {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.head_dim % 2 != 0 {
            return Err(format!(
                "head_dim = {}: rotary embeddings need it even",
                self.head_dim
            ));
        }
        Ok(())
    }

    /// What RoPE's cos and sin are multiplied by (YaRN's attention factor).
    fn rope_attention_scale(&self) -> f64 {
        match &self.rope_scaling {
            Some(RopeScaling::Yarn(y)) => y.attention_factor,
            _ => 1.0,
        }
    }

    /// Rotary inverse frequencies, computed in fp32 like the reference.
    fn inv_freq(&self) -> Vec<f32> {
        let dim = self.head_dim;
        let base = self.rope_theta as f32;
        let mut inv: Vec<f32> = (0..dim)
            .step_by(2)
            .map(|i| 1.0f32 / base.powf(i as f32 / dim as f32))
            .collect();
        match &self.rope_scaling {
            None => {}
            Some(RopeScaling::Linear { factor }) => {
                let factor = *factor as f32;
                inv.iter_mut().for_each(|f| *f /= factor);
            }
            Some(RopeScaling::Llama3(s)) => {
                // transformers' `_compute_llama3_parameters`.
                let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
                let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
                for f in inv.iter_mut() {
                    let freq = *f as f64;
                    let wavelen = 2.0 * std::f64::consts::PI / freq;
                    let scaled = if wavelen > low_wavelen {
                        freq / s.factor
                    } else if wavelen < high_wavelen {
                        freq
                    } else {
                        let smooth = (s.original_max_position_embeddings / wavelen
                            - s.low_freq_factor)
                            / (s.high_freq_factor - s.low_freq_factor);
                        (1.0 - smooth) * freq / s.factor + smooth * freq
                    };
                    *f = scaled as f32;
                }
            }
            Some(RopeScaling::Yarn(y)) => {
                // transformers' `_compute_yarn_parameters`, in its precisions:
                // the correction range in f64, the frequencies in f32.
                let d = dim as f64;
                let theta = self.rope_theta;
                let correction = |rotations: f64| {
                    d * (y.original_max_position_embeddings
                        / (rotations * 2.0 * std::f64::consts::PI))
                        .ln()
                        / (2.0 * theta.ln())
                };
                let (mut low, mut high) = (correction(y.beta_fast), correction(y.beta_slow));
                if y.truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
                if low == high {
                    high += 0.001;
                }
                let (low32, span32) = (low as f32, (high - low) as f32);
                let factor = y.factor as f32;
                for (i, f) in inv.iter_mut().enumerate() {
                    let pos_freq = base.powf((2 * i) as f32 / dim as f32);
                    let extrapolation = 1.0 / pos_freq;
                    let interpolation = 1.0 / (factor * pos_freq);
                    let ramp = ((i as f32 - low32) / span32).clamp(0.0, 1.0);
                    let keep = 1.0 - ramp;
                    *f = interpolation * (1.0 - keep) + extrapolation * keep;
                }
            }
        }
        inv
    }
}

/// The `config.json` fields every supported family shares, read once here;
/// `qwen2.rs` and `llama.rs` add their own fields beside it (`#[serde(flatten)]`).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct HfDecoderFields {
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
    /// transformers >= 5 keeps rope_theta (and any scaling) here.
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: Option<i64>,
}

fn default_eps() -> f64 {
    1e-6
}

fn default_theta() -> f64 {
    10000.0
}

impl HfDecoderFields {
    /// `rope_parameters.rope_theta` when present, else `rope_theta`.
    pub fn theta(&self) -> f64 {
        self.rope_parameters
            .as_ref()
            .and_then(|r| r.get("rope_theta"))
            .and_then(|t| t.as_f64())
            .unwrap_or(self.rope_theta)
    }

    /// The RoPE scaling of `rope_parameters` (transformers >= 5), else of
    /// the older `rope_scaling` field the family passes in.
    pub fn rope_scaling(
        &self,
        legacy: Option<&serde_json::Value>,
    ) -> Result<Option<RopeScaling>, String> {
        match (&self.rope_parameters, legacy) {
            (Some(p), _) => parse_rope_scaling(p, self.max_position_embeddings),
            (None, Some(s)) if !s.is_null() => parse_rope_scaling(s, self.max_position_embeddings),
            _ => Ok(None),
        }
    }

    /// The family-independent part of the decoder config; the caller sets
    /// biases and RoPE scaling.
    pub fn decoder_config(&self, default_max_positions: i64) -> DecoderConfig {
        DecoderConfig {
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
            rope_theta: self.theta(),
            rope_scaling: None,
            qkv_bias: false,
            o_bias: false,
            mlp_bias: false,
            qk_norm: false,
            tie_word_embeddings: self.tie_word_embeddings,
            max_position_embeddings: self
                .max_position_embeddings
                .unwrap_or(default_max_positions),
        }
    }
}

/// The key/value cache for one batch of sequences, owned by the caller and
/// allocated once per rollout (STYLE.md §2).
pub struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    /// `[B, capacity]` bool: which cached slots hold a real (non-pad) token.
    valid: Tensor,
    /// `[B]` i64: the position id the next real token of each sequence gets.
    next_pos: Tensor,
    len: i64,
    capacity: i64,
    /// No pad token has been written yet, so attention needs no mask.
    dense: bool,
}

impl KvCache {
    /// Allocate a cache for `batch` sequences of up to `capacity` tokens.
    pub fn new(cfg: &DecoderConfig, batch: i64, capacity: i64, kind: Kind, device: Device) -> Self {
        let shape = [batch, cfg.num_key_value_heads, capacity, cfg.head_dim];
        let layers = cfg.num_hidden_layers as usize;
        KvCache {
            k: (0..layers)
                .map(|_| Tensor::zeros(shape, (kind, device)))
                .collect(),
            v: (0..layers)
                .map(|_| Tensor::zeros(shape, (kind, device)))
                .collect(),
            valid: Tensor::zeros([batch, capacity], (Kind::Bool, device)),
            next_pos: Tensor::zeros([batch], (Kind::Int64, device)),
            len: 0,
            capacity,
            dense: true,
        }
    }

    /// Keep only the batch rows `rows` (an `[R]` i64 index tensor; a row may
    /// repeat, e.g. a prompt prefilled once for several samples), in that
    /// order: finished sequences of a generation batch stop costing compute.
    ///
    /// Fewer rows are moved inside the existing storage, filled slots only:
    /// a fresh cache would be written in full, empty slots too, and fault
    /// in new pages (a batch-32 cache of SmolLM2-135M is 350 MB).
    pub fn keep_rows(&mut self, rows: &Tensor) {
        let n = rows.size()[0];
        for t in self.k.iter_mut().chain(self.v.iter_mut()) {
            if n <= t.size()[0] && self.len > 0 {
                let picked = t.narrow(2, 0, self.len).index_select(0, rows);
                let kept = t.narrow(0, 0, n);
                kept.narrow(2, 0, self.len).copy_(&picked);
                *t = kept;
            } else {
                *t = t.index_select(0, rows);
            }
        }
        self.valid = self.valid.index_select(0, rows);
        self.next_pos = self.next_pos.index_select(0, rows);
    }

    /// A new cache of the batch rows `rows` (repeats allowed) with room
    /// for `capacity` slots (at least those filled); gradients flow back
    /// into this one.
    fn select(&self, rows: &Tensor, capacity: i64) -> KvCache {
        let capacity = capacity.max(self.len).min(self.capacity);
        let pick = |t: &Tensor| t.narrow(-2, 0, capacity).index_select(0, rows);
        KvCache {
            k: self.k.iter().map(pick).collect(),
            v: self.v.iter().map(pick).collect(),
            valid: self.valid.narrow(1, 0, capacity).index_select(0, rows),
            next_pos: self.next_pos.index_select(0, rows),
            len: self.len,
            capacity,
            dense: self.dense,
        }
    }

    /// Number of slots filled so far.
    pub fn len(&self) -> i64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> i64 {
        self.capacity
    }
}

/// `log p(targets)` under `logits`: `[.., V]` logits and `[..]` i64 ids
/// (e.g. `[B, T, V]` and `[B, T]`) give `[..]` f32 log-probabilities (`logits[:, t]` must already be the
/// prediction for `targets[:, t]`).
///
/// Computed in f32 whatever the logits' dtype: bf16 keeps 8 significant
/// bits (relative rounding 2⁻⁹), so a bf16 log-softmax puts a log-prob near
/// −20 off by ~0.04: the PPO ratio `exp(logp − old)` would then sit a few
/// percent away from 1 for identical policies, and Eq. 2's `log p` weights
/// would carry that noise into every gradient. The cast materialises an f32
/// copy of the logits (and autograd keeps the f32 log-softmax): `4·B·T·V`
/// bytes each, so callers with long sequences and large vocabularies call
/// this on chunks of `T`.
pub fn token_logprobs(logits: &Tensor, targets: &Tensor) -> Tensor {
    // At least fp32; a double-precision model (gradient checks) stays double.
    let kind = if logits.kind() == Kind::Double {
        Kind::Double
    } else {
        Kind::Float
    };
    logits
        .log_softmax(-1, kind)
        .gather(-1, &targets.unsqueeze(-1), false)
        .squeeze_dim(-1)
}

/// What one more forward pass costs, in padded token positions: a batch of
/// ragged sequences (prompts to prefill, completions to score) is split
/// into another length chunk only when that saves more padding than this.
const CHUNK_COST: usize = 128;

/// At most this many token positions (rows x padded width) per prefill
/// forward: bounds the attention's working set for long prompts, whose
/// masked attention otherwise holds `[rows, heads, width, width]` scores.
const PREFILL_TOKENS: usize = 8192;

/// Contiguous chunks `[lo, hi)` of `widths` (sorted widest first) that
/// minimise the padded positions (each chunk pads to its first width)
/// plus `cost` per chunk.
fn length_chunks(widths: &[usize], cost: usize) -> Vec<(usize, usize)> {
    let n = widths.len();
    // best[k]: the cheapest split of widths[..k]; from[k]: its last chunk's start.
    let mut best = vec![0usize; n + 1];
    let mut from = vec![0usize; n + 1];
    for k in 1..=n {
        best[k] = usize::MAX;
        for j in 0..k {
            let c = best[j] + (k - j) * widths[j] + cost;
            if c < best[k] {
                best[k] = c;
                from[k] = j;
            }
        }
    }
    let mut out = Vec::new();
    let mut k = n;
    while k > 0 {
        out.push((from[k], k));
        k = from[k];
    }
    out.reverse();
    out
}

/// The distinct sequences of `seqs` in first-seen order, and for each
/// sequence the index of its distinct copy: what lets a batch run a
/// prompt that several samples share only once.
pub fn distinct_rows<'s>(seqs: impl IntoIterator<Item = &'s [i64]>) -> (Vec<&'s [i64]>, Vec<i64>) {
    let mut distinct: Vec<&[i64]> = Vec::new();
    let mut rows = Vec::new();
    for s in seqs {
        let r = match distinct.iter().position(|d| *d == s) {
            Some(r) => r,
            None => {
                distinct.push(s);
                distinct.len() - 1
            }
        };
        rows.push(r as i64);
    }
    (distinct, rows)
}

/// `[m, L]` ids (pad `pad`) and validity of `prompts` left-padded to the
/// longest, so that every prompt ends in the last column.
pub fn left_padded(prompts: &[&[i64]], pad: i64, device: Device) -> (Tensor, Tensor) {
    let (m, l) = (
        prompts.len(),
        prompts.iter().map(|p| p.len()).max().unwrap_or(0),
    );
    let mut ids = vec![pad; m * l];
    let mut valid = vec![false; m * l];
    for (i, p) in prompts.iter().enumerate() {
        let off = i * l + (l - p.len());
        ids[off..off + p.len()].copy_from_slice(p);
        valid[off..off + p.len()].iter_mut().for_each(|v| *v = true);
    }
    let shape = [m as i64, l as i64];
    (
        Tensor::from_slice(&ids).view(shape).to_device(device),
        Tensor::from_slice(&valid).view(shape).to_device(device),
    )
}

/// Per-forward attention context shared by every layer.
struct AttnCtx {
    cos: Tensor,
    /// `[-sin, sin]` halves: see `apply_rope`.
    sin_signed: Tensor,
    /// `[B, 1, T, S]` bool, `None` when plain causal attention is exact.
    mask: Option<Tensor>,
    causal: bool,
    /// First cache slot this forward writes, when a cache is used.
    start: i64,
    /// Use the composite (math) attention, whose backward is itself
    /// differentiable: the fused CPU/CUDA kernels have no double backward,
    /// which second-order MAML needs.
    math: bool,
}

struct Attention {
    q_proj: LoraLinear,
    k_proj: LoraLinear,
    v_proj: LoraLinear,
    o_proj: LoraLinear,
    qkv: Fused,
    /// Qwen3's per-head RMSNorm weights for q and k, with the norm's eps.
    qk_norm: Option<(Tensor, Tensor, f64)>,
    n_heads: i64,
    n_kv: i64,
    head_dim: i64,
}

/// `x·cos + rotate_half(x)·sin`, with `rotate_half(x) = [-x₂, x₁]` written as
/// `roll(x, D/2)·[-sin₁, sin₂]`: the same products (negation is exact), in
/// three kernels instead of seven. `sin_signed` carries the sign.
fn apply_rope(x: &Tensor, cos: &Tensor, sin_signed: &Tensor) -> Tensor {
    if let Some(y) = crate::kernels::decode_ops::rope(x, cos, sin_signed) {
        return y;
    }
    let half = x.size()[3] / 2;
    x * cos + x.roll([half], [3]) * sin_signed
}

impl Attention {
    fn forward(
        &self,
        x: &Tensor,
        ctx: &AttnCtx,
        cache: Option<(&mut Tensor, &mut Tensor)>,
        train: bool,
    ) -> Tensor {
        let (b, t, _) = x.size3().expect("hidden states are [B, T, H]");
        let mut qkv = self
            .qkv
            .forward_t(&[&self.q_proj, &self.k_proj, &self.v_proj], x, train)
            .into_iter();
        let (q, k, v) = (
            qkv.next().expect("q"),
            qkv.next().expect("k"),
            qkv.next().expect("v"),
        );
        let mut q = q.view([b, t, self.n_heads, self.head_dim]);
        let mut k = k.view([b, t, self.n_kv, self.head_dim]);
        if let Some((qn, kn, eps)) = &self.qk_norm {
            q = rms_norm(&q, qn, *eps);
            k = rms_norm(&k, kn, *eps);
        }
        let q = q.transpose(1, 2);
        let k = k.transpose(1, 2);
        let v = v.view([b, t, self.n_kv, self.head_dim]).transpose(1, 2);
        let q = apply_rope(&q, &ctx.cos, &ctx.sin_signed);
        let k = apply_rope(&k, &ctx.cos, &ctx.sin_signed);
        let (k, v) = match cache {
            Some((kc, vc)) => {
                kc.narrow(2, ctx.start, t).copy_(&k);
                vc.narrow(2, ctx.start, t).copy_(&v);
                (
                    kc.narrow(2, 0, ctx.start + t),
                    vc.narrow(2, 0, ctx.start + t),
                )
            }
            None => (k, v),
        };
        let mut gqa = self.n_kv != self.n_heads;
        // One new token per sequence with grouped kv heads: the query heads
        // that share a kv head become the rows of one query against it, so
        // the attention kernels run one small matmul per kv head instead of
        // a matrix-vector product per query head, each rereading the cache
        // (12% of a batch-32 decode's time went to those). Same products;
        // the mask (`[B, 1, 1, S]` at most) broadcasts over the rows.
        let grouped = gqa && t == 1 && !ctx.causal;
        let q = if grouped {
            gqa = false;
            q.reshape([b, self.n_kv, self.n_heads / self.n_kv, self.head_dim])
        } else {
            q
        };
        let fast = grouped && !ctx.math;
        let y = if let Some(y) = fast
            .then(|| crate::kernels::decode_ops::attention(&q, &k, &v, ctx.mask.as_ref()))
            .flatten()
        {
            y
        } else if ctx.math {
            // The math kernel takes an additive mask; a boolean one is
            // converted by the dispatching op only.
            let additive = ctx.mask.as_ref().map(|m| {
                Tensor::zeros(m.size(), (q.kind(), q.device()))
                    .masked_fill(&m.logical_not(), f64::NEG_INFINITY)
            });
            Tensor::internal_scaled_dot_product_attention_math(
                &q,
                &k,
                &v,
                additive.as_ref(),
                0.0,
                ctx.causal,
                None::<&Tensor>,
                None::<f64>,
                gqa,
            )
            .0
        } else {
            Tensor::scaled_dot_product_attention(
                &q,
                &k,
                &v,
                ctx.mask.as_ref(),
                0.0,
                ctx.causal,
                None::<f64>,
                gqa,
            )
        };
        let y = if grouped {
            y.reshape([b, t, self.n_heads * self.head_dim])
        } else {
            y.transpose(1, 2)
                .reshape([b, t, self.n_heads * self.head_dim])
        };
        self.o_proj.forward_t(&y, train)
    }
}

struct Mlp {
    gate_proj: LoraLinear,
    up_proj: LoraLinear,
    down_proj: LoraLinear,
    gate_up: Fused,
}

impl Mlp {
    fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        let mut gu = self
            .gate_up
            .forward_t(&[&self.gate_proj, &self.up_proj], x, train)
            .into_iter();
        let (g, u) = (gu.next().expect("gate"), gu.next().expect("up"));
        let h = crate::kernels::decode_ops::silu_mul(&g, &u).unwrap_or_else(|| g.silu() * u);
        self.down_proj.forward_t(&h, train)
    }
}

struct Block {
    input_layernorm: Tensor,
    post_attention_layernorm: Tensor,
    self_attn: Attention,
    mlp: Mlp,
}

/// RMSNorm as the reference computes it: statistics in fp32, the weight applied
/// after casting back to the activation dtype.
fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
    let kind = x.kind();
    if let Some(y) = crate::kernels::decode_ops::rms_norm(x, weight, eps) {
        return y;
    }
    if kind == Kind::Float || kind == Kind::Double {
        // libtorch's fused kernel is bit-identical to the composite in fp32
        // and one dispatch instead of eight (fp64, for gradient checks, stays
        // fp64); in bf16/fp16 it rounds once
        // where the reference rounds twice, so those keep the composite.
        return x.rms_norm([x.size()[x.dim() - 1]], Some(weight), eps);
    }
    let xf = x.to_kind(Kind::Float);
    let var = xf.square().mean_dim(-1, true, Kind::Float);
    let y = xf * (var + eps).rsqrt();
    weight * y.to_kind(kind)
}

/// The Qwen2 / Llama decoder. Build with [`Decoder::new`] under a VarStore
/// root, then load weights into the store (`weights::load_into`).
pub struct Decoder {
    pub config: DecoderConfig,
    embed_tokens: Tensor,
    layers: Vec<Block>,
    norm: Tensor,
    lm_head: Option<Tensor>,
    inv_freq: Tensor,
    math_attention: std::cell::Cell<bool>,
    fused_logprobs: std::cell::Cell<bool>,
}

/// Which positions of a forward pass need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsFor {
    /// Every position (training, scoring).
    All,
    /// Only the last position of each row (generation steps).
    Last,
    /// Positions `start..T` (training on completions: the prompt positions
    /// before the shortest prompt's end need no logits).
    From(i64),
    /// No logits: the final normalised hidden states `[B, T, H]` of every
    /// position (embeddings of the policy).
    Hidden,
}

impl Decoder {
    /// Create the parameters (zero-initialised) under `root` with HF names.
    pub fn new(root: &Path, config: DecoderConfig) -> Result<Self, ModelError> {
        config
            .check()
            .map_err(|e| ModelError::Invalid(format!("model config: {e}")))?;
        let c = &config;
        let m = root / "model";
        let embed_tokens = (&m / "embed_tokens").zeros("weight", &[c.vocab_size, c.hidden_size]);
        let q_out = c.num_attention_heads * c.head_dim;
        let kv_out = c.num_key_value_heads * c.head_dim;
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let p = &m / "layers" / i;
                let a = &p / "self_attn";
                let f = &p / "mlp";
                let h = c.hidden_size;
                Block {
                    input_layernorm: (&p / "input_layernorm").ones("weight", &[h]),
                    post_attention_layernorm: (&p / "post_attention_layernorm")
                        .ones("weight", &[h]),
                    self_attn: Attention {
                        q_proj: LoraLinear::new(&a / "q_proj", h, q_out, c.qkv_bias),
                        k_proj: LoraLinear::new(&a / "k_proj", h, kv_out, c.qkv_bias),
                        v_proj: LoraLinear::new(&a / "v_proj", h, kv_out, c.qkv_bias),
                        o_proj: LoraLinear::new(&a / "o_proj", q_out, h, c.o_bias),
                        qkv: Fused::default(),
                        qk_norm: c.qk_norm.then(|| {
                            (
                                (&a / "q_norm").ones("weight", &[c.head_dim]),
                                (&a / "k_norm").ones("weight", &[c.head_dim]),
                                c.rms_norm_eps,
                            )
                        }),
                        n_heads: c.num_attention_heads,
                        n_kv: c.num_key_value_heads,
                        head_dim: c.head_dim,
                    },
                    mlp: Mlp {
                        gate_proj: LoraLinear::new(
                            &f / "gate_proj",
                            h,
                            c.intermediate_size,
                            c.mlp_bias,
                        ),
                        up_proj: LoraLinear::new(
                            &f / "up_proj",
                            h,
                            c.intermediate_size,
                            c.mlp_bias,
                        ),
                        down_proj: LoraLinear::new(
                            &f / "down_proj",
                            c.intermediate_size,
                            h,
                            c.mlp_bias,
                        ),
                        gate_up: Fused::default(),
                    },
                }
            })
            .collect();
        let norm = (&m / "norm").ones("weight", &[c.hidden_size]);
        let lm_head = (!c.tie_word_embeddings)
            .then(|| (root / "lm_head").zeros("weight", &[c.vocab_size, c.hidden_size]));
        let inv_freq = Tensor::from_slice(&config.inv_freq()).to_device(root.device());
        Ok(Decoder {
            config,
            embed_tokens,
            layers,
            norm,
            lm_head,
            inv_freq,
            math_attention: std::cell::Cell::new(false),
            fused_logprobs: std::cell::Cell::new(false),
        })
    }

    /// Every LoRA-capable projection, by HF module name (`q_proj`, ...), for
    /// attaching, merging and exporting adapters.
    pub fn projections_mut(&mut self) -> Vec<(String, &mut LoraLinear)> {
        let mut out = Vec::new();
        for (i, l) in self.layers.iter_mut().enumerate() {
            let pre = format!("model.layers.{i}");
            let a = &mut l.self_attn;
            let f = &mut l.mlp;
            for (name, lin) in [
                ("self_attn.q_proj", &mut a.q_proj),
                ("self_attn.k_proj", &mut a.k_proj),
                ("self_attn.v_proj", &mut a.v_proj),
                ("self_attn.o_proj", &mut a.o_proj),
                ("mlp.gate_proj", &mut f.gate_proj),
                ("mlp.up_proj", &mut f.up_proj),
                ("mlp.down_proj", &mut f.down_proj),
            ] {
                out.push((format!("{pre}.{name}"), lin));
            }
        }
        out
    }

    /// Read-only view of the projections, same order and names as `projections_mut`.
    pub fn projections(&self) -> Vec<(String, &LoraLinear)> {
        let mut out = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            let pre = format!("model.layers.{i}");
            let a = &l.self_attn;
            let f = &l.mlp;
            for (name, lin) in [
                ("self_attn.q_proj", &a.q_proj),
                ("self_attn.k_proj", &a.k_proj),
                ("self_attn.v_proj", &a.v_proj),
                ("self_attn.o_proj", &a.o_proj),
                ("mlp.gate_proj", &f.gate_proj),
                ("mlp.up_proj", &f.up_proj),
                ("mlp.down_proj", &f.down_proj),
            ] {
                out.push((format!("{pre}.{name}"), lin));
            }
        }
        out
    }

    /// Position ids `[B, T]` for new tokens whose validity is `valid` `[B, T]`,
    /// continuing from `start_pos` `[B]`.
    fn positions(valid: &Tensor, start_pos: &Tensor) -> Tensor {
        let run = valid.to_kind(Kind::Int64).cumsum(1, Kind::Int64) - 1;
        run.clamp_min(0) + start_pos.unsqueeze(1)
    }

    /// `cos` and sign-folded `sin` tables, `[B, 1, T, D]` in the activation
    /// dtype, computed in fp32 like the reference.
    fn rope_tables(&self, pos: &Tensor, kind: Kind) -> (Tensor, Tensor) {
        let freqs = pos.to_kind(Kind::Float).unsqueeze(-1) * self.inv_freq.view([1, 1, -1]);
        let (mut c, mut s) = (freqs.cos(), freqs.sin());
        let scale = self.config.rope_attention_scale();
        if scale != 1.0 {
            c *= scale;
            s *= scale;
        }
        let cos = Tensor::cat(&[&c, &c], -1).unsqueeze(1);
        let sin_signed = Tensor::cat(&[&s.neg(), &s], -1).unsqueeze(1);
        (cos.to_kind(kind), sin_signed.to_kind(kind))
    }

    /// Run the decoder on `input_ids` `[B, T]` (i64). `valid` `[B, T]` (bool)
    /// marks real tokens; `None` means all are real. With a cache, the new keys
    /// and values are appended to it and attention sees everything cached.
    /// Returns logits `[B, T, V]` (or `[B, 1, V]` for [`LogitsFor::Last`]; hidden states `[B, T, H]` for [`LogitsFor::Hidden`]) in
    /// the model's dtype.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        valid: Option<&Tensor>,
        cache: Option<&mut KvCache>,
        logits_for: LogitsFor,
        train: bool,
    ) -> Result<Tensor, ModelError> {
        let (b, t) = input_ids
            .size2()
            .map_err(|_| ModelError::Invalid("input_ids must be [batch, seq]".into()))?;
        let device = self.embed_tokens.device();
        let kind = self.embed_tokens.kind();
        let all_valid;
        // Only given masks need the (host-synchronising) check for padding.
        let (valid, dense_now) = match valid {
            Some(v) => (v, v.all().int64_value(&[]) != 0),
            None => {
                all_valid = Tensor::ones([b, t], (Kind::Bool, device));
                (&all_valid, true)
            }
        };

        let (ctx, cache) = match cache {
            Some(cache) => {
                if cache.len + t > cache.capacity {
                    return Err(ModelError::Invalid(format!(
                        "KV cache overflow: {} cached + {t} new > capacity {}",
                        cache.len, cache.capacity
                    )));
                }
                if cache.k[0].size()[0] != b {
                    return Err(ModelError::Invalid(format!(
                        "KV cache was allocated for batch {}, got batch {b}",
                        cache.k[0].size()[0]
                    )));
                }
                let start = cache.len;
                let pos = Self::positions(valid, &cache.next_pos);
                cache.valid.narrow(1, start, t).copy_(valid);
                let added = valid
                    .to_kind(Kind::Int64)
                    .sum_dim_intlist(1, false, Kind::Int64);
                let _ = cache.next_pos.g_add_(&added);
                cache.dense &= dense_now;
                let (cos, sin) = self.rope_tables(&pos, kind);
                let total = start + t;
                let (mask, causal) = if cache.dense {
                    // Without padding: a single new token sees everything; a
                    // prompt from an empty cache is plain causal.
                    if t == 1 {
                        (None, false)
                    } else if start == 0 {
                        (None, true)
                    } else {
                        (
                            Some(Self::mask(&cache.valid.narrow(1, 0, total), start, t)),
                            false,
                        )
                    }
                } else {
                    (
                        Some(Self::mask(&cache.valid.narrow(1, 0, total), start, t)),
                        false,
                    )
                };
                (
                    AttnCtx {
                        cos,
                        sin_signed: sin,
                        mask,
                        causal,
                        start,
                        math: self.math_attention.get(),
                    },
                    Some(cache),
                )
            }
            None => {
                let zeros = Tensor::zeros([b], (Kind::Int64, device));
                let pos = Self::positions(valid, &zeros);
                let (cos, sin) = self.rope_tables(&pos, kind);
                let (mask, causal) = if dense_now {
                    (None, true)
                } else {
                    (Some(Self::mask(valid, 0, t)), false)
                };
                (
                    AttnCtx {
                        cos,
                        sin_signed: sin,
                        mask,
                        causal,
                        start: 0,
                        math: self.math_attention.get(),
                    },
                    None,
                )
            }
        };

        let mut h = Tensor::embedding(&self.embed_tokens, input_ids, -1, false, false);
        let eps = self.config.rms_norm_eps;
        match cache {
            Some(cache) => {
                for (i, layer) in self.layers.iter().enumerate() {
                    let (kc, vc) = (&mut cache.k[i], &mut cache.v[i]);
                    h = layer.forward(&h, &ctx, Some((kc, vc)), eps, train);
                }
                cache.len += t;
            }
            None => {
                for layer in &self.layers {
                    h = layer.forward(&h, &ctx, None, eps, train);
                }
            }
        }
        let h = match logits_for {
            LogitsFor::All | LogitsFor::Hidden => h,
            LogitsFor::Last => h.narrow(1, t - 1, 1),
            LogitsFor::From(start) => {
                let start = start.clamp(0, t - 1);
                h.narrow(1, start, t - start)
            }
        };
        let h = rms_norm(&h, &self.norm, eps);
        if logits_for == LogitsFor::Hidden {
            return Ok(h);
        }
        let (b, t, d) = h.size3().expect("hidden states are [B, T, H]");
        Ok(self.project(&h.reshape([b * t, d])).reshape([b, t, -1]))
    }

    /// Logits `[N, V]` of final normalised hidden states `[N, H]`.
    fn project(&self, h: &Tensor) -> Tensor {
        let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        if let Some(y) = crate::kernels::gemv::linear(h, head, None)
            .or_else(|| crate::kernels::packed::linear(h, head, None))
        {
            return y;
        }
        // `W · hᵀ` rather than `h · Wᵀ`: for the few rows of a decode step the
        // BLAS kernels run this orientation of the vocab projection (the
        // largest matmul of a small model) markedly faster; same products.
        head.mm(&h.transpose(0, 1)).transpose(0, 1)
    }

    /// `[B, 1, T, S]` bool attention mask for `t` new rows starting at slot
    /// `start`, over key validity `key_valid` `[B, S]`. Each row also sees its
    /// own slot so a pad row never has an empty softmax (NaN).
    fn mask(key_valid: &Tensor, start: i64, t: i64) -> Tensor {
        let s = key_valid.size()[1];
        let device = key_valid.device();
        let q_idx = Tensor::arange_start(start, start + t, (Kind::Int64, device)).view([t, 1]);
        let k_idx = Tensor::arange(s, (Kind::Int64, device)).view([1, s]);
        let causal = k_idx.le_tensor(&q_idx); // [T, S]
        let diag = k_idx.eq_tensor(&q_idx);
        let m = causal.unsqueeze(0).logical_and(&key_valid.unsqueeze(1)); // [B, T, S]
        m.logical_or(&diag.unsqueeze(0)).unsqueeze(1)
    }

    pub fn device(&self) -> Device {
        self.embed_tokens.device()
    }

    /// Run `prompts` into a fresh cache with room for `capacity` slots and
    /// return it with the logits `[m, V]` at each prompt's last token.
    ///
    /// The cache is laid out exactly as one left-padded forward would leave
    /// it (every prompt ends in slot `L - 1`, `L` the longest), but the
    /// prompts run in chunks of similar length, at most [`PREFILL_TOKENS`]
    /// positions each: one forward pads every prompt to the longest and its
    /// masked attention grows with the square of that width: 40 ragged
    /// repair-style prompts (156..1421 tokens) took 2.8x as long in one
    /// padded forward as in these chunks (CPU). Same values up to float
    /// rounding; gradients flow back when `train`.
    pub fn prefill(
        &self,
        prompts: &[&[i64]],
        pad: i64,
        capacity: i64,
        train: bool,
    ) -> Result<(KvCache, Tensor), ModelError> {
        self.prefill_chunked(prompts, pad, capacity, train, CHUNK_COST, PREFILL_TOKENS)
    }

    fn prefill_chunked(
        &self,
        prompts: &[&[i64]],
        pad: i64,
        capacity: i64,
        train: bool,
        chunk_cost: usize,
        max_tokens: usize,
    ) -> Result<(KvCache, Tensor), ModelError> {
        let device = self.device();
        let m = prompts.len();
        if m == 0 {
            return Err(ModelError::Invalid(
                "prefill needs at least one prompt".into(),
            ));
        }
        if let Some(i) = prompts.iter().position(|p| p.is_empty()) {
            return Err(ModelError::Invalid(format!(
                "prompt {i} is empty: it has no last token to predict from"
            )));
        }
        let l = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
        if capacity < l as i64 {
            return Err(ModelError::Invalid(format!(
                "KV cache overflow: a {l}-token prompt > capacity {capacity}"
            )));
        }
        let mut order: Vec<usize> = (0..m).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(prompts[i].len()));
        let widths: Vec<usize> = order.iter().map(|&i| prompts[i].len()).collect();
        let mut pieces: Vec<(usize, usize)> = Vec::new();
        for (lo, hi) in length_chunks(&widths, chunk_cost) {
            let rows = (max_tokens / widths[lo]).max(1);
            pieces.extend((lo..hi).step_by(rows).map(|a| (a, (a + rows).min(hi))));
        }
        let layers = self.layers.len();
        let mut ks: Vec<Vec<Tensor>> = (0..layers).map(|_| Vec::new()).collect();
        let mut vs: Vec<Vec<Tensor>> = (0..layers).map(|_| Vec::new()).collect();
        let mut last = Vec::with_capacity(pieces.len());
        for (lo, hi) in pieces {
            let rows: Vec<&[i64]> = order[lo..hi].iter().map(|&i| prompts[i]).collect();
            let (ids, valid) = left_padded(&rows, pad, device);
            let w = widths[lo] as i64;
            let mut c = KvCache::new(&self.config, rows.len() as i64, w, self.kind(), device);
            let logits = self.forward(&ids, Some(&valid), Some(&mut c), LogitsFor::Last, train)?;
            last.push(logits.squeeze_dim(1));
            // Shift this chunk's slots right so its prompts end in slot L - 1.
            let shift = [0, 0, l as i64 - w, capacity - l as i64];
            for (i, (k, v)) in c.k.iter().zip(&c.v).enumerate() {
                ks[i].push(k.constant_pad_nd(shift));
                vs[i].push(v.constant_pad_nd(shift));
            }
        }
        let mut back = vec![0i64; m];
        for (sorted, &i) in order.iter().enumerate() {
            back[i] = sorted as i64;
        }
        let back = Tensor::from_slice(&back).to_device(device);
        let unsort = |parts: &[Tensor]| Tensor::cat(parts, 0).index_select(0, &back);
        let (_, valid) = left_padded(prompts, pad, device);
        let lens: Vec<i64> = prompts.iter().map(|p| p.len() as i64).collect();
        let cache = KvCache {
            k: ks.iter().map(|p| unsort(p)).collect(),
            v: vs.iter().map(|p| unsort(p)).collect(),
            valid: valid.constant_pad_nd([0, capacity - l as i64]),
            next_pos: Tensor::from_slice(&lens).to_device(device),
            len: l as i64,
            capacity,
            dense: prompts.iter().all(|p| p.len() == l),
        };
        Ok((cache, unsort(&last)))
    }

    /// Log-probabilities `[b, L]` (fp32, or fp64 for an fp64 model) of
    /// each completion's tokens given its prompt: column `j` of row `i` is
    /// `log p(completions[i][j] | prompt, completions[i][..j])`, 0 past the
    /// completion's end. Row `i`'s prompt is `prompts[rows[i]]`.
    ///
    /// Each distinct prompt runs through the model once and its keys and
    /// values are copied to the rows that share it (gradients from every
    /// row flow back into the one prefix pass); the completions then run in
    /// chunks of similar length, so short ones are not padded to the
    /// longest; and the vocabulary projection is computed only where a
    /// token is scored. The same values as a full forward over each prompt
    /// and its completion, up to float rounding, at a fraction of the cost
    /// when G samples share a prompt (GRPO groups).
    pub fn shared_prefix_logprobs(
        &self,
        prompts: &[&[i64]],
        rows: &[i64],
        completions: &[&[i64]],
        train: bool,
    ) -> Result<Tensor, ModelError> {
        self.shared_prefix_logprobs_chunked(prompts, rows, completions, train, CHUNK_COST)
    }

    fn shared_prefix_logprobs_chunked(
        &self,
        prompts: &[&[i64]],
        rows: &[i64],
        completions: &[&[i64]],
        train: bool,
        chunk_cost: usize,
    ) -> Result<Tensor, ModelError> {
        let device = self.device();
        let (m, b) = (prompts.len() as i64, completions.len());
        if rows.len() != b || rows.iter().any(|&r| r < 0 || r >= m) {
            return Err(ModelError::Invalid(format!(
                "shared-prefix scoring: {} rows for {b} completions over {m} prompts",
                rows.len()
            )));
        }
        let l = completions
            .iter()
            .map(|c| c.len())
            .max()
            .unwrap_or(0)
            .max(1);
        let lp = prompts.iter().map(|p| p.len()).max().unwrap_or(0) as i64;
        let (cache, last) = self.prefill_chunked(
            prompts,
            0,
            lp + l as i64 - 1,
            train,
            chunk_cost,
            PREFILL_TOKENS,
        )?;

        let mut values: Vec<Tensor> = Vec::new();
        let mut dest: Vec<i64> = Vec::new();
        let starting: Vec<usize> = (0..b).filter(|&i| !completions[i].is_empty()).collect();
        if !starting.is_empty() {
            let src: Vec<i64> = starting.iter().map(|&i| rows[i]).collect();
            let tok: Vec<i64> = starting.iter().map(|&i| completions[i][0]).collect();
            let src = Tensor::from_slice(&src).to_device(device);
            let tok = Tensor::from_slice(&tok).to_device(device);
            values.push(token_logprobs(&last.index_select(0, &src), &tok));
            dest.extend(starting.iter().map(|&i| (i * l) as i64));
        }
        // Rows with a second token, longest first, in chunks of similar length.
        let mut long: Vec<usize> = (0..b).filter(|&i| completions[i].len() >= 2).collect();
        long.sort_by_key(|&i| std::cmp::Reverse(completions[i].len()));
        // A completion's last token predicts nothing, so it pads to len - 1.
        let widths: Vec<usize> = long.iter().map(|&i| completions[i].len() - 1).collect();
        for (lo, hi) in length_chunks(&widths, chunk_cost) {
            let chunk = &long[lo..hi];
            let t = completions[chunk[0]].len() - 1;
            let bc = chunk.len();
            let src: Vec<i64> = chunk.iter().map(|&i| rows[i]).collect();
            let mut c = cache.select(&Tensor::from_slice(&src).to_device(device), lp + t as i64);
            // Tokens 0..t of each completion; each predicts the next one.
            let mut ids = vec![0i64; bc * t];
            let mut valid = vec![false; bc * t];
            let (mut sel, mut tgt) = (Vec::new(), Vec::new());
            for (r, &i) in chunk.iter().enumerate() {
                let comp = completions[i];
                let n = comp.len().min(t);
                ids[r * t..r * t + n].copy_from_slice(&comp[..n]);
                valid[r * t..r * t + n].iter_mut().for_each(|v| *v = true);
                for j in 0..comp.len() - 1 {
                    sel.push((r * t + j) as i64);
                    tgt.push(comp[j + 1]);
                    dest.push((i * l + j + 1) as i64);
                }
            }
            let (bc, t) = (bc as i64, t as i64);
            let ids = Tensor::from_slice(&ids).view([bc, t]).to_device(device);
            let valid = Tensor::from_slice(&valid).view([bc, t]).to_device(device);
            let h = self.forward(&ids, Some(&valid), Some(&mut c), LogitsFor::Hidden, train)?;
            let d = h.size()[2];
            let sel = Tensor::from_slice(&sel).to_device(device);
            let tgt = Tensor::from_slice(&tgt).to_device(device);
            let hs = h.reshape([bc * t, d]).index_select(0, &sel);
            values.push(self.score_hidden(&hs, &tgt)?);
        }
        // token_logprobs' kind (f32, or f64 for an f64 model).
        let out_kind = values.first().map_or(Kind::Float, Tensor::kind);
        let out = Tensor::zeros([(b * l) as i64], (out_kind, device));
        let out = if values.is_empty() {
            out
        } else {
            let dest = Tensor::from_slice(&dest).to_device(device);
            out.index_add(0, &dest, &Tensor::cat(&values, 0))
        };
        Ok(out.view([b as i64, l as i64]))
    }

    /// `log p(targets)` `[N]` of final normalised hidden states `[N, H]`:
    /// through [`crate::kernels::fused`] when it is switched on and applies
    /// (a frozen output projection, first-order gradients), else by the
    /// plain projection and [`token_logprobs`]. The same values up to float
    /// rounding either way.
    pub fn score_hidden(&self, hs: &Tensor, targets: &Tensor) -> Result<Tensor, ModelError> {
        let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        if self.fused_logprobs.get() && !self.math_attention.get() && !head.requires_grad() {
            use crate::kernels::{fused, KernelError};
            let backend = fused::Backend::for_tensor(hs);
            let out = match fused::token_logprobs(hs, head, targets, backend, None) {
                // No NVRTC or driver here: the same chunked computation in libtorch.
                Err(KernelError::Missing(why)) if backend == fused::Backend::Kernel => {
                    static WARNED: std::sync::Once = std::sync::Once::new();
                    WARNED.call_once(|| {
                        eprintln!("falcon: the fused log-prob kernel is unavailable ({why}); using its libtorch path")
                    });
                    fused::token_logprobs(hs, head, targets, fused::Backend::Reference, None)
                }
                other => other,
            };
            return out
                .map(|(lp, _)| lp)
                .map_err(|e| ModelError::Invalid(format!("fused log-probs: {e}")));
        }
        Ok(token_logprobs(&self.project(hs), targets))
    }

    /// `log p` of `ids[:, start+1 .. start+1+w]` `[B, w]` given the tokens
    /// before each, from one forward pass over `ids` `[B, T]`
    /// ([`Decoder::score_hidden`] at the scored positions).
    pub fn token_logprobs_from(
        &self,
        ids: &Tensor,
        valid: &Tensor,
        start: i64,
        w: i64,
        train: bool,
    ) -> Result<Tensor, ModelError> {
        let h = self.forward(ids, Some(valid), None, LogitsFor::Hidden, train)?;
        let (b, d) = (h.size()[0], h.size()[2]);
        let hs = h.narrow(1, start, w).reshape([b * w, d]);
        let targets = ids.narrow(1, start + 1, w).reshape([b * w]);
        Ok(self.score_hidden(&hs, &targets)?.view([b, w]))
    }

    /// Score through the fused log-prob path ([`crate::kernels::fused`])
    /// where it applies: a frozen output projection (LoRA) and first-order
    /// gradients. Off by default; the trainer switches it on from
    /// `[train] fused_logprobs`.
    pub fn set_fused_logprobs(&self, on: bool) {
        self.fused_logprobs.set(on);
    }

    /// Compute attention with the composite kernel, whose backward can be
    /// differentiated again (second-order MAML); the fused kernels are
    /// faster but first-order only. Same outputs up to rounding.
    pub fn set_math_attention(&self, on: bool) {
        self.math_attention.set(on);
    }

    pub fn kind(&self) -> Kind {
        self.embed_tokens.kind()
    }
}

impl Block {
    fn forward(
        &self,
        x: &Tensor,
        ctx: &AttnCtx,
        cache: Option<(&mut Tensor, &mut Tensor)>,
        eps: f64,
        train: bool,
    ) -> Tensor {
        let h = rms_norm(x, &self.input_layernorm, eps);
        let x = x + self.self_attn.forward(&h, ctx, cache, train);
        let h = rms_norm(&x, &self.post_attention_layernorm, eps);
        &x + self.mlp.forward(&h, train)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn::VarStore;

    #[test]
    fn rope_scaling_types_are_read_or_refused_by_name() {
        let j = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        assert_eq!(
            parse_rope_scaling(&j(r#"{"rope_type": "default"}"#), None),
            Ok(None)
        );
        assert_eq!(
            parse_rope_scaling(&j(r#"{"type": "linear", "factor": 2.0}"#), None),
            Ok(Some(RopeScaling::Linear { factor: 2.0 }))
        );
        // YaRN without a factor takes max / original positions, and the
        // attention factor of the paper.
        let Ok(Some(RopeScaling::Yarn(y))) = parse_rope_scaling(
            &j(r#"{"rope_type": "yarn", "original_max_position_embeddings": 32768}"#),
            Some(131072),
        ) else {
            panic!("yarn")
        };
        assert_eq!(
            (y.factor, y.beta_fast, y.beta_slow, y.truncate),
            (4.0, 32.0, 1.0, true)
        );
        assert!((y.attention_factor - (1.0 + 0.1 * 4f64.ln())).abs() < 1e-12);
        let e =
            parse_rope_scaling(&j(r#"{"rope_type": "dynamic", "factor": 2.0}"#), None).unwrap_err();
        assert!(e.contains("`dynamic`") && e.contains("yarn"), "{e}");
        let e = parse_rope_scaling(&j(r#"{"rope_type": "linear"}"#), None).unwrap_err();
        assert!(e.contains("`factor`"), "{e}");
        let e = parse_rope_scaling(&j(r#"{"partial_rotary_factor": 0.5}"#), None).unwrap_err();
        assert!(e.contains("partial_rotary_factor"), "{e}");
    }

    fn tiny() -> (VarStore, Decoder) {
        let cfg = DecoderConfig {
            vocab_size: 40,
            hidden_size: 32,
            intermediate_size: 48,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 8,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_scaling: None,
            qkv_bias: false,
            o_bias: false,
            mlp_bias: false,
            qk_norm: false,
            tie_word_embeddings: true,
            max_position_embeddings: 64,
        };
        let vs = VarStore::new(Device::Cpu);
        let d = Decoder::new(&vs.root(), cfg).unwrap();
        crate::model::generate::randomize_in_name_order(&vs, 3, 0.3);
        (vs, d)
    }

    /// Dropping rows from a filled cache (moved inside its storage) leaves
    /// the kept rows' next logits what they were in the full batch, in the
    /// order asked for; a repeated row still gets a cache of its own.
    #[test]
    fn kept_rows_decode_as_they_did_in_the_full_batch() {
        let (_vs, d) = tiny();
        let ids = Tensor::from_slice(&[1i64, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]).view([3, 4]);
        let next = Tensor::from_slice(&[13i64, 14, 15]).view([3, 1]);
        tch::no_grad(|| {
            let mut full = KvCache::new(&d.config, 3, 8, Kind::Float, Device::Cpu);
            let _ = d
                .forward(&ids, None, Some(&mut full), LogitsFor::Last, false)
                .unwrap();
            let mut kept = KvCache::new(&d.config, 3, 8, Kind::Float, Device::Cpu);
            let _ = d
                .forward(&ids, None, Some(&mut kept), LogitsFor::Last, false)
                .unwrap();
            let want = d
                .forward(&next, None, Some(&mut full), LogitsFor::Last, false)
                .unwrap();
            kept.keep_rows(&Tensor::from_slice(&[2i64, 0]));
            let got = d
                .forward(
                    &next.index_select(0, &Tensor::from_slice(&[2i64, 0])),
                    None,
                    Some(&mut kept),
                    LogitsFor::Last,
                    false,
                )
                .unwrap();
            let diff = (got - want.index_select(0, &Tensor::from_slice(&[2i64, 0])))
                .abs()
                .max()
                .double_value(&[]);
            assert!(diff <= 1e-6, "kept rows decode differently: {diff}");
            assert_eq!(kept.k[0].size()[0], 2);

            let mut grown = KvCache::new(&d.config, 1, 8, Kind::Float, Device::Cpu);
            let _ = d
                .forward(
                    &ids.narrow(0, 0, 1),
                    None,
                    Some(&mut grown),
                    LogitsFor::Last,
                    false,
                )
                .unwrap();
            grown.keep_rows(&Tensor::from_slice(&[0i64, 0]));
            let two = d
                .forward(
                    &Tensor::from_slice(&[13i64, 13]).view([2, 1]),
                    None,
                    Some(&mut grown),
                    LogitsFor::Last,
                    false,
                )
                .unwrap();
            let diff = (two.get(0) - two.get(1)).abs().max().double_value(&[]);
            assert!(diff == 0.0, "a repeated row decodes like its original");
            let _ = grown.k[0].get(1).fill_(0.0);
            assert!(
                grown.k[0].get(0).abs().sum(Kind::Float).double_value(&[]) > 0.0,
                "repeated rows own their cache"
            );
        });
    }

    /// Every completion token's log-prob (and the gradients through them)
    /// equals that of a full forward over its own prompt + completion, with
    /// prompts of different lengths, an empty and a one-token completion
    /// among them, in one length chunk or one chunk per length.
    #[test]
    fn shared_prefix_logprobs_equal_full_forwards() {
        let (vs, d) = tiny();
        let prompts: [&[i64]; 2] = [&[1, 2, 3], &[4, 5]];
        let rows = [0i64, 0, 1, 1, 0, 1];
        let comps: [&[i64]; 6] = [
            &[6, 7, 8],
            &[9],
            &[10, 11],
            &[],
            &[12, 13, 14, 15],
            &[16, 17, 18, 19],
        ];
        let mut full = Vec::new();
        for (i, c) in comps.iter().enumerate() {
            let p = prompts[rows[i] as usize];
            let ids: Vec<i64> = p.iter().chain(c.iter()).copied().collect();
            let t = ids.len() as i64;
            let ids = Tensor::from_slice(&ids).view([1, t]);
            let logits = d.forward(&ids, None, None, LogitsFor::All, true).unwrap();
            let lp = logits.get(0).log_softmax(-1, Kind::Float);
            let mut row = Vec::new();
            for j in 0..4i64 {
                row.push(if (j as usize) < c.len() {
                    lp.get(p.len() as i64 - 1 + j).get(c[j as usize])
                } else {
                    Tensor::zeros([], (Kind::Float, Device::Cpu))
                });
            }
            full.push(Tensor::stack(&row, 0));
        }
        let full = Tensor::stack(&full, 0);
        let w = Tensor::randn([6, 4], (Kind::Float, Device::Cpu));
        let grads = |x: &Tensor| -> Vec<Tensor> {
            let params: Vec<Tensor> = vs.trainable_variables();
            for p in &params {
                let mut g = p.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            }
            (x * &w).sum(Kind::Float).backward();
            params.iter().map(|p| p.grad().copy()).collect()
        };
        let g_full = grads(&full);
        for cost in [0, CHUNK_COST] {
            let shared = d
                .shared_prefix_logprobs_chunked(&prompts, &rows, &comps, true, cost)
                .unwrap();
            assert_eq!(shared.size(), [6, 4]);
            // Relative to the log-probs' size: fp32 sums in a different
            // order (batched vs one row; another CPU's BLAS kernels) differ
            // by a few ulps per layer. Seen: 1e-6..3e-6 here, 1.3e-5 on a CI
            // machine, at |log p| up to ~10. A wrong position or mask moves
            // them by 0.1 or more.
            let scale = full.abs().max().double_value(&[]).max(1.0);
            let diff = (&shared - &full).abs().max().double_value(&[]);
            assert!(
                diff < 1e-5 * scale,
                "chunk cost {cost}: log-probs differ by {diff} (scale {scale})"
            );
            assert_eq!(shared.get(3).abs().sum(Kind::Float).double_value(&[]), 0.0);
            for (x, y) in grads(&shared).iter().zip(&g_full) {
                let scale = y.abs().max().double_value(&[]).max(1e-6);
                let diff = (x - y).abs().max().double_value(&[]);
                assert!(
                    diff / scale < 1e-4,
                    "gradient differs by {diff} (scale {scale})"
                );
            }
        }
    }

    /// A chunked prefill leaves the cache a single left-padded forward
    /// leaves (in every real slot) and the same last logits, and decoding
    /// goes on from it identically: ragged prompts in input order unlike
    /// their length order, one chunk per length, rows split by the token
    /// budget, and everything in one chunk.
    #[test]
    fn chunked_prefill_matches_one_padded_forward() {
        let (_vs, d) = tiny();
        let prompts: [&[i64]; 5] = [&[1, 2, 3], &[4, 5], &[6, 7, 8, 9, 10], &[11, 12], &[13]];
        let cap = 8;
        let (ids, valid) = left_padded(&prompts, 0, Device::Cpu);
        let next = Tensor::from_slice(&[14i64, 15, 16, 17, 18]).view([5, 1]);
        let step_valid = Tensor::ones([5, 1], (Kind::Bool, Device::Cpu));
        let mut want = KvCache::new(&d.config, 5, cap, Kind::Float, Device::Cpu);
        let want_last = d
            .forward(&ids, Some(&valid), Some(&mut want), LogitsFor::Last, false)
            .unwrap()
            .squeeze_dim(1);
        let want_pos = want.next_pos.copy();
        let want_step = d
            .forward(
                &next,
                Some(&step_valid),
                Some(&mut want),
                LogitsFor::Last,
                false,
            )
            .unwrap();
        let close = |a: &Tensor, b: &Tensor, what: &str| {
            let diff = (a - b).abs().max().double_value(&[]);
            assert!(diff < 1e-5, "{what} differs by {diff}");
        };
        for (cost, max_tokens) in [(0, PREFILL_TOKENS), (0, 4), (1000, PREFILL_TOKENS)] {
            let what = format!("cost {cost}, budget {max_tokens}");
            let (mut got, last) = d
                .prefill_chunked(&prompts, 0, cap, false, cost, max_tokens)
                .unwrap();
            close(&last, &want_last, &format!("{what}: last logits"));
            assert_eq!(got.len(), 5);
            assert!(
                got.valid.equal(&valid.constant_pad_nd([0, 3])),
                "{what}: validity"
            );
            assert!(got.next_pos.equal(&want_pos), "{what}: positions");
            let real = valid.constant_pad_nd([0, 3]).view([5, 1, cap, 1]);
            for i in 0..2 {
                close(
                    &(&got.k[i] * &real),
                    &(&want.k[i] * &real),
                    &format!("{what}: keys"),
                );
                close(
                    &(&got.v[i] * &real),
                    &(&want.v[i] * &real),
                    &format!("{what}: values"),
                );
            }
            let step = d
                .forward(
                    &next,
                    Some(&step_valid),
                    Some(&mut got),
                    LogitsFor::Last,
                    false,
                )
                .unwrap();
            close(&step, &want_step, &format!("{what}: next step"));
        }
        assert!(d.prefill(&[], 0, cap, false).is_err());
        assert!(d.prefill(&[&[1, 2, 3]], 0, 2, false).is_err());
    }

    #[test]
    fn length_chunks_trade_padding_for_passes() {
        // Free passes: one chunk per distinct length.
        assert_eq!(length_chunks(&[9, 9, 5, 2], 0), [(0, 2), (2, 3), (3, 4)]);
        // Dear passes: one chunk.
        assert_eq!(length_chunks(&[9, 9, 5, 2], 1000), [(0, 4)]);
        // 2 long + 6 short: splitting saves 6 * (100 - 10) = 540 > 128.
        let lens = [100, 100, 10, 10, 10, 10, 10, 10];
        assert_eq!(length_chunks(&lens, 128), [(0, 2), (2, 8)]);
        assert!(length_chunks(&[], 128).is_empty());
    }

    /// The fused log-prob path (a frozen output projection, as under LoRA)
    /// gives the plain projection's log-probs and gradients, in both scoring
    /// paths; with the composite attention of second-order MAML it steps
    /// aside and the plain path runs.
    #[test]
    fn fused_scoring_matches_the_plain_projection() {
        let (vs, d) = tiny();
        let _ = d.embed_tokens.set_requires_grad(false);
        let prompts: [&[i64]; 2] = [&[1, 2, 3], &[4, 5]];
        let rows = [0i64, 1, 1];
        let comps: [&[i64]; 3] = [&[6, 7, 8], &[9], &[10, 11, 12, 13]];
        let ids = Tensor::from_slice(&[1i64, 2, 3, 4, 5, 6, 7, 8, 9, 10]).view([2, 5]);
        let valid = ids.ones_like().to_kind(Kind::Bool);
        let w = Tensor::randn([3, 4], (Kind::Float, Device::Cpu));
        let run = |fused: bool| -> (Tensor, Tensor, Vec<Tensor>) {
            d.set_fused_logprobs(fused);
            let a = d
                .shared_prefix_logprobs(&prompts, &rows, &comps, true)
                .unwrap();
            let b = d.token_logprobs_from(&ids, &valid, 1, 3, true).unwrap();
            let params: Vec<Tensor> = vs
                .trainable_variables()
                .into_iter()
                .filter(|p| p.requires_grad())
                .collect();
            let g = Tensor::run_backward(
                &[(&a * &w).sum(Kind::Float) + b.sum(Kind::Float)],
                &params,
                false,
                false,
            );
            (a.detach(), b.detach(), g)
        };
        let (a0, b0, g0) = run(false);
        let (a1, b1, g1) = run(true);
        assert_eq!(b1.size(), [2, 3]);
        assert!((&a1 - &a0).abs().max().double_value(&[]) < 1e-5);
        assert!((&b1 - &b0).abs().max().double_value(&[]) < 1e-5);
        assert!(!g0.is_empty());
        for (x, y) in g0.iter().zip(&g1) {
            let scale = x.abs().max().double_value(&[]).max(1e-3);
            assert!((x - y).abs().max().double_value(&[]) < 1e-4 * scale);
        }
        d.set_math_attention(true);
        let (a2, _, _) = run(true);
        let (a3, _, _) = run(false);
        d.set_math_attention(false);
        assert!((&a2 - &a3).abs().max().double_value(&[]) == 0.0);
    }

    #[test]
    fn shared_prefix_scoring_rejects_bad_rows() {
        let (_vs, d) = tiny();
        let prompts: [&[i64]; 1] = [&[1, 2]];
        let comps: [&[i64]; 1] = [&[3]];
        assert!(d
            .shared_prefix_logprobs(&prompts, &[1], &comps, false)
            .is_err());
        assert!(d
            .shared_prefix_logprobs(&prompts, &[0, 0], &comps, false)
            .is_err());
        let empty: [&[i64]; 1] = [&[]];
        assert!(d
            .shared_prefix_logprobs(&empty, &[0], &comps, false)
            .is_err());
    }
}
