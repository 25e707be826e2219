//! The policy (decoder + tokenizer + parameters) and generation: batched,
//! ragged prompts (left-padded), a KV cache allocated once per call, seeded
//! sampling, stop strings, and per-token log-probabilities for RL; fast
//! adapter weights swapped in, or K sets of them stacked, for meta-learning.
//!
//! [`Generator`] is the seam rollouts and LM judges call; [`Policy`]
//! implements it on the local model (the native engine), and
//! [`super::openai`] and [`super::vllm`] behind the same trait.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::decoder::{distinct_rows, Decoder, DecoderConfig, LogitsFor};
use super::lora;
use super::sampling::{row_uniform, Sampler};
use super::tokenizer::{ChatMessage, TextTokenizer};
use super::{weights, Dtype, LoraConfig, ModelError, TorchKind};

/// Why a completion ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-sequence token was produced (it is the last token id).
    Eos,
    /// A stop string appeared; the text is cut before it, the token ids end
    /// with the token that completed it.
    Stop(String),
    /// `max_new_tokens` was reached.
    Length,
}

impl FinishReason {
    /// `eos`, `stop` or `length`, as OpenAI-compatible servers name them.
    pub fn name(&self) -> &'static str {
        match self {
            FinishReason::Eos => "eos",
            FinishReason::Stop(_) => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// One generated continuation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    pub text: String,
    /// The prompt as the model saw it (after the chat template).
    pub prompt_ids: Vec<i64>,
    pub token_ids: Vec<i64>,
    /// `log p(token)` under the temperature-scaled policy, one per token id.
    pub logprobs: Vec<f32>,
    pub finish: FinishReason,
}

impl Completion {
    /// Whether the token limit ended it: its last statement may be
    /// unfinished (`reward::answer_code` trims it).
    pub fn cut_off(&self) -> bool {
        self.finish == FinishReason::Length
    }

    /// A completion known only as text (a remote server's answer, a scripted
    /// test generator): no token ids or log-probs, so never for training.
    pub fn text_only(text: impl Into<String>, finish: FinishReason) -> Self {
        Completion {
            text: text.into(),
            prompt_ids: Vec::new(),
            token_ids: Vec::new(),
            logprobs: Vec::new(),
            finish,
        }
    }
}

/// Sampling settings for one `generate` call.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationParams {
    pub max_new_tokens: usize,
    pub sampler: Sampler,
    /// Seeds libtorch's generator at the start of the call; `None` keeps the
    /// current generator state.
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    /// Wrap each prompt as one user message in the model's chat template.
    pub chat: bool,
    /// Optional system message when `chat` is on.
    pub system: Option<String>,
    /// Keep generating past end-of-sequence tokens (fixed-length benchmarks).
    pub ignore_eos: bool,
    /// With a `seed`, row i of the call draws from the stream of row
    /// `row_offset + i` ([`super::sampling::row_uniform`]): a shard of a
    /// larger batch (a data-parallel rank's) passes its first row's index in
    /// the whole batch and gets exactly the tokens the whole batch would.
    pub row_offset: u64,
    /// The start of the assistant's answer, written for the model: the
    /// prompt's ids end with it (after the chat template's assistant
    /// header), and the model continues from there. Not part of the
    /// completion's text or token ids: callers that parse the answer put it
    /// back in front. Empty: none.
    pub prefill: String,
    /// End a completion where its first code block closes
    /// ([`crate::text::code_block_end`]); the text keeps the closing fence.
    pub stop_at_block_end: bool,
}

/// The stop reason of a completion that ended at its code block's closing
/// fence.
pub const BLOCK_END: &str = "```";

impl Default for GenerationParams {
    fn default() -> Self {
        GenerationParams {
            max_new_tokens: 256,
            sampler: Sampler::greedy(),
            seed: Some(0),
            stop: Vec::new(),
            chat: false,
            system: None,
            ignore_eos: false,
            row_offset: 0,
            prefill: String::new(),
            stop_at_block_end: false,
        }
    }
}

