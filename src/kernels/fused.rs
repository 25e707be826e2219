//! Log-probs of sampled tokens from the last hidden states and the output
//! projection, without the `[tokens × vocabulary]` logits of the plain path.
//!
//! The plain path projects every scored hidden state onto the vocabulary,
//! casts the logits to fp32 and takes a log-softmax; autograd keeps both
//! for the backward. At Qwen2.5's 151,936-token vocabulary and 8k scored
//! tokens that is 2.5 GB of bf16 logits, 5 GB of fp32 log-probs and as
//! much again in the backward. Here the tokens run in chunks of about
//! [`CHUNK_VALUES`] logits: each chunk's statistics and its gradient with
//! respect to the hidden states, `∂ log p(y)/∂h = W_y − softmax(hWᵀ)·W`,
//! are computed at once, under `no_grad`, and only `[tokens × hidden]`
//! survives the chunk (the approach of Liger's fused linear cross-entropy).
//! The result carries that gradient through a surrogate `⟨h, g⟩` whose
//! value is cancelled exactly, so the callers' autograd sees an ordinary
//! tensor.
//!
//! Limits, enforced by the callers: the projection must be frozen (LoRA
//! training; its own gradient would need the upstream gradient, which is
//! not known in the forward), and the gradient is first order only (the
//! surrogate has no curvature), so second-order MAML uses the plain path.
//!
//! On CUDA each chunk's softmax statistics come from one kernel
//! (`kernels/token_logprobs.cu`), which reads the logits in their own
//! dtype and writes the softmax over them in place; elsewhere, and as the
//! reference it is checked against, the same statistics come from libtorch.

use tch::{Kind, Tensor};

use super::device::{ordinal, ptr, Arg, Gpu};
use super::KernelError;

/// About this many logits per chunk (256 Mi of them: 512 MiB in bf16).
pub const CHUNK_VALUES: i64 = 1 << 28;

/// Token rows per chunk for a vocabulary of `vocab`.
pub fn chunk_rows(vocab: i64) -> i64 {
    (CHUNK_VALUES / vocab.max(1)).max(1)
}

/// Where the per-chunk statistics are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// libtorch ops, any device: what CPU runs and the kernel is checked against.
    Reference,
    /// The CUDA kernel (CUDA tensors of dtype f32 or bf16).
    Kernel,
}

impl Backend {
    /// The kernel where it applies (CUDA, f32/bf16 logits), else the reference.
    pub fn for_tensor(h: &Tensor) -> Backend {
        if ordinal(h).is_some() && matches!(h.kind(), Kind::Float | Kind::BFloat16) {
            Backend::Kernel
        } else {
            Backend::Reference
        }
    }
}

/// Log-probs of `targets` `[N]` (i64) and entropies under
/// `softmax(h · headᵀ)` for hidden states `h` `[N, H]` and a frozen output
/// projection `head` `[V, H]`, chunked over `rows` rows at a time
/// ([`chunk_rows`] by default). Both are f32 (f64 for an f64 model); the
/// log-probs carry the exact first-order gradient with respect to `h`, the
/// entropies none.
pub fn token_logprobs(
    h: &Tensor,
    head: &Tensor,
    targets: &Tensor,
    backend: Backend,
    rows: Option<i64>,
) -> Result<(Tensor, Tensor), KernelError> {
    let (n, hd) = h
        .size2()
        .map_err(|_| KernelError::Invalid("hidden states must be [tokens, hidden]".into()))?;
    let (v, hd2) = head
        .size2()
        .map_err(|_| KernelError::Invalid("projection must be [vocab, hidden]".into()))?;
    if hd != hd2 || targets.size() != [n] {
        return Err(KernelError::Invalid(format!(
            "fused log-probs: hidden {:?}, projection {:?}, targets {:?}",
            h.size(),
            head.size(),
            targets.size()
        )));
    }
    if head.requires_grad() {
        return Err(KernelError::Invalid(
            "fused log-probs need a frozen output projection".into(),
        ));
    }
    // The kernel reads the target's logit without a bounds check.
    if n > 0 {
        let (lo, hi) = (
            targets.min().int64_value(&[]),
            targets.max().int64_value(&[]),
        );
        if lo < 0 || hi >= v {
            return Err(KernelError::Invalid(format!(
                "fused log-probs: token ids {lo}..={hi} outside the vocabulary of {v}"
            )));
        }
    }
    let out = if h.kind() == Kind::Double {
        Kind::Double
    } else {
        Kind::Float
    };
    let rows = rows.unwrap_or_else(|| chunk_rows(v)).max(1);
    let (lp, ent, grad) = tch::no_grad(|| -> Result<_, KernelError> {
        let hdet = h.detach();
        let (mut lps, mut ents, mut grads) = (Vec::new(), Vec::new(), Vec::new());
        let mut lo = 0;
        while lo < n {
            let c = rows.min(n - lo);
            let hc = hdet.narrow(0, lo, c);
            let yc = targets.narrow(0, lo, c);
            let z = hc.mm(&head.transpose(0, 1));
            let (lp, ent, p) = match backend {
                Backend::Reference => reference_stats(z, &yc, out),
                Backend::Kernel => kernel_stats(z, &yc)?,
            };
            let e = p.mm(head);
            grads.push(head.index_select(0, &yc).to_kind(out) - e.to_kind(out));
            lps.push(lp.to_kind(out));
            ents.push(ent.to_kind(out));
            lo += c;
        }
        if lps.is_empty() {
            let z = Tensor::zeros([0], (out, h.device()));
            return Ok((
                z.shallow_clone(),
                z,
                Tensor::zeros([0, hd], (out, h.device())),
            ));
        }
        Ok((
            Tensor::cat(&lps, 0),
            Tensor::cat(&ents, 0),
            Tensor::cat(&grads, 0),
        ))
    })?;
    if !h.requires_grad() {
        return Ok((lp, ent));
    }
    // ⟨h, g⟩ − its detached self is exactly zero, with gradient g.
    let s = (h.to_kind(out) * grad).sum_dim_intlist(-1, false, out);
    Ok((lp + (&s - s.detach()), ent))
}

