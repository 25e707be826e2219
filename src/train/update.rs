//! The policy update, shared by every step: sequences of (prompt,
//! completion, advantage, spans) cut into micro-batches whose losses add up
//! exactly to the whole batch's (each term scaled by its share of the batch's
//! normaliser), optionally running each shared prompt once, with the KL
//! reference from the base model; K tasks' losses at their own fast weights
//! in one batched pass; and the SFT example format.

use std::collections::BTreeMap;
use std::ops::Range;

use tch::{Device, Kind, Tensor};

use super::losses::{fine_grained_loss, kl_penalty, pg_loss, sl_loss, total_loss, PgBatch};
use super::optim::{clip_grad_norm, zero_grad, Optimizer};
use super::{trainable, TrainError};
use crate::config::{LossWeights, Normalization, TrainConfig};
use crate::dist::Group;
use crate::model::autocast::{kind_of, with_autocast};
use crate::model::{ChatMessage, Policy};
use crate::reward::TokenSpan;

/// Token ids of one SFT example: the prompt exactly as generation sees it
/// (chat template with the generation prompt), and the answer as the
/// template renders an assistant turn after it, end-of-turn included. A
/// template whose full rendering does not extend the prompt's gets the
/// answer followed by the first end-of-sequence id.
pub fn sft_example(
    policy: &Policy,
    prompt: &str,
    answer: &str,
) -> Result<(Vec<i64>, Vec<i64>), TrainError> {
    let tok = policy.tokenizer()?;
    let user = [ChatMessage::new("user", prompt)];
    let head = tok.apply_chat_template(&user, true)?;
    let full = tok.apply_chat_template(
        &[user[0].clone(), ChatMessage::new("assistant", answer)],
        false,
    )?;
    let prompt_ids = tok.encode(&head, false)?;
    let answer_ids = match full.strip_prefix(&head) {
        Some(rest) => tok.encode(rest.trim_end_matches('\n'), false)?,
        None => {
            let mut ids = tok.encode(answer, false)?;
            ids.extend(tok.eos_ids().iter().next().copied());
            ids
        }
    };
    Ok((prompt_ids, answer_ids))
}

/// One sequence of an update batch: prompt and completion token ids, the
/// sample's advantage, whether it passed (for `L_sl`) and its fine-grained
/// spans in completion-token coordinates.
#[derive(Clone, Copy)]
pub struct UpdateSeq<'s> {
    pub prompt_ids: &'s [i64],
    pub completion_ids: &'s [i64],
    pub advantage: f64,
    pub passed: bool,
    pub spans: &'s [TokenSpan],
    /// The engine's `log p` of each completion token as it sampled them
    /// (empty: not checked). The update compares its own with them and,
    /// with a TIS cap, weights the policy gradient by their ratio.
    pub rollout_logprobs: &'s [f32],
}

/// A micro-batch's tensors, padded to its own longest sequence.
struct MicroBatch {
    ids: Tensor,
    valid: Tensor,
    /// Column 0 of the masks and log-probs predicts token `start + 1`.
    start: i64,
    /// `[b, T-1-start]`: column c predicts a completion token.
    mask: Tensor,
    sl_mask: Tensor,
    advantages: Tensor,
    spans: Vec<Vec<TokenSpan>>,
    offsets: Vec<i64>,
    /// Its share of each term's whole-batch normaliser, by term name.
    share: BTreeMap<&'static str, f64>,
    reference: Option<Tensor>,
    old: Option<Tensor>,
    /// `[b, T-1-start]`: the engine's log-probs where `mask` is set.
    rollout: Option<Tensor>,
    /// Truncated importance weights of the policy-gradient term.
    tis: Option<Tensor>,
    /// Set when samples of the micro-batch share prompts and
    /// `[train] shared_prefix` is on.
    prefix: Option<SharedPrefix>,
}

/// How a micro-batch runs with each distinct prompt once
/// ([`crate::model::Decoder::shared_prefix_logprobs`]).
struct SharedPrefix {
    prompts: Vec<Vec<i64>>,
    /// Row i's prompt is `prompts[rows[i]]`.
    rows: Vec<i64>,
    completions: Vec<Vec<i64>>,
    /// `[b, T-1-start]`: for each column of the micro-batch's layout, the
    /// completion token it predicts (clamped where it predicts none).
    gather: Tensor,
}