/// Prompts in, completions (text, token ids, log-probs) out.
pub trait Generator {
    fn generate(
        &self,
        prompts: &[String],
        params: &GenerationParams,
    ) -> Result<Vec<Completion>, ModelError>;
}

/// Token ids of `prompts` as the model sees them: each wrapped as one user
/// message (after `params.system`) in the chat template when `params.chat`,
/// else encoded with the tokenizer's special tokens; `params.prefill`
/// follows (it is encoded with the text before it, as a server that
/// continues a final assistant message does). Every engine encodes
/// here, so the trainer scores exactly the ids that were generated from.
pub fn encode_prompts(
    tok: &TextTokenizer,
    prompts: &[String],
    params: &GenerationParams,
) -> Result<Vec<Vec<i64>>, ModelError> {
    prompts
        .iter()
        .map(|p| {
            if params.chat {
                let mut msgs = Vec::new();
                if let Some(s) = &params.system {
                    msgs.push(ChatMessage::new("system", s));
                }
                msgs.push(ChatMessage::new("user", p));
                let text = tok.apply_chat_template(&msgs, true)? + &params.prefill;
                // The template already holds any BOS it wants.
                tok.encode(&text, false)
            } else {
                tok.encode(&format!("{p}{}", params.prefill), true)
            }
        })
        .collect()
}

/// Which family a `config.json` describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Qwen2,
    Qwen3,
    Llama,
}

impl Family {
    /// The HF `model_type`.
    pub fn name(self) -> &'static str {
        match self {
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Llama => "llama",
        }
    }
}

/// Write an HF model directory with random weights: `config` as
/// `config.json` and `model.safetensors` with every tensor the config
/// implies, norms at 1 and the rest N(0, scale²) drawn in name order after
/// `tch::manual_seed(seed)`. For tests and fixtures (tiny models checked
/// against reference outputs); no tokenizer files are written.
pub fn write_random_model(
    dir: &Path,
    config: &serde_json::Value,
    seed: i64,
    scale: f64,
) -> Result<(), ModelError> {
    let path = dir.join("config.json");
    std::fs::write(&path, config.to_string()).map_err(|e| ModelError::io(&path, e))?;
    let (_, cfg, _) = read_config(dir)?;
    let vs = VarStore::new(Device::Cpu);
    let _model = Decoder::new(&vs.root(), cfg)?;
    let named: Vec<(String, Tensor)> = randomize_in_name_order(&vs, seed, scale)
        .into_iter()
        .map(|(n, t)| (n, t.detach()))
        .collect();
    weights::save_safetensors(&dir.join("model.safetensors"), &named, None)
}

/// Set every variable of `vs` in place: norms at 1, the rest N(0, scale²),
/// drawn in name order after `tch::manual_seed(seed)` (`variables()` is a
/// HashMap, so its own order would change which draw lands where from run
/// to run). Returns the variables in that order. For tests and fixtures.
pub(crate) fn randomize_in_name_order(
    vs: &VarStore,
    seed: i64,
    scale: f64,
) -> Vec<(String, Tensor)> {
    tch::manual_seed(seed);
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    tch::no_grad(|| {
        for (n, t) in &named {
            let mut t = t.shallow_clone();
            if n.ends_with("norm.weight") {
                let _ = t.fill_(1.0);
            } else {
                t.copy_(&(Tensor::randn(t.size(), (Kind::Float, Device::Cpu)) * scale));
            }
        }
    });
    named
}

