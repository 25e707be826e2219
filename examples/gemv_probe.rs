//! Times `kernels::gemv` against libtorch's `linear` on SmolLM2-135M's
//! matmul shapes (vocabulary projection, fused gate/up, down) at 1, 8, 16
//! and 32 rows, fp32 and bf16 (bf16 both through AVX512-BF16 and widened to
//! the fp32 kernel), 2 threads, back to back in one process: the figures
//! behind `gemv::MAX_ROWS`, the bf16 row limit and `CHUNK_ROWS`. A probe, not a
//! benchmark (`scripts/bench/run generate` is that).
//!
//!   cargo run --release --no-default-features --example gemv_probe

use falcon_rl::kernels::gemv::Isa;
use std::time::Instant;
use tch::{Device, Kind, Tensor};
fn main() {
    if !falcon_rl::kernels::gemv::supported() {
        eprintln!("this CPU lacks AVX2/FMA: the kernel never runs here");
        return;
    }
    tch::set_num_threads(2);
    let _g = tch::no_grad_guard();
    for &(n, k) in &[(49152i64, 576i64), (3072, 576), (576, 1536)] {
        for kind in [Kind::Float, Kind::BFloat16] {
            let w = Tensor::randn([n, k], (Kind::Float, Device::Cpu)).to_kind(kind);
            for m in [1i64, 8, 16, 32] {
                let x = Tensor::randn([m, k], (Kind::Float, Device::Cpu)).to_kind(kind);
                let reps = 200;
                for (on, cap) in [
                    (true, Isa::Avx512Bf16),
                    (true, Isa::Avx512),
                    (false, Isa::Avx512Bf16),
                ] {
                    if cap != Isa::Avx512Bf16 && kind != Kind::BFloat16 {
                        continue;
                    }
                    falcon_rl::kernels::gemv::set_enabled(on);
                    falcon_rl::kernels::gemv::cap_isa(cap);
                    let _ = falcon_rl::kernels::gemv::linear(&x, &w, None)
                        .unwrap_or_else(|| x.linear(&w, None::<Tensor>));
                    let t = Instant::now();
                    for _ in 0..reps {
                        let _ = falcon_rl::kernels::gemv::linear(&x, &w, None)
                            .unwrap_or_else(|| x.linear(&w, None::<Tensor>));
                    }
                    let s = t.elapsed().as_secs_f64() / reps as f64;
                    let gbs = (n * k) as f64 * kind.elt_size_in_bytes() as f64 / s / 1e9;
                    println!(
                        "{n}x{k} {kind:?} m={m} {}: {:.3} ms {:.1} GB/s",
                        match (on, cap) {
                            (false, _) => "torch",
                            (true, Isa::Avx512Bf16) => "gemv",
                            _ => "gemv, widened",
                        },
                        s * 1e3,
                        gbs
                    );
                }
            }
        }
    }
}
