//! The mathematics of FALCON's meta-update (Algorithm 1) over fast LoRA
//! weights, apart from the loop that feeds it: fast weights θ_i from θ by
//! `inner_steps` SGD steps with rate α on `L_inner` ([`adapt`]); the
//! meta-gradient of the query loss at θ_i carried back to θ, first or second
//! order ([`meta_backward`], or for K tasks at once [`query_gradients`] then
//! [`carry_back`]); and Reptile's move of θ toward the mean θ_i
//! ([`reptile_update`]). The meta step (`step::meta`) runs them.
//!
//! Fast weights are swapped into the policy's adapters
//! ([`Policy::swap_adapters`]), so K adaptations cost K adapters, never a
//! second model. Second-order MAML carries the query gradient back through
//! the inner steps with Hessian-vector products (double backward, which
//! needs the composite attention kernel,
//! [`crate::model::Decoder::set_math_attention`]), one inner step at a time.

use std::collections::BTreeMap;

use tch::Tensor;

use super::optim::sgd_fast_weights;
use super::TrainError;
use crate::model::Policy;

/// Named tensors: the trainable weights θ or one task's fast weights θ_i.
pub type Weights = Vec<(String, Tensor)>;

/// The inner loop of Algorithm 1 (lines 9–11).
#[derive(Debug, Clone, Copy)]
pub struct InnerLoop {
    pub steps: usize,
    /// α.
    pub lr: f64,
}

/// One task's adaptation: the fast weights θ_i and the points the inner
/// steps started from, all detached (the meta-gradient is formed by
/// [`meta_backward`], which revisits them one at a time).
pub struct Adapted {
    /// θ_i = θ_K, as leaves that require grad.
    pub fast: Weights,
    /// θ_0 = θ, …, θ_{K−1}.
    path: Vec<Weights>,
    /// The inner loss before each step.
    pub losses: Vec<f64>,
}

impl Adapted {
    /// No adaptation: θ_i = θ.
    pub fn identity(theta: &[(String, Tensor)]) -> Self {
        Adapted {
            fast: leaves(theta),
            path: Vec::new(),
            losses: Vec::new(),
        }
    }
}

/// Detached copies of `w` that require grad: the inputs of one
/// differentiation, with no graph behind them.
fn leaves(w: &[(String, Tensor)]) -> Weights {
    w.iter()
        .map(|(n, t)| (n.clone(), t.detach().copy().set_requires_grad(true)))
        .collect()
}

fn grads_of(
    l: &Tensor,
    at: &[(String, Tensor)],
    create_graph: bool,
) -> Result<Vec<Tensor>, TrainError> {
    let inputs: Vec<&Tensor> = at.iter().map(|(_, t)| t).collect();
    Tensor::f_run_backward(&[l], &inputs, create_graph, create_graph)
        .map_err(TrainError::MetaGradient)
}

/// `acc += add`, where an undefined tensor is zero.
fn accumulate(acc: &mut [Tensor], add: Vec<Tensor>) {
    for (a, g) in acc.iter_mut().zip(add) {
        if g.defined() {
            *a = if a.defined() { &*a + g } else { g };
        }
    }
}

fn undefined(n: usize) -> Vec<Tensor> {
    (0..n).map(|_| Tensor::new()).collect()
}

/// A loss evaluated in pieces (micro-batches): it hands each piece's loss,
/// with its graph, to the sink, and returns the summed term values
/// (`total` included). The pieces add up to the loss, so gradients and
/// Hessian-vector products are sums over pieces, and a pass holds one
/// piece's activations at a time.
pub trait PieceLoss:
    FnMut(
    &mut Policy,
    &mut dyn FnMut(Tensor) -> Result<(), TrainError>,
) -> Result<BTreeMap<String, f64>, TrainError>
{
}

impl<F> PieceLoss for F where
    F: FnMut(
        &mut Policy,
        &mut dyn FnMut(Tensor) -> Result<(), TrainError>,
    ) -> Result<BTreeMap<String, f64>, TrainError>
{
}

