//! The loss terms of FALCON's inner loss (Algorithm 1, line 10:
//! `L_inner = Σ_j L_j`, j ∈ {sl, coarse, error, complexity, style, negative}),
//! each a pure function over tensors returning a scalar, plus the plain
//! policy-gradient / PPO surrogate of the baseline trainer and a KL penalty.
//!
//! Layout: `[B, T]` tensors hold one value per token position of a batch of
//! `B` sequences (prompt + completion, right-padded to `T`); column `t` holds
//! `log p(w_t | w_{<t})`, so the caller shifts logits by one before
//! [`token_logprobs`]. A bool mask selects the tokens a loss sees; every
//! masked-out value is replaced by 0 *before* any non-linearity, so padding
//! can hold anything (even ±inf) without turning a loss or a gradient to NaN.
//!
//! Normalisation: Eqs. 2, 3 and 8 are sums over tokens. Sums make the step
//! size grow with completion length and batch size, so every loss here is a
//! mean over the tokens it covers (documented per function); a loss over no
//! tokens is exactly 0 and still backpropagates (zero gradients).

use std::collections::BTreeMap;

use tch::{Kind, Tensor};

use crate::reward::spans::TokenSpan;

/// Inputs of the policy-gradient losses for one batch of `B` sequences of `T` tokens.
#[derive(Debug)]
pub struct PgBatch {
    /// `[B, T]` f32: `log π_θ(w_t)` under the current policy, with grad.
    pub logprobs: Tensor,
    /// `[B, T]` f32: `log π_old(w_t)` under the sampling policy (no grad).
    pub old_logprobs: Tensor,
    /// `[B, T]` f32: `log π_ref(w_t)` under the frozen reference, for [`kl_penalty`].
    pub ref_logprobs: Option<Tensor>,
    /// `[B, T]` bool: true on completion tokens.
    pub mask: Tensor,
    /// `[B]` f32: one advantage per sequence (see `train::advantage`).
    pub advantages: Tensor,
    /// `[B, T]`: a constant weight per token of the policy-gradient
    /// objective (truncated importance sampling against the engine's
    /// log-probs); `None` is 1 everywhere.
    pub token_weight: Option<Tensor>,
}

/// Shapes in a [`PgBatch`] or span inputs that do not fit together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LossError {
    /// A tensor has the wrong shape.
    #[error("{name} has shape {got:?}, expected {want:?}")]
    Shape {
        /// Which input.
        name: &'static str,
        /// Its shape.
        got: Vec<i64>,
        /// The shape it should have.
        want: Vec<i64>,
    },
    /// A per-sequence list has the wrong length.
    #[error("{name} has {got} entries for a batch of {batch} sequences")]
    BatchLength {
        /// Which input.
        name: &'static str,
        /// Its length.
        got: usize,
        /// Batch size `B`.
        batch: i64,
    },
}

impl PgBatch {
    /// Checks that every tensor has the shape the losses expect.
    pub fn validate(&self) -> Result<(), LossError> {
        let bt = self.logprobs.size();
        if bt.len() != 2 {
            return Err(LossError::Shape {
                name: "logprobs",
                got: bt,
                want: vec![-1, -1],
            });
        }
        let b = bt[0];
        let mut named = vec![("old_logprobs", &self.old_logprobs), ("mask", &self.mask)];
        if let Some(r) = &self.ref_logprobs {
            named.push(("ref_logprobs", r));
        }
        if let Some(w) = &self.token_weight {
            named.push(("token_weight", w));
        }
        for (name, t) in named {
            if t.size() != bt {
                return Err(LossError::Shape {
                    name,
                    got: t.size(),
                    want: bt.clone(),
                });
            }
        }
        if self.advantages.size() != [b] {
            return Err(LossError::Shape {
                name: "advantages",
                got: self.advantages.size(),
                want: vec![b],
            });
        }
        Ok(())
    }
}

pub use crate::config::Normalization;

pub use crate::model::decoder::token_logprobs;

