//! Custom kernels for the hot spots libtorch does not serve well (CUDA, and
//! one for the CPU), and the libtorch reference path of each, which is what
//! runs where a kernel cannot and what the tests compare against.
//!
//! The CUDA C sources live in `kernels/` at the top of the repository and
//! are embedded in the binary. NVRTC compiles them at run time for the
//! device at hand and the driver API launches them, both through `cudarc`
//! with the libraries loaded at run time ([`toolchain`]): the same binary
//! builds and runs on machines with no CUDA at all, and a CPU machine can
//! still compile every kernel to PTX and assemble it (`ptxas`), which is
//! what CI checks.
//!
//! - [`fused`]: log-probs (and entropies) of sampled tokens straight from
//!   the last hidden states and the output projection, in chunks, never
//!   materialising fp32 `[tokens × vocabulary]` logits.
//! - [`multi_lora`]: LoRA with one adapter per row (a gather-matmul over
//!   per-row adapter indices), so K tasks' fast adapters run in one batch.
//! - [`device`]: the device's free and total memory, and kernel launches.
//! - [`gemv`] (CPU, not CUDA): a decode step's matrix-vector products at
//!   batch 1 to 8, on a small spinning pool instead of libtorch's OpenMP.
//! - [`decode_ops`] (CPU): a batched decode step's attention over the KV
//!   cache and SiLU-gated product, one pass each.
//! - [`packed`] (CPU): at 9 to 64 rows, products on weights packed once
//!   per generation instead of at every call: in `panel_gemm`'s panels with
//!   its AVX-512 kernel, or for MKL's packed sgemm.

pub mod decode_ops;
pub mod device;
pub mod fused;
pub mod gemv;
pub mod multi_lora;
pub mod packed;
mod panel_gemm;
pub mod toolchain;

/// Every kernel source: `(name, CUDA C)`.
pub const SOURCES: &[(&str, &str)] = &[
    (
        "token_logprobs",
        include_str!("../../kernels/token_logprobs.cu"),
    ),
    ("lora_bgmv", include_str!("../../kernels/lora_bgmv.cu")),
];

/// Helpers every kernel includes (`#include "common.cuh"`, expanded by
/// [`toolchain::source`]: the sources compile from memory, with no
/// include directory).
pub const COMMON: &str = include_str!("../../kernels/common.cuh");

/// A process-wide on/off switch from the environment (`0`/`off`/`false`/`no`
/// or `1`/`on`/`true`/`yes`); `None` when unset. A spelling it does not
/// understand warns, saying what happens instead (`otherwise`), and counts
/// as unset: a typo must not pass for a measurement of the other path.
pub(crate) fn env_switch(var: &str, otherwise: &str) -> Option<bool> {
    let v = std::env::var(var).ok()?;
    let on = parse_switch(&v);
    if on.is_none() {
        eprintln!(
            "warning: {var}={v:?} is not understood (0/off/false/no or 1/on/true/yes); {otherwise}"
        );
    }
    on
}

/// A kernel's process-wide on/off switch: on, unless its environment
/// variable (read once, at first use, through [`env_switch`]) or
/// [`Switch::set`] says off. Benchmarks use either to compare a kernel with
/// its libtorch path.
pub(crate) struct Switch {
    on: std::sync::atomic::AtomicBool,
    checked: std::sync::OnceLock<()>,
    var: &'static str,
    /// What happens when `var` is not understood (for the warning).
    otherwise: &'static str,
}

impl Switch {
    pub(crate) const fn new(var: &'static str, otherwise: &'static str) -> Self {
        Switch {
            on: std::sync::atomic::AtomicBool::new(true),
            checked: std::sync::OnceLock::new(),
            var,
            otherwise,
        }
    }