/// The gradient of `loss` at `at` (swapped into the policy), summed over
/// its pieces, and its term values.
fn gradient(
    policy: &mut Policy,
    at: &[(String, Tensor)],
    loss: &mut impl PieceLoss,
) -> Result<(Vec<Tensor>, BTreeMap<String, f64>), TrainError> {
    let mut grads = undefined(at.len());
    let parts = policy.with_adapters(at, |p| {
        loss(p, &mut |l: Tensor| {
            if l.requires_grad() {
                accumulate(&mut grads, grads_of(&l, at, false)?);
            }
            Ok(())
        })
    })??;
    Ok((grads, parts))
}

/// Fast weights θ_i from θ by `inner.steps` SGD steps on `loss`, which is
/// evaluated with the current fast weights swapped into the policy. No
/// graph is kept: each piece's is freed once its gradient is taken.
pub fn adapt(
    policy: &mut Policy,
    theta: &[(String, Tensor)],
    inner: &InnerLoop,
    mut loss: impl PieceLoss,
) -> Result<Adapted, TrainError> {
    let mut at = leaves(theta);
    let mut path = Vec::with_capacity(inner.steps);
    let mut losses = Vec::with_capacity(inner.steps);
    for _ in 0..inner.steps {
        let (grads, parts) = gradient(policy, &at, &mut loss)?;
        losses.push(parts.get("total").copied().unwrap_or(0.0));
        let next = tch::no_grad(|| sgd_fast_weights(&at, &grads, inner.lr))?;
        path.push(std::mem::replace(&mut at, leaves(&next)));
    }
    Ok(Adapted {
        fast: at,
        path,
        losses,
    })
}

/// Accumulate one task's meta-gradient into θ's `.grad` and return the
/// query loss's terms.
///
/// `v = ∇L_q(θ_K)` at the fast weights. First order (`second_order` off)
/// applies v to θ. Second order carries it back through the inner steps,
/// `v ← v − α·H_s(θ_k)·v` for k = K−1 … 0 (the Jacobian of an SGD step is
/// `I − α·H`), with each Hessian-vector product taken by differentiating
/// `⟨∇L_s(θ_k), v⟩` again, piece by piece. This is exactly MAML's gradient
/// through the inner steps, but only one piece's double-backward graph is
/// alive at a time (the forward pass is recomputed), never the whole
/// unrolled loop plus the query pass. Double backward needs the composite
/// attention kernel.
pub fn meta_backward(
    policy: &mut Policy,
    theta: &[(String, Tensor)],
    adapted: &Adapted,
    inner: &InnerLoop,
    second_order: bool,
    inner_loss: impl PieceLoss,
    mut query_loss: impl PieceLoss,
) -> Result<BTreeMap<String, f64>, TrainError> {
    let (v, parts) = gradient(policy, &adapted.fast, &mut query_loss)?;
    carry_back(policy, theta, adapted, inner, second_order, inner_loss, v)?;
    Ok(parts)
}

/// Each task's `v_i` (one tensor per fast weight) and its query-loss terms.
pub type QueryGradients = (Vec<Vec<Tensor>>, Vec<BTreeMap<String, f64>>);

/// The query losses of several tasks, each at its own fast weights, in one
/// batched evaluation: `loss` gets the policy and the tasks' fast weights,
/// hands each piece (a sum over tasks) to the sink and returns each task's
/// term values. Since task i's loss depends only on its own fast weights,
/// one gradient of the pieces gives every `v_i = ∇L_q,i(θ_i)` at once.
pub fn query_gradients(
    policy: &mut Policy,
    adapted: &[&Adapted],
    loss: impl FnOnce(
        &mut Policy,
        &[&[(String, Tensor)]],
        &mut dyn FnMut(Tensor) -> Result<(), TrainError>,
    ) -> Result<Vec<BTreeMap<String, f64>>, TrainError>,
) -> Result<QueryGradients, TrainError> {
    let fast: Vec<&[(String, Tensor)]> = adapted.iter().map(|a| a.fast.as_slice()).collect();
    let all: Weights = fast
        .iter()
        .flat_map(|w| w.iter().map(|(n, t)| (n.clone(), t.shallow_clone())))
        .collect();
    let mut grads = undefined(all.len());
    let parts = loss(policy, &fast, &mut |l: Tensor| {
        if l.requires_grad() {
            accumulate(&mut grads, grads_of(&l, &all, false)?);
        }
        Ok(())
    })?;
    let mut out = Vec::with_capacity(fast.len());
    let mut it = grads.into_iter();
    for w in &fast {
        out.push(it.by_ref().take(w.len()).collect());
    }
    Ok((out, parts))
}

