//! How a worker process is started: the bubblewrap command line (network,
//! pid and mount namespaces; read-only system; private size-capped tmpfs), the
//! scrubbed environment, and the limits the worker applies to each candidate
//! process. Pure functions of the config, unit-tested.

use std::path::{Path, PathBuf};

use crate::config::{CudaMode, ExecConfig, Isolation};

/// Where the worker's private writable directory is mounted inside bubblewrap.
pub const SANDBOX_JOBDIR: &str = "/tmp/job";
/// Directories replaced by an empty tmpfs inside the sandbox.
pub const HIDDEN_DIRS: [&str; 2] = ["/root", "/home"];
/// The start of every bubblewrap command line: no network, own pid, ipc
/// and uts namespaces, dies with its parent, the system read-only.
pub const NAMESPACES: [&str; 12] = [
    "--unshare-net",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--die-with-parent",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
];

/// PATH inside the sandbox.
pub const SANDBOX_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The limits one worker applies to its candidate processes (sent as argv JSON).
#[derive(Debug, Clone, serde::Serialize)]
pub struct WorkerLimits {
    pub uid: u32,
    /// Drop to `uid` (only possible when the trainer runs as root).
    pub setuid: bool,
    pub jobdir: String,
    pub max_msg: u64,
    pub out_cap: usize,
    /// RLIMIT_AS, bytes.
    #[serde(rename = "as")]
    pub address_space: u64,
    /// RLIMIT_FSIZE, bytes.
    pub fsize: u64,
    pub nofile: u64,
    pub nproc: u64,
    /// RLIMIT_CPU, seconds.
    pub cpu: u64,
    pub preload: Vec<String>,
    /// Pin the worker to CPU number `pin` modulo the CPUs it may use.
    pub pin: Option<usize>,
    /// numba kernels run on the GPU: cap their allocations and limit the
    /// data segment instead of the address space (a CUDA context reserves
    /// far more virtual memory than any sane RLIMIT_AS).
    pub cuda_device: bool,
    pub cuda_memory_fraction: f64,
    /// Keep a job's candidate process across passing tests.
    pub reuse_child: bool,
}

/// The CUDA mode after resolving `auto` against this host.
pub fn resolve_cuda(mode: CudaMode) -> CudaMode {
    match mode {
        CudaMode::Auto if Path::new("/dev/nvidia0").exists() => CudaMode::Device,
        CudaMode::Auto => CudaMode::Sim,
        m => m,
    }
}