impl SharedPrefix {
    /// `None` when no two sequences share a prompt (nothing to save).
    fn plan(seqs: &[&UpdateSeq], start: usize, w: usize, device: Device) -> Option<Self> {
        let (distinct, rows) =
            crate::model::decoder::distinct_rows(seqs.iter().map(|s| s.prompt_ids));
        if distinct.len() == seqs.len() || seqs.iter().any(|s| s.prompt_ids.is_empty()) {
            return None;
        }
        let l = seqs
            .iter()
            .map(|s| s.completion_ids.len())
            .max()
            .unwrap_or(0)
            .max(1);
        let b = seqs.len();
        let mut gather = vec![0i64; b * w];
        for (i, s) in seqs.iter().enumerate() {
            // Column c predicts token c + start + 1 of the full sequence,
            // which is completion token c + start + 1 - p.
            let p = s.prompt_ids.len() as i64;
            for c in 0..w {
                let j = c as i64 + start as i64 + 1 - p;
                gather[i * w + c] = j.clamp(0, l as i64 - 1);
            }
        }
        let (b, w) = (b as i64, w as i64);
        Some(SharedPrefix {
            prompts: distinct.iter().map(|p| p.to_vec()).collect(),
            rows,
            completions: seqs.iter().map(|s| s.completion_ids.to_vec()).collect(),
            gather: Tensor::from_slice(&gather).view([b, w]).to_device(device),
        })
    }
}

/// The normalisers of the loss terms for a set of sequences: completion
/// tokens (`pg` token mean, `kl`), sequences with any completion token
/// (`pg` sequence mean), passing-completion tokens (`sl`) and span terms
/// (`fine`).
fn normalisers(seqs: &[&UpdateSeq], norm: Normalization) -> BTreeMap<&'static str, f64> {
    let tokens: usize = seqs.iter().map(|s| s.completion_ids.len()).sum();
    let nonempty = seqs.iter().filter(|s| !s.completion_ids.is_empty()).count();
    let sl: usize = seqs
        .iter()
        .filter(|s| s.passed)
        .map(|s| s.completion_ids.len())
        .sum();
    let spans: Vec<Vec<TokenSpan>> = seqs.iter().map(|s| s.spans.to_vec()).collect();
    let offsets: Vec<i64> = seqs.iter().map(|s| s.prompt_ids.len() as i64 - 1).collect();
    let t = seqs
        .iter()
        .map(|s| s.prompt_ids.len() + s.completion_ids.len())
        .max()
        .unwrap_or(2)
        .max(2) as i64
        - 1;
    let fine = super::losses::fine_grained_terms(&spans, &offsets, t);
    let pg = match norm {
        Normalization::TokenMean => tokens,
        Normalization::SequenceMean => nonempty,
    };
    BTreeMap::from([
        ("pg", pg as f64),
        ("kl", tokens as f64),
        ("sl", sl as f64),
        ("fine", fine as f64),
    ])
}