/// Read `config.json` from an HF directory.
pub fn read_config(dir: &Path) -> Result<(Family, DecoderConfig, serde_json::Value), ModelError> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
    let raw: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ModelError::bad(&path, format!("invalid JSON: {e}")))?;
    let model_type = raw
        .get("model_type")
        .and_then(|m| m.as_str())
        .ok_or_else(|| ModelError::bad(&path, "missing field `model_type`"))?;
    let bad = |e: serde_json::Error| ModelError::bad(&path, e.to_string());
    let (family, cfg) = match model_type {
        "qwen2" => {
            let c: super::qwen2::Qwen2Config = serde_json::from_value(raw.clone()).map_err(bad)?;
            (Family::Qwen2, c.decoder_config())
        }
        "qwen3" => {
            let c: super::qwen3::Qwen3Config = serde_json::from_value(raw.clone()).map_err(bad)?;
            (Family::Qwen3, c.decoder_config())
        }
        "llama" => {
            let c: super::llama::LlamaConfig = serde_json::from_value(raw.clone()).map_err(bad)?;
            (Family::Llama, c.decoder_config())
        }
        other => {
            return Err(ModelError::bad(
                &path,
                format!("model_type `{other}` is not supported (qwen2, qwen3 and llama are)"),
            ))
        }
    };
    let cfg = cfg.map_err(|e| ModelError::bad(&path, e))?;
    cfg.check().map_err(|e| ModelError::bad(&path, e))?;
    Ok((family, cfg, raw))
}

/// A loaded model: parameters, network, tokenizer and where they came from.
pub struct Policy {
    pub vs: VarStore,
    pub model: Decoder,
    pub tokenizer: Option<TextTokenizer>,
    pub family: Family,
    pub dtype: Dtype,
    /// The `config.json` as read, kept for export.
    pub hf_config: serde_json::Value,
    pub source_dir: PathBuf,
    pub lora: Option<LoraConfig>,
}

impl Policy {
    /// Load an HF model directory (config.json, safetensors, tokenizer files).
    pub fn load(dir: &Path, dtype: Dtype, device: Device) -> Result<Self, ModelError> {
        let (family, cfg, raw) = read_config(dir)?;
        let tie = cfg.tie_word_embeddings;
        let mut vs = VarStore::new(device);
        let model = Decoder::new(&vs.root(), cfg)?;
        vs.set_kind(dtype.kind());
        let files = weights::checkpoint_files(dir)?;
        let unused = weights::load_into(&files, &vs.variables())?;
        let unexpected: Vec<&String> = unused
            .iter()
            .filter(|n| !(n.ends_with("rotary_emb.inv_freq") || (tie && *n == "lm_head.weight")))
            .collect();
        if !unexpected.is_empty() {
            return Err(ModelError::bad(
                dir,
                format!(
                    "checkpoint has tensors this {} config does not use, e.g. {:?}",
                    family.name(),
                    unexpected.iter().take(3).collect::<Vec<_>>()
                ),
            ));
        }
        let tokenizer = if dir.join("tokenizer.json").is_file() {
            Some(TextTokenizer::from_dir(dir)?)
        } else {
            None
        };
        Ok(Policy {
            vs,
            model,
            tokenizer,
            family,
            dtype,
            hf_config: raw,
            source_dir: dir.to_path_buf(),
            lora: None,
        })
    }

    pub fn device(&self) -> Device {
        self.vs.device()
    }

    pub fn tokenizer(&self) -> Result<&TextTokenizer, ModelError> {
        self.tokenizer.as_ref().ok_or_else(|| {
            ModelError::NotFound(format!(
                "{}: no tokenizer.json, so text prompts cannot be encoded",
                self.source_dir.display()
            ))
        })
    }

    /// Attach fresh LoRA adapters to the configured projections and freeze
    /// every base parameter.
    pub fn attach_lora(&mut self, cfg: &LoraConfig) -> Result<(), ModelError> {
        lora::check(cfg)?;
        if self.lora.is_some() {
            return Err(ModelError::Invalid(
                "LoRA adapters are already attached".into(),
            ));
        }
        self.vs.freeze();
        let root = self.vs.root();
        for (name, lin) in self.model.projections_mut() {
            if lora::targets_module(cfg, &name) {
                let p = name.split('.').fold(root.clone(), |p, part| p / part);
                lin.attach(&p, cfg);
            }
        }
        self.lora = Some(cfg.clone());
        Ok(())
    }

    /// Fold every adapter into its base weight (faster inference).
    pub fn merge_lora(&mut self) {
        for (_, lin) in self.model.projections_mut() {
            lin.merge();
        }
    }