/// The environment every worker (and so every candidate process) sees; nothing
/// of the trainer's environment is passed through.
pub fn sandbox_env(cfg: &ExecConfig) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("PATH", SANDBOX_PATH),
        ("LANG", "C.UTF-8"),
        ("LC_ALL", "C.UTF-8"),
        ("PYTHONHASHSEED", "0"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("PYTHONUNBUFFERED", "1"),
        ("OMP_NUM_THREADS", "1"),
        ("OPENBLAS_NUM_THREADS", "1"),
        ("MKL_NUM_THREADS", "1"),
        ("NUMBA_NUM_THREADS", "1"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    if resolve_cuda(cfg.cuda) == CudaMode::Sim {
        env.push(("NUMBA_ENABLE_CUDASIM".into(), "1".into()));
    }
    env
}

/// The worker's limits for pool slot `slot`.
pub fn worker_limits(cfg: &ExecConfig, slot: usize, jobdir: &str, root: bool) -> WorkerLimits {
    const MIB: u64 = 1 << 20;
    let cpu = if cfg.cpu_s > 0 {
        cfg.cpu_s
    } else {
        cfg.timeout_s.ceil() as u64 + 1
    };
    WorkerLimits {
        uid: cfg.uid_base + slot as u32,
        setuid: root,
        jobdir: jobdir.to_owned(),
        max_msg: cfg.max_result_mb * MIB,
        out_cap: cfg.output_bytes,
        address_space: cfg.memory_mb * MIB,
        fsize: cfg.file_size_mb * MIB,
        nofile: cfg.open_files,
        nproc: cfg.processes,
        cpu,
        preload: cfg.preload.clone(),
        pin: Some(slot),
        cuda_device: resolve_cuda(cfg.cuda) == CudaMode::Device,
        cuda_memory_fraction: cfg.cuda_memory_fraction,
        reuse_child: cfg.reuse_child,
    }
}

/// The argv that starts one worker: bubblewrap's options then `python -s -c
/// WORKER LIMITS`, or just the latter when `isolation = "none"`.
pub fn worker_argv(
    cfg: &ExecConfig,
    bwrap: &Path,
    python: &Path,
    python_roots: &[PathBuf],
    worker_src: &str,
    limits_json: &str,
    root: bool,
) -> Vec<String> {
    let mut argv: Vec<String> = Vec::new();
    let s = |x: &str| x.to_owned();
    if cfg.isolation == Isolation::Bwrap {
        argv.push(bwrap.display().to_string());
        argv.extend(NAMESPACES.map(s));
        for a in [
            // Root-owned, read-only to the candidate: it may write only in
            // the per-test directory the worker makes inside the job tmpfs.
            "--perms", "0755", "--size", "1048576", "--tmpfs", "/tmp",
        ] {
            argv.push(s(a));
        }
        // Home directories are hidden (keys, tokens, the trainer's files);
        // an interpreter installed under one (pyenv, a venv) is bound back
        // read-only with world-traversable parents, so the candidate uid
        // can import from it.
        for hidden in HIDDEN_DIRS {
            if !Path::new(hidden).is_dir() {
                continue;
            }
            argv.extend(["--perms", "0755", "--tmpfs", hidden].map(s));
            let mut made = std::collections::BTreeSet::new();
            for root in python_roots
                .iter()
                .filter(|r| r.starts_with(hidden) && r.as_path() != Path::new(hidden))
            {
                let mut parents: Vec<&Path> = root
                    .ancestors()
                    .skip(1)
                    .take_while(|a| *a != Path::new(hidden))
                    .collect();
                parents.reverse();
                for d in parents {
                    if made.insert(d.to_path_buf()) {
                        argv.extend([
                            "--perms".into(),
                            "0755".into(),
                            "--dir".into(),
                            d.display().to_string(),
                        ]);
                    }
                }
                argv.extend([
                    "--ro-bind".into(),
                    root.display().to_string(),
                    root.display().to_string(),
                ]);
                made.insert(root.clone());
            }
        }
        argv.extend(["--perms", "0755", "--size"].map(s));
        argv.push((cfg.disk_mb << 20).to_string());
        argv.push(s("--tmpfs"));
        argv.push(s(SANDBOX_JOBDIR));
        if root {
            // The worker needs these to drop candidates to their uid, hand
            // them a directory, and clean up after them; nothing else.
            argv.push(s("--cap-drop"));
            argv.push(s("ALL"));
            for cap in [
                "CAP_SETUID",
                "CAP_SETGID",
                "CAP_CHOWN",
                "CAP_KILL",
                "CAP_DAC_OVERRIDE",
                "CAP_FOWNER",
            ] {
                argv.push(s("--cap-add"));
                argv.push(s(cap));
            }
        }
        if resolve_cuda(cfg.cuda) == CudaMode::Device {
            for dev in nvidia_devices() {
                argv.push(s("--dev-bind"));
                argv.push(dev.display().to_string());
                argv.push(dev.display().to_string());
            }
        }
        argv.push(s("--chdir"));
        argv.push(s(SANDBOX_JOBDIR));
        argv.push(s("--clearenv"));
        for (k, v) in sandbox_env(cfg) {
            argv.push(s("--setenv"));
            argv.push(k);
            argv.push(v);
        }
    }
    argv.push(python.display().to_string());
    argv.push(s("-s"));
    argv.push(s("-c"));
    argv.push(worker_src.to_owned());
    argv.push(limits_json.to_owned());
    argv
}

/// The NVIDIA device nodes to bind into the sandbox in `cuda = "device"` mode.
pub fn nvidia_devices() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/dev") {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("nvidia") {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Resolves a program name against the trainer's PATH (or checks a path).
pub fn which(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bwrap_argv_has_every_isolation_flag_and_a_clean_env() {
        let cfg = ExecConfig {
            cuda: CudaMode::Sim,
            ..ExecConfig::default()
        };
        let argv = worker_argv(
            &cfg,
            Path::new("/usr/bin/bwrap"),
            Path::new("/usr/bin/python3"),
            &[PathBuf::from("/root/.pyenv/versions/3")],
            "SRC",
            "{}",
            true,
        );
        let joined = argv.join(" ");
        for flag in [
            "--unshare-net",
            "--unshare-pid",
            "--die-with-parent",
            "--ro-bind / /",
            "--clearenv",
            "--cap-drop ALL",
        ] {
            assert!(joined.contains(flag), "{flag} missing: {joined}");
        }
        assert!(
            joined.contains(&format!("--size {} --tmpfs /tmp/job", 64 << 20)),
            "{joined}"
        );
        assert!(joined.contains("--setenv NUMBA_ENABLE_CUDASIM 1"));
        assert_eq!(&argv[argv.len() - 4..], ["-s", "-c", "SRC", "{}"]);
        assert_eq!(argv[0], "/usr/bin/bwrap");
        assert!(joined.contains("--perms 0755 --tmpfs /root --perms 0755 --dir /root/.pyenv --perms 0755 --dir /root/.pyenv/versions --ro-bind /root/.pyenv/versions/3 /root/.pyenv/versions/3"), "{joined}");
    }

    #[test]
    fn no_isolation_is_just_python() {
        let cfg = ExecConfig {
            isolation: Isolation::None,
            ..ExecConfig::default()
        };
        let argv = worker_argv(
            &cfg,
            Path::new("bwrap"),
            Path::new("/p/python3"),
            &[],
            "SRC",
            "{}",
            false,
        );
        assert_eq!(argv, ["/p/python3", "-s", "-c", "SRC", "{}"]);
    }

    #[test]
    fn limits_follow_config() {
        let cfg = ExecConfig {
            timeout_s: 2.5,
            memory_mb: 100,
            uid_base: 50000,
            ..ExecConfig::default()
        };
        let l = worker_limits(&cfg, 3, "/tmp/job", true);
        assert_eq!((l.uid, l.cpu, l.address_space), (50003, 4, 100 << 20));
        let json = serde_json::to_string(&l).unwrap();
        assert!(json.contains("\"as\":104857600"), "{json}");
        assert_eq!(resolve_cuda(CudaMode::Sim), CudaMode::Sim);
        let device = ExecConfig {
            cuda: CudaMode::Device,
            ..ExecConfig::default()
        };
        assert!(!sandbox_env(&device)
            .iter()
            .any(|(k, _)| k == "NUMBA_ENABLE_CUDASIM"));
    }
}