/// The policy-gradient surrogate: `−mean(A · ratio)` over masked tokens,
/// `ratio = exp(logp − old_logprobs)`.
///
/// With `clip = Some(ε)` it is PPO's clipped objective,
/// `−mean(min(ratio·A, clip(ratio, 1−ε, 1+ε)·A))`.
/// On the first update after sampling `ratio = 1`, so the value is
/// `−mean(A)` and the gradient is REINFORCE's `−mean(A · ∇log p)`: FALCON's
/// Eq. 2 with `R_fine = A` spread over the whole completion.
pub fn pg_loss(batch: &PgBatch, clip: Option<f64>, norm: Normalization) -> Tensor {
    let mask = as_bool(&batch.mask);
    // Zero the log-ratio on padding before exp, so garbage there cannot give inf·0.
    let log_ratio =
        (&batch.logprobs - batch.old_logprobs.detach()).masked_fill(&mask.logical_not(), 0.0);
    // exp(sg(x))·(1 + x − sg(x)): the value and gradient of exp(x), but its
    // derivative treats the weight as a constant. Differentiating the policy
    // gradient again (second-order MAML, where `old` is the current policy)
    // then gives the derivative of the estimator A·∇log p, without the
    // spurious ∇log p ∇log pᵀ term of the surrogate's own curvature.
    let w = log_ratio.detach();
    let ratio = w.exp() * (&log_ratio - &w + 1.0);
    let adv = batch
        .advantages
        .detach()
        .to_kind(batch.logprobs.kind())
        .unsqueeze(1);
    let unclipped = &ratio * &adv;
    let objective = match clip {
        None => unclipped,
        Some(eps) => unclipped.minimum(&(ratio.clamp(1.0 - eps, 1.0 + eps) * &adv)),
    };
    let objective = match &batch.token_weight {
        Some(tw) => objective * tw.detach().to_kind(batch.logprobs.kind()),
        None => objective,
    };
    let objective = objective.masked_fill(&mask.logical_not(), 0.0);
    match norm {
        Normalization::TokenMean => -(objective.sum(acc(&objective)) / count(&mask)),
        Normalization::SequenceMean => {
            let per_seq_n = mask.sum_dim_intlist(1, false, Kind::Float);
            let per_seq =
                objective.sum_dim_intlist(1, false, acc(&objective)) / per_seq_n.clamp_min(1.0);
            let n_seq = per_seq_n.gt(0.0).sum(Kind::Float).clamp_min(1.0);
            -(per_seq.sum(acc(&per_seq)) / n_seq)
        }
    }
}

/// FALCON's fine-grained loss (Eq. 2 = Eq. 8):
/// `−Σ_spans Σ_{t∈span} R_fine · log p(ŵ_t)`, divided by the number of
/// (span, token) terms of that double sum over the whole batch.
///
/// `spans[b]` are sequence `b`'s spans in completion-token coordinates
/// (half-open, `TokenSpan::end_token` exclusive); completion token `j` sits
/// at column `completion_offset[b] + j` of `logprobs` (`[B, T]`). Spans are
/// clipped to the columns `0..T`; a span left empty is skipped. Overlapping
/// spans both count (their rewards add on the shared tokens). No spans at
/// all give 0.
///
/// Errors only when `logprobs` is not 2-D or `spans` / `completion_offset`
/// do not have `B` entries; out-of-range spans never fail.
pub fn fine_grained_loss(
    logprobs: &Tensor,
    spans: &[Vec<TokenSpan>],
    completion_offset: &[i64],
) -> Result<Tensor, LossError> {
    let size = logprobs.size();
    let [b, t] = size[..] else {
        return Err(LossError::Shape {
            name: "logprobs",
            got: size,
            want: vec![-1, -1],
        });
    };
    for (name, got) in [
        ("spans", spans.len()),
        ("completion_offset", completion_offset.len()),
    ] {
        if got as i64 != b {
            return Err(LossError::BatchLength {
                name,
                got,
                batch: b,
            });
        }
    }

    // R_fine per position (summed over overlapping spans).
    let mut weight = vec![0f32; (b * t) as usize];
    for (row, (row_spans, &offset)) in spans.iter().zip(completion_offset).enumerate() {
        for span in row_spans {
            let start = clip_column(offset, span.start_token, t);
            let end = clip_column(offset, span.end_token, t);
            for col in start..end {
                weight[row * t as usize + col] += span.reward as f32;
            }
        }
    }
    let n_terms = fine_grained_terms(spans, completion_offset, t);
    let weight = Tensor::from_slice(&weight)
        .view([b, t])
        .to_device(logprobs.device());
    let on_span = weight.ne(0.0);
    // Masked before multiplying, so a -inf log-prob off the spans stays harmless.
    let terms = (logprobs.masked_fill(&on_span.logical_not(), 0.0) * weight).sum(acc(logprobs));
    Ok(-(terms / n_terms.max(1) as f64))
}