fn micro_batch(seqs: &[&UpdateSeq], device: Device, shared_prefix: bool) -> MicroBatch {
    let b = seqs.len();
    let tmax = seqs
        .iter()
        .map(|s| s.prompt_ids.len() + s.completion_ids.len())
        .max()
        .unwrap_or(2)
        .max(2);
    // Predictions before the shortest prompt's last token are never scored,
    // so the vocabulary projection (and its log-softmax) skips them.
    let start = seqs
        .iter()
        .map(|s| s.prompt_ids.len().saturating_sub(1))
        .min()
        .unwrap_or(0)
        .min(tmax - 2);
    let w = tmax - 1 - start;
    let mut ids = vec![0i64; b * tmax];
    let mut valid = vec![false; b * tmax];
    let mut mask = vec![false; b * w];
    let mut sl_mask = vec![false; b * w];
    let checked = seqs
        .iter()
        .all(|s| s.rollout_logprobs.len() == s.completion_ids.len())
        && seqs.iter().any(|s| !s.rollout_logprobs.is_empty());
    let mut rollout = vec![0f32; if checked { b * w } else { 0 }];
    for (i, s) in seqs.iter().enumerate() {
        let (p, n) = (s.prompt_ids.len(), s.completion_ids.len());
        for (j, &id) in s.prompt_ids.iter().chain(s.completion_ids).enumerate() {
            ids[i * tmax + j] = id;
            valid[i * tmax + j] = true;
        }
        for j in p.saturating_sub(1)..(p + n).saturating_sub(1) {
            mask[i * w + j - start] = true;
            sl_mask[i * w + j - start] = s.passed;
            if checked {
                rollout[i * w + j - start] = s.rollout_logprobs[j + 1 - p];
            }
        }
    }
    let (b, t, w) = (b as i64, tmax as i64, w as i64);
    let adv: Vec<f64> = seqs.iter().map(|s| s.advantage).collect();
    MicroBatch {
        ids: Tensor::from_slice(&ids).view([b, t]).to_device(device),
        valid: Tensor::from_slice(&valid).view([b, t]).to_device(device),
        start: start as i64,
        mask: Tensor::from_slice(&mask).view([b, w]).to_device(device),
        sl_mask: Tensor::from_slice(&sl_mask).view([b, w]).to_device(device),
        advantages: Tensor::from_slice(&adv)
            .to_kind(Kind::Float)
            .to_device(device),
        spans: seqs.iter().map(|s| s.spans.to_vec()).collect(),
        offsets: seqs
            .iter()
            .map(|s| s.prompt_ids.len() as i64 - 1 - start as i64)
            .collect(),
        share: BTreeMap::new(),
        reference: None,
        old: None,
        rollout: checked.then(|| Tensor::from_slice(&rollout).view([b, w]).to_device(device)),
        tis: None,
        prefix: if shared_prefix {
            SharedPrefix::plan(seqs, start, w as usize, device)
        } else {
            None
        },
    }
}

/// `log p` of the next tokens `start+1..T` of the micro-batch, `[b, T-1-start]`.
fn batch_logprobs(policy: &Policy, mb: &MicroBatch, train: bool) -> Result<Tensor, TrainError> {
    if let Some(sp) = &mb.prefix {
        let prompts: Vec<&[i64]> = sp.prompts.iter().map(Vec::as_slice).collect();
        let comps: Vec<&[i64]> = sp.completions.iter().map(Vec::as_slice).collect();
        let by_token = policy
            .model
            .shared_prefix_logprobs(&prompts, &sp.rows, &comps, train)?;
        // Into the micro-batch's layout; columns that predict no completion
        // token are masked by every term, and 0 keeps them finite.
        let cols = by_token.gather(1, &sp.gather, false);
        return Ok(cols.where_self(&mb.mask, &cols.zeros_like()));
    }
    let t = mb.ids.size()[1];
    let w = t - 1 - mb.start;
    Ok(policy
        .model
        .token_logprobs_from(&mb.ids, &mb.valid, mb.start, w, train)?)
}

/// The weighted loss of one micro-batch from its log-probs (`old`: those
/// of the policy that generated it, for the PPO ratio), each term scaled by
/// the micro-batch's share of the whole batch's normaliser; and every term's
/// value.
fn mb_loss(
    mb: &MicroBatch,
    logp: &Tensor,
    old: Tensor,
    clip: Option<f64>,
    norm: Normalization,
    w: &LossWeights,
) -> Result<(Tensor, BTreeMap<String, f64>), TrainError> {
    let batch = PgBatch {
        old_logprobs: old,
        logprobs: logp.shallow_clone(),
        ref_logprobs: None,
        mask: mb.mask.shallow_clone(),
        advantages: mb.advantages.shallow_clone(),
        token_weight: mb.tis.as_ref().map(Tensor::shallow_clone),
    };
    let pg = pg_loss(&batch, clip, norm) * mb.share["pg"];
    let fine = fine_grained_loss(logp, &mb.spans, &mb.offsets)? * mb.share["fine"];
    let sl = sl_loss(logp, &mb.sl_mask) * mb.share["sl"];
    let mut terms = vec![("pg", pg, w.pg), ("fine", fine, w.fine), ("sl", sl, w.sl)];
    if let Some(r) = &mb.reference {
        terms.push(("kl", kl_penalty(logp, r, &mb.mask) * mb.share["kl"], w.kl));
    }
    Ok(total_loss(&terms))
}

/// `sum += terms`, term by term: the loss terms of several pieces (or
/// tasks) add up.
pub(super) fn add_terms(
    sum: &mut BTreeMap<String, f64>,
    terms: impl IntoIterator<Item = (String, f64)>,
) {
    for (k, v) in terms {
        *sum.entry(k).or_insert(0.0) += v;
    }
}