    /// Switch every adapter on or off (off: the base model, e.g. as the
    /// frozen reference of a KL penalty).
    pub fn set_lora_enabled(&mut self, on: bool) {
        for (_, lin) in self.model.projections_mut() {
            lin.set_adapter_enabled(on);
        }
    }

    /// Undo [`Policy::merge_lora`].
    pub fn unmerge_lora(&mut self) {
        for (_, lin) in self.model.projections_mut() {
            lin.unmerge();
        }
    }

    /// Functional LoRA: exchange the adapters' factors with the tensors in
    /// `fast`, named as in the VarStore (`….q_proj.lora_A.weight`,
    /// `….lora_B.weight`). Calling it again with the same slice swaps back.
    /// MAML's fast weights θ_i are such tensors (functions of θ with their
    /// autograd graph), so K adapted policies cost K adapters, not K models.
    /// Nothing is swapped unless every name and shape matches.
    pub fn swap_adapters(&mut self, fast: &mut [(String, Tensor)]) -> Result<(), ModelError> {
        let plan = self.factor_plan(fast, "swapping in fast weights")?;
        let mut projections = self.model.projections_mut();
        for (p, i, is_a) in plan {
            let ad = projections[p].1.adapter.as_mut().expect("checked above");
            let own = if is_a { &mut ad.a } else { &mut ad.b };
            std::mem::swap(own, &mut fast[i].1);
        }
        Ok(())
    }

    /// `(index, name)` of every projection that carries an adapter.
    fn projections_with_adapters(&self) -> Vec<(usize, String)> {
        self.model
            .projections()
            .into_iter()
            .enumerate()
            .filter(|(_, (_, lin))| lin.adapter.is_some())
            .map(|(p, (name, _))| (p, name))
            .collect()
    }

    /// Where each of `fast`'s tensors goes, `(projection, index in fast,
    /// is it A)`, once every name is known, given once, of the right shape,
    /// and no adapter is merged (`doing` says what for, in that error).
    fn factor_plan(
        &self,
        fast: &[(String, Tensor)],
        doing: &str,
    ) -> Result<Vec<(usize, usize, bool)>, ModelError> {
        let mut at: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for (i, (name, _)) in fast.iter().enumerate() {
            if at.insert(name.as_str(), i).is_some() {
                return Err(ModelError::Invalid(format!(
                    "fast weight `{name}` given twice"
                )));
            }
        }
        let mut plan: Vec<(usize, usize, bool)> = Vec::with_capacity(fast.len());
        for (p, (name, lin)) in self.model.projections().into_iter().enumerate() {
            let Some(ad) = &lin.adapter else { continue };
            if lin.is_merged() {
                return Err(ModelError::Invalid(format!(
                    "{name}: the adapter is merged into the base weight; unmerge before {doing}"
                )));
            }
            for (suffix, own, is_a) in [
                ("lora_A.weight", &ad.a, true),
                ("lora_B.weight", &ad.b, false),
            ] {
                if let Some(&i) = at.get(format!("{name}.{suffix}").as_str()) {
                    if fast[i].1.size() != own.size() {
                        return Err(ModelError::Invalid(format!(
                            "fast weight `{name}.{suffix}` has shape {:?}, the adapter {:?}",
                            fast[i].1.size(),
                            own.size()
                        )));
                    }
                    plan.push((p, i, is_a));
                }
            }
        }
        if plan.len() != fast.len() {
            let known: std::collections::HashSet<usize> = plan.iter().map(|x| x.1).collect();
            let stray = (0..fast.len()).find(|i| !known.contains(i)).unwrap_or(0);
            return Err(ModelError::Invalid(format!(
                "fast weight `{}` names no LoRA factor of this model",
                fast[stray].0
            )));
        }
        Ok(plan)
    }

