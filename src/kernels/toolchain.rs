//! Finding and loading the CUDA libraries and tools at run time, and
//! compiling the kernel sources with them.
//!
//! Nothing here is linked: the binary must start where there is no CUDA.
//! NVRTC comes from the PyTorch wheel the process already runs on
//! (`site-packages/nvidia/cu13/lib`, beside `torch/`, found through the
//! loaded `libtorch_cpu.so`), or from `FALCON_CUDA_LIB_DIR`. It loads
//! `libnvrtc-builtins` by name, so that is loaded first, by path, and the
//! dynamic linker then finds it already there. `ptxas` comes from the same
//! wheel (`torch/bin/ptxas`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::{KernelError, COMMON, SOURCES};

/// The directory of the loaded `libtorch_cpu.so` (`…/torch/lib`).
fn torch_lib_dir() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libtorch_cpu.so"))
        .and_then(|p| Path::new(p).parent().map(Path::to_path_buf))
}

/// Where the CUDA libraries of the wheel are, in the order tried.
fn lib_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("FALCON_CUDA_LIB_DIR") {
        dirs.push(PathBuf::from(d));
    }
    if let Some(torch_lib) = torch_lib_dir() {
        if let Some(site) = torch_lib.parent().and_then(Path::parent) {
            dirs.push(site.join("nvidia/cu13/lib"));
        }
    }
    dirs
}

/// `dlopen(name, RTLD_NOW | RTLD_GLOBAL)`, kept open for the life of the
/// process; the error is `dlerror`'s. Loading a library by path first is
/// how a later load by its soname (from libtorch, NVRTC or cudarc) finds it.
pub fn dlopen_global(name: &str) -> Result<(), String> {
    let c = std::ffi::CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: dlopen/dlerror are thread-safe in glibc; the handle is kept
    // open for the life of the process on purpose (libtorch holds its
    // registrations, NVRTC its builtins).
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL);
        if h.is_null() {
            let e = libc::dlerror();
            return Err(if e.is_null() {
                "unknown dlopen error".into()
            } else {
                std::ffi::CStr::from_ptr(e).to_string_lossy().into_owned()
            });
        }
    }
    Ok(())
}

/// Load NVRTC (and its builtins) once and say from where; the error says
/// where it looked.
pub fn load_nvrtc() -> Result<String, KernelError> {
    static DONE: OnceLock<Result<String, String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let mut tried = Vec::new();
        for dir in lib_dirs() {
            let lib = dir.join("libnvrtc.so.13");
            if !lib.exists() {
                tried.push(lib.display().to_string());
                continue;
            }
            let builtins = dir.join("libnvrtc-builtins.so.13.0");
            if builtins.exists() {
                dlopen_global(&builtins.to_string_lossy())?;
            }
            return dlopen_global(&lib.to_string_lossy()).map(|()| lib.display().to_string());
        }
        // Last, whatever the library path holds.
        dlopen_global("libnvrtc.so.13")
            .map(|()| "libnvrtc.so.13 (library path)".to_string())
            .map_err(|e| {
                format!(
                    "NVRTC (libnvrtc.so.13) not found: looked at {} and the library path ({e}); \
                 run scripts/setup (the torch wheel brings it) or set FALCON_CUDA_LIB_DIR",
                    if tried.is_empty() {
                        "no torch wheel".to_string()
                    } else {
                        tried.join(", ")
                    }
                )
            })
    })
    .clone()
    .map_err(KernelError::Missing)
}

/// The CUDA C source of kernel `name`, with `common.cuh` included.
pub fn source(name: &str) -> Result<String, KernelError> {
    SOURCES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, s)| s.replace("#include \"common.cuh\"", COMMON))
        .ok_or_else(|| KernelError::Invalid(format!("no kernel named {name:?}")))
}

/// PTX of kernel `name` for virtual architecture `arch` (`compute_90`).
pub fn compile_ptx(name: &str, arch: &str) -> Result<String, KernelError> {
    load_nvrtc()?;
    let src = source(name)?;
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        name: Some(format!("{name}.cu")),
        ..Default::default()
    };
    // cudarc panics when a symbol is missing from the library it loaded;
    // a wrong libnvrtc must be an error, not an abort.
    let out = std::panic::catch_unwind(|| cudarc::nvrtc::compile_ptx_with_opts(src, opts))
        .map_err(|_| KernelError::Missing("libnvrtc lacks a symbol cudarc needs".into()))?;
    match out {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(e) => Err(KernelError::Compile {
            name: name.into(),
            log: match e {
                cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                    log.to_string_lossy().into_owned()
                }
                other => format!("{other:?}"),
            },
        }),
    }
}

/// `ptxas` of the torch wheel, or `FALCON_PTXAS`.
pub fn ptxas() -> Result<PathBuf, KernelError> {
    if let Some(p) = std::env::var_os("FALCON_PTXAS") {
        return Ok(PathBuf::from(p));
    }
    let cand = torch_lib_dir().and_then(|l| l.parent().map(|t| t.join("bin/ptxas")));
    match cand {
        Some(p) if p.exists() => Ok(p),
        _ => Err(KernelError::Missing(format!(
            "ptxas not found (looked at {}); run scripts/setup or set FALCON_PTXAS",
            cand.map_or("no torch wheel".into(), |p| p.display().to_string())
        ))),
    }
}

/// Assemble `ptx` of kernel `name` into a cubin for `sm` (`sm_90`), the
/// check that NVRTC's output is valid machine code for that GPU.
pub fn assemble(name: &str, ptx: &str, sm: &str) -> Result<Vec<u8>, KernelError> {
    let tool = ptxas()?;
    let dir = tempdir()?;
    let (src, out) = (
        dir.join(format!("{name}.ptx")),
        dir.join(format!("{name}.cubin")),
    );
    let io = |e: std::io::Error| KernelError::Missing(format!("ptxas scratch files: {e}"));
    std::fs::write(&src, ptx).map_err(io)?;
    let run = std::process::Command::new(&tool)
        .arg(format!("-arch={sm}"))
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .output()
        .map_err(|e| KernelError::Missing(format!("running {}: {e}", tool.display())));
    let result = run.and_then(|o| {
        if o.status.success() {
            std::fs::read(&out).map_err(io)
        } else {
            Err(KernelError::Assemble {
                name: name.into(),
                arch: sm.into(),
                log: String::from_utf8_lossy(&o.stderr).into_owned(),
            })
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn tempdir() -> Result<PathBuf, KernelError> {
    let dir = std::env::temp_dir().join(format!(
        "falcon-ptxas-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir)
        .map_err(|e| KernelError::Missing(format!("{}: {e}", dir.display())))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_kernel_is_an_error() {
        assert!(matches!(source("nope"), Err(KernelError::Invalid(_))));
    }

    #[test]
    fn every_source_gets_the_common_helpers() {
        for (name, raw) in SOURCES {
            assert!(raw.contains("#include \"common.cuh\""), "{name}");
            let s = source(name).unwrap();
            assert!(
                !s.lines().any(|l| l.trim_start().starts_with("#include")),
                "{name}"
            );
            assert!(s.contains("to_bf16(float f)"), "{name}");
        }
    }
}