/// A piece's term values with its loss `l` as `total`.
fn with_total(l: &Tensor, mut parts: BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    parts.insert("total".into(), l.double_value(&[]));
    parts
}

/// `seqs` in micro-batches of at most `size` sequences (0 = one), each
/// with its share of every term's whole-batch normaliser, so that their
/// losses add up to the one-pass loss; with `kl`, each also carries the
/// base model's log-probs (the reference: the same weights with every
/// adapter switched off).
/// Only `seqs[share]` are cut (a data-parallel rank's part), against the
/// normalisers of all of `seqs`.
fn micro_batches(
    policy: &mut Policy,
    seqs: &[UpdateSeq],
    share: Range<usize>,
    size: usize,
    norm: Normalization,
    kl: bool,
    shared_prefix: bool,
) -> Result<Vec<MicroBatch>, TrainError> {
    let all: Vec<&UpdateSeq> = seqs.iter().collect();
    let whole = normalisers(&all, norm);
    let mine = &all[share];
    let size = if size == 0 { mine.len() } else { size }.max(1);
    let mut out = Vec::new();
    for chunk in mine.chunks(size) {
        let mut mb = micro_batch(chunk, policy.device(), shared_prefix);
        mb.share = normalisers(chunk, norm)
            .iter()
            .map(|(k, v)| (*k, v / whole[k].max(1.0)))
            .collect();
        if kl {
            policy.set_lora_enabled(false);
            let r = tch::no_grad(|| batch_logprobs(policy, &mb, false));
            policy.set_lora_enabled(true);
            mb.reference = Some(r?);
        }
        out.push(mb);
    }
    Ok(out)
}

/// The on-policy loss of `seqs` (no ratio clipping) with the policy as it
/// is now (fast weights included), in micro-batches of at most `size`
/// sequences: `piece` gets each micro-batch's loss with its graph (they add
/// up to the one-pass loss), and the summed term values, `total` included,
/// come back. MAML's `L_inner`, whose passes then hold one micro-batch's
/// activations at a time.
#[allow(clippy::too_many_arguments)]
pub(super) fn seqs_loss(
    policy: &mut Policy,
    seqs: &[UpdateSeq],
    size: usize,
    norm: Normalization,
    w: &LossWeights,
    shared_prefix: bool,
    piece: &mut dyn FnMut(Tensor) -> Result<(), TrainError>,
) -> Result<BTreeMap<String, f64>, TrainError> {
    let mut sum: BTreeMap<String, f64> = BTreeMap::new();
    let all = 0..seqs.len();
    for mb in micro_batches(policy, seqs, all, size, norm, w.kl > 0.0, shared_prefix)? {
        let logp = batch_logprobs(policy, &mb, true)?;
        let old = logp.detach();
        let (l, parts) = mb_loss(&mb, &logp, old, None, norm, w)?;
        add_terms(&mut sum, with_total(&l, parts));
        piece(l)?;
    }
    Ok(sum)
}

