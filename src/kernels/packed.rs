//! fp32 weights packed once while a batched generation runs, so the
//! products of a decode step at more than [`super::gemv::MAX_ROWS`] rows
//! stop re-packing every weight at every call.
//!
//! Why: at 32 rows a decode step is matrix products (about 70% of an RL
//! step's generation, perf), and a plain sgemm call copies the whole weight
//! into its own blocked layout before it multiplies: for a decode step's
//! few rows that copy is a large part of the call. Packing once pays it
//! once. The weights change after every optimizer step, so packing is
//! scoped: inside a [`Scope`] (one generation), each weight a product meets
//! is packed at first use and dropped when the scope ends. A weight changed
//! in place inside a scope (its version counter moves) is packed again; a
//! change through a tensor that only shares its storage (`set_data`, as
//! fused projections alias their parts) moves no version counter, which is
//! why no pack outlives its scope.
//!
//! Two layouts:
//! - where the CPU has AVX-512F, [`super::panel_gemm`]'s panels and its own
//!   kernel (`FALCON_CPU_PANELS=0` switches to MKL): packing SmolLM2-135M
//!   took 170 ms on the pool's two threads against MKL's 860 ms on one,
//!   and a decode step's products at 9 to 16 rows 5-15% less time
//!   (`examples/packed_probe.rs`);
//! - else MKL's packed sgemm (`cblas_sgemm_pack` / `cblas_sgemm_compute`).
//!   libtorch's x86-64 builds carry MKL and export its C API; the functions
//!   are looked up at run time, so a libtorch without MKL (aarch64) only
//!   means this path is never taken.
//!
//! Each output is one dot product, as in libtorch's own `linear`; only the
//! blocking (summation order) differs.

use std::cell::RefCell;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use tch::{Device, Kind, Tensor};

/// Most rows a packed product takes. Past 64, libtorch's own sgemm, whose
/// packing is amortised over the rows, was as fast or faster (the 49152 ×
/// 576 vocabulary projection at 128 rows: 0.8×; 1.1-1.6× at 32 to 64 rows
/// for every projection of SmolLM2-135M, 2 threads), so a prefill keeps it.
pub const MAX_ROWS: usize = 64;

/// The row count MKL is told to pack for: its layout depends on it. 32 (a
/// GRPO batch) was the fastest or within noise of it at 9 to 64 rows; 1
/// made the vocabulary projection at 32 rows 30% slower, 4096 doubled the
/// small projections.
const HINT_ROWS: i32 = 32;

static SWITCH: super::Switch = super::Switch::new("FALCON_CPU_PACK", "weights are packed");

static PANELS: super::Switch = super::Switch::new(
    "FALCON_CPU_PANELS",
    "weights are packed as panels where the CPU has AVX-512F",
);

/// Pack as [`super::panel_gemm`]'s panels (on, where the CPU has AVX-512F)
/// or for MKL's packed sgemm (off). `FALCON_CPU_PANELS=0` in the environment
/// starts it off; benchmarks use either to compare the two.
pub fn set_panels(on: bool) {
    PANELS.set(on)
}

fn panels() -> bool {
    PANELS.get() && super::panel_gemm::supported()
}

/// Switch packing on or off for the whole process (off: [`linear`] always
/// declines). `FALCON_CPU_PACK=0` in the environment starts it off;
/// benchmarks use either to compare the two paths.
pub fn set_enabled(on: bool) {
    SWITCH.set(on)
}

fn enabled() -> bool {
    SWITCH.get()
}

// MKL's C API, LP64 interface (MKL_INT = int), as libtorch links it.
const ROW_MAJOR: i32 = 101;
const NO_TRANS: i32 = 111;
const TRANS: i32 = 112;
const PACKED: i32 = 151;
const B_MATRIX: i32 = 162;

type SetLocal = unsafe extern "C" fn(i32) -> i32;
type GetSize = unsafe extern "C" fn(i32, i32, i32, i32) -> usize;
type Pack = unsafe extern "C" fn(i32, i32, i32, i32, i32, i32, f32, *const f32, i32, *mut f32);
type Compute = unsafe extern "C" fn(
    i32,
    i32,
    i32,
    i32,
    i32,
    i32,
    *const f32,
    i32,
    *const f32,
    i32,
    f32,
    *mut f32,
    i32,
);