    /// Run `f` with the adapters' factors replaced by `fast` (shallow
    /// copies: gradients flow back into `fast`), then put the originals back.
    pub fn with_adapters<R>(
        &mut self,
        fast: &[(String, Tensor)],
        f: impl FnOnce(&mut Policy) -> R,
    ) -> Result<R, ModelError> {
        let mut slot: Vec<(String, Tensor)> = fast
            .iter()
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect();
        self.swap_adapters(&mut slot)?;
        let out = f(self);
        self.swap_adapters(&mut slot)
            .expect("the tensors swapped in a moment ago swap back");
        Ok(out)
    }

    /// Run `f` with K sets of fast adapter weights at once: row `i` of every
    /// batch `f` runs goes through `fast[rows[i]]` (`rows` `[B]`, i64, on the
    /// model's device). Each set names every adapter factor, as
    /// [`Policy::swap_adapters`] takes them; gradients reach each set's own
    /// tensors. FALCON's meta-step evaluates its K tasks' fast weights in one
    /// batch with this.
    pub fn with_stacked_adapters<R>(
        &mut self,
        fast: &[&[(String, Tensor)]],
        rows: &Tensor,
        f: impl FnOnce(&mut Policy) -> R,
    ) -> Result<R, ModelError> {
        let factors = self.projections_with_adapters();
        // Per set, where each factor (projection, is it A) sits in it.
        let mut at: Vec<std::collections::HashMap<(usize, bool), usize>> = Vec::new();
        for set in fast {
            let plan = self.factor_plan(set, "stacking fast weights")?;
            let map: std::collections::HashMap<(usize, bool), usize> =
                plan.into_iter().map(|(p, i, a)| ((p, a), i)).collect();
            for (p, name) in &factors {
                for (is_a, suffix) in [(true, "lora_A.weight"), (false, "lora_B.weight")] {
                    if !map.contains_key(&(*p, is_a)) {
                        return Err(ModelError::Invalid(format!(
                            "a set of fast weights lacks `{name}.{suffix}`"
                        )));
                    }
                }
            }
            at.push(map);
        }
        let stack = |p: usize, is_a: bool| {
            let ts: Vec<&Tensor> = fast
                .iter()
                .zip(&at)
                .map(|(set, at)| &set[at[&(p, is_a)]].1)
                .collect();
            Tensor::stack(&ts, 0)
        };
        let projections = self.model.projections();
        let plan: Vec<_> = factors
            .iter()
            .map(|&(p, _)| (projections[p].1, stack(p, true), stack(p, false)))
            .collect();
        for (lin, a, b) in plan {
            lin.set_stacked(Some(super::lora::Stacked {
                a,
                b,
                rows: rows.shallow_clone(),
            }));
        }
        drop(projections);
        let out = f(self);
        for (_, lin) in self.model.projections() {
            lin.set_stacked(None);
        }
        Ok(out)
    }

    /// Turn text prompts into token ids (through the chat template if asked).
    pub fn encode_prompts(
        &self,
        prompts: &[String],
        params: &GenerationParams,
    ) -> Result<Vec<Vec<i64>>, ModelError> {
        encode_prompts(self.tokenizer()?, prompts, params)
    }

