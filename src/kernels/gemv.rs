//! Decode-time matrix-vector products on the CPU: `y = x Wᵀ (+ b)` for a
//! few rows of `x` (at most [`MAX_ROWS`]) against an fp32 or bf16 weight,
//! the shape of every matmul of a decode step at batch 1 to 8. libtorch's
//! `linear` is the reference and the fallback for everything else.
//!
//! Why not libtorch: these products are bound by memory bandwidth, yet
//! decode at batch 1 reached under half of it (`scripts/bench/run generate`'s
//! roofline). A profile of a batch-1 fp32 decode: 55% MKL's sgemv, 17% in
//! the kernel waking and parking libtorch's OpenMP threads, once per matmul
//! (falcon runs OpenMP passive: spinning OpenMP threads starve the sandbox
//! and any other process on the machine); in bf16, oneDNN's kernels read the
//! weights at a third of the bandwidth. Here a small pool of workers spins
//! between products, handing its core to any other runnable process at each
//! turn of the spin (`sched_yield`), and parks after [`SPIN`]; the caller
//! and the workers take chunks of output rows from one atomic counter, so a
//! worker that is not scheduled holds up nothing but the chunk it claimed.
//! The same pool runs the batched decode's work ([`super::packed`],
//! [`super::decode_ops`]) through [`run_shared`].
//!
//! Each output is one fp32 dot product (bf16 inputs widened exactly),
//! rounded once to the output dtype as libtorch does; only the order of the
//! additions differs from the reference.

use std::hint;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};

/// Most rows of `x` one call takes. Past eight the product is a real
/// matrix product: MKL's sgemm beat a version of these kernels that took 16
/// and 32 rows in groups of eight (the 49152 × 576 vocabulary projection at
/// 16 rows: 10.6 ms against 7.3, `examples/gemv_probe.rs`). In bf16 a decode
/// is faster with these up to eight rows (batch-8 bf16 decode, 2 threads:
/// 214-218 tokens/s, against 184-189 when libtorch took five rows and more),
/// although oneDNN's eight-row matmul alone, in a hot loop, is faster: in a
/// decode step each of its matmuls first wakes its threads.
pub const MAX_ROWS: usize = 8;

/// How long an idle worker spins (yielding) before it parks: longer than
/// the gap between two products of one decode step, shorter than anything a
/// user would notice as a busy core.
pub const SPIN: Duration = Duration::from_millis(2);

/// Output rows per chunk of work: 32, so that each chunk's outputs fill
/// whole cache lines of their own (64 bytes of bf16). At 16, the two threads
/// wrote the two halves of one line at each bf16 store, and the lines
/// bounced between their cores: the eight-row bf16 vocabulary projection
/// took 6.2 ms, now 2.7 (`examples/gemv_probe.rs`, 2 threads).
const CHUNK_ROWS: usize = 32;

/// Products smaller than this many weight bytes run on the caller alone:
/// waking a worker costs more than it saves.
const PARALLEL_BYTES: usize = 256 << 10;

static SWITCH: super::Switch =
    super::Switch::new("FALCON_CPU_GEMV", "the CPU decode kernel stays on");

/// Switch the kernel on or off for the whole process (off: every product
/// goes to libtorch). `FALCON_CPU_GEMV=0` (or `off`, `false`, `no`) in the
/// environment starts it off; benchmarks use either to compare the two
/// paths.
pub fn set_enabled(on: bool) {
    SWITCH.set(on)
}

fn enabled() -> bool {
    SWITCH.get()
}

/// Does this CPU have what the kernel needs (x86-64 with AVX2 and FMA)?
pub fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The instruction sets the kernels use, in order: each level includes the
/// ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// AVX2 and FMA: eight lanes; the least the kernel runs on.
    Avx2 = 0,
    /// AVX-512F: sixteen lanes and the registers to run several weight rows
    /// at once.
    Avx512 = 1,
    /// AVX512-BF16: bf16 weights take the pairwise dot product.
    Avx512Bf16 = 2,
}

static ISA_CAP: AtomicU8 = AtomicU8::new(Isa::Avx512Bf16 as u8);

/// Use no instruction set past `cap`, even where the CPU has it: the tests
/// run every kernel this way on one machine.
pub fn cap_isa(cap: Isa) {
    ISA_CAP.store(cap as u8, Ordering::SeqCst);
}