    /// Set it, whatever the environment says.
    pub(crate) fn set(&self, on: bool) {
        self.checked.get_or_init(|| ());
        self.on.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    pub(crate) fn get(&self) -> bool {
        self.checked.get_or_init(|| {
            if let Some(on) = env_switch(self.var, self.otherwise) {
                self.on.store(on, std::sync::atomic::Ordering::SeqCst);
            }
        });
        self.on.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// `Some(on)` for the usual spellings of a switch, `None` otherwise.
fn parse_switch(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "0" | "off" | "false" | "no" => Some(false),
        "1" | "on" | "true" | "yes" | "" => Some(true),
        _ => None,
    }
}

/// Does this CPU have AVX-512F (what [`decode_ops`] and `panel_gemm` need)?
/// What a kernel test says when build.rs saw a CPU feature that the CPU
/// running the test lacks (a target directory carried to another machine).
#[cfg(test)]
pub(crate) const STALE_BUILD: &str =
    "built where the CPU had the feature, run where it has not: rebuild the tests";

pub(crate) fn avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| is_x86_feature_detected!("avx512f"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `(m, n, k)` of `x Wᵀ (+ b)` where a CPU kernel may take it: `w` `[n, k]`
/// contiguous in one of `kinds`, `x` `[.., k]` and `b` `[n]` of the same
/// kind, all on the CPU, `x` with 1 to `max_rows` rows, nothing autograd
/// must record; `None` otherwise (the caller uses libtorch).
pub(crate) fn cpu_linear_shape(
    x: &tch::Tensor,
    w: &tch::Tensor,
    b: Option<&tch::Tensor>,
    kinds: &[tch::Kind],
    max_rows: usize,
) -> Option<(usize, usize, usize)> {
    use tch::Device;
    let kind = w.kind();
    if !kinds.contains(&kind)
        || w.device() != Device::Cpu
        || x.device() != Device::Cpu
        || x.kind() != kind
        || w.dim() != 2
        || !w.is_contiguous()
        || x.dim() == 0
    {
        return None;
    }
    let (n, k) = (w.size()[0], w.size()[1]);
    let xs = x.size();
    if xs[xs.len() - 1] != k || k == 0 || n == 0 {
        return None;
    }
    let m = x.numel() / k as usize;
    if m == 0 || m > max_rows {
        return None;
    }
    if let Some(b) = b {
        if b.kind() != kind || b.device() != Device::Cpu || b.size() != [n] {
            return None;
        }
    }
    let records = |t: &tch::Tensor| t.requires_grad();
    if grad_enabled() && (records(x) || records(w) || b.is_some_and(records)) {
        return None;
    }
    Some((m, n as usize, k as usize))
}

/// Is autograd recording (not inside `no_grad`)?
pub(crate) fn grad_enabled() -> bool {
    // SAFETY: plain calls into libtorch's thread-local grad mode; the
    // previous mode is restored at once.
    unsafe {
        let prev = torch_sys::at_grad_set_enabled(0);
        torch_sys::at_grad_set_enabled(prev);
        prev != 0
    }
}

/// What can go wrong finding, compiling or running a kernel.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// A CUDA library or tool is not on this machine.
    #[error("{0}")]
    Missing(String),
    #[error("NVRTC could not compile kernels/{name}.cu:\n{log}")]
    Compile { name: String, log: String },
    #[error("ptxas could not assemble kernels/{name}.cu for {arch}:\n{log}")]
    Assemble {
        name: String,
        arch: String,
        log: String,
    },
    #[error("CUDA driver: {0}")]
    Driver(String),
    #[error("{0}")]
    Invalid(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_switch_reads_the_usual_spellings() {
        for (v, want) in [
            ("0", Some(false)),
            ("OFF", Some(false)),
            (" no", Some(false)),
            ("false", Some(false)),
            ("1", Some(true)),
            ("on", Some(true)),
            ("ture", None),
            ("disable", None),
        ] {
            assert_eq!(parse_switch(v), want, "{v:?}");
        }
    }
}