struct Mkl {
    get_size: GetSize,
    pack: Pack,
    compute: Compute,
    set_local: Option<SetLocal>,
}

fn mkl() -> Option<&'static Mkl> {
    static MKL: OnceLock<Option<Mkl>> = OnceLock::new();
    MKL.get_or_init(|| {
        let find = |name: &str| {
            let c = std::ffi::CString::new(name).expect("no NUL in a symbol name");
            // SAFETY: dlsym on the process's global scope, which holds
            // libtorch_cpu (build.rs links it by name).
            let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        let (g, p, c) = (
            find("cblas_sgemm_pack_get_size")?,
            find("cblas_sgemm_pack")?,
            find("cblas_sgemm_compute")?,
        );
        // SAFETY: the symbols are MKL's, with the signatures above.
        unsafe {
            Some(Mkl {
                get_size: std::mem::transmute::<*mut libc::c_void, GetSize>(g),
                pack: std::mem::transmute::<*mut libc::c_void, Pack>(p),
                compute: std::mem::transmute::<*mut libc::c_void, Compute>(c),
                set_local: find("MKL_Set_Num_Threads_Local")
                    .map(|f| std::mem::transmute::<*mut libc::c_void, SetLocal>(f)),
            })
        }
    })
    .as_ref()
}

/// Can this process pack weights (AVX-512F, or libtorch carries MKL's
/// packed API)?
pub fn supported() -> bool {
    panels() || mkl().is_some()
}

/// The buffer of one packed weight. MKL asks for more than it writes (2 to
/// 20 times the weight, by shape); the pages it never touches are never
/// made resident, so the memory cost is about one copy of the weight.
/// Huge pages (`MADV_HUGEPAGE`) made the panel products 5% faster but
/// faulting them in tripled the time to pack a model (174 → 440-600 ms for
/// SmolLM2-135M, `examples/packed_probe.rs`): a net loss over a generation.
struct Buffer {
    ptr: *mut f32,
    layout: std::alloc::Layout,
}

impl Buffer {
    fn new(bytes: usize) -> Option<Self> {
        let layout = std::alloc::Layout::from_size_align(bytes.max(64), 64).ok()?;
        // SAFETY: a non-zero size; the packing fills what is read.
        let ptr = unsafe { std::alloc::alloc(layout) } as *mut f32;
        (!ptr.is_null()).then_some(Self { ptr, layout })
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr as *mut u8, self.layout) }
    }
}

struct Packed {
    /// Keeps the weight's storage alive, so no other tensor can take its
    /// address (the cache key) while the scope lasts.
    weight: Tensor,
    version: i64,
    layout: Layout,
}

enum Layout {
    /// [`super::panel_gemm`]'s panels, the whole weight in one buffer.
    Panels(Buffer),
    /// For MKL: output columns `[start, start + len)`, each packed on its
    /// own.
    Mkl(Vec<(usize, usize, Buffer)>),
}

/// Panels per claim of a panel product: small enough that two threads
/// share even a 576-column weight evenly.
const PANELS_PER_PART: usize = 2;

/// Output columns per packed part (a multiple of 64). Parts are what the
/// threads share, so a weight has at least two where it has 256 columns.
const PART_COLS: usize = 512;

/// `[start, len)` column ranges for `n` output columns.
fn column_parts(n: usize) -> Vec<(usize, usize)> {
    let count = if n < 256 {
        1
    } else {
        n.div_ceil(PART_COLS).max(2)
    };
    let size = n.div_ceil(count).div_ceil(64) * 64;
    (0..n)
        .step_by(size.max(1))
        .map(|start| (start, size.min(n - start)))
        .collect()
}

#[derive(Default)]
struct Cache {
    depth: usize,
    entries: HashMap<(usize, i64, i64, bool), Packed>,
    /// Weight bytes packed so far (about what the buffers hold).
    bytes: usize,
    budget: usize,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
}

