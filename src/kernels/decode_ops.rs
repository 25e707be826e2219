//! The small operations of a batched CPU decode step that libtorch runs as
//! several kernels each, here in one pass: attention of one new token per
//! sequence over the KV cache, RMSNorm, RoPE and the MLP's SiLU-gated
//! product. fp32 or bf16 (computed in fp32, rounded where libtorch's bf16
//! ops round), AVX-512, nothing for autograd to record, inside a
//! generation's [`Scope`]; `None` otherwise (the caller keeps libtorch's
//! ops, which the tests compare these against).
//!
//! Why: in an RL step's batch-32 generation, attention (libtorch's
//! `scaled_dot_product_attention`) took 18% of the forward time, 0.37 ms
//! per call for work bound by reading the cache, and each of a layer's
//! parallel libtorch ops wakes libtorch's OpenMP threads, which falcon runs
//! passive (see `main.rs`): with every wake removed (a spinning OpenMP, not
//! an option beside the sandbox) generation took 7% less time. Attention
//! here runs on the CPU kernels' worker pool ([`super::gemv::run_shared`]),
//! whose workers spin (yielding) between jobs; the SiLU product, a few
//! microseconds of work, runs on the caller.
//!
//! `exp` is Cephes' single-precision polynomial (about 1 ulp), so values
//! differ from libtorch's in the last bits: generation's numbers, not the
//! update's, which recomputes everything under autograd in libtorch.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tch::{Device, Kind, Tensor};

static SWITCH: super::Switch =
    super::Switch::new("FALCON_CPU_DECODE_OPS", "the decode kernels stay on");

/// Switch these kernels on or off for the whole process.
/// `FALCON_CPU_DECODE_OPS=0` in the environment starts them off;
/// benchmarks use either to compare the two paths.
pub fn set_enabled(on: bool) {
    SWITCH.set(on)
}

fn enabled() -> bool {
    SWITCH.get()
}

/// Does this CPU have AVX-512F?
pub fn supported() -> bool {
    super::avx512f()
}