/// The best instruction set of this CPU within the cap (valid only where
/// [`supported`]).
fn isa() -> Isa {
    static DETECTED: OnceLock<Isa> = OnceLock::new();
    let detected = *DETECTED.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if !is_x86_feature_detected!("avx512f") {
                Isa::Avx2
            } else if !is_x86_feature_detected!("avx512bf16") {
                Isa::Avx512
            } else {
                Isa::Avx512Bf16
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Isa::Avx2
        }
    });
    match ISA_CAP.load(Ordering::Relaxed).min(detected as u8) {
        0 => Isa::Avx2,
        1 => Isa::Avx512,
        _ => Isa::Avx512Bf16,
    }
}

/// `x Wᵀ + b` for `x` `[.., K]` with at most [`MAX_ROWS`] rows, `w` `[N, K]`
/// and `b` `[N]`, all on the CPU in one dtype (fp32 or bf16), or `None`
/// when this kernel does not apply (other shapes, dtypes or devices, a
/// product autograd must record, no AVX2, switched off): the caller then
/// uses libtorch.
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Option<Tensor> {
    if !enabled() || !supported() {
        return None;
    }
    let kind = w.kind();
    let (m, n, k) = super::cpu_linear_shape(x, w, b, &[Kind::Float, Kind::BFloat16], MAX_ROWS)?;
    let xs = x.size();
    let x = x.contiguous();
    let isa = isa();
    let x = if kind == Kind::BFloat16 && isa == Isa::Avx512Bf16 {
        // SAFETY: `x` is a contiguous bf16 tensor of `m · k` elements.
        Input::Bf16(
            unsafe { std::slice::from_raw_parts(x.data_ptr() as *const u16, m * k) }.to_vec(),
        )
    } else {
        Input::F32(to_f32(&x, m * k))
    };
    let bias = b.map(|b| to_f32(&b.contiguous(), n));
    let mut out_shape = xs[..xs.len() - 1].to_vec();
    out_shape.push(n as i64);
    let y = Tensor::empty(out_shape.as_slice(), (kind, Device::Cpu));
    let job = Job {
        x,
        wide: isa >= Isa::Avx512,
        bias,
        w: w.data_ptr() as usize,
        y: y.data_ptr() as usize,
        bf16: kind == Kind::BFloat16,
        m,
        n,
        k,
        chunks: n.div_ceil(CHUNK_ROWS),
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
    };
    let weight_bytes = n * k * kind.elt_size_in_bytes();
    if weight_bytes < PARALLEL_BYTES {
        job.work();
    } else {
        pool().run(Arc::new(job));
    }
    Some(y)
}

/// `t` (contiguous, fp32 or bf16, `len` elements) as fp32.
fn to_f32(t: &Tensor, len: usize) -> Vec<f32> {
    match t.kind() {
        Kind::BFloat16 => {
            // SAFETY: `t` is a contiguous bf16 tensor of `len` elements
            // that outlives this borrow.
            let s = unsafe { std::slice::from_raw_parts(t.data_ptr() as *const u16, len) };
            s.iter().map(|&h| widen(h)).collect()
        }
        _ => {
            // SAFETY: as above, fp32.
            unsafe { std::slice::from_raw_parts(t.data_ptr() as *const f32, len) }.to_vec()
        }
    }
}