/// The number of (span, token) terms [`fine_grained_loss`] divides by, for
/// `T = t` columns: what a caller splitting a batch into micro-batches needs
/// to keep the whole batch's normalisation.
pub fn fine_grained_terms(spans: &[Vec<TokenSpan>], completion_offset: &[i64], t: i64) -> usize {
    spans
        .iter()
        .zip(completion_offset)
        .flat_map(|(row, &offset)| {
            row.iter().map(move |span| {
                clip_column(offset, span.end_token, t).saturating_sub(clip_column(
                    offset,
                    span.start_token,
                    t,
                ))
            })
        })
        .sum()
}

/// Column of completion token `j` for a completion starting at `offset`,
/// clipped to `0..=t`.
fn clip_column(offset: i64, j: usize, t: i64) -> usize {
    let j = i64::try_from(j).unwrap_or(i64::MAX);
    offset.saturating_add(j).clamp(0, t) as usize
}

/// `L_sl` (Eq. 3): cross-entropy `−log p(w_t)` averaged over the masked
/// tokens (passing samples' completions, task demonstrations). Eq. 3 sums;
/// the mean keeps its scale independent of the number of tokens.
pub fn sl_loss(logprobs: &Tensor, mask: &Tensor) -> Tensor {
    let mask = as_bool(mask);
    -(logprobs
        .masked_fill(&mask.logical_not(), 0.0)
        .sum(acc(logprobs))
        / count(&mask))
}

/// A penalty keeping the policy near the frozen reference: the "k3"
/// estimator of `KL(π_θ ‖ π_ref)` on tokens sampled from the policy,
/// `exp(ref − logp) − (ref − logp) − 1`, averaged over masked tokens.
///
/// Chosen after Schulman's note on approximating KL divergence: k3 is
/// unbiased like `logp − ref` (k1), yet never negative per token (`e^x ≥ 1+x`)
/// and of lower variance, so a mean over few tokens is a usable penalty.
/// `ref_logprobs` is treated as a constant. Differentiated as a loss, k3's
/// expected gradient is that of `KL(π_ref ‖ π_θ)` (GRPO uses it the same
/// way); both directions vanish, with zero gradient, at `π_θ = π_ref`.
pub fn kl_penalty(logprobs: &Tensor, ref_logprobs: &Tensor, mask: &Tensor) -> Tensor {
    let mask = as_bool(mask);
    let log_ratio = (ref_logprobs.detach() - logprobs).masked_fill(&mask.logical_not(), 0.0);
    // Padding has log_ratio 0, whose k3 is exactly 0.
    let k3 = log_ratio.exp() - &log_ratio - 1.0;
    k3.sum(acc(&k3)) / count(&mask)
}