thread_local! {
    static DEPTH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// While alive, this thread's decode steps may take these kernels. Only a
/// generation opens one: every other forward (a KL penalty's reference
/// pass, scoring) keeps libtorch's numbers to the bit, so that two passes
/// meant to agree differ only where their inputs do.
pub struct Scope {
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Open a scope (they nest).
pub fn scope() -> Scope {
    DEPTH.with(|d| d.set(d.get() + 1));
    Scope {
        _not_send: std::marker::PhantomData,
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// Inside a scope, switched on, AVX-512F, every tensor on the CPU in fp32
/// or bf16 (all the same), none that autograd records.
fn applies(ts: &[&Tensor]) -> bool {
    DEPTH.with(|d| d.get()) > 0
        && enabled()
        && supported()
        && ts
            .first()
            .is_some_and(|t| matches!(t.kind(), Kind::Float | Kind::BFloat16))
        && ts
            .iter()
            .all(|t| t.kind() == ts[0].kind() && t.device() == Device::Cpu)
        && !(super::grad_enabled() && ts.iter().any(|t| t.requires_grad()))
}

/// Attention of one query position per sequence: `q` `[B, H, G, D]` (the
/// `G` query heads that share kv head `h`), `k`, `v` `[B, H, S, D]` (any
/// strides but a contiguous last dimension: views of a cache), `mask`
/// `[B, 1, 1, S]` bool (true: attend) or `None`; scale `1/√D`. Returns
/// `[B, H, G, D]`. A row with no key to attend gets zeros. fp32 or bf16: in
/// bf16 every product and sum is fp32 (the inputs widened exactly) and the
/// output is rounded once, as libtorch's bf16 attention does.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Option<Tensor> {
    if !applies(&[q, k, v]) || q.dim() != 4 || k.dim() != 4 || v.dim() != 4 {
        return None;
    }
    let kind = q.kind();
    let (qs, ks) = (q.size(), k.size());
    let (b, h, g, d) = (qs[0], qs[1], qs[2], qs[3]);
    let s = ks[2];
    if ks != [b, h, s, d] || v.size() != ks || d % 16 != 0 || d > 256 || g > 16 || s == 0 {
        return None;
    }
    if k.stride()[3] != 1 || v.stride()[3] != 1 {
        return None;
    }
    let mask = match mask {
        Some(m) => {
            if m.kind() != Kind::Bool || m.device() != Device::Cpu || m.size() != [b, 1, 1, s] {
                return None;
            }
            Some(m.shallow_clone())
        }
        None => None,
    };
    let q = q.contiguous();
    let y = Tensor::empty([b, h, g, d], (kind, Device::Cpu));
    let (kst, vst) = (k.stride(), v.stride());
    let job = Arc::new(Attend {
        bf16: kind == Kind::BFloat16,
        q: q.data_ptr() as usize,
        k: k.data_ptr() as usize,
        v: v.data_ptr() as usize,
        y: y.data_ptr() as usize,
        mask: mask
            .as_ref()
            .map(|m| (m.data_ptr() as usize, m.stride()[0], m.stride()[3])),
        k_strides: [kst[0], kst[1], kst[2]],
        v_strides: [vst[0], vst[1], vst[2]],
        heads: h as usize,
        g: g as usize,
        d: d as usize,
        s: s as usize,
        parts: (b * h) as usize,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
    });
    super::gemv::run_shared(job);
    // `q`, `k`, `v`, `mask` and `y` outlive the job: run_shared returns
    // only when every part is done.
    drop((q, mask));
    Some(y)
}

/// Most elements the kernels that run on the caller alone ([`silu_mul`],
/// [`rms_norm`], [`rope`]) take: 64 rows of SmolLM2-135M's MLP and more. A
/// prefill's larger tensors keep libtorch's parallel ops.
const MAX_ELEMENTS: usize = 1 << 17;

/// `silu(g) · u` for `g`, `u` `[.., N]` of one shape (rows may be strided,
/// as the two halves of a fused gate/up projection are); a contiguous
/// result.
///
/// bf16 rounds where libtorch's `g.silu() * u` does: the SiLU, then the
/// product (each computed in fp32 from the widened inputs).
pub fn silu_mul(g: &Tensor, u: &Tensor) -> Option<Tensor> {
    if !applies(&[g, u]) || g.size() != u.size() || g.dim() < 1 {
        return None;
    }
    let kind = g.kind();
    let n = *g.size().last()? as usize;
    if kind == Kind::BFloat16 && !n.is_multiple_of(16) {
        return None;
    }
    let (g2, u2) = (g.reshape([-1, n as i64]), u.reshape([-1, n as i64]));
    if g2.stride()[1] != 1 || u2.stride()[1] != 1 {
        return None;
    }
    let rows = g2.size()[0] as usize;
    if rows * n > MAX_ELEMENTS {
        return None;
    }
    let y = Tensor::empty(g.size(), (kind, Device::Cpu));
    let (gs, us) = (g2.stride()[0] as usize, u2.stride()[0] as usize);
    for r in 0..rows {
        // SAFETY: row `r` of each: `n` elements from its row start (a
        // multiple of 16 in bf16); AVX-512F checked in `applies`.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            if kind == Kind::BFloat16 {
                simd::silu_mul_row_bf16(
                    (g2.data_ptr() as *const u16).add(r * gs),
                    (u2.data_ptr() as *const u16).add(r * us),
                    (y.data_ptr() as *mut u16).add(r * n),
                    n,
                )
            } else {
                simd::silu_mul_row(
                    (g2.data_ptr() as *const f32).add(r * gs),
                    (u2.data_ptr() as *const f32).add(r * us),
                    (y.data_ptr() as *mut f32).add(r * n),
                    n,
                )
            }
        };
    }
    Some(y)
}

/// `x / √(mean(x²) + eps) · w` over the last dimension of `x` `[.., N]`
/// (contiguous), `w` `[N]`; the sum of squares in fp32, as libtorch's. bf16
/// rounds where the decoder's bf16 composite does: the normalised `x`, then
/// its product with `w`.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Option<Tensor> {
    if !applies(&[x, w]) || x.dim() < 1 || !x.is_contiguous() || !w.is_contiguous() {
        return None;
    }
    let kind = x.kind();
    let n = *x.size().last()? as usize;
    if w.size() != [n as i64] || n == 0 || x.numel() > MAX_ELEMENTS {
        return None;
    }
    if kind == Kind::BFloat16 && !n.is_multiple_of(16) {
        return None;
    }
    let rows = x.numel() / n;
    let y = Tensor::empty(x.size(), (kind, Device::Cpu));
    for r in 0..rows {
        // SAFETY: row `r` of `x` and `y`, `n` elements each (a multiple of
        // 16 in bf16), and `w`'s `n`; AVX-512F checked in `applies`.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            if kind == Kind::BFloat16 {
                simd::rms_norm_row_bf16(
                    (x.data_ptr() as *const u16).add(r * n),
                    w.data_ptr() as *const u16,
                    (y.data_ptr() as *mut u16).add(r * n),
                    n,
                    eps as f32,
                )
            } else {
                simd::rms_norm_row(
                    (x.data_ptr() as *const f32).add(r * n),
                    w.data_ptr() as *const f32,
                    (y.data_ptr() as *mut f32).add(r * n),
                    n,
                    eps as f32,
                )
            }
        };
    }
    Some(y)
}

