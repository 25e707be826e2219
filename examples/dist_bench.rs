//! All-reduce time and bandwidth of the trainer's process group (c10d
//! Gloo), run as the ranks of a torchrun job (scripts/bench/run dist):
//!
//!   torchrun --no-python --nproc-per-node 2 dist_bench [--repeats N] [ELEMENTS ...]
//!
//! For each size: the gradients of that many fp32 parameters all-reduced
//! the way a step does it (`Group::all_reduce_grads`: buckets of
//! `--bucket-mb`, summed), median seconds over the repeats, and the
//! bandwidths as nccl-tests define them (algorithm: bytes / time; bus:
//! that × 2(n−1)/n, what each link carries in a ring). Rank 0 prints one
//! JSON line per size. Sizes above `--max-param-elements` are measured on
//! one flat buffer in bucket-sized slices (the same collectives without
//! 2× the memory for parameters and their gradients).

use std::time::{Duration, Instant};

use falcon_rl::dist::{Group, Launch, Reduce};
use tch::{Device, Kind, Tensor};

fn main() {
    let mut repeats = 5usize;
    let mut bucket_mb = 25.0f64;
    let mut max_param = 50_000_000usize;
    let mut sizes: Vec<usize> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| -> String {
            args.next()
                .unwrap_or_else(|| panic!("{name} needs a value"))
        };
        match a.as_str() {
            "--repeats" => repeats = val("--repeats").parse().expect("a count"),
            "--bucket-mb" => bucket_mb = val("--bucket-mb").parse().expect("MiB"),
            "--max-param-elements" => {
                max_param = val("--max-param-elements").parse().expect("a count")
            }
            s => sizes.push(s.parse::<f64>().expect("a number of elements") as usize),
        }
    }
    if sizes.is_empty() {
        sizes = vec![1_800_000];
    }
    let launch = Launch::from_env().expect("a launcher's environment");
    let g = Group::init(&launch, Duration::from_secs(600)).expect("rendezvous");
    let bucket = (bucket_mb * (1 << 20) as f64) as usize;
    for &n in &sizes {
        let mut times = Vec::with_capacity(repeats);
        if n <= max_param {
            // Parameters shaped like LoRA factors, each with a gradient.
            let per = 16 * 576;
            let params: Vec<Tensor> = (0..n.div_ceil(per))
                .map(|i| {
                    let m = per.min(n - i * per) as i64;
                    Tensor::zeros([m], (Kind::Float, Device::Cpu)).set_requires_grad(true)
                })
                .collect();
            for p in &params {
                (p * (g.rank() as f64 + 1.0)).sum(Kind::Float).backward();
            }
            for _ in 0..repeats + 1 {
                g.barrier().unwrap();
                let t0 = Instant::now();
                g.all_reduce_grads(&params, bucket, false).unwrap();
                times.push(t0.elapsed().as_secs_f64());
            }
        } else {
            let flat = Tensor::ones([n as i64], (Kind::Float, Device::Cpu));
            let step = (bucket / 4).max(1) as i64;
            for _ in 0..repeats + 1 {
                g.barrier().unwrap();
                let t0 = Instant::now();
                let mut off = 0i64;
                while off < n as i64 {
                    let len = step.min(n as i64 - off);
                    g.all_reduce(&[flat.narrow(0, off, len)], Reduce::Sum)
                        .unwrap();
                    off += len;
                }
                times.push(t0.elapsed().as_secs_f64());
            }
        }
        times.remove(0); // warm-up: connections and allocations
        times.sort_by(f64::total_cmp);
        let med = times[times.len() / 2];
        let bytes = (n * 4) as f64;
        let w = g.world() as f64;
        if g.is_main() {
            println!(
                "{}",
                serde_json::json!({
                    "elements": n,
                    "mib": bytes / (1 << 20) as f64,
                    "world": g.world(),
                    "bucket_mb": bucket_mb,
                    "repeats": repeats,
                    "median_s": med,
                    "min_s": times[0],
                    "max_s": times[times.len() - 1],
                    "algbw_gbs": bytes / med / 1e9,
                    "busbw_gbs": bytes / med / 1e9 * 2.0 * (w - 1.0) / w,
                })
            );
        }
    }
    g.barrier().unwrap();
}