/// `Σ weight · term` over `(name, term, weight)`, and every term's raw
/// (unweighted) value by name for logging.
///
/// A term with weight 0 is logged but left out of the sum, so a log-only term
/// that came out NaN cannot poison the loss. No terms give a CPU zero.
///
/// # Panics
/// When two terms share a name: one of them would vanish from the log.
pub fn total_loss(terms: &[(&str, Tensor, f64)]) -> (Tensor, BTreeMap<String, f64>) {
    let mut values = BTreeMap::new();
    let mut total: Option<Tensor> = None;
    for (name, term, weight) in terms {
        let raw = term.detach().to_kind(Kind::Double).double_value(&[]);
        assert!(
            values.insert(name.to_string(), raw).is_none(),
            "loss term {name:?} given twice"
        );
        if *weight != 0.0 {
            let weighted = term * *weight;
            total = Some(match total {
                None => weighted,
                Some(acc) => acc + weighted,
            });
        }
    }
    let total = total.unwrap_or_else(|| Tensor::zeros([], (Kind::Float, tch::Device::Cpu)));
    (total, values)
}

/// The mask as bool, whatever integer or float kind the caller built it in.
fn as_bool(mask: &Tensor) -> Tensor {
    if mask.kind() == Kind::Bool {
        mask.shallow_clone()
    } else {
        mask.ne(0.0)
    }
}

/// Number of true entries, at least 1 (an empty mask gives 0 / 1 = 0).
/// The accumulation kind of a sum: fp32, or fp64 for a double-precision
/// model (gradient checks).
fn acc(t: &Tensor) -> Kind {
    if t.kind() == Kind::Double {
        Kind::Double
    } else {
        Kind::Float
    }
}

