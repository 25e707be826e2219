//! A weight laid out in column panels, and the AVX-512 product of a few
//! rows (9 to 64, a batched decode step) against it: [`super::packed`]'s
//! layout where the CPU has AVX-512F, instead of MKL's packed sgemm.
//!
//! Why: at these row counts a product must stream the whole weight from
//! memory once and do little arithmetic per byte, and MKL's packed compute
//! did neither well (cold weights, one decode step's shapes at 16 rows:
//! 36 ms against a 22 ms copy of the same bytes). Here each panel holds 32
//! output columns as `[k][32]`, so one pass reads it front to back; the
//! rows go in blocks of at most [`MAX_BLOCK`], each block's 2 × rows
//! accumulators stay in registers, a broadcast input element feeds two
//! fused multiply-adds, and the panel ahead is prefetched while a block
//! computes.
//!
//! Each output is one fp32 sum over `k` in order, plus the bias: only the
//! summation order differs from libtorch's `linear`.

/// Output columns per panel: two AVX-512 registers.
pub(crate) const PANEL: usize = 32;

/// Most input rows one pass over a panel takes: 2 × 14 accumulators, two
/// weight registers and the broadcast fill the 32 registers. Fewer
/// accumulators (three registers of weights, 9 rows) was as fast hot and
/// slower cold.
const MAX_BLOCK: usize = 14;

/// How far ahead of the one being read a panel is prefetched, in floats
/// (4 KiB): without it a cold product at 16 rows ran at 60% of the copy
/// bandwidth; 1-16 KiB were within noise of each other.
const PREFETCH: usize = 1024;

/// Can this CPU run the kernel (AVX-512F)?
pub(crate) fn supported() -> bool {
    super::avx512f()
}

/// Floats a packed `[n, k]` weight takes: whole panels (the last one padded
/// with zero columns).
pub(crate) fn packed_len(n: usize, k: usize) -> usize {
    n.div_ceil(PANEL) * PANEL * k
}

/// Lay the rows `rows` of the row-major `[n, k]` weight `w` out as panels
/// into `dst` (panel `p` of the range at `p · PANEL · k`); the range starts
/// on a panel boundary. Columns past `n` are zero.
pub(crate) fn pack(w: &[f32], k: usize, rows: std::ops::Range<usize>, dst: &mut [f32]) {
    let n = w.len() / k;
    debug_assert_eq!(rows.start % PANEL, 0);
    // Tiles of 16 × PANEL: each weight row's 64 bytes are read whole, and
    // the tile's writes stay within 2 KiB.
    const TILE: usize = 16;
    for (p, panel) in dst.chunks_exact_mut(PANEL * k).enumerate() {
        let first = rows.start + p * PANEL;
        if first >= rows.end {
            break;
        }
        for k0 in (0..k).step_by(TILE) {
            let kl = TILE.min(k - k0);
            for c in 0..PANEL {
                let j = first + c;
                if j < n && j < rows.end {
                    let src = &w[j * k + k0..j * k + k0 + kl];
                    for (i, &v) in src.iter().enumerate() {
                        panel[(k0 + i) * PANEL + c] = v;
                    }
                } else {
                    for i in 0..kl {
                        panel[(k0 + i) * PANEL + c] = 0.0;
                    }
                }
            }
        }
    }
}

/// The rows of `x` `[m, k]` the way the kernel reads them: in blocks of at
/// most [`MAX_BLOCK`] rows (as even as possible), each block interleaved as
/// `[k][rows]` so that a step over `k` reads one short contiguous run.
pub(crate) struct Rows {
    k: usize,
    /// `(first row, rows, offset in data)`.
    blocks: Vec<(usize, usize, usize)>,
    data: Vec<f32>,
}