    /// Generate from token-id prompts. `eos` ends a sequence; stop strings
    /// need the tokenizer and are checked on the decoded completion.
    pub fn generate_ids(
        &self,
        prompts: &[Vec<i64>],
        params: &GenerationParams,
    ) -> Result<Vec<Completion>, ModelError> {
        if prompts.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(i) = prompts.iter().position(|p| p.is_empty()) {
            return Err(ModelError::Invalid(format!("prompt {i} is empty")));
        }
        let vocab = self.model.config.vocab_size;
        if let Some(bad) = prompts.iter().flatten().find(|&&t| t < 0 || t >= vocab) {
            return Err(ModelError::Invalid(format!(
                "token id {bad} is outside the vocabulary (size {vocab})"
            )));
        }
        if (!params.stop.is_empty() || params.stop_at_block_end) && self.tokenizer.is_none() {
            return Err(ModelError::Invalid("stop strings need a tokenizer".into()));
        }
        let device = self.device();
        let b = prompts.len();
        let max_len = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let (mut eos, pad) = match &self.tokenizer {
            Some(t) => (t.eos_ids().clone(), t.pad_id()),
            None => (BTreeSet::new(), 0),
        };
        if params.ignore_eos {
            eos.clear();
        }
        // Identical prompts (a GRPO group's G samples) are prefilled once;
        // their cache rows and first logits are then copied per sample.
        let (distinct, row_of) = distinct_rows(prompts.iter().map(Vec::as_slice));
        let m = distinct.len();
        let eos_t = Tensor::from_slice(&eos.iter().copied().collect::<Vec<_>>()).to_device(device);
        if let Some(seed) = params.seed {
            tch::manual_seed(seed as i64);
        }

        let mut out: Vec<Completion> = prompts
            .iter()
            .map(|p| Completion {
                text: String::new(),
                prompt_ids: p.clone(),
                token_ids: Vec::new(),
                logprobs: Vec::new(),
                finish: FinishReason::Length,
            })
            .collect();
        let mut done = vec![false; b];
        let capacity = (max_len + params.max_new_tokens) as i64;

        tch::no_grad(|| -> Result<(), ModelError> {
            // Restored when this closure returns, by any path.
            let _folded: Vec<lora::Folded> = if fold_lora() {
                self.model
                    .projections()
                    .into_iter()
                    .filter_map(|(_, lin)| lin.fold_for_inference())
                    .collect()
            } else {
                Vec::new()
            };
            // Declared after the folds: weights are packed as folded, and
            // the packs are dropped before the folds restore the weights
            // (a pack must not outlive its generation: kernels::packed).
            let _ops = (device == Device::Cpu).then(crate::kernels::decode_ops::scope);
            let _packed = (b > crate::kernels::gemv::MAX_ROWS && device == Device::Cpu)
                .then(crate::kernels::packed::scope)
                .flatten();
            let (mut cache, mut logits) = self.model.prefill(&distinct, pad, capacity, false)?;
            if m < b {
                let idx = Tensor::from_slice(&row_of).to_device(device);
                cache.keep_rows(&idx);
                logits = logits.index_select(0, &idx);
            }
            let mut alive = Tensor::ones([b as i64], (Kind::Bool, device));
            // rows[j]: the prompt index of batch row j. Once an eighth of
            // the rows have finished, the batch is compacted to the live
            // ones: every finished row costs a live row's compute each step
            // (matmuls at batch 32 are bound by arithmetic here), and a
            // compaction costs about one step's worth of copying.
            let mut rows: Vec<usize> = (0..b).collect();
            for step in 0..params.max_new_tokens {
                let (mut next, lp) = match params.seed {
                    Some(seed) => {
                        let u: Vec<f64> = rows
                            .iter()
                            .map(|&i| row_uniform(seed, params.row_offset + i as u64, step as u64))
                            .collect();
                        params.sampler.sample_with(&logits, &Tensor::from_slice(&u))
                    }
                    None => params.sampler.sample(&logits),
                };
                let next_h = Vec::<i64>::try_from(&next.to_device(Device::Cpu))?;
                let lp_h = Vec::<f32>::try_from(&lp.to_device(Device::Cpu))?;
                let mut newly_stopped = Vec::new();
                for (j, &i) in rows.iter().enumerate() {
                    if done[i] {
                        continue;
                    }
                    let c = &mut out[i];
                    c.token_ids.push(next_h[j]);
                    c.logprobs.push(lp_h[j]);
                    if eos.contains(&next_h[j]) {
                        c.finish = FinishReason::Eos;
                        done[i] = true;
                    } else if let Some(s) = self.first_stop(&c.token_ids, params)? {
                        c.finish = FinishReason::Stop(s);
                        done[i] = true;
                        newly_stopped.push(j as i64);
                    }
                }
                if done.iter().all(|&d| d) || step + 1 == params.max_new_tokens {
                    break;
                }
                let live: Vec<i64> = (0..rows.len())
                    .filter(|&j| !done[rows[j]])
                    .map(|j| j as i64)
                    .collect();
                if (rows.len() - live.len()) * 8 >= rows.len() {
                    let idx = Tensor::from_slice(&live).to_device(device);
                    cache.keep_rows(&idx);
                    next = next.index_select(0, &idx);
                    rows = live.iter().map(|&j| rows[j as usize]).collect();
                    alive = Tensor::ones([rows.len() as i64], (Kind::Bool, device));
                } else {
                    // EOS is tracked on the device; stop strings (rare) are pushed down.
                    if !eos.is_empty() {
                        alive = alive.logical_and(&Tensor::isin(&next, &eos_t, false, true));
                    }
                    if !newly_stopped.is_empty() {
                        let idx = Tensor::from_slice(&newly_stopped).to_device(device);
                        alive = alive.index_fill(0, &idx, 0);
                    }
                }
                let input = next.where_self(
                    &alive,
                    &Tensor::scalar_tensor(pad as f64, (Kind::Int64, device)),
                );
                logits = self
                    .model
                    .forward(
                        &input.unsqueeze(1),
                        Some(&alive.unsqueeze(1)),
                        Some(&mut cache),
                        LogitsFor::Last,
                        false,
                    )?
                    .squeeze_dim(1);
            }
            Ok(())
        })?;

        if let Some(tok) = &self.tokenizer {
            for c in out.iter_mut() {
                let text = tok.decode(&c.token_ids, true)?;
                c.text = cut_at_stop(text, &c.finish, params);
            }
        }
        Ok(out)
    }