/// Carry one task's query gradient `v = ∇L_q(θ_i)` back to θ's `.grad`:
/// as is (first order), or through the inner steps (second order; see
/// [`meta_backward`]).
pub fn carry_back(
    policy: &mut Policy,
    theta: &[(String, Tensor)],
    adapted: &Adapted,
    inner: &InnerLoop,
    second_order: bool,
    mut inner_loss: impl PieceLoss,
    mut v: Vec<Tensor>,
) -> Result<(), TrainError> {
    if v.iter().all(|t| !t.defined()) {
        return Ok(());
    }
    if second_order {
        policy.model.set_math_attention(true);
        let back = (|| -> Result<(), TrainError> {
            for at in adapted.path.iter().rev() {
                let at = leaves(at);
                let mut hv = undefined(at.len());
                policy.with_adapters(&at, |p| {
                    inner_loss(p, &mut |l: Tensor| {
                        if !l.requires_grad() {
                            return Ok(());
                        }
                        let g = grads_of(&l, &at, true)?;
                        let mut dot: Option<Tensor> = None;
                        for (gj, vj) in g.iter().zip(&v) {
                            if gj.defined() && vj.defined() {
                                let t = (gj * vj).sum(gj.kind());
                                dot = Some(match dot {
                                    Some(d) => d + t,
                                    None => t,
                                });
                            }
                        }
                        if let Some(dot) = dot.filter(|d| d.requires_grad()) {
                            accumulate(&mut hv, grads_of(&dot, &at, false)?);
                        }
                        Ok(())
                    })
                })??;
                for (vj, h) in v.iter_mut().zip(&hv) {
                    if vj.defined() && h.defined() {
                        *vj = &*vj - h * inner.lr;
                    }
                }
            }
            Ok(())
        })();
        policy.model.set_math_attention(false);
        back?;
    }
    // θ.grad += v, through autograd's own accumulation.
    let mut surrogate: Option<Tensor> = None;
    for ((_, p), vj) in theta.iter().zip(&v) {
        if vj.defined() {
            let t = (p * vj.detach()).sum(p.kind());
            surrogate = Some(match surrogate {
                Some(s) => s + t,
                None => t,
            });
        }
    }
    if let Some(s) = surrogate {
        s.backward();
    }
    Ok(())
}