fn count(mask: &Tensor) -> Tensor {
    mask.sum(Kind::Float).clamp_min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOL: f64 = 1e-5;

    fn t2(rows: &[&[f32]]) -> Tensor {
        let cols = rows[0].len() as i64;
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        Tensor::from_slice(&flat).view([rows.len() as i64, cols])
    }

    fn mask2(rows: &[&[bool]]) -> Tensor {
        let cols = rows[0].len() as i64;
        let flat: Vec<bool> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        Tensor::from_slice(&flat).view([rows.len() as i64, cols])
    }

    fn val(t: &Tensor) -> f64 {
        t.to_kind(Kind::Double).double_value(&[])
    }

    fn at(t: &Tensor, idx: &[i64]) -> f64 {
        t.to_kind(Kind::Double).double_value(idx)
    }

    fn assert_close(got: f64, want: f64) {
        assert!((got - want).abs() < TOL, "got {got}, want {want}");
    }

    /// Deterministic `[B, T, V]` logits, a leaf with grad.
    fn logits(b: i64, t: i64, v: i64) -> Tensor {
        let n = (b * t * v) as usize;
        let data: Vec<f32> = (0..n).map(|i| 2.0 * (i as f32 * 0.731).sin()).collect();
        Tensor::from_slice(&data)
            .view([b, t, v])
            .set_requires_grad(true)
    }

    fn targets() -> Tensor {
        Tensor::from_slice(&[1i64, 3, 0, 2, 2, 1]).view([2, 3])
    }

    /// log-softmax of `logits[b, t]` at `y`, in f64 by hand.
    fn manual_logp(logits: &Tensor, b: i64, t: i64, y: i64) -> f64 {
        let v = logits.size()[2];
        let row: Vec<f64> = (0..v).map(|k| at(logits, &[b, t, k])).collect();
        let lse = row.iter().map(|x| x.exp()).sum::<f64>().ln();
        row[y as usize] - lse
    }

    #[test]
    fn token_logprobs_match_manual_log_softmax() {
        let z = logits(2, 3, 4);
        let y = targets();
        let lp = token_logprobs(&z, &y);
        assert_eq!(lp.size(), [2, 3]);
        assert_eq!(lp.kind(), Kind::Float);
        for b in 0..2 {
            for t in 0..3 {
                let want = manual_logp(&z, b, t, at(&y, &[b, t]) as i64);
                assert_close(at(&lp, &[b, t]), want);
            }
        }
        // bf16 logits still give f32 log-probs.
        let lp16 = token_logprobs(&z.to_kind(Kind::BFloat16), &y);
        assert_eq!(lp16.kind(), Kind::Float);
    }

    #[test]
    fn pg_loss_on_first_epoch_is_reinforce_with_the_softmax_gradient() {
        let z = logits(2, 3, 4);
        let y = targets();
        let lp = token_logprobs(&z, &y);
        let mask = mask2(&[&[false, true, true], &[false, true, false]]);
        let adv = [1.5f32, -0.5];
        let batch = PgBatch {
            old_logprobs: lp.detach(),
            logprobs: lp,
            ref_logprobs: None,
            token_weight: None,
            mask,
            advantages: Tensor::from_slice(&adv),
        };
        batch.validate().unwrap();
        let loss = pg_loss(&batch, None, Normalization::TokenMean);
        // ratio = 1: value −(1.5 + 1.5 − 0.5) / 3
        assert_close(val(&loss), -2.5 / 3.0);
        loss.backward();
        let g = z.grad();
        // d(−A·log softmax(z)_y / N)/dz_k = −A/N · (1[k = y] − softmax(z)_k); 0 off the mask.
        let n = 3.0;
        for b in 0..2i64 {
            for t in 0..3i64 {
                let on = at(&batch.mask.to_kind(Kind::Float), &[b, t]) != 0.0;
                let yv = at(&y, &[b, t]) as i64;
                let row: Vec<f64> = (0..4).map(|k| at(&z, &[b, t, k])).collect();
                let s: f64 = row.iter().map(|x| x.exp()).sum();
                for k in 0..4i64 {
                    let want = if on {
                        let p = row[k as usize].exp() / s;
                        -(adv[b as usize] as f64) / n * (f64::from(u8::from(k == yv)) - p)
                    } else {
                        0.0
                    };
                    assert_close(at(&g, &[b, t, k]), want);
                }
            }
        }

        // Same gradient as the plain surrogate −Σ m·A·log p / N.
        let z2 = logits(2, 3, 4);
        let lp2 = token_logprobs(&z2, &y);
        let m = batch.mask.to_kind(Kind::Float);
        let a = Tensor::from_slice(&adv).unsqueeze(1);
        let reinforce = -(lp2 * a * &m).sum(Kind::Float) / n;
        reinforce.backward();
        assert!(z2.grad().allclose(&g, 1e-6, 1e-7, false));
    }

    #[test]
    fn pg_loss_value_matches_a_loop_for_both_normalizations() {
        let lp = t2(&[&[-1.0, -2.0, -0.5], &[-0.3, -4.0, 9.0]]);
        let old = t2(&[&[-1.2, -1.5, -0.5], &[-0.1, -4.0, f32::NEG_INFINITY]]);
        let mask = mask2(&[&[true, true, true], &[true, false, false]]);
        let adv = [2.0f64, -1.0];
        let batch = PgBatch {
            logprobs: lp.shallow_clone(),
            old_logprobs: old.shallow_clone(),
            ref_logprobs: None,
            token_weight: None,
            mask: mask.shallow_clone(),
            advantages: Tensor::from_slice(&adv),
        };
        let mut per_seq = [(0.0, 0.0); 2];
        let (mut sum, mut n) = (0.0, 0.0);
        for b in 0..2 {
            for t in 0..3 {
                if at(&mask.to_kind(Kind::Float), &[b, t]) != 0.0 {
                    let o = adv[b as usize] * (at(&lp, &[b, t]) - at(&old, &[b, t])).exp();
                    sum += o;
                    n += 1.0;
                    per_seq[b as usize].0 += o;
                    per_seq[b as usize].1 += 1.0;
                }
            }
        }
        let token = pg_loss(&batch, None, Normalization::TokenMean);
        assert_close(val(&token), -sum / n);
        let seq = pg_loss(&batch, None, Normalization::SequenceMean);
        let want = -(per_seq[0].0 / per_seq[0].1 + per_seq[1].0 / per_seq[1].1) / 2.0;
        assert_close(val(&seq), want);
        assert!(
            (val(&token) - val(&seq)).abs() > 1e-3,
            "the two must differ here"
        );
    }

    #[test]
    fn ppo_clip_is_active_only_where_it_should_be() {
        // One token per sequence, old log-prob 0, so ratio = exp(logp).
        let eps = 0.2;
        let cases: [(f64, f64, f64, f64); 5] = [
            // (A, ratio, objective, d objective / d logp)
            (1.0, 1.5, 1.2, 0.0),    // A > 0, ratio above 1+ε: clipped
            (1.0, 0.5, 0.5, 0.5),    // A > 0, ratio below 1−ε: not clipped
            (-1.0, 0.5, -0.8, 0.0),  // A < 0, ratio below 1−ε: clipped
            (-1.0, 1.5, -1.5, -1.5), // A < 0, ratio above 1+ε: not clipped
            (1.0, 1.1, 1.1, 1.1),    // inside the band
        ];
        let n = cases.len() as f64;
        let ratios: Vec<f32> = cases.iter().map(|c| c.1.ln() as f32).collect();
        let lp = Tensor::from_slice(&ratios)
            .view([cases.len() as i64, 1])
            .set_requires_grad(true);
        let batch = PgBatch {
            logprobs: lp.shallow_clone(),
            old_logprobs: lp.zeros_like(),
            ref_logprobs: None,
            token_weight: None,
            mask: lp.ones_like().to_kind(Kind::Bool),
            advantages: Tensor::from_slice(&cases.map(|c| c.0 as f32)),
        };
        let loss = pg_loss(&batch, Some(eps), Normalization::TokenMean);
        let want: f64 = cases.iter().map(|c| c.2).sum::<f64>();
        assert_close(val(&loss), -want / n);
        loss.backward();
        let g = lp.grad();
        for (i, c) in cases.iter().enumerate() {
            assert_close(at(&g, &[i as i64, 0]), -c.3 / n);
        }
        // Without clipping every token has gradient −A·ratio / n.
        let unclipped = pg_loss(&batch, None, Normalization::TokenMean);
        let want: f64 = cases.iter().map(|c| c.0 * c.1).sum::<f64>();
        assert_close(val(&unclipped), -want / n);
    }

    fn span(start_token: usize, end_token: usize, reward: f64) -> TokenSpan {
        TokenSpan {
            start_token,
            end_token,
            reward,
        }
    }

    #[test]
    fn fine_grained_loss_follows_eq2_with_clipped_spans() {
        let lp = t2(&[
            &[-0.1, -0.2, -0.3, -0.4, -0.5, -0.6],
            &[-1.0, -2.0, -3.0, -4.0, -5.0, -6.0],
        ])
        .set_requires_grad(true);
        let spans = vec![
            // completion starts at column 2: cols 2,3 (R 1.0) and col 5 (cut at T = 6)
            vec![span(0, 2, 1.0), span(3, 10, -0.5), span(10, 20, 9.0)],
            // offset −1: completion tokens 0..3 are cols −1..2, clipped to 0,1
            vec![span(0, 3, 2.0), span(2, 2, 5.0)],
        ];
        let loss = fine_grained_loss(&lp, &spans, &[2, -1]).unwrap();
        // Σ R·log p = 1·(−0.3 − 0.4) − 0.5·(−0.6) + 2·(−1 − 2) = −0.7 + 0.3 − 6 = −6.4
        // terms: 2 + 1 + 2 = 5
        assert_close(val(&loss), 6.4 / 5.0);
        loss.backward();
        let g = lp.grad();
        let want = [
            [0.0, 0.0, -1.0, -1.0, 0.0, 0.5],
            [-2.0, -2.0, 0.0, 0.0, 0.0, 0.0],
        ];
        for (b, row) in want.iter().enumerate() {
            for (t, w) in row.iter().enumerate() {
                assert_close(at(&g, &[b as i64, t as i64]), w / 5.0);
            }
        }
    }

    #[test]
    fn fine_grained_overlapping_spans_add_up() {
        let lp = t2(&[&[-1.0, -2.0, -3.0]]);
        let spans = vec![vec![span(0, 3, 1.0), span(1, 2, -0.5)]];
        let loss = fine_grained_loss(&lp, &spans, &[0]).unwrap();
        // −(1·(−6) − 0.5·(−2)) / 4
        assert_close(val(&loss), 5.0 / 4.0);
    }

    #[test]
    fn fine_grained_without_spans_is_zero_and_backpropagates() {
        let mut lp = t2(&[&[-1.0, f32::NEG_INFINITY], &[-3.0, -4.0]]).set_requires_grad(true);
        for spans in [
            vec![vec![], vec![]],
            vec![vec![span(5, 9, 1.0)], vec![span(1, 1, 3.0)]],
        ] {
            let loss = fine_grained_loss(&lp, &spans, &[0, 0]).unwrap();
            assert_eq!(val(&loss), 0.0);
            lp.zero_grad();
            loss.backward();
            let g = lp.grad();
            assert_eq!(val(&g.abs().sum(Kind::Float)), 0.0);
        }
    }

    #[test]
    fn fine_grained_rejects_per_sequence_lists_of_the_wrong_length() {
        let lp = t2(&[&[-1.0], &[-2.0]]);
        let err = fine_grained_loss(&lp, &[vec![]], &[0, 0]).unwrap_err();
        assert_eq!(
            err,
            LossError::BatchLength {
                name: "spans",
                got: 1,
                batch: 2
            }
        );
        assert!(fine_grained_loss(&lp, &[vec![], vec![]], &[0]).is_err());
    }

    #[test]
    fn sl_loss_is_mean_cross_entropy_over_masked_tokens() {
        let lp = t2(&[&[f32::NEG_INFINITY, -0.5, -1.5], &[-2.0, -1.0, f32::NAN]]);
        let mask = mask2(&[&[false, true, true], &[true, false, false]]);
        assert_close(val(&sl_loss(&lp, &mask)), (0.5 + 1.5 + 2.0) / 3.0);
        // An integer mask works the same.
        assert_close(
            val(&sl_loss(&lp, &mask.to_kind(Kind::Int64))),
            (0.5 + 1.5 + 2.0) / 3.0,
        );
    }

    #[test]
    fn kl_penalty_is_zero_for_equal_policies_and_positive_otherwise() {
        let lp = t2(&[&[-0.5, -1.0, -2.0], &[-0.2, -3.0, 0.0]]);
        let mask = mask2(&[&[true, true, false], &[true, true, true]]);
        assert_eq!(val(&kl_penalty(&lp, &lp, &mask)), 0.0);

        let reference = t2(&[&[-0.7, -0.4, f32::INFINITY], &[-0.2, -2.0, -1.0]]);
        let kl = val(&kl_penalty(&lp, &reference, &mask));
        let mut want = 0.0;
        for (b, t) in [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)] {
            let d = at(&reference, &[b, t]) - at(&lp, &[b, t]);
            want += d.exp() - d - 1.0;
        }
        assert!(kl > 0.0);
        assert_close(kl, want / 5.0);
    }

    #[test]
    fn padded_tokens_change_nothing() {
        let y = targets();
        let mask = mask2(&[&[false, true, true], &[true, true, false]]);
        let run = |bump: f64| {
            let z = logits(2, 3, 4);
            // Change every logit of the padded positions (0,0) and (1,2).
            let delta = Tensor::zeros([2, 3, 4], (Kind::Float, tch::Device::Cpu));
            let _ = delta.get(0).get(0).fill_(bump);
            let _ = delta.get(1).get(2).fill_(-bump);
            let zb = &z + delta;
            let lp = token_logprobs(&zb, &y);
            let reference = (&lp * 1.1).detach();
            let batch = PgBatch {
                old_logprobs: (&lp + 0.05).detach(),
                logprobs: lp.shallow_clone(),
                ref_logprobs: Some(reference.shallow_clone()),
                mask: mask.shallow_clone(),
                advantages: Tensor::from_slice(&[0.7f32, -1.3]),
                token_weight: None,
            };
            let (total, logged) = total_loss(&[
                (
                    "pg",
                    pg_loss(&batch, Some(0.2), Normalization::SequenceMean),
                    1.0,
                ),
                ("sl", sl_loss(&lp, &mask), 0.5),
                ("kl", kl_penalty(&lp, &reference, &mask), 0.1),
            ]);
            total.backward();
            (logged, z.grad())
        };
        let (base, g) = run(0.0);
        let (bumped, _) = run(50.0);
        for (name, v) in &base {
            assert_close(bumped[name], *v);
        }
        for (b, t) in [(0, 0), (1, 2)] {
            assert_eq!(val(&g.get(b).get(t).abs().sum(Kind::Float)), 0.0);
        }
        assert!(val(&g.abs().sum(Kind::Float)) > 0.0);
    }

    #[test]
    fn total_loss_weights_terms_and_logs_raw_values() {
        let a = Tensor::from(2.0f32).set_requires_grad(true);
        let (total, logged) = total_loss(&[
            ("coarse", &a * 3.0, 0.5),
            ("style", Tensor::from(-1.0f32), 2.0),
            ("negative", Tensor::from(f32::NAN), 0.0),
        ]);
        assert_close(val(&total), 0.5 * 6.0 - 2.0);
        assert_close(logged["coarse"], 6.0);
        assert_close(logged["style"], -1.0);
        assert!(logged["negative"].is_nan());
        total.backward();
        assert_close(val(&a.grad()), 1.5);

        let (empty, logged) = total_loss(&[]);
        assert_eq!(val(&empty), 0.0);
        assert!(logged.is_empty());
    }

    #[test]
    #[should_panic(expected = "given twice")]
    fn total_loss_rejects_duplicate_names() {
        let _ = total_loss(&[
            ("sl", Tensor::from(1.0f32), 1.0),
            ("sl", Tensor::from(2.0f32), 1.0),
        ]);
    }

    #[test]
    fn token_weights_scale_each_tokens_policy_gradient() {
        let z = Tensor::randn([2, 3, 5], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let y = Tensor::from_slice(&[1i64, 2, 3, 4, 0, 1]).view([2, 3]);
        let lp = token_logprobs(&z, &y);
        let batch = |w: Option<Tensor>| PgBatch {
            old_logprobs: lp.detach(),
            logprobs: lp.shallow_clone(),
            ref_logprobs: None,
            mask: lp.ones_like().to_kind(Kind::Bool),
            advantages: Tensor::from_slice(&[0.5f32, -1.0]),
            token_weight: w,
        };
        let plain = pg_loss(&batch(None), None, Normalization::TokenMean);
        let twice = pg_loss(
            &batch(Some(lp.ones_like() * 2.0)),
            None,
            Normalization::TokenMean,
        );
        assert!((twice.double_value(&[]) - 2.0 * plain.double_value(&[])).abs() < 1e-6);
        // Weight 0 on row 1: only row 0's advantage remains.
        let w = Tensor::from_slice(&[1f32, 1., 1., 0., 0., 0.]).view([2, 3]);
        let half = pg_loss(&batch(Some(w)), None, Normalization::TokenMean);
        assert!((half.double_value(&[]) - (-0.5 * 3.0 / 6.0)).abs() < 1e-6);
    }

    #[test]
    fn validate_names_the_misshapen_tensor() {
        let lp = Tensor::zeros([2, 3], (Kind::Float, tch::Device::Cpu));
        let batch = PgBatch {
            old_logprobs: lp.zeros_like(),
            ref_logprobs: Some(Tensor::zeros([2, 4], (Kind::Float, tch::Device::Cpu))),
            mask: lp.ones_like().to_kind(Kind::Bool),
            advantages: Tensor::zeros([2], (Kind::Float, tch::Device::Cpu)),
            token_weight: None,
            logprobs: lp,
        };
        let err = batch.validate().unwrap_err();
        assert!(
            matches!(
                err,
                LossError::Shape {
                    name: "ref_logprobs",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn normalization_serializes_in_snake_case() {
        let s = serde_json::to_string(&Normalization::SequenceMean).unwrap();
        assert_eq!(s, "\"sequence_mean\"");
    }
}