/// Rotary embedding as `x·cos + roll(x, D/2)·sin_signed` over the last
/// dimension: `x` `[B, H, T, D]`, `cos` and `sin_signed` `[B, 1, T, D]`
/// (the sign of `rotate_half` folded into `sin_signed`). bf16 rounds where
/// libtorch's three ops do: each product, then the sum.
pub fn rope(x: &Tensor, cos: &Tensor, sin_signed: &Tensor) -> Option<Tensor> {
    if !applies(&[x, cos, sin_signed]) || x.dim() != 4 || x.numel() > MAX_ELEMENTS {
        return None;
    }
    let xs = x.size();
    let (b, h, t, d) = (xs[0], xs[1], xs[2], xs[3]);
    if cos.size() != [b, 1, t, d] || sin_signed.size() != [b, 1, t, d] || d % 2 != 0 {
        return None;
    }
    let (x, cos, sin) = (x.contiguous(), cos.contiguous(), sin_signed.contiguous());
    let y = Tensor::empty([b, h, t, d], (x.kind(), Device::Cpu));
    let dims = (b as usize, h as usize, t as usize, d as usize);
    // SAFETY: four contiguous tensors of the checked shapes and one kind.
    unsafe {
        if x.kind() == Kind::BFloat16 {
            rope_rows::<u16>(&x, &cos, &sin, &y, dims)
        } else {
            rope_rows::<f32>(&x, &cos, &sin, &y, dims)
        }
    }
    Some(y)
}

/// [`rope`]'s loop over rows of `D` elements of type `E`.
///
/// # Safety
/// `x`, `y` contiguous `[B, H, T, D]`, `cos`, `sin` contiguous `[B, 1, T, D]`,
/// all of `E`'s dtype.
unsafe fn rope_rows<E: RopeElem>(
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    y: &Tensor,
    (b, h, t, d): (usize, usize, usize, usize),
) {
    let (xp, cp, sp, yp) = (
        x.data_ptr() as *const E,
        cos.data_ptr() as *const E,
        sin.data_ptr() as *const E,
        y.data_ptr() as *mut E,
    );
    let half = d / 2;
    for bi in 0..b {
        for hi in 0..h {
            for ti in 0..t {
                let row = ((bi * h + hi) * t + ti) * d;
                let table = (bi * t + ti) * d;
                for j in 0..d {
                    let rolled = *xp.add(row + (j + half) % d);
                    let a = E::mul(*xp.add(row + j), *cp.add(table + j));
                    let r = E::mul(rolled, *sp.add(table + j));
                    *yp.add(row + j) = E::add(a, r);
                }
            }
        }
    }
}

/// fp32, or bf16 (`u16` bits) computed in fp32 and rounded after each op.
trait RopeElem: Copy {
    fn mul(a: Self, b: Self) -> Self;
    fn add(a: Self, b: Self) -> Self;
}

impl RopeElem for f32 {
    fn mul(a: f32, b: f32) -> f32 {
        a * b
    }
    fn add(a: f32, b: f32) -> f32 {
        a + b
    }
}

impl RopeElem for u16 {
    fn mul(a: u16, b: u16) -> u16 {
        super::gemv::bf16_bits(widen(a) * widen(b))
    }
    fn add(a: u16, b: u16) -> u16 {
        super::gemv::bf16_bits(widen(a) + widen(b))
    }
}