/// While alive, [`linear`] on this thread packs each fp32 CPU weight it
/// meets once and reuses it; dropping the last scope frees every packed
/// weight. Scopes nest. Weights may change inside a scope (they are packed
/// again), but packing only pays when they do not.
pub struct Scope {
    _not_send: PhantomData<*const ()>,
}

/// Open a packing scope, or `None` where packing is off or unavailable.
pub fn scope() -> Option<Scope> {
    if !enabled() || !supported() {
        return None;
    }
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.depth == 0 {
            c.budget = budget();
        }
        c.depth += 1;
    });
    Some(Scope {
        _not_send: PhantomData,
    })
}

impl Drop for Scope {
    fn drop(&mut self) {
        CACHE.with(|c| {
            let mut c = c.borrow_mut();
            c.depth -= 1;
            if c.depth == 0 {
                c.entries.clear();
                c.bytes = 0;
            }
        });
    }
}

/// How many weight bytes one scope may pack: a quarter of the memory the
/// kernel reports available when it opens (packing is a second copy of
/// every weight), so a model that barely fits is never pushed into swap.
fn budget() -> usize {
    let available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(4 << 30);
    available / 4
}

/// How many weights this thread holds packed (tests).
pub fn packed_count() -> usize {
    CACHE.with(|c| c.borrow().entries.len())
}

/// `x Wᵀ (+ b)` through a packed copy of `w`, for fp32 CPU tensors of at
/// most [`MAX_ROWS`] rows inside a [`Scope`] while autograd does not record
/// them; `None` (the caller uses libtorch) otherwise, and when the scope's
/// memory budget is spent.
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Option<Tensor> {
    if !enabled() || CACHE.with(|c| c.borrow().depth) == 0 {
        return None;
    }
    let panels = panels();
    let mkl = if panels { None } else { Some(mkl()?) };
    let (m, n, k) = super::cpu_linear_shape(x, w, b, &[Kind::Float], MAX_ROWS)?;
    // MKL's sizes are 32-bit.
    if n > i32::MAX as usize || k > i32::MAX as usize {
        return None;
    }
    let xs = x.size();
    let key = (w.data_ptr() as usize, n as i64, k as i64, panels);
    let version = w.internal_version();
    let layout = CACHE.with(|c| {
        let mut c = c.borrow_mut();
        let fresh = |p: &Packed| p.version == version;
        if !c.entries.get(&key).is_some_and(fresh) {
            if let Some(old) = c.entries.remove(&key) {
                c.bytes -= old.weight.numel() * 4;
            }
            let bytes = w.numel() * 4;
            if c.bytes + bytes > c.budget {
                return None;
            }
            let layout = match mkl {
                None => Layout::Panels(pack_panels(w, n, k)?),
                Some(mkl) => Layout::Mkl(pack_mkl(mkl, w, n, k)?),
            };
            c.bytes += bytes;
            let weight = w.shallow_clone();
            c.entries.insert(
                key,
                Packed {
                    weight,
                    version,
                    layout,
                },
            );
        }
        c.entries.get(&key).map(|p| match &p.layout {
            Layout::Panels(buf) => Parts::Panels(buf.ptr as usize),
            Layout::Mkl(parts) => Parts::Mkl(
                parts
                    .iter()
                    .map(|(start, len, buf)| (*start, *len, buf.ptr as usize))
                    .collect(),
            ),
        })
    })?;
    let x = x.contiguous();
    let mut out_shape = xs[..xs.len() - 1].to_vec();
    out_shape.push(n as i64);
    let mut y = Tensor::empty(out_shape.as_slice(), (Kind::Float, Device::Cpu));
    // Outlives the job (the caller waits for it to finish).
    let bias = b.map(Tensor::contiguous);
    let work = match layout {
        Parts::Panels(w) => {
            // SAFETY: `x` is a contiguous fp32 tensor of `m · k` elements.
            let xv = unsafe { std::slice::from_raw_parts(x.data_ptr() as *const f32, m * k) };
            Product::Panels {
                rows: super::panel_gemm::Rows::new(xv, m, k),
                w,
                bias: bias.as_ref().map(|b| b.data_ptr() as usize),
                parts: n
                    .div_ceil(super::panel_gemm::PANEL)
                    .div_ceil(PANELS_PER_PART),
            }
        }
        Parts::Mkl(parts) => {
            // Never `b.expand(..).contiguous()`: at one row that is `b`
            // itself (a size-1 dimension's stride does not count), and MKL
            // would add into the bias.
            let beta = match b {
                Some(b) => {
                    y.copy_(&b.expand(out_shape.as_slice(), false));
                    1.0
                }
                None => 0.0,
            };
            Product::Mkl {
                mkl: mkl.expect("an MKL layout was packed with MKL"),
                x: x.data_ptr() as usize,
                beta,
                parts,
            }
        }
    };
    let job = Arc::new(Job {
        work,
        y: y.data_ptr() as usize,
        m,
        n,
        k,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
    });
    super::gemv::run_shared(job);
    Some(y)
}