/// Log-probs, entropies and the softmax (in the logits' dtype) of logits
/// `z` `[c, V]`, computed in `out` precision with libtorch. At most two
/// chunk-sized buffers are alive at once: `z` is dropped once the
/// log-softmax exists, and the entropy's product is taken in place.
fn reference_stats(z: Tensor, y: &Tensor, out: Kind) -> (Tensor, Tensor, Tensor) {
    let kind = z.kind();
    let mut logp = z.log_softmax(-1, out);
    drop(z);
    let lp = logp.gather(-1, &y.unsqueeze(-1), false).squeeze_dim(-1);
    let p = logp.exp();
    let _ = logp.g_mul_(&p);
    let ent = -logp.sum_dim_intlist(-1, false, out);
    drop(logp);
    (lp, ent, p.to_kind(kind))
}

/// The same with the CUDA kernel: `z` is overwritten by its softmax.
fn kernel_stats(z: Tensor, y: &Tensor) -> Result<(Tensor, Tensor, Tensor), KernelError> {
    let dev = ordinal(&z)
        .ok_or_else(|| KernelError::Invalid("the fused kernel needs CUDA tensors".into()))?;
    let name = match z.kind() {
        Kind::Float => "row_stats_f32",
        Kind::BFloat16 => "row_stats_bf16",
        k => {
            return Err(KernelError::Invalid(format!(
                "the fused kernel takes f32 or bf16 logits, not {k:?}"
            )))
        }
    };
    let gpu = Gpu::get(dev)?;
    let z = z.contiguous();
    let (c, v) = (z.size()[0], z.size()[1]);
    let y = y.to_kind(Kind::Int64).contiguous();
    let lp = Tensor::empty([c], (Kind::Float, z.device()));
    let ent = Tensor::empty([c], (Kind::Float, z.device()));
    if c > 0 {
        gpu.launch(
            name,
            (c as u32, 1),
            512,
            &[ptr(&z), ptr(&y), ptr(&lp), ptr(&ent), Arg::I64(v)],
        )?;
    }
    Ok((lp, ent, z))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn plain(h: &Tensor, head: &Tensor, y: &Tensor) -> Tensor {
        h.mm(&head.transpose(0, 1))
            .log_softmax(-1, h.kind())
            .gather(-1, &y.unsqueeze(-1), false)
            .squeeze_dim(-1)
    }

    fn case(kind: Kind) -> (Tensor, Tensor, Tensor) {
        tch::manual_seed(3);
        let h = Tensor::randn([37, 16], (kind, Device::Cpu)).set_requires_grad(true);
        let head = Tensor::randn([101, 16], (kind, Device::Cpu));
        let y = Tensor::randint(101, [37], (Kind::Int64, Device::Cpu));
        (h, head, y)
    }

    #[test]
    fn values_and_gradients_match_the_plain_path_in_any_chunking() {
        let (h, head, y) = case(Kind::Double);
        let w = Tensor::randn([37], (Kind::Double, Device::Cpu));
        let want = plain(&h, &head, &y);
        let gw = tch::Tensor::run_backward(&[(&want * &w).sum(Kind::Double)], &[&h], false, false)
            .remove(0);
        for rows in [1, 5, 37, 1000] {
            let (lp, ent) = token_logprobs(&h, &head, &y, Backend::Reference, Some(rows)).unwrap();
            assert!(
                (&lp - &want).abs().max().double_value(&[]) < 1e-12,
                "rows {rows}"
            );
            let g = tch::Tensor::run_backward(&[(&lp * &w).sum(Kind::Double)], &[&h], false, false)
                .remove(0);
            assert!(
                (&g - &gw).abs().max().double_value(&[]) < 1e-12,
                "rows {rows}"
            );
            let p = h.mm(&head.transpose(0, 1)).softmax(-1, Kind::Double);
            let want_ent = -(&p * p.log()).sum_dim_intlist(-1, false, Kind::Double);
            assert!((&ent - want_ent).abs().max().double_value(&[]) < 1e-12);
            assert!(!ent.requires_grad());
        }
    }

    #[test]
    fn f32_matches_the_plain_path() {
        let (h, head, y) = case(Kind::Float);
        let want = plain(&h, &head, &y);
        let (lp, _) = token_logprobs(&h, &head, &y, Backend::Reference, Some(8)).unwrap();
        assert_eq!(lp.kind(), Kind::Float);
        assert!((&lp - &want).abs().max().double_value(&[]) < 1e-4);
    }

    #[test]
    fn a_trainable_projection_or_wrong_shapes_are_refused() {
        let (h, head, y) = case(Kind::Float);
        let trainable = head.detach().set_requires_grad(true);
        assert!(token_logprobs(&h, &trainable, &y, Backend::Reference, None).is_err());
        let short = y.narrow(0, 0, 3);
        assert!(token_logprobs(&h, &head, &short, Backend::Reference, None).is_err());
        let past = y.ones_like() * 101;
        assert!(token_logprobs(&h, &head, &past, Backend::Reference, None).is_err());
    }

    #[test]
    fn the_kernel_refuses_cpu_tensors() {
        let (h, head, y) = case(Kind::Float);
        assert_eq!(Backend::for_tensor(&h), Backend::Reference);
        assert!(token_logprobs(&h, &head, &y, Backend::Kernel, None).is_err());
    }
}