    fn first_stop(
        &self,
        ids: &[i64],
        params: &GenerationParams,
    ) -> Result<Option<String>, ModelError> {
        if params.stop.is_empty() && !params.stop_at_block_end {
            return Ok(None);
        }
        let tok = self.tokenizer()?;
        // Only a closing fence ends the answer, and it arrives with a
        // backtick: skip decoding the whole text again (each step, each
        // row: 4% of an RL step's generation) for any other token.
        if params.stop.is_empty() && ids.last().is_some_and(|&id| !tok.may_hold_backtick(id)) {
            return Ok(None);
        }
        let text = tok.decode(ids, true)?;
        Ok(stop_in(&text, params))
    }
}

/// Which stop ended `text`, if any: a stop string it contains, else
/// [`BLOCK_END`] when `stop_at_block_end` and its code block has closed.
pub fn stop_in(text: &str, params: &GenerationParams) -> Option<String> {
    params
        .stop
        .iter()
        .find(|s| text.contains(s.as_str()))
        .cloned()
        .or_else(|| {
            (params.stop_at_block_end && block_end(text, params).is_some())
                .then(|| BLOCK_END.to_owned())
        })
}

/// Where `text`'s code block closes, reading the answer as the prefill
/// followed by `text` (a prefill may open the block); an offset in `text`.
fn block_end(text: &str, params: &GenerationParams) -> Option<usize> {
    if params.prefill.is_empty() {
        return crate::text::code_block_end(text);
    }
    let whole = format!("{}{text}", params.prefill);
    crate::text::code_block_end(&whole).map(|end| end.saturating_sub(params.prefill.len()))
}

/// The text of a completion that ended with `finish`: cut before its stop
/// string, or just after its code block's closing fence.
pub fn cut_at_stop(mut text: String, finish: &FinishReason, params: &GenerationParams) -> String {
    if let FinishReason::Stop(s) = finish {
        let at = if params.stop.contains(s) {
            text.find(s.as_str())
        } else if s == BLOCK_END {
            block_end(&text, params)
        } else {
            None
        };
        if let Some(at) = at {
            text.truncate(at);
        }
    }
    text
}