/// `w` `[n, k]` as panels, or `None` where the memory cannot be had. The
/// pool's threads pack parts of it side by side: a generation packs every
/// weight of the model once, on its first decode step.
fn pack_panels(w: &Tensor, n: usize, k: usize) -> Option<Buffer> {
    let len = super::panel_gemm::packed_len(n, k);
    let buf = Buffer::new(len * 4)?;
    let panels = n.div_ceil(super::panel_gemm::PANEL);
    let job = Arc::new(PackJob {
        w: w.data_ptr() as usize,
        n,
        k,
        dst: buf.ptr as usize,
        parts: panels.div_ceil(PANELS_PER_PACK),
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
    });
    super::gemv::run_shared(job);
    Some(buf)
}

/// Panels packed per claim.
const PANELS_PER_PACK: usize = 8;

/// Packing one weight as panels, in parts of [`PANELS_PER_PACK`] panels.
struct PackJob {
    /// Addresses of the contiguous fp32 weight `[n, k]` and of the buffer of
    /// `packed_len(n, k)` floats; both outlive the job (its caller waits).
    w: usize,
    n: usize,
    k: usize,
    dst: usize,
    parts: usize,
    next: AtomicUsize,
    done: AtomicUsize,
}

impl super::gemv::Work for PackJob {
    fn work(&self) {
        use super::panel_gemm::PANEL;
        let (n, k) = (self.n, self.k);
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.parts {
                break;
            }
            let rows = i * PANELS_PER_PACK * PANEL..((i + 1) * PANELS_PER_PACK * PANEL).min(n);
            let start = i * PANELS_PER_PACK * PANEL * k;
            let len = super::panel_gemm::packed_len(rows.len(), k);
            // SAFETY: see `PackJob::w`; part `i` writes its own panels only.
            unsafe {
                let src = std::slice::from_raw_parts(self.w as *const f32, n * k);
                let dst = std::slice::from_raw_parts_mut((self.dst as *mut f32).add(start), len);
                super::panel_gemm::pack(src, k, rows, dst);
            }
            self.done.fetch_add(1, Ordering::Release);
        }
    }

    fn finished(&self) -> bool {
        self.done.load(Ordering::Acquire) >= self.parts
    }
}

/// `w` `[n, k]` packed for MKL, in column parts.
fn pack_mkl(mkl: &Mkl, w: &Tensor, n: usize, k: usize) -> Option<Vec<(usize, usize, Buffer)>> {
    let mut parts = Vec::new();
    for (start, len) in column_parts(n) {
        // SAFETY: plain size query.
        let size = unsafe { (mkl.get_size)(B_MATRIX, HINT_ROWS, len as i32, k as i32) };
        let buf = Buffer::new(size)?;
        // SAFETY: rows `start..start + len` of the contiguous fp32 `[n, k]`
        // weight; `buf` holds the bytes MKL asked for. B = Wᵀ, so W's rows
        // are packed transposed.
        unsafe {
            (mkl.pack)(
                ROW_MAJOR,
                B_MATRIX,
                TRANS,
                HINT_ROWS,
                len as i32,
                k as i32,
                1.0,
                (w.data_ptr() as *const f32).add(start * k),
                k as i32,
                buf.ptr,
            )
        };
        parts.push((start, len, buf));
    }
    Some(parts)
}