/// bf16 → fp32: bf16 is the top half of an fp32, so widening is a shift,
/// exact.
#[inline(always)]
fn widen(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// fp32 → bf16 with round-to-nearest-even, as libtorch rounds.
pub(crate) fn bf16_bits(f: f32) -> u16 {
    if f.is_nan() {
        return 0x7fc0;
    }
    let bits = f.to_bits();
    let rounding = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

/// The rows of `x`, `[m, k]`, in the form the kernels read.
enum Input {
    /// fp32 (bf16 widened exactly), for the kernels that compute in fp32.
    F32(Vec<f32>),
    /// bf16 as given, for the AVX512-BF16 kernel.
    Bf16(Vec<u16>),
}

/// Work the pool's threads share: each thread claims parts until none are
/// left ([`Work::work`]); the caller returns once every part is done.
pub(crate) trait Work: Send + Sync {
    /// Claim and do parts until none are left.
    fn work(&self);
    /// Is every claimed part done?
    fn finished(&self) -> bool;
}

/// Run `job` on the caller and the pool's workers (the caller alone while
/// another thread has the pool, or where the pool has no workers);
/// returns when it is finished.
pub(crate) fn run_shared(job: Arc<dyn Work>) {
    pool().run(job)
}

/// One product, split into chunks of output rows.
struct Job {
    x: Input,
    /// AVX-512 kernels (else AVX2).
    wide: bool,
    bias: Option<Vec<f32>>,
    /// Addresses of the weight `[n, k]` and the output `[m, n]`. They stay
    /// valid while any chunk is unfinished: [`Pool::run`] returns only when
    /// every claimed chunk is done, and a claim past the last chunk touches
    /// neither.
    w: usize,
    y: usize,
    bf16: bool,
    m: usize,
    n: usize,
    k: usize,
    chunks: usize,
    next: AtomicUsize,
    done: AtomicUsize,
}

impl Work for Job {
    fn work(&self) {
        Job::work(self)
    }

    fn finished(&self) -> bool {
        Job::finished(self)
    }
}

impl Job {
    /// Claim and compute chunks until none are left.
    fn work(&self) {
        loop {
            let c = self.next.fetch_add(1, Ordering::Relaxed);
            if c >= self.chunks {
                return;
            }
            let rows = c * CHUNK_ROWS..((c + 1) * CHUNK_ROWS).min(self.n);
            // SAFETY: the chunk is claimed by this thread alone; see `Job::w`.
            unsafe { self.chunk(rows) };
            self.done.fetch_add(1, Ordering::Release);
        }
    }

    fn finished(&self) -> bool {
        self.done.load(Ordering::Acquire) >= self.chunks
    }

    /// Output rows `rows` of every input row.
    ///
    /// # Safety
    /// `self.w` and `self.y` must still point at the live weight and
    /// output, and no other thread may write these rows.
    unsafe fn chunk(&self, rows: std::ops::Range<usize>) {
        // The row count is a constant inside the kernels, so that their
        // accumulators stay in registers.
        macro_rules! by_rows {
            ($($m:literal)*) => {
                match self.m {
                    $($m => self.chunk_m::<$m>(rows),)*
                    _ => unreachable!("one to eight rows"),
                }
            };
        }
        by_rows!(1 2 3 4 5 6 7 8)
    }

    /// [`Job::chunk`] with the row count `M` (`== self.m`) a constant.
    ///
    /// # Safety
    /// As [`Job::chunk`]; `M == self.m`.
    unsafe fn chunk_m<const M: usize>(&self, rows: std::ops::Range<usize>) {
        #[cfg(target_arch = "x86_64")]
        {
            let k = self.k;
            match &self.x {
                Input::Bf16(xh) => self.bf16_rows::<M>(&xh[..M * k], rows),
                Input::F32(x) if self.bf16 => {
                    let w = self.w as *const u16;
                    self.rows_of::<M, _>(&x[..M * k], rows, |r| simd::Bf16Row(w.add(r * k)));
                }
                Input::F32(x) => {
                    let w = self.w as *const f32;
                    self.rows_of::<M, _>(&x[..M * k], rows, |r| simd::F32Row(w.add(r * k)));
                }
            }
        }
    }

    /// [`Job::chunk_m`] for bf16 weights with AVX512-BF16.
    ///
    /// # Safety
    /// As [`Job::chunk`]; `M == self.m`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn bf16_rows<const M: usize>(&self, xh: &[u16], rows: std::ops::Range<usize>) {
        let (k, end) = (self.k, rows.end);
        let row = |r: usize| (self.w as *const u16).add(r * k);
        let mut r = rows.start;
        self.blocks::<M, 2>(&mut r, end, |r, out| {
            simd::dot_rows_bf16_xr::<M, 2>(xh, k, [row(r), row(r + 1)], out)
        });
        self.blocks::<M, 1>(&mut r, end, |r, out| {
            simd::dot_rows_bf16_xr::<M, 1>(xh, k, [row(r)], out)
        });
    }

    /// [`Job::chunk_m`] over weight rows given by `row`: several weight rows
    /// at a time where AVX-512 has the registers (four for one or two rows
    /// of `x`, two up to eight), one at a time otherwise.
    ///
    /// # Safety
    /// As [`Job::chunk`]; `M == self.m`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn rows_of<const M: usize, W: simd::Row>(
        &self,
        x: &[f32],
        rows: std::ops::Range<usize>,
        row: impl Fn(usize) -> W,
    ) {
        let (k, end) = (self.k, rows.end);
        let mut r = rows.start;
        if self.wide {
            if M <= 2 {
                self.blocks::<M, 4>(&mut r, end, |r, out| {
                    let w = [row(r), row(r + 1), row(r + 2), row(r + 3)];
                    simd::dot_rows_512_xr::<M, 4, W>(x, k, w, out)
                });
            }
            self.blocks::<M, 2>(&mut r, end, |r, out| {
                simd::dot_rows_512_xr::<M, 2, W>(x, k, [row(r), row(r + 1)], out)
            });
            self.blocks::<M, 1>(&mut r, end, |r, out| {
                simd::dot_rows_512::<M>(x, k, row(r), &mut out[0])
            });
        } else {
            self.blocks::<M, 1>(&mut r, end, |r, out| {
                simd::dot_rows::<M>(x, k, row(r), &mut out[0])
            });
        }
    }

    /// Whole blocks of `R` weight rows from `*r` on while they fit before
    /// `end`, each through `kernel` (its first row and its sums), then
    /// stored; `*r` is left at the first row not done.
    ///
    /// # Safety
    /// As [`Job::chunk`], for the rows done; `kernel` must be sound to call
    /// on them.
    #[inline(always)]
    unsafe fn blocks<const M: usize, const R: usize>(
        &self,
        r: &mut usize,
        end: usize,
        kernel: impl Fn(usize, &mut [[f32; M]; R]),
    ) {
        while *r + R <= end {
            let mut out = [[0f32; M]; R];
            kernel(*r, &mut out);
            for (d, o) in out.iter().enumerate() {
                self.store(*r + d, o);
            }
            *r += R;
        }
    }

    /// Output row `r` of every row of `x`, from their fp32 sums.
    ///
    /// # Safety
    /// As [`Job::chunk`], for row `r`.
    unsafe fn store(&self, r: usize, sums: &[f32]) {
        let bias = self.bias.as_ref().map_or(0.0, |b| b[r]);
        for (i, a) in sums.iter().enumerate() {
            let v = a + bias;
            if self.bf16 {
                *(self.y as *mut u16).add(i * self.n + r) = bf16_bits(v);
            } else {
                *(self.y as *mut f32).add(i * self.n + r) = v;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
// The kernels index several accumulator arrays by one row counter: a range
// loop says that more plainly than zipped iterators.
#[allow(clippy::needless_range_loop)]
mod simd {
    use std::arch::x86_64::*;

    /// One weight row, read as fp32.
    pub trait Row: Copy {
        /// Weights `j..j + 8`.
        unsafe fn load8(self, j: usize) -> __m256;
        /// Weights `j..j + 16`.
        unsafe fn load16(self, j: usize) -> __m512;
        /// Weight `j`.
        unsafe fn at(self, j: usize) -> f32;
        /// Start loading the cache line of weight `j` (past the row: the
        /// rows after it, which are next), without faulting.
        unsafe fn prefetch(self, j: usize);
    }

    #[derive(Clone, Copy)]
    pub struct F32Row(pub *const f32);

    #[derive(Clone, Copy)]
    pub struct Bf16Row(pub *const u16);

    impl Row for F32Row {
        #[inline(always)]
        unsafe fn load8(self, j: usize) -> __m256 {
            _mm256_loadu_ps(self.0.add(j))
        }
        #[inline(always)]
        unsafe fn load16(self, j: usize) -> __m512 {
            _mm512_loadu_ps(self.0.add(j))
        }
        #[inline(always)]
        unsafe fn at(self, j: usize) -> f32 {
            *self.0.add(j)
        }
        #[inline(always)]
        unsafe fn prefetch(self, j: usize) {
            _mm_prefetch::<_MM_HINT_T0>(self.0.wrapping_add(j) as *const i8);
        }
    }

    impl Row for Bf16Row {
        /// Widened as [`super::widen`] does, eight or sixteen at a time.
        #[inline(always)]
        unsafe fn load8(self, j: usize) -> __m256 {
            let h = _mm_loadu_si128(self.0.add(j) as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
        }
        #[inline(always)]
        unsafe fn load16(self, j: usize) -> __m512 {
            let h = _mm256_loadu_si256(self.0.add(j) as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
        }
        #[inline(always)]
        unsafe fn at(self, j: usize) -> f32 {
            super::widen(*self.0.add(j))
        }
        #[inline(always)]
        unsafe fn prefetch(self, j: usize) {
            _mm_prefetch::<_MM_HINT_T0>(self.0.wrapping_add(j) as *const i8);
        }
    }

    /// [`dot_rows`] sixteen lanes wide.
    ///
    /// # Safety
    /// As [`dot_rows`], with AVX-512F.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn dot_rows_512<const M: usize>(x: &[f32], k: usize, w: impl Row, out: &mut [f32]) {
        let m = M;
        let mut acc0 = [_mm512_setzero_ps(); M];
        let mut acc1 = [_mm512_setzero_ps(); M];
        let xp = x.as_ptr();
        let mut j = 0;
        if m <= 4 {
            while j + 32 <= k {
                let (w0, w1) = (w.load16(j), w.load16(j + 16));
                w.prefetch(j + k);
                w.prefetch(j + 16 + k);
                for i in 0..m {
                    let r = xp.add(i * k + j);
                    acc0[i] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(r), acc0[i]);
                    acc1[i] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(r.add(16)), acc1[i]);
                }
                j += 32;
            }
        }
        while j + 16 <= k {
            let w0 = w.load16(j);
            w.prefetch(j + k);
            for i in 0..m {
                acc0[i] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xp.add(i * k + j)), acc0[i]);
            }
            j += 16;
        }
        for i in 0..m {
            let mut sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0[i], acc1[i]));
            for t in j..k {
                sum += x[i * k + t] * w.at(t);
            }
            out[i] = sum;
        }
    }

    /// [`dot_rows_512`] for `R` weight rows at once (`out[r]` for row
    /// `w[r]`): each load of `x` serves all of them, which is what limits
    /// the product once `x` has more than one row (AVX-512 has the 32
    /// registers the `M · R` accumulators need).
    ///
    /// Each weight load also prefetches the same offset `R` rows on (the
    /// next call's rows: a chunk's rows are adjacent in memory). Without it
    /// the kernel stalled on those loads at eight rows of `x`, where the
    /// arithmetic between two loads hides too little of their latency: the
    /// 49152 × 576 vocabulary projection took 7.2 ms, with it 3.6 ms
    /// (`examples/gemv_probe.rs`; at one row 2.5 → 2.3 ms).
    ///
    /// # Safety
    /// As [`dot_rows_512`], for every row.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn dot_rows_512_xr<const M: usize, const R: usize, W: Row>(
        x: &[f32],
        k: usize,
        w: [W; R],
        out: &mut [[f32; M]; R],
    ) {
        let mut acc = [[_mm512_setzero_ps(); M]; R];
        let xp = x.as_ptr();
        let mut j = 0;
        while j + 16 <= k {
            let mut wv = [_mm512_setzero_ps(); R];
            for r in 0..R {
                wv[r] = w[r].load16(j);
                w[r].prefetch(j + R * k);
            }
            for i in 0..M {
                let xv = _mm512_loadu_ps(xp.add(i * k + j));
                for r in 0..R {
                    acc[r][i] = _mm512_fmadd_ps(wv[r], xv, acc[r][i]);
                }
            }
            j += 16;
        }
        for r in 0..R {
            for i in 0..M {
                let mut sum = _mm512_reduce_add_ps(acc[r][i]);
                for t in j..k {
                    sum += x[i * k + t] * w[r].at(t);
                }
                out[r][i] = sum;
            }
        }
    }

    /// [`dot_rows_512_xr`] for bf16 weights and a bf16 `x` (`xh`, the
    /// input as given), with AVX512-BF16's pairwise dot product: each
    /// instruction multiplies 32 bf16 pairs exactly and adds them into 16
    /// fp32 sums, half the instructions of widening first. Like every
    /// AVX512-BF16 instruction it treats subnormal inputs as zero.
    ///
    /// # Safety
    /// As [`dot_rows_512_xr`], with AVX512-BF16; `w[r]` holds `k` bf16.
    #[target_feature(enable = "avx512f,avx512bf16,avx2,fma")]
    pub unsafe fn dot_rows_bf16_xr<const M: usize, const R: usize>(
        xh: &[u16],
        k: usize,
        w: [*const u16; R],
        out: &mut [[f32; M]; R],
    ) {
        let load = |p: *const u16| -> __m512bh {
            std::mem::transmute(_mm512_loadu_si512(p as *const __m512i))
        };
        let mut acc = [[_mm512_setzero_ps(); M]; R];
        let xp = xh.as_ptr();
        let mut j = 0;
        while j + 32 <= k {
            let mut wv = [load(w[0].add(j)); R];
            for r in 1..R {
                wv[r] = load(w[r].add(j));
            }
            for p in w {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(j + R * k) as *const i8);
            }
            for i in 0..M {
                let xv = load(xp.add(i * k + j));
                for r in 0..R {
                    acc[r][i] = _mm512_dpbf16_ps(acc[r][i], wv[r], xv);
                }
            }
            j += 32;
        }
        use super::widen;
        for r in 0..R {
            for i in 0..M {
                let mut sum = _mm512_reduce_add_ps(acc[r][i]);
                for t in j..k {
                    sum += widen(xh[i * k + t]) * widen(*w[r].add(t));
                }
                out[r][i] = sum;
            }
        }
    }

    /// `out[i] = Σⱼ x[i·k + j] · w[j]` for every row `i` of `x` (`out.len()`
    /// rows of `k`): the weight row is read once for all of them.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `w` holds `k` readable weights; `x` holds
    /// `out.len() · k` values.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_rows<const M: usize>(x: &[f32], k: usize, w: impl Row, out: &mut [f32]) {
        // Two accumulators per row while the rows are few: the product is
        // bound by memory, and two chains keep FMA latency out of its way.
        let m = M;
        let mut acc0 = [_mm256_setzero_ps(); M];
        let mut acc1 = [_mm256_setzero_ps(); M];
        let xp = x.as_ptr();
        let mut j = 0;
        if m <= 4 {
            while j + 16 <= k {
                let (w0, w1) = (w.load8(j), w.load8(j + 8));
                for i in 0..m {
                    let r = xp.add(i * k + j);
                    acc0[i] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(r), acc0[i]);
                    acc1[i] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(r.add(8)), acc1[i]);
                }
                j += 16;
            }
        }
        while j + 8 <= k {
            let w0 = w.load8(j);
            for i in 0..m {
                acc0[i] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xp.add(i * k + j)), acc0[i]);
            }
            j += 8;
        }
        for i in 0..m {
            let v = _mm256_add_ps(acc0[i], acc1[i]);
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            let mut sum = _mm_cvtss_f32(s);
            for t in j..k {
                sum += x[i * k + t] * w.at(t);
            }
            out[i] = sum;
        }
    }
}