/// [`seqs_loss`] of K tasks, each at its own fast weights `fast[i]`, with
/// the forward passes of the K tasks run as one batch through stacked
/// adapters ([`Policy::with_stacked_adapters`]): round j runs the j-th
/// micro-batch of every task that has one, padded to the longest. Each
/// task's loss keeps its own normalisers, so the pieces handed to `piece`
/// (one per round, the sum over its tasks) add up to `Σ_i L_i(θ_i)`, and
/// each task's term values come back. Prompts are not shared across rows
/// here (the plain forward), and a round holds up to K micro-batches'
/// activations.
#[allow(clippy::too_many_arguments)]
pub(super) fn seqs_loss_batched(
    policy: &mut Policy,
    tasks: &[&[UpdateSeq]],
    fast: &[&[(String, Tensor)]],
    size: usize,
    norm: Normalization,
    w: &LossWeights,
    piece: &mut dyn FnMut(Tensor) -> Result<(), TrainError>,
) -> Result<Vec<BTreeMap<String, f64>>, TrainError> {
    if tasks.len() != fast.len() {
        return Err(TrainError::Invalid(format!(
            "{} tasks but {} sets of fast weights",
            tasks.len(),
            fast.len()
        )));
    }
    let mut per_task = Vec::with_capacity(tasks.len());
    for seqs in tasks {
        let all = 0..seqs.len();
        per_task.push(micro_batches(
            policy,
            seqs,
            all,
            size,
            norm,
            w.kl > 0.0,
            false,
        )?);
    }
    let mut sums: Vec<BTreeMap<String, f64>> = vec![BTreeMap::new(); tasks.len()];
    let rounds = per_task.iter().map(Vec::len).max().unwrap_or(0);
    let device = policy.device();
    for j in 0..rounds {
        let group: Vec<usize> = (0..tasks.len())
            .filter(|&i| j < per_task[i].len())
            .collect();
        let mbs: Vec<&MicroBatch> = group.iter().map(|&i| &per_task[i][j]).collect();
        let t_max = mbs.iter().map(|m| m.ids.size()[1]).max().unwrap_or(2);
        let start = mbs.iter().map(|m| m.start).min().unwrap_or(0);
        let ids = Tensor::cat(
            &mbs.iter()
                .map(|m| m.ids.constant_pad_nd([0, t_max - m.ids.size()[1]]))
                .collect::<Vec<_>>(),
            0,
        );
        let valid = Tensor::cat(
            &mbs.iter()
                .map(|m| {
                    m.valid
                        .to_kind(Kind::Int64)
                        .constant_pad_nd([0, t_max - m.valid.size()[1]])
                        .to_kind(Kind::Bool)
                })
                .collect::<Vec<_>>(),
            0,
        );
        let mut rows = Vec::new();
        for (k, m) in mbs.iter().enumerate() {
            rows.extend(std::iter::repeat_n(k as i64, m.ids.size()[0] as usize));
        }
        let rows = Tensor::from_slice(&rows).to_device(device);
        let sets: Vec<&[(String, Tensor)]> = group.iter().map(|&i| fast[i]).collect();
        let w_all = t_max - 1 - start;
        let logp = policy.with_stacked_adapters(&sets, &rows, |p| {
            p.model
                .token_logprobs_from(&ids, &valid, start, w_all, true)
        })??;
        let mut total: Option<Tensor> = None;
        let mut row = 0;
        for (k, m) in mbs.iter().enumerate() {
            let b = m.ids.size()[0];
            let w_own = m.ids.size()[1] - 1 - m.start;
            let lp = logp.narrow(0, row, b).narrow(1, m.start - start, w_own);
            row += b;
            let (l, parts) = mb_loss(m, &lp, lp.detach(), None, norm, w)?;
            add_terms(&mut sums[group[k]], with_total(&l, parts));
            total = Some(match total {
                Some(t) => t + l,
                None => l,
            });
        }
        if let Some(t) = total {
            piece(t)?;
        }
    }
    Ok(sums)
}