/// Reptile's outer step: θ ← θ + ε · mean_i(θ_i − θ), in place.
pub fn reptile_update(
    theta: &[(String, Tensor)],
    adapted: &[Vec<(String, Tensor)>],
    eps: f64,
) -> Result<(), TrainError> {
    if adapted.is_empty() {
        return Ok(());
    }
    tch::no_grad(|| {
        for (j, (name, p)) in theta.iter().enumerate() {
            let mut sum = p.zeros_like();
            for a in adapted {
                let (n, t) = a
                    .get(j)
                    .ok_or_else(|| TrainError::Invalid(format!("adapted weights lack `{name}`")))?;
                if n != name {
                    return Err(TrainError::Invalid(format!(
                        "adapted weight `{n}` where `{name}` was expected"
                    )));
                }
                sum += t.detach() - p;
            }
            let step = sum * (eps / adapted.len() as f64);
            let _ = p.shallow_clone().g_add_(&step);
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LossWeights, Normalization};
    use crate::model::LogitsFor;
    use crate::reward::TokenSpan;
    use crate::train::optim::zero_grad;
    use crate::train::trainable;
    use crate::train::update::{seqs_loss, seqs_loss_batched, UpdateSeq};
    use std::path::Path;
    use tch::{Device, Kind};

    /// A 2-layer, 16-wide Llama (vocab 64) with random weights and LoRA
    /// (rank 2 on q/v, B random so that every term has a gradient), in
    /// double precision so that finite differences are accurate.
    fn tiny_policy(dir: &Path) -> Policy {
        let mut p = crate::model::testing::tiny_lora_policy(dir);
        p.vs.set_kind(Kind::Double);
        tch::no_grad(|| {
            for (n, t) in trainable(&p) {
                if n.contains("lora_B") {
                    t.shallow_clone().copy_(&(t.randn_like() * 0.3));
                }
            }
        });
        p
    }

    struct Data {
        ids: Vec<(Vec<i64>, Vec<i64>)>,
        spans: Vec<Vec<TokenSpan>>,
        adv: Vec<f64>,
    }

    impl Data {
        fn new(seed: i64) -> Self {
            let r = |n: i64, k: i64| -> Vec<i64> {
                (0..n)
                    .map(|i| (i * 7 + seed * 13 + k * 5) % 61 + 1)
                    .collect()
            };
            Data {
                // Unequal lengths: padding and the attention mask are
                // exercised; the first and last share a prompt, so whole
                // batches take the shared-prefix path.
                ids: vec![
                    (r(3, 0), r(4, 1)),
                    (r(5, 2), r(2, 3)),
                    (r(2, 4), r(5, 5)),
                    (r(3, 0), r(3, 6)),
                ],
                spans: vec![
                    vec![TokenSpan {
                        start_token: 1,
                        end_token: 3,
                        reward: -0.7,
                    }],
                    vec![],
                    vec![],
                    vec![],
                ],
                adv: vec![1.0, -0.5, 0.3 + seed as f64 * 0.1, -0.4],
            }
        }

        fn seqs(&self) -> Vec<UpdateSeq<'_>> {
            (0..self.ids.len())
                .map(|i| UpdateSeq {
                    prompt_ids: &self.ids[i].0,
                    completion_ids: &self.ids[i].1,
                    advantage: self.adv[i],
                    passed: i != 1,
                    spans: &self.spans[i],
                    rollout_logprobs: &[],
                })
                .collect()
        }
    }

    const W: LossWeights = LossWeights {
        pg: 1.0,
        fine: 1.0,
        sl: 0.5,
        kl: 0.0,
    };

    /// The query loss of the finite-difference check leaves out the
    /// policy-gradient term: on-policy, its value is −mean(A) whatever θ is
    /// (only its gradient is the estimator), so a finite difference of it
    /// would be 0. The inner loss keeps it: its gradient and Hessian are
    /// what the check is about.
    const W_QUERY: LossWeights = LossWeights { pg: 0.0, ..W };

    /// The loss of `d` with weights `w`, in pieces of `size` sequences.
    fn pieces<'d>(d: &'d Data, w: &'d LossWeights, size: usize) -> impl PieceLoss + 'd {
        move |p: &mut Policy, sink: &mut dyn FnMut(Tensor) -> Result<(), TrainError>| {
            seqs_loss(p, &d.seqs(), size, Normalization::TokenMean, w, true, sink)
        }
    }

    /// The loss of `d` as one tensor.
    fn whole(p: &mut Policy, d: &Data, w: &LossWeights) -> Tensor {
        let mut total: Option<Tensor> = None;
        seqs_loss(
            p,
            &d.seqs(),
            0,
            Normalization::TokenMean,
            w,
            true,
            &mut |l| {
                total = Some(match total.take() {
                    Some(t) => t + l,
                    None => l,
                });
                Ok(())
            },
        )
        .unwrap();
        total.unwrap()
    }

    fn flat(ws: &[(String, Tensor)], grad: bool) -> Tensor {
        Tensor::cat(
            &ws.iter()
                .map(|(_, t)| if grad { t.grad() } else { t.detach() }.reshape([-1]))
                .collect::<Vec<_>>(),
            0,
        )
    }

    /// θ.grad after one task's meta-gradient with `inner`, the losses in
    /// pieces of `size` sequences.
    fn meta_grad(
        p: &mut Policy,
        (s, q): (&Data, &Data),
        inner: &InnerLoop,
        second: bool,
        size: usize,
    ) -> Tensor {
        let theta = trainable(p);
        zero_grad(&theta);
        let ad = adapt(p, &theta, inner, pieces(s, &W, size)).unwrap();
        meta_backward(
            p,
            &theta,
            &ad,
            inner,
            second,
            pieces(s, &W, size),
            pieces(q, &W_QUERY, size),
        )
        .unwrap();
        let g = flat(&theta, true);
        zero_grad(&theta);
        g
    }

    /// F(θ) = L_q(θ_i(θ)).
    fn meta_value(p: &mut Policy, s: &Data, q: &Data, inner: &InnerLoop) -> f64 {
        let theta = trainable(p);
        let ad = adapt(p, &theta, inner, pieces(s, &W, 0)).unwrap();
        let v = p
            .with_adapters(&ad.fast, |p| whole(p, q, &W_QUERY))
            .unwrap();
        v.double_value(&[])
    }

    fn shift(theta: &[(String, Tensor)], dir: &[Tensor], h: f64) {
        tch::no_grad(|| {
            for ((_, p), d) in theta.iter().zip(dir) {
                let _ = p.shallow_clone().g_add_(&(d * h));
            }
        });
    }

    /// K tasks' query losses in one batched pass (stacked fast adapters,
    /// tasks of different lengths padded together) give the per-task loop's
    /// meta-gradient and loss values, first and second order, whole or in
    /// micro-batches.
    #[test]
    fn batched_query_pass_equals_the_per_task_loop() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = tiny_policy(dir.path());
        let support: Vec<Data> = (0..3).map(Data::new).collect();
        let mut query: Vec<Data> = (0..3).map(|i| Data::new(10 + i)).collect();
        query[1].ids[0].1.extend([5, 6, 7, 8]);
        query[2].ids.truncate(3);
        query[2].adv.truncate(3);
        query[2].spans.truncate(3);
        let inner = InnerLoop { steps: 1, lr: 0.1 };
        let theta = trainable(&p);
        for size in [0, 2] {
            for second in [false, true] {
                zero_grad(&theta);
                let mut want_parts = Vec::new();
                for (s, q) in support.iter().zip(&query) {
                    let ad = adapt(&mut p, &theta, &inner, pieces(s, &W, size)).unwrap();
                    want_parts.push(
                        meta_backward(
                            &mut p,
                            &theta,
                            &ad,
                            &inner,
                            second,
                            pieces(s, &W, size),
                            pieces(q, &W, size),
                        )
                        .unwrap(),
                    );
                }
                let want = flat(&theta, true);
                zero_grad(&theta);
                let ads: Vec<Adapted> = support
                    .iter()
                    .map(|s| adapt(&mut p, &theta, &inner, pieces(s, &W, size)).unwrap())
                    .collect();
                let qs: Vec<Vec<UpdateSeq>> = query.iter().map(Data::seqs).collect();
                let qrefs: Vec<&[UpdateSeq]> = qs.iter().map(Vec::as_slice).collect();
                let refs: Vec<&Adapted> = ads.iter().collect();
                let (vs, parts) = query_gradients(&mut p, &refs, |pp, fast, sink| {
                    seqs_loss_batched(pp, &qrefs, fast, size, Normalization::TokenMean, &W, sink)
                })
                .unwrap();
                for ((v, ad), s) in vs.into_iter().zip(&ads).zip(&support) {
                    carry_back(&mut p, &theta, ad, &inner, second, pieces(s, &W, size), v).unwrap();
                }
                let got = flat(&theta, true);
                let scale = want.abs().max().double_value(&[]);
                assert!(scale > 1e-6);
                let diff = (&got - &want).abs().max().double_value(&[]);
                assert!(
                    diff < 1e-9 * scale,
                    "size {size} second {second}: {diff} vs {scale}"
                );
                for (a, b) in parts.iter().zip(&want_parts) {
                    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
                    for (k, x) in a {
                        assert!((x - b[k]).abs() < 1e-10, "{k}: {x} vs {}", b[k]);
                    }
                }
            }
        }
        zero_grad(&theta);
    }

    #[test]
    fn second_order_meta_gradient_matches_finite_differences() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = tiny_policy(dir.path());
        let (s, q) = (Data::new(1), Data::new(2));
        let inner = InnerLoop { steps: 2, lr: 0.5 };
        let g2 = meta_grad(&mut p, (&s, &q), &inner, true, 0);
        let g1 = meta_grad(&mut p, (&s, &q), &inner, false, 0);
        // In micro-batches of one sequence: the same gradient (the pieces
        // add up, and so do their Hessian-vector products).
        let g2_pieces = meta_grad(&mut p, (&s, &q), &inner, true, 1);
        assert!(g2_pieces.allclose(&g2, 1e-9, 1e-12, false));
        let first = inner;
        let theta = trainable(&p);
        tch::manual_seed(5);
        let dirs: Vec<Tensor> = theta.iter().map(|(_, t)| t.randn_like()).collect();
        let v = Tensor::cat(&dirs.iter().map(|d| d.reshape([-1])).collect::<Vec<_>>(), 0);
        let h = 1e-5;
        shift(&theta, &dirs, h);
        let up = meta_value(&mut p, &s, &q, &first);
        shift(&theta, &dirs, -2.0 * h);
        let down = meta_value(&mut p, &s, &q, &first);
        shift(&theta, &dirs, h);
        let fd = (up - down) / (2.0 * h);
        let d2 = g2.dot(&v).double_value(&[]);
        let d1 = g1.dot(&v).double_value(&[]);
        // Central differences in fp64: truncation error ~h², rounding ~1e-11.
        let tol = 1e-4 * fd.abs().max(1.0);
        assert!(
            (d2 - fd).abs() < tol,
            "second order {d2} vs finite difference {fd}"
        );
        // The check can tell the orders apart: first-order misses the
        // curvature term by far more than the tolerance.
        assert!(
            (d1 - fd).abs() > 100.0 * tol,
            "first order {d1} is as close to {fd} as second order {d2}"
        );
    }

    #[test]
    fn first_order_and_reptile_match_hand_computation() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = tiny_policy(dir.path());
        let (s, q) = (Data::new(3), Data::new(4));
        let alpha = 0.3;
        let theta = trainable(&p);
        let theta0: Vec<Tensor> = theta.iter().map(|(_, t)| t.detach().copy()).collect();
        // By hand: one plain SGD step on L_s, then ∇L_q at the new point.
        let by_hand_step = |p: &mut Policy, d: &Data| {
            let theta = trainable(p);
            zero_grad(&theta);
            whole(p, d, &W).backward();
            tch::no_grad(|| {
                for (_, t) in &theta {
                    let g = t.grad();
                    let _ = t.shallow_clone().g_sub_(&(g * alpha));
                }
            });
            zero_grad(&theta);
        };
        let restore = |theta: &[(String, Tensor)]| {
            tch::no_grad(|| {
                for ((_, t), t0) in theta.iter().zip(&theta0) {
                    t.shallow_clone().copy_(t0);
                }
            })
        };
        by_hand_step(&mut p, &s);
        whole(&mut p, &q, &W_QUERY).backward();
        let want = flat(&theta, true);
        zero_grad(&theta);
        restore(&theta);
        let inner = InnerLoop {
            steps: 1,
            lr: alpha,
        };
        let got = meta_grad(&mut p, (&s, &q), &inner, false, 0);
        assert!(
            got.allclose(&want, 1e-10, 1e-12, false),
            "FOMAML {got:?} vs by hand {want:?}"
        );
        assert!(flat(&theta, false).equal(&Tensor::cat(
            &theta0.iter().map(|t| t.reshape([-1])).collect::<Vec<_>>(),
            0
        )));

        // Reptile over two tasks, two inner steps each.
        let inner = InnerLoop { steps: 2, ..inner };
        let mut ends = Vec::new();
        for d in [&s, &q] {
            by_hand_step(&mut p, d);
            by_hand_step(&mut p, d);
            ends.push(flat(&theta, false));
            restore(&theta);
        }
        let eps = 0.4;
        let start = flat(&theta, false);
        let want = &start + ((&ends[0] - &start) + (&ends[1] - &start)) * (eps / 2.0);
        let adapted: Vec<Weights> = [&s, &q]
            .iter()
            .map(|d| {
                adapt(&mut p, &theta, &inner, pieces(d, &W, 0))
                    .unwrap()
                    .fast
            })
            .collect();
        reptile_update(&theta, &adapted, eps).unwrap();
        let got = flat(&theta, false);
        assert!(got.allclose(&want, 1e-10, 1e-12, false));
        assert!(!got.allclose(&start, 1e-6, 1e-6, false), "θ moved");
    }

    #[test]
    fn fast_weights_swap_in_and_out_without_copying_the_model() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = tiny_policy(dir.path());
        let theta = trainable(&p);
        let ids = Tensor::from_slice(&[5i64, 9, 3, 7]).view([1, 4]);
        let fwd = |p: &Policy| {
            p.model
                .forward(&ids, None, None, LogitsFor::All, false)
                .unwrap()
        };
        let base = fwd(&p);
        let fast: Weights = theta
            .iter()
            .map(|(n, t)| (n.clone(), t.detach() + t.randn_like() * 0.2))
            .collect();
        let swapped = p.with_adapters(&fast, |p| fwd(p)).unwrap();
        assert!(fwd(&p).equal(&base), "the originals are back");
        // The same weights copied into the parameters give the same output.
        tch::no_grad(|| {
            for ((_, t), (_, f)) in theta.iter().zip(&fast) {
                t.shallow_clone().copy_(f);
            }
        });
        assert!(fwd(&p).allclose(&swapped, 1e-12, 1e-12, false));
        assert!(!swapped.allclose(&base, 1e-3, 1e-3, false));
        // Math attention gives the fused kernel's result.
        p.model.set_math_attention(true);
        assert!(fwd(&p).allclose(&swapped, 1e-10, 1e-10, false));
        p.model.set_math_attention(false);

        let mut bad = vec![(
            "model.layers.0.self_attn.k_proj.lora_A.weight".to_owned(),
            Tensor::zeros([2, 16], (Kind::Double, Device::Cpu)),
        )];
        let e = p.swap_adapters(&mut bad).unwrap_err().to_string();
        assert!(e.contains("names no LoRA factor"), "{e}");
        let mut bad = vec![(
            theta[0].0.clone(),
            Tensor::zeros([1], (Kind::Double, Device::Cpu)),
        )];
        let e = p.swap_adapters(&mut bad).unwrap_err().to_string();
        assert!(e.contains("has shape"), "{e}");

        // Stacking checks each set as swapping does, and wants every factor.
        let rows = Tensor::from_slice(&[0i64]);
        let e = p
            .with_stacked_adapters(&[&bad], &rows, |_| ())
            .unwrap_err()
            .to_string();
        assert!(e.contains("has shape"), "{e}");
        let e = p
            .with_stacked_adapters(&[&fast, &fast[1..]], &rows, |_| ())
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("lacks `{}`", fast[0].0)), "{e}");
        let two = p
            .with_stacked_adapters(&[&fast, &fast], &rows, |p| fwd(p))
            .unwrap();
        assert!(two.allclose(&swapped, 1e-12, 1e-12, false));
    }
}