/// The worker threads (libtorch's thread count less the caller) and the
/// one job they are working on.
struct Pool {
    job: Mutex<Option<Arc<dyn Work>>>,
    /// Bumped for every job, so a spinning worker sees it without the lock.
    epoch: AtomicU64,
    workers: OnceLock<Vec<Thread>>,
    /// One caller at a time: another thread's product meanwhile runs on that
    /// thread alone.
    busy: AtomicBool,
}

fn pool() -> &'static Pool {
    static POOL: Pool = Pool {
        job: Mutex::new(None),
        epoch: AtomicU64::new(0),
        workers: OnceLock::new(),
        busy: AtomicBool::new(false),
    };
    POOL.workers.get_or_init(|| {
        let n = (tch::get_num_threads().max(1) - 1) as usize;
        (0..n)
            .filter_map(|i| {
                thread::Builder::new()
                    .name(format!("falcon-gemv-{i}"))
                    .spawn(|| worker(&POOL))
                    .ok()
                    .map(|h| h.thread().clone())
            })
            .collect()
    });
    &POOL
}

impl Pool {
    fn run(&self, job: Arc<dyn Work>) {
        let workers = self.workers.get().map_or(&[][..], Vec::as_slice);
        if workers.is_empty()
            || self
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            job.work();
            return;
        }
        *self.job.lock().expect("gemv job lock") = Some(job.clone());
        self.epoch.fetch_add(1, Ordering::SeqCst);
        for w in workers {
            w.unpark();
        }
        job.work();
        wait_until(|| job.finished(), None);
        *self.job.lock().expect("gemv job lock") = None;
        self.busy.store(false, Ordering::Release);
    }
}

