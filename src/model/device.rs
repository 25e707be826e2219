//! Device selection and run-time CUDA discovery.
//!
//! torch-sys links with `--as-needed`, so `libtorch_cuda.so` is dropped from
//! the binary and libtorch would report no CUDA even on a GPU machine. We load
//! it ourselves at start-up with `dlopen(RTLD_GLOBAL)`: its static initialisers
//! register the CUDA backend with libtorch. Where it (or one of its CUDA
//! libraries) is missing, we carry on with the CPU and remember why.

use std::sync::OnceLock;

use tch::Device;

use super::ModelError;
use crate::kernels::toolchain::dlopen_global;

/// What the CUDA probe found.
#[derive(Debug, Clone)]
pub struct CudaStatus {
    /// `libtorch_cuda.so` was loaded into the process.
    pub library_loaded: bool,
    /// Number of CUDA devices libtorch sees (0 on a CPU host).
    pub device_count: usize,
    /// Why CUDA is unavailable, when it is.
    pub reason: Option<String>,
}

impl CudaStatus {
    pub fn available(&self) -> bool {
        self.device_count > 0
    }
}

static CUDA: OnceLock<CudaStatus> = OnceLock::new();

/// Probe for CUDA once per process; later calls return the same answer.
pub fn cuda_status() -> &'static CudaStatus {
    CUDA.get_or_init(probe)
}

fn probe() -> CudaStatus {
    if std::env::var_os("FALCON_DISABLE_CUDA").is_some() {
        return CudaStatus {
            library_loaded: false,
            device_count: 0,
            reason: Some("FALCON_DISABLE_CUDA is set".into()),
        };
    }
    let (library_loaded, load_error) = match dlopen_global("libtorch_cuda.so") {
        Ok(()) => (true, None),
        Err(e) => (false, Some(e)),
    };
    let device_count = if library_loaded {
        tch::Cuda::device_count().max(0) as usize
    } else {
        0
    };
    let reason = match (library_loaded, device_count) {
        (_, n) if n > 0 => None,
        (true, _) => Some("libtorch_cuda.so loaded but no CUDA device is visible".into()),
        (false, _) => load_error.map(|e| format!("libtorch_cuda.so could not be loaded: {e}")),
    };
    CudaStatus {
        library_loaded,
        device_count,
        reason,
    }
}

/// The device a run config asks for, after `auto` (CPU when the asked-for
/// device is not there; loading the model reports that case).
pub fn device_of(cfg: &crate::config::RunConfig) -> Device {
    parse_device(&cfg.model.device.to_string()).unwrap_or(Device::Cpu)
}

/// Parse a device string: `auto` (CUDA when present, else CPU), `cpu`,
/// `cuda` or `cuda:N`.
pub fn parse_device(spec: &str) -> Result<Device, ModelError> {
    let spec = spec.trim().to_ascii_lowercase();
    let status = cuda_status();
    let want_cuda = |idx: usize| -> Result<Device, ModelError> {
        if !status.available() {
            return Err(ModelError::Invalid(format!(
                "device `{spec}` requested but CUDA is unavailable ({}); use --device cpu or auto",
                status.reason.as_deref().unwrap_or("unknown reason")
            )));
        }
        if idx >= status.device_count {
            return Err(ModelError::Invalid(format!(
                "device `{spec}`: only {} CUDA device(s) visible",
                status.device_count
            )));
        }
        Ok(Device::Cuda(idx))
    };
    match spec.as_str() {
        "auto" => Ok(if status.available() {
            Device::Cuda(0)
        } else {
            Device::Cpu
        }),
        "cpu" => Ok(Device::Cpu),
        "cuda" | "gpu" => want_cuda(0),
        s => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(idx)) => want_cuda(idx),
            _ => Err(ModelError::Invalid(format!(
                "unknown device `{spec}`: use auto, cpu, cuda or cuda:N"
            ))),
        },
    }
}
