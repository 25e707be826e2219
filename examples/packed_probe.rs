//! Times `kernels::packed` with its two layouts (falcon's AVX-512 panels,
//! MKL's packed sgemm) on one decode step of SmolLM2-135M: its 121 weight
//! shapes, each weight its own (cold: 540 MB, more than the caches hold), at
//! 9 to 64 rows, 2 threads; and what packing them costs. A probe, not a
//! benchmark (`scripts/bench/run train` is that).
//!
//!   cargo run --release --no-default-features --example packed_probe

use falcon_rl::kernels::packed;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

fn main() {
    tch::set_num_threads(2);
    let _g = tch::no_grad_guard();
    let mut shapes = Vec::new();
    for _ in 0..30 {
        shapes.extend([(960i64, 576i64), (576, 576), (3072, 576), (576, 1536)]);
    }
    shapes.push((49152, 576));
    let ws: Vec<Tensor> = shapes
        .iter()
        .map(|&(n, k)| Tensor::randn([n, k], (Kind::Float, Device::Cpu)))
        .collect();
    let bytes: f64 = shapes.iter().map(|&(n, k)| (n * k * 4) as f64).sum();
    let step = |xs: &[Tensor]| {
        for (w, x) in ws.iter().zip(xs) {
            let _ = packed::linear(x, w, None).expect("packed");
        }
    };
    for panels in [true, false] {
        packed::set_panels(panels);
        let _s = packed::scope().expect("packing available");
        let t = Instant::now();
        let xs: Vec<Tensor> = shapes
            .iter()
            .map(|&(_, k)| Tensor::randn([9, k], (Kind::Float, Device::Cpu)))
            .collect();
        step(&xs);
        println!(
            "{}: pack + first step {:.0} ms",
            if panels { "panels" } else { "mkl" },
            t.elapsed().as_secs_f64() * 1e3
        );
        for m in [2i64, 4, 8, 9, 12, 16, 24, 32, 48, 64] {
            let xs: Vec<Tensor> = shapes
                .iter()
                .map(|&(_, k)| Tensor::randn([m, k], (Kind::Float, Device::Cpu)))
                .collect();
            step(&xs);
            let reps = 5;
            let t = Instant::now();
            for _ in 0..reps {
                step(&xs);
            }
            let s = t.elapsed().as_secs_f64() / reps as f64;
            let g = if m <= 8 {
                let t = Instant::now();
                for _ in 0..reps {
                    for (w, x) in ws.iter().zip(&xs) {
                        let _ = falcon_rl::kernels::gemv::linear(x, w, None).expect("gemv");
                    }
                }
                format!(
                    "; gemv {:.1} ms",
                    t.elapsed().as_secs_f64() / reps as f64 * 1e3
                )
            } else {
                String::new()
            };
            println!(
                "  m={m}: {:.1} ms/step ({:.1} GB/s){g}",
                s * 1e3,
                bytes / s / 1e9
            );
        }
    }
}