fn widen(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// One attention call, shared out by `(sequence, kv head)`.
struct Attend {
    /// bf16 tensors (else fp32).
    bf16: bool,
    /// Addresses of `q`, `k`, `v`, the output, and the mask with its
    /// sequence and key strides; valid until the job is finished.
    q: usize,
    k: usize,
    v: usize,
    y: usize,
    mask: Option<(usize, i64, i64)>,
    k_strides: [i64; 3],
    v_strides: [i64; 3],
    heads: usize,
    g: usize,
    d: usize,
    s: usize,
    parts: usize,
    next: AtomicUsize,
    done: AtomicUsize,
}

impl super::gemv::Work for Attend {
    fn work(&self) {
        let mut scores = vec![0f32; self.g * self.s];
        // The running sums, then (bf16) the query widened and the output
        // before rounding.
        let mut acc = vec![0f32; 3 * self.g * self.d];
        loop {
            let p = self.next.fetch_add(1, Ordering::Relaxed);
            if p >= self.parts {
                return;
            }
            // SAFETY: part `p` writes only its own `[G, D]` block of the
            // output; the addresses are live (see `Attend::q`).
            #[cfg(target_arch = "x86_64")]
            unsafe {
                self.part(p, &mut scores, &mut acc)
            };
            self.done.fetch_add(1, Ordering::Release);
        }
    }

    fn finished(&self) -> bool {
        self.done.load(Ordering::Acquire) >= self.parts
    }
}

impl Attend {
    #[cfg(target_arch = "x86_64")]
    unsafe fn part(&self, p: usize, scores: &mut [f32], scratch: &mut [f32]) {
        if self.bf16 {
            self.part_of::<u16>(p, scores, scratch)
        } else {
            self.part_of::<f32>(p, scores, scratch)
        }
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn part_of<E: simd::Elem>(&self, p: usize, scores: &mut [f32], scratch: &mut [f32]) {
        let (bi, hi) = ((p / self.heads) as i64, (p % self.heads) as i64);
        let (g, d, s) = (self.g, self.d, self.s);
        let (acc, rest) = scratch.split_at_mut(g * d);
        let (qf, yf) = rest.split_at_mut(g * d);
        let q = E::widen(
            std::slice::from_raw_parts((self.q as *const E).add(p * g * d), g * d),
            qf,
        );
        let k =
            (self.k as *const E).offset((bi * self.k_strides[0] + hi * self.k_strides[1]) as isize);
        let v =
            (self.v as *const E).offset((bi * self.v_strides[0] + hi * self.v_strides[1]) as isize);
        let attends = |j: usize| match self.mask {
            Some((m, sb, sk)) => *(m as *const u8).offset((bi * sb + j as i64 * sk) as isize) != 0,
            None => true,
        };
        let scale = 1.0 / (d as f32).sqrt();
        simd::scores(
            q,
            k,
            self.k_strides[2] as usize,
            g,
            d,
            s,
            scale,
            &attends,
            scores,
        );
        simd::weighted_values(
            v,
            self.v_strides[2] as usize,
            g,
            d,
            s,
            scores,
            acc,
            yf.as_mut_ptr(),
        );
        E::narrow(
            yf,
            std::slice::from_raw_parts_mut((self.y as *mut E).add(p * g * d), g * d),
        );
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    /// An element type the attention reads: fp32, or bf16 (as `u16` bits)
    /// widened exactly.
    pub trait Elem: Copy {
        /// Sixteen elements from `p`, as fp32.
        unsafe fn load16(p: *const Self) -> __m512;
        /// `src` as fp32: itself, or widened into `buf`.
        fn widen<'a>(src: &'a [Self], buf: &'a mut [f32]) -> &'a [f32];
        /// `src` into `dst`, rounded to nearest even where narrower.
        fn narrow(src: &[f32], dst: &mut [Self]);
    }

    impl Elem for f32 {
        #[inline(always)]
        unsafe fn load16(p: *const f32) -> __m512 {
            _mm512_loadu_ps(p)
        }
        fn widen<'a>(src: &'a [f32], _: &'a mut [f32]) -> &'a [f32] {
            src
        }
        fn narrow(src: &[f32], dst: &mut [f32]) {
            dst.copy_from_slice(src)
        }
    }

    impl Elem for u16 {
        #[inline(always)]
        unsafe fn load16(p: *const u16) -> __m512 {
            let h = _mm256_loadu_si256(p as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
        }
        fn widen<'a>(src: &'a [u16], buf: &'a mut [f32]) -> &'a [f32] {
            for (b, &h) in buf.iter_mut().zip(src) {
                *b = f32::from_bits((h as u32) << 16);
            }
            &buf[..src.len()]
        }
        fn narrow(src: &[f32], dst: &mut [u16]) {
            for (d, &f) in dst.iter_mut().zip(src) {
                *d = super::super::gemv::bf16_bits(f);
            }
        }
    }

    /// `e^x` for each lane: Cephes' `expf` (range reduction by ln 2 in two
    /// parts, a degree-5 polynomial), about 1 ulp; inputs below -104 give 0
    /// (`-inf` included), above 88.7 +inf.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn exp(x: __m512) -> __m512 {
        let x = _mm512_max_ps(x, _mm512_set1_ps(-104.0));
        let x = _mm512_min_ps(x, _mm512_set1_ps(88.72283));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm512_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            0.5,
        ] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let r2 = _mm512_mul_ps(r, r);
        let y = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0));
        _mm512_scalef_ps(y, n)
    }

    /// The mask of lanes `0..len` (`len` at most 16).
    #[inline(always)]
    fn tail_mask(len: usize) -> u16 {
        ((1u32 << len) - 1) as u16
    }

    /// Lanes `0..len` of `p` (at most 16), the rest zero.
    #[inline(always)]
    unsafe fn load_tail(p: *const f32, len: usize) -> __m512 {
        _mm512_maskz_loadu_ps(tail_mask(len), p)
    }

    /// `scores[i·s + j] = (q_i · k_j) · scale`, `-inf` where key `j` is not
    /// attended; then each row `i` becomes `exp(score - max)` (its softmax
    /// numerators).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn scores<E: Elem>(
        q: &[f32],
        k: *const E,
        k_row: usize,
        g: usize,
        d: usize,
        s: usize,
        scale: f32,
        attends: &dyn Fn(usize) -> bool,
        scores: &mut [f32],
    ) {
        for j in 0..s {
            if !attends(j) {
                for i in 0..g {
                    scores[i * s + j] = f32::NEG_INFINITY;
                }
                continue;
            }
            let kj = k.add(j * k_row);
            for i in 0..g {
                let qi = q.as_ptr().add(i * d);
                let mut a = _mm512_setzero_ps();
                for c in (0..d).step_by(16) {
                    a = _mm512_fmadd_ps(_mm512_loadu_ps(qi.add(c)), E::load16(kj.add(c)), a);
                }
                scores[i * s + j] = _mm512_reduce_add_ps(a) * scale;
            }
        }
        for i in 0..g {
            let row = &mut scores[i * s..(i + 1) * s];
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let m = _mm512_set1_ps(if max == f32::NEG_INFINITY { 0.0 } else { max });
            let mut j = 0;
            while j < s {
                let len = (s - j).min(16);
                let x = load_tail(row.as_ptr().add(j), len);
                _mm512_mask_storeu_ps(
                    row.as_mut_ptr().add(j),
                    tail_mask(len),
                    exp(_mm512_sub_ps(x, m)),
                );
                j += 16;
            }
        }
    }

    /// `y_i = Σ_j w_ij v_j / Σ_j w_ij` for the numerators `w` from
    /// [`scores`]; zeros where a row has none.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn weighted_values<E: Elem>(
        v: *const E,
        v_row: usize,
        g: usize,
        d: usize,
        s: usize,
        w: &[f32],
        acc: &mut [f32],
        y: *mut f32,
    ) {
        acc[..g * d].fill(0.0);
        for j in 0..s {
            let vj = v.add(j * v_row);
            for i in 0..g {
                let wij = w[i * s + j];
                if wij == 0.0 {
                    continue;
                }
                let wv = _mm512_set1_ps(wij);
                let ai = acc.as_mut_ptr().add(i * d);
                for c in (0..d).step_by(16) {
                    let a = _mm512_fmadd_ps(wv, E::load16(vj.add(c)), _mm512_loadu_ps(ai.add(c)));
                    _mm512_storeu_ps(ai.add(c), a);
                }
            }
        }
        for i in 0..g {
            let total: f32 = w[i * s..(i + 1) * s].iter().sum();
            let inv = _mm512_set1_ps(if total > 0.0 { 1.0 / total } else { 0.0 });
            for c in (0..d).step_by(16) {
                let a = _mm512_loadu_ps(acc.as_ptr().add(i * d + c));
                _mm512_storeu_ps(y.add(i * d + c), _mm512_mul_ps(a, inv));
            }
        }
    }

    /// `y = x / √(mean(x²) + eps) · w` over `n` lanes.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn rms_norm_row(x: *const f32, w: *const f32, y: *mut f32, n: usize, eps: f32) {
        let mut acc = _mm512_setzero_ps();
        let mut j = 0;
        while j < n {
            let v = load_tail(x.add(j), (n - j).min(16));
            acc = _mm512_fmadd_ps(v, v, acc);
            j += 16;
        }
        let inv = 1.0 / (_mm512_reduce_add_ps(acc) / n as f32 + eps).sqrt();
        let inv = _mm512_set1_ps(inv);
        let mut j = 0;
        while j < n {
            let len = (n - j).min(16);
            let v = _mm512_mul_ps(load_tail(x.add(j), len), inv);
            let r = _mm512_mul_ps(v, load_tail(w.add(j), len));
            _mm512_mask_storeu_ps(y.add(j), tail_mask(len), r);
            j += 16;
        }
    }

    /// `v` rounded to bf16 (nearest even), still as fp32.
    #[inline(always)]
    unsafe fn round_bf16(v: __m512) -> __m512 {
        let b = _mm512_castps_si512(v);
        let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
        let r = _mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
        _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(-65536)))
    }

    /// Store sixteen lanes already rounded by [`round_bf16`] as bf16.
    #[inline(always)]
    unsafe fn store_bf16(p: *mut u16, v: __m512) {
        let h = _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(_mm512_castps_si512(v)));
        _mm256_storeu_si256(p as *mut __m256i, h);
    }

    /// [`rms_norm_row`] for bf16, `n` a multiple of 16: the normalised value
    /// rounded, then its product with the weight.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn rms_norm_row_bf16(x: *const u16, w: *const u16, y: *mut u16, n: usize, eps: f32) {
        let mut acc = _mm512_setzero_ps();
        for j in (0..n).step_by(16) {
            let v = u16::load16(x.add(j));
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        let inv = _mm512_set1_ps(1.0 / (_mm512_reduce_add_ps(acc) / n as f32 + eps).sqrt());
        for j in (0..n).step_by(16) {
            let v = round_bf16(_mm512_mul_ps(u16::load16(x.add(j)), inv));
            store_bf16(
                y.add(j),
                round_bf16(_mm512_mul_ps(u16::load16(w.add(j)), v)),
            );
        }
    }

    /// [`silu_mul_row`] for bf16, `n` a multiple of 16: the SiLU rounded,
    /// then the product.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn silu_mul_row_bf16(g: *const u16, u: *const u16, y: *mut u16, n: usize) {
        let one = _mm512_set1_ps(1.0);
        for j in (0..n).step_by(16) {
            let gv = u16::load16(g.add(j));
            let e = exp(_mm512_sub_ps(_mm512_setzero_ps(), gv));
            let silu = round_bf16(_mm512_div_ps(gv, _mm512_add_ps(one, e)));
            store_bf16(
                y.add(j),
                round_bf16(_mm512_mul_ps(silu, u16::load16(u.add(j)))),
            );
        }
    }

    /// `y = g · u / (1 + e^(-g))` over `n` lanes.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn silu_mul_row(g: *const f32, u: *const f32, y: *mut f32, n: usize) {
        let one = _mm512_set1_ps(1.0);
        let mut j = 0;
        while j < n {
            let len = (n - j).min(16);
            let gv = load_tail(g.add(j), len);
            let uv = load_tail(u.add(j), len);
            let e = exp(_mm512_sub_ps(_mm512_setzero_ps(), gv));
            let r = _mm512_div_ps(_mm512_mul_ps(gv, uv), _mm512_add_ps(one, e));
            _mm512_mask_storeu_ps(y.add(j), tail_mask(len), r);
            j += 16;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: &Tensor, want: &Tensor, tol: f64) {
        let err = (got - want).abs().max().double_value(&[]);
        let scale = want.abs().max().double_value(&[]).max(1.0);
        assert!(err <= tol * scale, "max |Δ| {err} (scale {scale})");
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    #[cfg_attr(
        not(falcon_cpu_avx512f),
        ignore = "needs AVX-512F, which this CPU lacks"
    )]
    fn exp_is_within_two_ulp_of_the_float64_exp() {
        assert!(supported(), "{}", crate::kernels::STALE_BUILD);
        let xs: Vec<f32> = (0..20_000)
            .map(|i| -100.0 + i as f32 * 0.0094)
            .chain([0.0, -0.0, 1e-30, -87.0, 88.0, f32::NEG_INFINITY])
            .collect();
        for c in xs.chunks(16) {
            let mut buf = [0f32; 16];
            buf[..c.len()].copy_from_slice(c);
            let mut out = [0f32; 16];
            // SAFETY: AVX-512F checked above; 16-lane buffers.
            unsafe {
                use std::arch::x86_64::*;
                _mm512_storeu_ps(out.as_mut_ptr(), simd::exp(_mm512_loadu_ps(buf.as_ptr())));
            }
            for (x, y) in c.iter().zip(out) {
                let want = (*x as f64).exp();
                let ulp = (want as f32).abs() * f32::EPSILON;
                let err = (y as f64 - want).abs();
                assert!(
                    err <= 2.0 * ulp as f64 || (want < 1e-38 && err < 1e-38),
                    "exp({x}) = {y}, want {want}"
                );
            }
        }
    }

    /// Against libtorch's attention on the grouped decode layout, with cache
    /// views (strided), a mask with holes, and a row whose only key is
    /// itself.
    #[test]
    #[cfg_attr(
        not(falcon_cpu_avx512f),
        ignore = "needs AVX-512F, which this CPU lacks"
    )]
    fn attention_matches_libtorch() {
        assert!(supported(), "{}", crate::kernels::STALE_BUILD);
        tch::manual_seed(2);
        let _s = scope();
        let (b, h, g, d, cap, s) = (4, 3, 3, 64, 40, 29);
        let q = Tensor::randn([b, h, g, d], (Kind::Float, Device::Cpu));
        let kc = Tensor::randn([b, h, cap, d], (Kind::Float, Device::Cpu));
        let vc = Tensor::randn([b, h, cap, d], (Kind::Float, Device::Cpu));
        let (k, v) = (kc.narrow(2, 0, s), vc.narrow(2, 0, s));
        let mask = Tensor::rand([b, 1, 1, s], (Kind::Float, Device::Cpu)).gt(0.3);
        let _ = mask.get(2).fill_(0);
        let _ = mask.get(2).narrow(-1, s - 1, 1).fill_(1);
        tch::no_grad(|| {
            for m in [None, Some(&mask)] {
                let got = attention(&q, &k, &v, m).expect("fp32 CPU");
                let want =
                    Tensor::scaled_dot_product_attention(&q, &k, &v, m, 0.0, false, None, false);
                close(&got, &want, 1e-5);
            }
        });
        // bf16: products and sums in fp32 from the widened inputs, one
        // rounding at the end. The reference is libtorch's fp32 attention on
        // the same bf16 values, rounded once: equal but for summation order,
        // so at most one bf16 step apart (2^-8 relative), and mostly equal.
        let bf = |t: &Tensor| t.to_kind(Kind::BFloat16);
        let (qb, kb, vb) = (bf(&q), bf(&kc).narrow(2, 0, s), bf(&vc).narrow(2, 0, s));
        tch::no_grad(|| {
            for m in [None, Some(&mask)] {
                let got = attention(&qb, &kb, &vb, m).expect("bf16 CPU");
                assert_eq!(got.kind(), Kind::BFloat16);
                let f = |t: &Tensor| t.to_kind(Kind::Float);
                let want = Tensor::scaled_dot_product_attention(
                    &f(&qb),
                    &f(&kb),
                    &f(&vb),
                    m,
                    0.0,
                    false,
                    None,
                    false,
                )
                .to_kind(Kind::BFloat16);
                close_bf16(&got, &want);
            }
        });
        // Not for autograd, mixed dtypes or other shapes.
        let qg = q.set_requires_grad(true);
        assert!(attention(&qg, &k, &v, None).is_none());
        assert!(attention(&qb, &k, &v, None).is_none());
        assert!(attention(
            &q.narrow(3, 0, 8),
            &k.narrow(3, 0, 8),
            &v.narrow(3, 0, 8),
            None
        )
        .is_none());
    }

    #[test]
    #[cfg_attr(
        not(falcon_cpu_avx512f),
        ignore = "needs AVX-512F, which this CPU lacks"
    )]
    fn rms_norm_and_rope_match_libtorch() {
        assert!(supported(), "{}", crate::kernels::STALE_BUILD);
        tch::manual_seed(4);
        let x = Tensor::randn([7, 1, 100], (Kind::Float, Device::Cpu)) * 3.0;
        let w = Tensor::randn([100], (Kind::Float, Device::Cpu));
        // Outside a generation's scope, every forward keeps libtorch.
        assert!(tch::no_grad(|| rms_norm(&x, &w, 1e-5)).is_none());
        let _s = scope();
        let got = tch::no_grad(|| rms_norm(&x, &w, 1e-5)).expect("fp32 CPU");
        close(&got, &x.rms_norm([100], Some(&w), 1e-5), 2e-6);

        let (b, h, t, d) = (3, 5, 2, 64);
        // A strided view `[B, H, T, D]`, as the projections give.
        let q = Tensor::randn([b, t, h, d], (Kind::Float, Device::Cpu)).transpose(1, 2);
        let cos = Tensor::randn([b, 1, t, d], (Kind::Float, Device::Cpu));
        let sin = Tensor::randn([b, 1, t, d], (Kind::Float, Device::Cpu));
        let got = tch::no_grad(|| rope(&q, &cos, &sin)).expect("fp32 CPU");
        let want = &q * &cos + q.roll([d / 2], [3]) * &sin;
        close(&got, &want, 1e-6);
    }

    /// bf16 results against libtorch's bf16 ops: within one bf16 step
    /// (2^-8 relative) and mostly equal (the fp32 sums before the roundings
    /// are in another order, and `exp` is not libtorch's).
    fn close_bf16(got: &Tensor, want: &Tensor) {
        assert_eq!(got.kind(), Kind::BFloat16);
        let (got, want) = (got.to_kind(Kind::Float), want.to_kind(Kind::Float));
        let err = ((&got - &want).abs() / want.abs().clamp_min(1e-3))
            .max()
            .double_value(&[]);
        assert!(err <= 1.0 / 128.0, "max relative |Δ| {err}");
        let same = got.eq_tensor(&want).to_kind(Kind::Float).mean(Kind::Float);
        assert!(
            same.double_value(&[]) > 0.9,
            "only {same} of bf16 outputs equal"
        );
    }

    #[test]
    #[cfg_attr(
        not(falcon_cpu_avx512f),
        ignore = "needs AVX-512F, which this CPU lacks"
    )]
    fn bf16_rms_norm_rope_and_silu_mul_round_where_libtorch_does() {
        assert!(supported(), "{}", crate::kernels::STALE_BUILD);
        tch::manual_seed(5);
        let _s = scope();
        let bf = |t: Tensor| t.to_kind(Kind::BFloat16);
        let x = bf(Tensor::randn([9, 1, 96], (Kind::Float, Device::Cpu)) * 3.0);
        let w = bf(Tensor::randn([96], (Kind::Float, Device::Cpu)));
        let got = tch::no_grad(|| rms_norm(&x, &w, 1e-5)).expect("bf16 CPU");
        // The decoder's bf16 composite (model::decoder::rms_norm).
        let xf = x.to_kind(Kind::Float);
        let var = xf.square().mean_dim(-1, true, Kind::Float);
        let want = &w * (xf * (var + 1e-5).rsqrt()).to_kind(Kind::BFloat16);
        close_bf16(&got, &want);

        let gu = bf(Tensor::randn([5, 2 * 96], (Kind::Float, Device::Cpu)) * 6.0);
        let parts = gu.split_with_sizes([96, 96], -1);
        let got = tch::no_grad(|| silu_mul(&parts[0], &parts[1])).expect("bf16 CPU");
        close_bf16(&got, &(parts[0].silu() * &parts[1]));
        let (b, h, t, d) = (3, 5, 2, 64);
        let q = bf(Tensor::randn([b, t, h, d], (Kind::Float, Device::Cpu))).transpose(1, 2);
        let cos = bf(Tensor::randn([b, 1, t, d], (Kind::Float, Device::Cpu)));
        let sin = bf(Tensor::randn([b, 1, t, d], (Kind::Float, Device::Cpu)));
        let got = tch::no_grad(|| rope(&q, &cos, &sin)).expect("bf16 CPU");
        // Each product and the sum rounded, as libtorch's bf16 ops: equal.
        let want = &q * &cos + q.roll([d / 2], [3]) * &sin;
        assert!(got.equal(&want), "bf16 rope differs from libtorch's");
        // A width the bf16 rows do not take (not a multiple of 16).
        let odd = bf(Tensor::randn([2, 40], (Kind::Float, Device::Cpu)));
        assert!(tch::no_grad(|| silu_mul(&odd, &odd)).is_none());
    }

    #[test]
    #[cfg_attr(
        not(falcon_cpu_avx512f),
        ignore = "needs AVX-512F, which this CPU lacks"
    )]
    fn silu_mul_matches_libtorch_on_the_halves_of_a_fused_projection() {
        assert!(supported(), "{}", crate::kernels::STALE_BUILD);
        let _s = scope();
        let gu = Tensor::randn([5, 2 * 100], (Kind::Float, Device::Cpu)) * 6.0;
        let parts = gu.split_with_sizes([100, 100], -1);
        let got = tch::no_grad(|| silu_mul(&parts[0], &parts[1])).expect("fp32 CPU");
        close(&got, &(parts[0].silu() * &parts[1]), 2e-6);
        assert!(got.is_contiguous());
    }
}