impl Rows {
    pub(crate) fn new(x: &[f32], m: usize, k: usize) -> Self {
        let count = m.div_ceil(MAX_BLOCK).max(1);
        let mut data = vec![0f32; m * k];
        let mut blocks = Vec::with_capacity(count);
        let (mut first, mut off) = (0, 0);
        for b in 0..count {
            let rows = m / count + usize::from(b < m % count);
            for r in 0..rows {
                for (kk, &v) in x[(first + r) * k..(first + r + 1) * k].iter().enumerate() {
                    data[off + kk * rows + r] = v;
                }
            }
            blocks.push((first, rows, off));
            first += rows;
            off += rows * k;
        }
        Self { k, blocks, data }
    }
}

/// `y[.., cols] = x Wᵀ (+ b)` for the panels `panels` of a packed weight
/// with `n` columns, `y` row-major `[m, n]`.
///
/// # Safety
/// `w` holds the packed weight (at least those panels, from panel 0 at
/// `w`), `y` has room for `[m, n]` and no other thread writes these
/// columns, `bias` (if any) holds `n` floats; the CPU has AVX-512F.
pub(crate) unsafe fn product(
    x: &Rows,
    w: *const f32,
    n: usize,
    panels: std::ops::Range<usize>,
    bias: Option<*const f32>,
    y: *mut f32,
) {
    #[cfg(target_arch = "x86_64")]
    {
        let k = x.k;
        for p in panels {
            let panel = w.add(p * PANEL * k);
            let col = p * PANEL;
            let cols = PANEL.min(n - col);
            for &(first, rows, off) in &x.blocks {
                let out = Out {
                    y: y.add(first * n + col),
                    ldy: n,
                    cols,
                    bias: bias.map(|b| b.add(col)),
                };
                simd::block(rows, x.data.as_ptr().add(off), panel, k, &out);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, w, n, panels, bias, y);
        unreachable!("panel_gemm::supported() is false off x86-64");
    }
}

/// Where one block's sums go: `cols` (≤ [`PANEL`]) columns from `y` on,
/// rows `ldy` apart, each plus its bias.
struct Out {
    y: *mut f32,
    ldy: usize,
    cols: usize,
    bias: Option<*const f32>,
}

#[cfg(target_arch = "x86_64")]
// One accumulator array indexed by the row counter: a range loop reads
// more plainly than zipped iterators.
#[allow(clippy::needless_range_loop)]
mod simd {
    use super::{Out, PANEL, PREFETCH};
    use std::arch::x86_64::*;

    /// [`kernel`] with the row count a constant.
    pub(super) unsafe fn block(rows: usize, x: *const f32, w: *const f32, k: usize, out: &Out) {
        macro_rules! by_rows {
            ($($r:literal)*) => {
                match rows {
                    $($r => kernel::<$r>(x, w, k, out),)*
                    _ => unreachable!("1 to MAX_BLOCK rows"),
                }
            };
        }
        by_rows!(1 2 3 4 5 6 7 8 9 10 11 12 13 14)
    }

    /// `R` interleaved rows (`x[kk · R + r]`) times one panel.
    #[target_feature(enable = "avx512f")]
    unsafe fn kernel<const R: usize>(x: *const f32, w: *const f32, k: usize, out: &Out) {
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        for kk in 0..k {
            let at = w.add(kk * PANEL);
            let w0 = _mm512_loadu_ps(at);
            let w1 = _mm512_loadu_ps(at.add(16));
            _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH + 16) as *const i8);
            for r in 0..R {
                let b = _mm512_set1_ps(*x.add(kk * R + r));
                lo[r] = _mm512_fmadd_ps(b, w0, lo[r]);
                hi[r] = _mm512_fmadd_ps(b, w1, hi[r]);
            }
        }
        let (m0, m1) = masks(out.cols);
        let (b0, b1) = match out.bias {
            Some(b) => (
                _mm512_maskz_loadu_ps(m0, b),
                _mm512_maskz_loadu_ps(m1, b.add(16)),
            ),
            None => (_mm512_setzero_ps(), _mm512_setzero_ps()),
        };
        for r in 0..R {
            let y = out.y.add(r * out.ldy);
            _mm512_mask_storeu_ps(y, m0, _mm512_add_ps(lo[r], b0));
            _mm512_mask_storeu_ps(y.add(16), m1, _mm512_add_ps(hi[r], b1));
        }
    }

    /// Lane masks of the two registers for `cols` valid columns.
    fn masks(cols: usize) -> (__mmask16, __mmask16) {
        let lanes = |c: usize| -> __mmask16 {
            if c >= 16 {
                0xffff
            } else {
                ((1u32 << c) - 1) as __mmask16
            }
        };
        (lanes(cols), lanes(cols.saturating_sub(16)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(
        x: &[f32],
        w: &[f32],
        b: Option<&[f32]>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Vec<f64> {
        let mut y = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k)
                    .map(|kk| x[i * k + kk] as f64 * w[j * k + kk] as f64)
                    .sum();
                y[i * n + j] = s + b.map_or(0.0, |b| b[j] as f64);
            }
        }
        y
    }

    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    }

    #[test]
    #[cfg_attr(
        not(falcon_cpu_avx512f),
        ignore = "needs AVX-512F, which this CPU lacks"
    )]
    fn every_row_count_and_ragged_columns_match_an_fp64_reference() {
        assert!(supported(), "{}", crate::kernels::STALE_BUILD);
        // 70 columns: two whole panels and a ragged third; k not a
        // multiple of the packing tile.
        let (n, k) = (70, 37);
        let w = values(n * k, 1);
        let b = values(n, 2);
        let mut packed = vec![f32::NAN; packed_len(n, k)];
        pack(&w, k, 0..n, &mut packed);
        for m in [1, 9, 13, 14, 15, 28, 29, 33, 64] {
            let x = values(m * k, 3 + m as u64);
            let rows = Rows::new(&x, m, k);
            for bias in [None, Some(&b[..])] {
                // Columns past n must stay untouched: a sentinel row after y.
                let mut y = vec![f32::NAN; m * n + 1];
                y[m * n] = 7.0;
                let panels = n.div_ceil(PANEL);
                // Two calls over disjoint panel ranges, as two threads would.
                unsafe {
                    product(
                        &rows,
                        packed.as_ptr(),
                        n,
                        0..1,
                        bias.map(|b| b.as_ptr()),
                        y.as_mut_ptr(),
                    );
                    product(
                        &rows,
                        packed.as_ptr(),
                        n,
                        1..panels,
                        bias.map(|b| b.as_ptr()),
                        y.as_mut_ptr(),
                    );
                }
                let want = reference(&x, &w, bias, m, n, k);
                for (i, (&got, &want)) in y.iter().zip(&want).enumerate() {
                    assert!(
                        (got as f64 - want).abs() <= 1e-5 * want.abs().max(1.0),
                        "m {m} element {i}: {got} against {want}"
                    );
                }
                assert_eq!(y[m * n], 7.0, "m {m}: a store went past the output");
            }
        }
    }

    #[test]
    fn packing_part_of_the_rows_lays_out_just_those_panels() {
        let (n, k) = (100, 5);
        let w = values(n * k, 9);
        let mut whole = vec![0f32; packed_len(n, k)];
        pack(&w, k, 0..n, &mut whole);
        // Rows 64..100 are panels 2 and 3 of the whole.
        let mut part = vec![1f32; packed_len(36, k)];
        pack(&w, k, 64..100, &mut part);
        assert_eq!(part[..], whole[2 * PANEL * k..]);
        // Panel 0, k 3, column 5 is w[5][3]; padding is zero.
        assert_eq!(whole[3 * PANEL + 5], w[5 * k + 3]);
        assert_eq!(whole[3 * PANEL * k + 4 * PANEL + 10], 0.0);
    }
}