/// The policy update on one generated batch: `ppo_epochs` optimizer
/// steps, each accumulating the gradients of the batch's micro-batches.
/// Every term is scaled by its micro-batch's share of the whole batch's
/// normaliser, so the accumulated loss and gradient equal those of the
/// batch in one pass. In a data-parallel run each rank back-propagates
/// `seqs[share]` and the gradients are summed over the ranks before
/// clipping, so every rank takes the one-process step. Returns the first
/// epoch's loss terms (the on-policy values, summed over the ranks) and
/// gradient norm, and, where the sequences carry the engine's log-probs,
/// the [`Mismatch`] between those and the update's own.
#[allow(clippy::too_many_arguments)]
pub(super) fn update(
    policy: &mut Policy,
    optimizer: &mut dyn Optimizer,
    t: &TrainConfig,
    seqs: &[UpdateSeq],
    lr: f64,
    w: &LossWeights,
    dist: &Group,
    bucket_bytes: usize,
    tis_cap: f64,
) -> Result<Updated, TrainError> {
    let share = super::shard::local_seqs(dist, seqs.len(), t.group_size);
    // Forward passes only: backward replays the dtypes they recorded.
    let (dev, ac) = (policy.device(), kind_of(t.autocast));
    let mut micro = with_autocast(dev, ac, || {
        micro_batches(
            policy,
            seqs,
            share,
            t.micro_batch,
            t.normalization,
            w.kl > 0.0,
            t.shared_prefix,
        )
    })??;
    let clip = (t.ppo_epochs > 1).then_some(t.clip_eps);
    let params = trainable(policy);
    let mut first: Option<(BTreeMap<String, f64>, f64)> = None;
    let mut mismatch = Mismatch::default();
    for _epoch in 0..t.ppo_epochs {
        zero_grad(&params);
        let mut loss: BTreeMap<String, f64> = BTreeMap::new();
        for mb in micro.iter_mut() {
            let logp = with_autocast(dev, ac, || batch_logprobs(policy, mb, true))??;
            if mb.old.is_none() {
                let old = logp.detach();
                if let Some(r) = &mb.rollout {
                    mb.tis = mismatch.add(&old, r, &mb.mask, tis_cap);
                }
                mb.old = Some(old);
            }
            let old = mb.old.as_ref().expect("set above").shallow_clone();
            let (total, parts) = mb_loss(mb, &logp, old, clip, t.normalization, w)?;
            add_terms(&mut loss, with_total(&total, parts));
            if total.requires_grad() {
                total.backward();
            }
        }
        super::shard::sum_grads(dist, &params, bucket_bytes)?;
        let grad_norm = clip_grad_norm(&params, t.grad_clip);
        // A step whose gradient is not finite is skipped, not applied.
        if grad_norm.is_finite() {
            optimizer.step(&params, lr)?;
        }
        zero_grad(&params);
        if first.is_none() {
            first = Some((super::shard::sum_terms(dist, loss)?, grad_norm));
        }
    }
    let (loss, grad_norm) = first.expect("ppo_epochs >= 1");
    Ok(Updated {
        loss,
        grad_norm,
        mismatch: mismatch.reduce(dist)?,
    })
}

/// What [`update`] reports: the first epoch's loss terms and gradient norm,
/// and the engine/trainer log-prob [`Mismatch`] (empty when unchecked).
pub(super) struct Updated {
    pub loss: BTreeMap<String, f64>,
    pub grad_norm: f64,
    pub mismatch: BTreeMap<String, f64>,
}

/// How far the engine's log-probs of the sampled tokens are from the
/// trainer's for the same weights: kernels, batching and precision differ
/// (vLLM's "rollout/train mismatch"). Sums over this rank's tokens.
#[derive(Default)]
struct Mismatch {
    tokens: f64,
    abs_sum: f64,
    abs_max: f64,
    /// k3 estimate of KL(π_rollout ‖ π_train), summed over tokens.
    kl_sum: f64,
}

impl Mismatch {
    /// Count the masked tokens of `train` against `rollout`; with `cap > 0`
    /// returns the truncated importance weights `min(π_train/π_rollout, cap)`
    /// (1 off the mask).
    fn add(&mut self, train: &Tensor, rollout: &Tensor, mask: &Tensor, cap: f64) -> Option<Tensor> {
        let off = mask.logical_not();
        let train = train.to_kind(Kind::Float);
        let d = (&train - rollout).masked_fill(&off, 0.0);
        let rho = d.exp();
        self.tokens += mask.sum(Kind::Float).double_value(&[]);
        self.abs_sum += d.abs().sum(Kind::Double).double_value(&[]);
        self.abs_max = self.abs_max.max(d.abs().max().double_value(&[]));
        self.kl_sum += (&rho - 1.0 - &d).sum(Kind::Double).double_value(&[]);
        (cap > 0.0).then(|| rho.clamp_max(cap).masked_fill(&off, 1.0))
    }

    /// `mismatch/{abs_mean,abs_max,kl}` over every rank; empty when nothing
    /// was checked.
    fn reduce(self, dist: &Group) -> Result<BTreeMap<String, f64>, TrainError> {
        let mut sums = [self.tokens, self.abs_sum, self.kl_sum];
        let mut max = [self.abs_max];
        if dist.world() > 1 {
            dist.all_reduce_f64(&mut sums, crate::dist::Reduce::Sum)?;
            dist.all_reduce_f64(&mut max, crate::dist::Reduce::Max)?;
        }
        let [n, abs, kl] = sums;
        if n == 0.0 {
            return Ok(BTreeMap::new());
        }
        Ok(BTreeMap::from([
            ("abs_mean".to_owned(), abs / n),
            ("abs_max".to_owned(), max[0]),
            ("kl".to_owned(), kl / n),
        ]))
    }
}
