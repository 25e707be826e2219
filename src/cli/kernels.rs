//! `falcon kernels`: compile every CUDA kernel (no GPU needed), and on a
//! GPU compare each with its libtorch reference and measure it.

use std::time::Instant;

use anyhow::{bail, Result};
use clap::{Args, Subcommand, ValueEnum};
use tch::{Device, Kind, Tensor};

use falcon_rl::kernels::fused::{self, Backend};
use falcon_rl::kernels::multi_lora::{self, Stack};
use falcon_rl::kernels::{device, toolchain, SOURCES};
use falcon_rl::model::{Dtype, TorchKind};

use super::UsageError;

#[derive(Subcommand)]
pub enum KernelsCmd {
    /// Compile every kernel to PTX with NVRTC and assemble it with ptxas for
    /// one GPU architecture; no GPU needed (what CI runs).
    Check {
        /// Target GPU architecture (`sm_90` is the H100/H200).
        #[arg(long, default_value = "sm_90")]
        arch: String,
    },
    /// On a CUDA device: one kernel case against its reference (max
    /// difference, time, device memory the case reserved), as one JSON line.
    /// Run each case in its own process: memory is read from the device.
    Bench(BenchArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum Case {
    /// One update's log-probs, plain path: full logits, fp32 log-softmax.
    Plain,
    /// The same with the fused path (kernel on CUDA); checked against plain.
    Fused,
    /// Batched multi-adapter LoRA: the kernel against the reference.
    Lora,
    /// The device vector index (exact inner product, top-10) against the
    /// same index on the CPU.
    Index,
}

#[derive(Args)]
pub struct BenchArgs {
    #[arg(long, value_enum)]
    case: Case,
    /// Scored tokens (plain/fused) or rows (lora).
    #[arg(long, default_value_t = 8192)]
    tokens: i64,
    /// Vocabulary (Qwen2.5's by default).
    #[arg(long, default_value_t = 151_936)]
    vocab: i64,
    /// Hidden size (Qwen2.5-0.5B's by default).
    #[arg(long, default_value_t = 896)]
    hidden: i64,
    /// Adapters in the lora case (FALCON's tasks per meta-step).
    #[arg(long, default_value_t = 8)]
    adapters: i64,
    #[arg(long, default_value_t = 16)]
    rank: i64,
    /// bf16 or fp32.
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Vectors in the index case.
    #[arg(long, default_value_t = 1_000_000)]
    entries: i64,
    /// Their dimension (all-MiniLM-L6-v2's by default).
    #[arg(long, default_value_t = 384)]
    dim: i64,
}

pub fn run(cmd: KernelsCmd) -> Result<()> {
    match cmd {
        KernelsCmd::Check { arch } => check(&arch),
        KernelsCmd::Bench(a) => bench(a),
    }
}

fn check(arch: &str) -> Result<()> {
    let Some(num) = arch.strip_prefix("sm_") else {
        return Err(UsageError(format!("--arch {arch}: expected sm_NN (e.g. sm_90)")).into());
    };
    let virt = format!("compute_{num}");
    for (name, _) in SOURCES {
        let t = Instant::now();
        let ptx = toolchain::compile_ptx(name, &virt)?;
        let cubin = toolchain::assemble(name, &ptx, arch)?;
        println!(
            "kernels/{name}.cu: {} bytes of PTX ({virt}), {} bytes of {arch} code ({:.2} s)",
            ptx.len(),
            cubin.len(),
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_kind(Kind::Float) - b.to_kind(Kind::Float))
        .abs()
        .max()
        .double_value(&[])
}

fn bench(a: BenchArgs) -> Result<()> {
    let kind = match a.dtype.parse::<Dtype>().map(TorchKind::kind) {
        Ok(k @ (Kind::BFloat16 | Kind::Float)) => k,
        _ => return Err(UsageError(format!("--dtype {}: bf16 or fp32", a.dtype)).into()),
    };
    if !tch::Cuda::is_available() {
        bail!("falcon kernels bench needs a CUDA device");
    }
    let dev = Device::Cuda(0);
    tch::manual_seed(0);
    let sync = || tch::Cuda::synchronize(0);
    let (free0, total) = device::memory(0)?;
    let mut out = serde_json::Map::new();
    let case_name = a.case.to_possible_value().expect("every case has a name");
    out.insert("case".into(), case_name.get_name().into());
    match a.case {
        Case::Plain | Case::Fused => {
            // The update's inputs: last hidden states (trainable upstream),
            // a frozen projection, sampled tokens, advantages.
            let h =
                (Tensor::randn([a.tokens, a.hidden], (kind, dev)) * 0.5).set_requires_grad(true);
            let head = Tensor::randn([a.vocab, a.hidden], (kind, dev)) * 0.05;
            let y = Tensor::randint(a.vocab, [a.tokens], (Kind::Int64, dev));
            let adv = Tensor::randn([a.tokens], (Kind::Float, dev));
            sync();
            let (f_before, _) = device::memory(0)?;
            let step = |fused_path: bool| -> Result<(Tensor, Tensor)> {
                let lp = if fused_path {
                    fused::token_logprobs(&h, &head, &y, Backend::for_tensor(&h), None)?.0
                } else {
                    h.mm(&head.transpose(0, 1))
                        .log_softmax(-1, Kind::Float)
                        .gather(-1, &y.unsqueeze(-1), false)
                        .squeeze_dim(-1)
                };
                let loss = -(&lp * &adv).mean(Kind::Float);
                let g = Tensor::run_backward(&[loss], &[&h], false, false).remove(0);
                Ok((lp.detach(), g))
            };
            let fused_path = matches!(a.case, Case::Fused);
            let t = Instant::now();
            let (lp, g) = step(fused_path)?;
            sync();
            let first = t.elapsed().as_secs_f64();
            let (f_after, _) = device::memory(0)?;
            let t = Instant::now();
            let _ = step(fused_path)?;
            sync();
            out.insert("seconds".into(), t.elapsed().as_secs_f64().into());
            out.insert("first_seconds".into(), first.into());
            out.insert(
                "reserved_mib".into(),
                ((f_before.saturating_sub(f_after)) as f64 / 1048576.0).into(),
            );
            if fused_path {
                // Against the plain path, computed after the measurement.
                let (lp0, g0) = step(false)?;
                out.insert("max_dlogp".into(), max_diff(&lp, &lp0).into());
                out.insert("max_dgrad".into(), max_diff(&g, &g0).into());
                out.insert(
                    "grad_scale".into(),
                    g0.abs().max().to_kind(Kind::Float).double_value(&[]).into(),
                );
                // The kernel's statistics against the libtorch reference's.
                let (lr, er) = tch::no_grad(|| {
                    fused::token_logprobs(&h, &head, &y, Backend::Reference, None)
                })?;
                let (lk, ek) =
                    tch::no_grad(|| fused::token_logprobs(&h, &head, &y, Backend::Kernel, None))?;
                out.insert(
                    "kernel_vs_reference_dlogp".into(),
                    max_diff(&lk, &lr).into(),
                );
                out.insert("kernel_vs_reference_dent".into(), max_diff(&ek, &er).into());
            }
        }
        Case::Index => index_case(&a, &mut out)?,
        Case::Lora => {
            let (k, r) = (a.adapters, a.rank);
            let sa = Tensor::randn([k, r, a.hidden], (kind, dev)) * 0.05;
            let sb = Tensor::randn([k, a.hidden, r], (kind, dev)) * 0.05;
            let x = Tensor::randn([a.tokens, a.hidden], (kind, dev));
            let idx = Tensor::randint(k, [a.tokens], (Kind::Int64, dev));
            let s = Stack {
                a: &sa,
                b: &sb,
                scale: 2.0,
            };
            let time = |f: &dyn Fn() -> Result<Tensor>| -> Result<(Tensor, f64)> {
                let y = f()?;
                sync();
                let t = Instant::now();
                for _ in 0..10 {
                    let _ = f()?;
                }
                sync();
                Ok((y, t.elapsed().as_secs_f64() / 10.0))
            };
            let (yr, tr) = time(&|| Ok(tch::no_grad(|| multi_lora::reference(&x, &s, &idx))?))?;
            let (yk, tk) = time(&|| Ok(multi_lora::kernel(&x, &s, &idx)?))?;
            // Per-adapter loop, what the meta-step did before batching.
            let (yl, tl) = time(&|| {
                Ok(tch::no_grad(|| {
                    let mut y = Tensor::zeros([a.tokens, a.hidden], (kind, dev));
                    for j in 0..k {
                        let rows = idx.eq(j).nonzero().squeeze_dim(-1);
                        let xs = x.index_select(0, &rows);
                        let ys = xs.matmul(&sa.get(j).tr()).matmul(&sb.get(j).tr()) * 2.0;
                        let _ = y.index_copy_(0, &rows, &ys);
                    }
                    y
                }))
            })?;
            out.insert("kernel_vs_reference".into(), max_diff(&yk, &yr).into());
            out.insert("loop_vs_reference".into(), max_diff(&yl, &yr).into());
            out.insert(
                "output_scale".into(),
                yr.abs().max().to_kind(Kind::Float).double_value(&[]).into(),
            );
            out.insert("kernel_seconds".into(), tk.into());
            out.insert("reference_seconds".into(), tr.into());
            out.insert("loop_seconds".into(), tl.into());
        }
    }
    out.insert("total_mib".into(), (total as f64 / 1048576.0).into());
    out.insert(
        "free_mib_at_start".into(),
        (free0 as f64 / 1048576.0).into(),
    );
    println!("{}", serde_json::Value::Object(out));
    Ok(())
}

fn index_case(a: &BenchArgs, out: &mut serde_json::Map<String, serde_json::Value>) -> Result<()> {
    use falcon_rl::memory::index::{ExactIndex, VectorIndex};
    let (n, d) = (a.entries, a.dim);
    let unit = |t: Tensor| {
        let norm = t.norm_scalaropt_dim(2, [1], true);
        t / norm
    };
    let v = unit(Tensor::randn([n, d], (Kind::Float, Device::Cpu)));
    let q = unit(Tensor::randn([64, d], (Kind::Float, Device::Cpu)));
    let ids: Vec<i64> = (0..n).collect();
    let mut results = Vec::new();
    for dev in [Device::Cuda(0), Device::Cpu] {
        let mut ix = ExactIndex::new(d as usize, dev);
        ix.add(&ids, &v)?;
        let _ = ix.search(&q, 10)?;
        let t = Instant::now();
        let mut hits = Vec::new();
        for _ in 0..5 {
            hits = ix.search(&q, 10)?;
        }
        results.push((hits, t.elapsed().as_secs_f64() / 5.0));
    }
    let (gpu, cpu) = (&results[0], &results[1]);
    let (mut same, mut all) = (0usize, 0usize);
    for (g, c) in gpu.0.iter().zip(&cpu.0) {
        let cs: std::collections::BTreeSet<i64> = c.iter().map(|h| h.id).collect();
        same += g.iter().filter(|h| cs.contains(&h.id)).count();
        all += c.len();
    }
    out.insert("entries".into(), n.into());
    out.insert("dim".into(), d.into());
    out.insert("cuda_seconds".into(), gpu.1.into());
    out.insert("cpu_seconds".into(), cpu.1.into());
    out.insert(
        "same_top10".into(),
        (same as f64 / all.max(1) as f64).into(),
    );
    Ok(())
}