/// Spin until `done()`, handing the core to any other runnable thread every
/// sixteenth turn; after `park_after` (if given), park between checks
/// instead (an unpark, or a stale one, wakes it to check again).
fn wait_until(mut done: impl FnMut() -> bool, park_after: Option<Duration>) {
    let since = Instant::now();
    let mut turns = 0u32;
    while !done() {
        turns = turns.wrapping_add(1);
        if !turns.is_multiple_of(16) {
            hint::spin_loop();
        } else if park_after.is_some_and(|d| since.elapsed() > d) {
            thread::park();
        } else {
            thread::yield_now();
        }
    }
}

fn worker(pool: &'static Pool) {
    let mut seen = pool.epoch.load(Ordering::SeqCst);
    loop {
        wait_until(
            || {
                let e = pool.epoch.load(Ordering::SeqCst);
                let new = e != seen;
                seen = e;
                new
            },
            Some(SPIN),
        );
        let job = pool.job.lock().expect("gemv job lock").clone();
        if let Some(job) = job {
            job.work();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: &Tensor, want: &Tensor, rel: f64) {
        let (g, w) = (got.to_kind(Kind::Double), want.to_kind(Kind::Double));
        let scale = w.abs().max().double_value(&[]).max(1e-6);
        let err = (g - w).abs().max().double_value(&[]);
        assert!(err <= rel * scale, "max |Δ| {err} against scale {scale}");
    }

    /// Every kernel (each instruction set this CPU has), on shapes with and
    /// without a vector tail (k % 8, k % 16, k % 32), output row counts
    /// that leave partial chunks and odd weight rows, and every row count.
    #[test]
    #[cfg_attr(
        not(falcon_cpu_avx2_fma),
        ignore = "needs AVX2 and FMA, which this CPU lacks"
    )]
    fn matches_libtorch_in_fp32_and_bf16() {
        assert!(supported(), "{}", crate::kernels::STALE_BUILD);
        tch::manual_seed(7);
        let _guard = tch::no_grad_guard();
        for cap in [Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16] {
            cap_isa(cap);
            for &(n, k) in &[(37, 19), (101, 64), (1000, 72), (3001, 576)] {
                for m in 1..=MAX_ROWS as i64 {
                    for bias in [false, true] {
                        check_shape(n, k, m, bias, cap);
                    }
                }
            }
        }
        cap_isa(Isa::Avx512Bf16);
    }

    fn check_shape(n: i64, k: i64, m: i64, bias: bool, cap: Isa) {
        let x = Tensor::randn([m, k], (Kind::Float, Device::Cpu));
        let w = Tensor::randn([n, k], (Kind::Float, Device::Cpu));
        let b = bias.then(|| Tensor::randn([n], (Kind::Float, Device::Cpu)));
        let y = linear(&x, &w, b.as_ref()).expect("kernel applies");
        assert_eq!(y.size(), [m, n]);
        close(&y, &x.linear(&w, b.as_ref()), 1e-5);

        let (xh, wh) = (x.to_kind(Kind::BFloat16), w.to_kind(Kind::BFloat16));
        let bh = b.as_ref().map(|b| b.to_kind(Kind::BFloat16));
        let yh = linear(&xh, &wh, bh.as_ref()).expect("kernel applies to bf16");
        assert_eq!(yh.kind(), Kind::BFloat16);
        // Rounding the exact product of the bf16 values once puts it at
        // most half a bf16 ulp away; ours also sums k products in fp32,
        // which may add up to k·2⁻²⁴·Σ|xᵢwᵢ| (the standard bound; it
        // matters where the products cancel to near zero). One ulp of the
        // result plus that bound is the tolerance.
        let (xd, wd) = (xh.to_kind(Kind::Double), wh.to_kind(Kind::Double));
        let bd = bh.as_ref().map(|b| b.to_kind(Kind::Double));
        let exact = xd.linear(&wd, bd.as_ref());
        let magnitude = xd.abs().linear(&wd.abs(), bd.map(|b| b.abs()).as_ref());
        let tol = exact.abs() * 2f64.powi(-8) + magnitude * (k as f64 * 2f64.powi(-24));
        let off = (yh.to_kind(Kind::Double) - &exact).abs();
        assert!(
            bool::try_from(off.le_tensor(&tol).all()).unwrap(),
            "bf16 n={n} k={k} m={m} {cap:?}: further from the exact product than rounding allows"
        );
    }

    #[test]
    #[cfg_attr(
        not(falcon_cpu_avx2_fma),
        ignore = "needs AVX2 and FMA, which this CPU lacks"
    )]
    fn keeps_leading_dimensions_and_rounds_like_libtorch() {
        assert!(supported(), "{}", crate::kernels::STALE_BUILD);
        let _guard = tch::no_grad_guard();
        let x = Tensor::randn([2, 1, 64], (Kind::Float, Device::Cpu));
        let w = Tensor::randn([48, 64], (Kind::Float, Device::Cpu));
        let y = linear(&x, &w, None).unwrap();
        assert_eq!(y.size(), [2, 1, 48]);
        close(&y, &x.linear(&w, None::<Tensor>), 1e-5);
        for (f, h) in [
            (1.0f32, 0x3f80u16),
            (f32::from_bits(0x3f80_8000), 0x3f80), // a tie: to even, down
            (f32::from_bits(0x3f81_8000), 0x3f82), // a tie: to even, up
        ] {
            assert_eq!(bf16_bits(f), h, "{f}");
            let t = Tensor::from_slice(&[f]).to_kind(Kind::BFloat16);
            let lt = u16::from_ne_bytes(
                Vec::<u8>::try_from(t.view_dtype(Kind::Uint8)).unwrap()[..2]
                    .try_into()
                    .unwrap(),
            );
            assert_eq!(lt, h, "libtorch rounds {f} the same way");
        }
    }

    /// What the kernel must leave to libtorch.
    #[test]
    fn declines_what_it_does_not_do() {
        let w = Tensor::randn([16, 8], (Kind::Float, Device::Cpu));
        let many = Tensor::randn([MAX_ROWS as i64 + 1, 8], (Kind::Float, Device::Cpu));
        assert!(
            linear(&many, &w, None).is_none(),
            "more rows than a decode step"
        );
        let x = Tensor::randn([1, 8], (Kind::Float, Device::Cpu));
        assert!(linear(&x, &w.transpose(0, 1).transpose(0, 1).t_copy().t_(), None).is_none());
        assert!(linear(&x.to_kind(Kind::Half), &w.to_kind(Kind::Half), None).is_none());
        assert!(
            linear(&x.to_kind(Kind::BFloat16), &w, None).is_none(),
            "mixed dtypes"
        );
        let xg = x.set_requires_grad(true);
        assert!(
            linear(&xg, &w, None).is_none(),
            "autograd records this product"
        );
        let _guard = tch::no_grad_guard();
        if supported() {
            assert!(
                linear(&xg, &w, None).is_some(),
                "nothing records under no_grad"
            );
        }
    }

    /// Products from several threads at once: one holds the pool, the
    /// others run on their own thread, every result is right.
    #[test]
    #[cfg_attr(
        not(falcon_cpu_avx2_fma),
        ignore = "needs AVX2 and FMA, which this CPU lacks"
    )]
    fn concurrent_callers_get_their_own_results() {
        assert!(supported(), "{}", crate::kernels::STALE_BUILD);
        let handles: Vec<_> = (0..4)
            .map(|s| {
                thread::spawn(move || {
                    let _guard = tch::no_grad_guard();
                    tch::manual_seed(s);
                    let w = Tensor::randn([4096, 64], (Kind::Float, Device::Cpu));
                    for _ in 0..50 {
                        let x = Tensor::randn([3, 64], (Kind::Float, Device::Cpu));
                        let y = linear(&x, &w, None).expect("kernel applies");
                        close(&y, &x.linear(&w, None::<Tensor>), 1e-5);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("caller thread");
        }
    }
}
