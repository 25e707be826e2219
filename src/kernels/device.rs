//! The CUDA device as the kernels see it: its memory, and launching the
//! compiled kernels on tensors that libtorch allocated.
//!
//! libtorch and cudarc share the device's primary context, and kernels run
//! on the legacy default stream, the one libtorch's own kernels use unless
//! told otherwise, so they are ordered with libtorch's work without extra
//! synchronisation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use tch::{Device, Tensor};

use super::toolchain::{compile_ptx, load_nvrtc};
use super::{KernelError, SOURCES};

fn driver(e: impl std::fmt::Debug) -> KernelError {
    KernelError::Driver(format!("{e:?}"))
}

/// Is the CUDA driver library on this machine? Checked before cudarc is
/// asked, since cudarc aborts the process when it cannot load it.
fn driver_present() -> Result<(), KernelError> {
    static OK: OnceLock<bool> = OnceLock::new();
    let ok = *OK.get_or_init(|| super::toolchain::dlopen_global("libcuda.so.1").is_ok());
    if ok {
        Ok(())
    } else {
        Err(KernelError::Missing(
            "the CUDA driver (libcuda.so.1) is not on this machine".into(),
        ))
    }
}

/// One device's context, stream and compiled kernels.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    functions: HashMap<String, CudaFunction>,
    /// `(major, minor)`.
    pub capability: (i32, i32),
}

impl Gpu {
    /// The device `ordinal`, its kernels compiled on first use (about a
    /// second for all of them) and kept for the process.
    pub fn get(ordinal: usize) -> Result<Arc<Gpu>, KernelError> {
        static GPUS: OnceLock<Mutex<HashMap<usize, Arc<Gpu>>>> = OnceLock::new();
        let mut map = GPUS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(g) = map.get(&ordinal) {
            return Ok(g.clone());
        }
        let g = Arc::new(Gpu::open(ordinal)?);
        map.insert(ordinal, g.clone());
        Ok(g)
    }

    fn open(ordinal: usize) -> Result<Gpu, KernelError> {
        driver_present()?;
        load_nvrtc()?;
        let ctx = CudaContext::new(ordinal).map_err(driver)?;
        let capability = ctx.compute_capability().map_err(driver)?;
        let arch = format!("compute_{}{}", capability.0, capability.1);
        let mut functions = HashMap::new();
        for (name, src) in SOURCES {
            let ptx = compile_ptx(name, &arch)?;
            let module = ctx
                .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
                .map_err(driver)?;
            for f in kernel_names(src) {
                let func = module.load_function(&f).map_err(driver)?;
                functions.insert(f, func);
            }
        }
        let stream = ctx.default_stream();
        Ok(Gpu {
            ctx,
            stream,
            functions,
            capability,
        })
    }

    /// `(free, total)` bytes of device memory.
    pub fn memory(&self) -> Result<(usize, usize), KernelError> {
        self.ctx.mem_get_info().map_err(driver)
    }

    pub(crate) fn function(&self, name: &str) -> Result<&CudaFunction, KernelError> {
        self.functions
            .get(name)
            .ok_or_else(|| KernelError::Invalid(format!("no compiled kernel {name}")))
    }

    /// Launch `name` on the default stream with `args` (each a device
    /// pointer or a scalar, in the kernel's parameter order).
    pub(crate) fn launch(
        &self,
        name: &str,
        grid: (u32, u32),
        block: u32,
        args: &[Arg],
    ) -> Result<(), KernelError> {
        let f = self.function(name)?;
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::Ptr(p) => b.arg(p),
                Arg::I64(v) => b.arg(v),
                Arg::I32(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: (grid.0, grid.1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: every pointer comes from a live, contiguous libtorch CUDA
        // tensor of the dtype and shape the kernel expects (checked by the
        // callers), and the arguments follow the kernel's signature.
        unsafe { b.launch(cfg) }.map_err(driver)?;
        Ok(())
    }
}

/// A kernel argument.
pub(crate) enum Arg {
    Ptr(u64),
    I64(i64),
    I32(i32),
    F32(f32),
}

/// The device pointer of a contiguous CUDA tensor.
pub(crate) fn ptr(t: &Tensor) -> Arg {
    Arg::Ptr(t.data_ptr() as u64)
}

/// The device ordinal of a CUDA tensor.
pub(crate) fn ordinal(t: &Tensor) -> Option<usize> {
    match t.device() {
        Device::Cuda(i) => Some(i),
        _ => None,
    }
}

/// `(free, total)` bytes of CUDA device `ordinal`, for budgeting memory
/// before a run allocates it.
pub fn memory(ordinal: usize) -> Result<(usize, usize), KernelError> {
    driver_present()?;
    // No kernels are compiled for this: a context on the device suffices
    // (the primary one, which libtorch shares).
    CudaContext::new(ordinal)
        .and_then(|ctx| ctx.mem_get_info())
        .map_err(driver)
}

/// The `extern "C" __global__` functions a source defines.
fn kernel_names(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(i) = rest.find("extern \"C\" __global__") {
        rest = &rest[i..];
        if let Some(open) = rest.find('(') {
            let head = &rest[..open];
            if let Some(name) = head.split_whitespace().last() {
                out.push(name.to_string());
            }
        }
        rest = &rest[1..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_names_its_kernels() {
        let names: Vec<String> = SOURCES.iter().flat_map(|(_, s)| kernel_names(s)).collect();
        for want in [
            "row_stats_f32",
            "row_stats_bf16",
            "shrink_f32",
            "shrink_bf16",
            "expand_f32",
            "expand_bf16",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
        }
    }
}