/// A server's completion under `params.stop_at_block_end`, which servers
/// do not know: cut at the token whose decoding closed the code block (the
/// first prefix of the token ids whose text has a closed block), with its
/// log-probs, and marked [`BLOCK_END`]. Text-only completions (no token
/// ids) are cut by text.
pub fn cut_at_block_end(
    mut c: Completion,
    tok: Option<&TextTokenizer>,
    params: &GenerationParams,
) -> Result<Completion, ModelError> {
    if !params.stop_at_block_end || matches!(c.finish, FinishReason::Stop(_)) {
        return Ok(c);
    }
    let Some(end) = block_end(&c.text, params) else {
        return Ok(c);
    };
    match tok {
        Some(tok) if !c.token_ids.is_empty() => {
            // The smallest k whose prefix closes the block (closing is
            // monotone in k).
            let closes = |k: usize| -> Result<bool, ModelError> {
                Ok(block_end(&tok.decode(&c.token_ids[..k], true)?, params).is_some())
            };
            let (mut lo, mut hi) = (1, c.token_ids.len());
            if !closes(hi)? {
                return Ok(c);
            }
            while lo < hi {
                let mid = (lo + hi) / 2;
                if closes(mid)? {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            c.token_ids.truncate(hi);
            c.logprobs.truncate(hi);
            let text = tok.decode(&c.token_ids, true)?;
            c.finish = FinishReason::Stop(BLOCK_END.to_owned());
            c.text = cut_at_stop(text, &c.finish, params);
        }
        _ => {
            c.text.truncate(end);
            c.finish = FinishReason::Stop(BLOCK_END.to_owned());
        }
    }
    Ok(c)
}

/// Fold fp32 LoRA adapters into their weights while generating
/// ([`lora::LoraLinear::fold_for_inference`]); `FALCON_FOLD_LORA=0` keeps
/// them apart, for benchmarks comparing the two.
fn fold_lora() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        crate::kernels::env_switch("FALCON_FOLD_LORA", "adapters are folded in").unwrap_or(true)
    })
}

impl Generator for Policy {
    fn generate(
        &self,
        prompts: &[String],
        params: &GenerationParams,
    ) -> Result<Vec<Completion>, ModelError> {
        let ids = self.encode_prompts(prompts, params)?;
        self.generate_ids(&ids, params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(stop: &[&str], block: bool, prefill: &str) -> GenerationParams {
        GenerationParams {
            stop: stop.iter().map(|s| s.to_string()).collect(),
            stop_at_block_end: block,
            prefill: prefill.into(),
            ..GenerationParams::default()
        }
    }

    #[test]
    fn stop_strings_come_before_the_block_end() {
        let text = "```python\nx = 1\n```\nmore END";
        assert_eq!(
            stop_in(text, &params(&["END"], true, "")).as_deref(),
            Some("END")
        );
        assert_eq!(
            stop_in(text, &params(&[], true, "")).as_deref(),
            Some(BLOCK_END)
        );
        assert_eq!(stop_in(text, &params(&[], false, "")), None);
        assert_eq!(stop_in("```python\nx = 1\n", &params(&[], true, "")), None);
        // A user stop string is cut before; the block end after its fence.
        let p = params(&["END"], true, "");
        let stop = |s: &str| FinishReason::Stop(s.into());
        assert_eq!(
            cut_at_stop(text.into(), &stop("END"), &p),
            "```python\nx = 1\n```\nmore "
        );
        assert_eq!(
            cut_at_stop(text.into(), &stop(BLOCK_END), &p),
            "```python\nx = 1\n```"
        );
        assert_eq!(cut_at_stop(text.into(), &FinishReason::Length, &p), text);
    }

    #[test]
    fn a_prefill_can_open_the_block() {
        let p = params(&[], true, "Here:\n```python\n");
        assert_eq!(stop_in("x = 1\n```\nbye", &p).as_deref(), Some(BLOCK_END));
        let c = Completion::text_only("x = 1\n```\nbye", FinishReason::Length);
        let c = cut_at_block_end(c, None, &p).unwrap();
        assert_eq!((c.text.as_str(), c.finish.name()), ("x = 1\n```", "stop"));
        // Without the rule, or already stopped, nothing changes.
        let kept = Completion::text_only("x = 1\n```\nbye", FinishReason::Eos);
        let same = cut_at_block_end(kept.clone(), None, &params(&[], false, "```\n")).unwrap();
        assert_eq!(same, kept);
    }
}