/// Where a packed weight's buffers are, for one product.
enum Parts {
    Panels(usize),
    /// `(first column, columns, packed buffer address)`.
    Mkl(Vec<(usize, usize, usize)>),
}

/// One product over a packed weight, in parts shared by the caller and the
/// CPU kernels' worker pool ([`super::gemv::run_shared`]), each part
/// single-threaded: libtorch's OpenMP threads sleep between parallel
/// regions (falcon runs them passive, see `main.rs`), and waking them for
/// each of a decode step's 121 products cost more than a quarter of a
/// batch-32 generation; the pool's workers spin (yielding) between
/// products.
struct Job {
    work: Product,
    /// Address of the output `[m, n]`, valid until the job is finished: the
    /// caller waits for that before it returns.
    y: usize,
    m: usize,
    n: usize,
    k: usize,
    next: AtomicUsize,
    done: AtomicUsize,
}

enum Product {
    /// Parts of [`PANELS_PER_PART`] panels.
    Panels {
        rows: super::panel_gemm::Rows,
        /// The packed buffer's address; it lives in the caller's scope,
        /// which cannot end while the caller waits.
        w: usize,
        /// The bias's address (`n` floats), valid as `Job::y` is.
        bias: Option<usize>,
        parts: usize,
    },
    /// One MKL call per packed column part.
    Mkl {
        mkl: &'static Mkl,
        /// Address of the input `[m, k]`, valid as `Job::y` is.
        x: usize,
        beta: f32,
        /// As [`Parts::Mkl`]; the buffers live as the panels' do.
        parts: Vec<(usize, usize, usize)>,
    },
}

impl Job {
    fn parts(&self) -> usize {
        match &self.work {
            Product::Panels { parts, .. } => *parts,
            Product::Mkl { parts, .. } => parts.len(),
        }
    }

    /// Part `i` (`< self.parts()`).
    ///
    /// # Safety
    /// Part `i` is the calling thread's alone; see `Job::y` for the
    /// addresses.
    unsafe fn part(&self, i: usize) {
        match &self.work {
            Product::Panels {
                rows,
                w,
                bias,
                parts: _,
            } => {
                let panels = self.n.div_ceil(super::panel_gemm::PANEL);
                let first = i * PANELS_PER_PART;
                super::panel_gemm::product(
                    rows,
                    *w as *const f32,
                    self.n,
                    first..(first + PANELS_PER_PART).min(panels),
                    bias.map(|b| b as *const f32),
                    self.y as *mut f32,
                );
            }
            Product::Mkl {
                mkl,
                x,
                beta,
                parts,
            } => {
                let (start, len, buf) = parts[i];
                (mkl.compute)(
                    ROW_MAJOR,
                    NO_TRANS,
                    PACKED,
                    self.m as i32,
                    len as i32,
                    self.k as i32,
                    *x as *const f32,
                    self.k as i32,
                    buf as *const f32,
                    len as i32,
                    *beta,
                    (self.y as *mut f32).add(start),
                    self.n as i32,
                )
            }
        }
    }
}

impl super::gemv::Work for Job {
    fn work(&self) {
        let mkl = matches!(self.work, Product::Mkl { .. });
        // SAFETY: a thread-local MKL setting, put back below.
        let prev = if mkl {
            unsafe { set_local_threads(1) }
        } else {
            0
        };
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.parts() {
                break;
            }
            // SAFETY: part `i` is this thread's alone; the parts write
            // disjoint columns of `y`.
            unsafe { self.part(i) };
            self.done.fetch_add(1, Ordering::Release);
        }
        if mkl {
            // SAFETY: as above.
            unsafe { set_local_threads(prev) };
        }
    }

    fn finished(&self) -> bool {
        self.done.load(Ordering::Acquire) >= self.parts()
    }
}

/// MKL's thread count for the calling thread only; returns the previous
/// one (0: the process-wide setting). The C entry point is the mixed-case
/// name: `mkl_set_num_threads_local` is the Fortran one, which takes a
/// pointer (calling it with a value crashed).
///
/// # Safety
/// Calls into MKL; sound on any thread.
unsafe fn set_local_threads(n: i32) -> i32 {
    match mkl().and_then(|m| m.set_local) {
        Some(f) => f(n),
        None => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &Tensor, b: &Tensor) {
        let diff = (a - b).abs().max().double_value(&[]);
        let scale = b.abs().max().double_value(&[]).max(1.0);
        assert!(
            diff <= 1e-5 * scale,
            "max difference {diff} (scale {scale})"
        );
    }

    /// On x86-64 libtorch carries MKL: the path must really be there, or
    /// every other test here would pass by declining.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn libtorch_exports_the_packed_api() {
        assert!(mkl().is_some());
    }

    /// Both layouts where this machine has them: the panels need AVX-512F,
    /// MKL's layout libtorch's MKL. On x86-64 CI machines at least one of
    /// them is always there ([`libtorch_exports_the_packed_api`]).
    fn layouts() -> Vec<bool> {
        let mut out = Vec::new();
        if super::super::panel_gemm::supported() {
            out.push(true);
        }
        if mkl().is_some() {
            out.push(false);
        }
        out
    }

    #[test]
    fn packed_products_match_libtorch_for_any_row_count() {
        for panels in layouts() {
            set_panels(panels);
            tch::manual_seed(0);
            // Three MKL column parts, the last one short; 34 panels of 32
            // columns and a ragged one of 12.
            let w = Tensor::randn([1100, 96], (Kind::Float, Device::Cpu));
            let b = Tensor::randn([1100], (Kind::Float, Device::Cpu));
            let b0 = b.copy();
            let _s = scope().unwrap();
            tch::no_grad(|| {
                for m in [1, 9, 14, 15, 32, 33, 64] {
                    let x = Tensor::randn([m, 96], (Kind::Float, Device::Cpu));
                    close(
                        &linear(&x, &w, None).unwrap(),
                        &x.linear(&w, None::<Tensor>),
                    );
                    close(&linear(&x, &w, Some(&b)).unwrap(), &x.linear(&w, Some(&b)));
                    let x3 = x.view([1, m, 96]);
                    let y3 = linear(&x3, &w, Some(&b)).unwrap();
                    assert_eq!(y3.size(), [1, m, 1100]);
                    close(&y3, &x3.linear(&w, Some(&b)));
                }
            });
            // Packed once, however many products used it; the bias untouched.
            assert_eq!(packed_count(), 1, "panels {panels}");
            assert!(b.equal(&b0), "the bias was written to (panels {panels})");
        }
    }

    /// The panels must be the default wherever the CPU has AVX-512F: the
    /// figures in `docs/model.md` are theirs.
    #[test]
    fn panels_are_the_default_where_the_cpu_has_avx512() {
        if std::env::var_os("FALCON_CPU_PANELS").is_some() {
            return;
        }
        assert_eq!(panels(), super::super::panel_gemm::supported());
    }

    #[test]
    fn column_parts_cover_every_column_once() {
        for n in [1, 63, 255, 256, 576, 960, 1100, 3072, 49152] {
            let parts = column_parts(n);
            let mut next = 0;
            for (i, &(start, len)) in parts.iter().enumerate() {
                assert_eq!(start, next, "n {n}");
                assert!(len > 0);
                if i + 1 < parts.len() {
                    assert_eq!(len % 64, 0, "n {n}: only the last part is ragged");
                }
                next = start + len;
            }
            assert_eq!(next, n);
            assert!(
                n < 256 || parts.len() >= 2,
                "n {n}: both threads get a part"
            );
        }
    }

    #[test]
    #[cfg_attr(
        not(target_arch = "x86_64"),
        ignore = "needs x86-64 (AVX-512F panels or MKL)"
    )]
    fn nothing_is_packed_outside_a_scope_and_a_scope_frees_what_it_packed() {
        assert!(
            supported(),
            "no packed products on this CPU (neither AVX-512F panels nor MKL)"
        );
        let w = Tensor::randn([64, 32], (Kind::Float, Device::Cpu));
        let x = Tensor::randn([16, 32], (Kind::Float, Device::Cpu));
        assert!(linear(&x, &w, None).is_none());
        {
            let _outer = scope().unwrap();
            {
                let _inner = scope().unwrap();
                assert!(linear(&x, &w, None).is_some());
            }
            // The inner scope's end frees nothing the outer one still uses.
            assert_eq!(packed_count(), 1);
        }
        assert_eq!(packed_count(), 0);
        assert!(linear(&x, &w, None).is_none());
    }

    #[test]
    #[cfg_attr(
        not(target_arch = "x86_64"),
        ignore = "needs x86-64 (AVX-512F panels or MKL)"
    )]
    fn a_weight_changed_inside_the_scope_is_packed_again() {
        assert!(
            supported(),
            "no packed products on this CPU (neither AVX-512F panels nor MKL)"
        );
        let mut w = Tensor::randn([48, 40], (Kind::Float, Device::Cpu));
        let x = Tensor::randn([12, 40], (Kind::Float, Device::Cpu));
        let _s = scope().unwrap();
        let before = linear(&x, &w, None).unwrap();
        tch::no_grad(|| {
            let _ = w.g_add_scalar_(1.0);
        });
        let after = linear(&x, &w, None).unwrap();
        close(&after, &x.linear(&w, None::<Tensor>));
        assert!((after - before).abs().max().double_value(&[]) > 0.1);
    }

    /// Fused projections share storage with their parts through
    /// `set_data`, which keeps each tensor's own version counter: a part
    /// folded in place leaves the fused weight's version where it was. So a
    /// pack must never outlive its generation (a version check alone would
    /// keep a stale one).
    #[test]
    #[cfg_attr(
        not(target_arch = "x86_64"),
        ignore = "needs x86-64 (AVX-512F panels or MKL)"
    )]
    fn a_new_scope_sees_a_change_made_through_an_aliasing_tensor() {
        assert!(
            supported(),
            "no packed products on this CPU (neither AVX-512F panels nor MKL)"
        );
        let fused = Tensor::randn([64, 32], (Kind::Float, Device::Cpu));
        let part = Tensor::zeros([32, 32], (Kind::Float, Device::Cpu));
        tch::no_grad(|| part.shallow_clone().set_data(&fused.narrow(0, 0, 32)));
        let x = Tensor::randn([12, 32], (Kind::Float, Device::Cpu));
        let before = {
            let _s = scope().unwrap();
            linear(&x, &fused, None).unwrap()
        };
        let v = fused.internal_version();
        tch::no_grad(|| {
            let _ = part.shallow_clone().g_add_scalar_(1.0);
        });
        assert_eq!(fused.internal_version(), v, "the premise: no version bump");
        let _s = scope().unwrap();
        let after = linear(&x, &fused, None).unwrap();
        close(&after, &x.linear(&fused, None::<Tensor>));
        assert!((after - before).abs().max().double_value(&[]) > 0.1);
    }

    #[test]
    #[cfg_attr(
        not(target_arch = "x86_64"),
        ignore = "needs x86-64 (AVX-512F panels or MKL)"
    )]
    fn products_autograd_records_and_other_dtypes_are_declined() {
        assert!(
            supported(),
            "no packed products on this CPU (neither AVX-512F panels nor MKL)"
        );
        let _s = scope().unwrap();
        let w = Tensor::randn([16, 8], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let x = Tensor::randn([12, 8], (Kind::Float, Device::Cpu));
        assert!(linear(&x, &w, None).is_none());
        let wb = Tensor::randn([16, 8], (Kind::BFloat16, Device::Cpu));
        let xb = Tensor::randn([12, 8], (Kind::BFloat16, Device::Cpu));
        assert!(linear(&xb, &wb, None).is_none());
        // Wrong shapes and a non-contiguous weight are declined, not guessed.
        let wt = Tensor::randn([8, 16], (Kind::Float, Device::Cpu)).transpose(0, 1);
        assert!(linear(&x, &wt, None).is_none());
        let x65 = Tensor::randn([MAX_ROWS as i64 + 1, 8], (Kind::Float, Device::Cpu));
        assert!(tch::no_grad(|| linear(&x65, &w.detach(), None)).is_none());
        let x7 = Tensor::randn([12, 7], (Kind::Float, Device::Cpu));
        assert!(tch::no_grad(|| linear(&x7, &w.detach(), None)).is_none());
    }
}
