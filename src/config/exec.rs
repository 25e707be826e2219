//! `[exec]`: the sandbox that runs candidate code (docs/sandbox.md): its
//! isolation, limits, pool size, clock and CUDA mode, and `[exec.remote]`,
//! the sandbox services a run may use instead of a local pool.

use serde::{Deserialize, Serialize};

use super::{Problems, Section};

/// Default wall-clock limit per test, seconds.
pub const EXEC_DEFAULT_TIMEOUT_S: f64 = 5.0;
/// Default address-space limit of the process running candidate code, MiB.
pub const EXEC_DEFAULT_MEMORY_MB: u64 = 2048;
/// Default limit on the size of any one file the candidate writes (stdout included), MiB.
pub const EXEC_DEFAULT_FILE_SIZE_MB: u64 = 16;
/// Default size of each worker's private writable tmpfs (the job directory), MiB.
pub const EXEC_DEFAULT_DISK_MB: u64 = 64;
/// Default limit on open file descriptors of the candidate process.
pub const EXEC_DEFAULT_OPEN_FILES: u64 = 64;
/// Default limit on processes and threads of the candidate's uid.
pub const EXEC_DEFAULT_PROCESSES: u64 = 32;
/// Default number of bytes of stdout/stderr kept per sample (the tail).
pub const EXEC_DEFAULT_OUTPUT_BYTES: usize = 4096;
/// Default largest answer (one message) the trusted side accepts from candidate code, MiB.
pub const EXEC_DEFAULT_MAX_RESULT_MB: u64 = 16;
/// Default first uid of the candidate processes; worker `i` uses `uid_base + i`.
pub const EXEC_DEFAULT_UID_BASE: u32 = 61000;
/// Share of GPU memory one numba candidate may take in `cuda = "device"` mode.
pub const EXEC_DEFAULT_CUDA_MEMORY_FRACTION: f64 = 0.05;
/// Modules imported once by every worker before it forks (missing ones are
/// skipped; those outside the standard library wait for a job that may use them).
pub const EXEC_DEFAULT_PRELOAD: &[&str] = &[
    "math",
    "re",
    "collections",
    "itertools",
    "functools",
    "heapq",
    "bisect",
    "string",
    "typing",
    "fractions",
    "decimal",
    "statistics",
    "random",
    "operator",
    "copy",
    "datetime",
    "hashlib",
    "numpy",
];

/// How strongly candidate code is isolated from the host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// bubblewrap: network, pid and mount namespaces, read-only system, private tmpfs.
    #[default]
    Bwrap,
    /// No namespaces (rlimits, uid drop when root, timeouts only). Warns loudly once.
    None,
}

/// Where `numba_cuda` tasks run their kernels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CudaMode {
    /// The device when `/dev/nvidia0` exists, else the simulator.
    #[default]
    Auto,
    /// numba's CUDA simulator (`NUMBA_ENABLE_CUDASIM=1`).
    Sim,
    /// The GPU (the NVIDIA device nodes are bound into the sandbox).
    Device,
}

/// The clock `[exec] timeout_s` is measured on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecClock {
    /// CPU seconds of the candidate process. The same code times out the
    /// same way however busy the machine is, so a sample's reward (and a
    /// rerun) does not depend on what else runs; `wall_timeout_s` catches
    /// code that sleeps or blocks.
    #[default]
    Cpu,
    /// Wall-clock seconds: a sample near the limit may pass on an idle
    /// machine and time out on a busy one.
    Wall,
}

/// Where candidate code runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecBackend {
    /// A pool of sandboxed workers in this process's machine.
    #[default]
    Local,
    /// The services of `[exec.remote] urls` (`falcon sandbox serve` or SandboxFusion).
    Remote,
}

/// What the servers of `[exec.remote] urls` speak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemoteApi {
    /// `falcon sandbox serve`: one call per sample returns every test's result.
    #[default]
    Falcon,
    /// A SandboxFusion server: one `/run_code` call per test, the verdict
    /// read from the exit status and the traceback.
    SandboxFusion,
}

/// `[exec.remote]`: sandbox services reached over HTTP (docs/sandbox.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RemoteConfig {
    /// Base URLs (`http://host:port`); requests go to the least busy one and
    /// fail over to the next.
    pub urls: Vec<String>,
    pub api: RemoteApi,
    /// Requests in flight per server.
    pub concurrency: usize,
    /// Further tries of a request that got no answer (connection refused,
    /// reset, timed out, 5xx), each after an exponential backoff and on the
    /// next server.
    pub retries: u32,
    /// Deadline of one request, seconds; 0 = the tests' own wall-clock
    /// limits plus 30 s.
    pub timeout_s: f64,
    /// The environment variable holding the bearer token (unset = no token).
    pub token_env: String,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        Self {
            urls: Vec::new(),
            api: RemoteApi::Falcon,
            concurrency: 4,
            retries: 3,
            timeout_s: 0.0,
            token_env: "FALCON_SANDBOX_TOKEN".to_owned(),
        }
    }
}

/// `[exec]`: the sandbox that runs candidate code (see docs/sandbox.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExecConfig {
    /// `"local"` (default): a pool here; `"remote"`: the services of `[exec.remote]`.
    pub backend: ExecBackend,
    pub remote: RemoteConfig,
    /// `"bwrap"` (default) or `"none"` (weaker; warns once).
    pub isolation: Isolation,
    /// Warm workers in the pool; 0 = one per CPU.
    pub workers: usize,
    /// The Python that runs candidate code: `"auto"` (default) is the
    /// project's virtualenv, which `scripts/setup` provisions with what the
    /// bundled task kinds import (numpy, numba, ndonnx), else `python3` on
    /// `PATH`; or a name on `PATH`, or a path. Resolved once on the host.
    pub python: String,
    /// The bubblewrap binary.
    pub bwrap: String,
    /// Limit per test, seconds on `clock`.
    pub timeout_s: f64,
    /// What `timeout_s` measures: `"cpu"` (default) or `"wall"`.
    pub clock: ExecClock,
    /// `clock = "cpu"`: wall-clock limit per test for code that sleeps or
    /// blocks; 0 = 3 × `timeout_s` + 10 s. Unused with `clock = "wall"`.
    pub wall_timeout_s: f64,
    /// CPU-seconds limit per test; 0 = `ceil(timeout_s) + 1`.
    pub cpu_s: u64,
    /// Address-space limit of the candidate process, MiB.
    pub memory_mb: u64,
    /// Largest file the candidate may write (stdout/stderr included), MiB.
    pub file_size_mb: u64,
    /// Size of each worker's writable tmpfs, MiB.
    pub disk_mb: u64,
    /// Open file descriptors of the candidate process.
    pub open_files: u64,
    /// Processes/threads of the candidate's uid.
    pub processes: u64,
    /// Bytes of stdout/stderr tail kept per sample.
    pub output_bytes: usize,
    /// Largest single answer accepted from candidate code, MiB.
    pub max_result_mb: u64,
    /// First uid for candidate processes (worker i uses uid_base + i); needs root.
    pub uid_base: u32,
    /// numba_cuda tasks: `"auto"`, `"sim"` or `"device"`.
    pub cuda: CudaMode,
    /// Modules each worker imports before forking (missing ones are skipped).
    /// Standard-library ones at start; the others (numpy) before the first
    /// job that imports a module outside the standard library or names one.
    pub preload: Vec<String>,
    /// `cuda = "device"`: the share of the GPU's memory one candidate process
    /// may allocate through numba; the rest stays with the trainer.
    pub cuda_memory_fraction: f64,
    /// Run a job's tests in one candidate process while they pass (a failing,
    /// crashing or timed-out test gets a fresh process for the next test).
    /// `false` forks a fresh process for every test.
    pub reuse_child: bool,
}

impl Default for ExecConfig {
    fn default() -> Self {
        Self {
            backend: ExecBackend::Local,
            remote: RemoteConfig::default(),
            isolation: Isolation::Bwrap,
            workers: 0,
            python: "auto".to_owned(),
            bwrap: "bwrap".to_owned(),
            timeout_s: EXEC_DEFAULT_TIMEOUT_S,
            clock: ExecClock::Cpu,
            wall_timeout_s: 0.0,
            cpu_s: 0,
            memory_mb: EXEC_DEFAULT_MEMORY_MB,
            file_size_mb: EXEC_DEFAULT_FILE_SIZE_MB,
            disk_mb: EXEC_DEFAULT_DISK_MB,
            open_files: EXEC_DEFAULT_OPEN_FILES,
            processes: EXEC_DEFAULT_PROCESSES,
            output_bytes: EXEC_DEFAULT_OUTPUT_BYTES,
            max_result_mb: EXEC_DEFAULT_MAX_RESULT_MB,
            uid_base: EXEC_DEFAULT_UID_BASE,
            cuda: CudaMode::Auto,
            preload: EXEC_DEFAULT_PRELOAD
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            cuda_memory_fraction: EXEC_DEFAULT_CUDA_MEMORY_FRACTION,
            reuse_child: true,
        }
    }
}

impl ExecConfig {
    /// Warm workers in the pool: `workers`, or one per CPU when 0.
    pub fn pool_size(&self) -> usize {
        if self.workers == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            self.workers
        }
    }

    /// The wall-clock seconds a test may take before the worker kills it.
    pub fn wall_limit_s(&self) -> f64 {
        self.wall_limit_for(self.timeout_s, self.clock)
    }

    /// The same for a limit of `timeout_s` on `clock` (a script's own): a
    /// configured `wall_timeout_s` still applies, but never below the limit.
    pub fn wall_limit_for(&self, timeout_s: f64, clock: ExecClock) -> f64 {
        match clock {
            ExecClock::Wall => timeout_s,
            ExecClock::Cpu if self.wall_timeout_s > 0.0 => self.wall_timeout_s.max(timeout_s),
            // Roomy, so that a CPU-bound test on a loaded machine (a quarter
            // of a core) still ends on its CPU limit, not on this one.
            ExecClock::Cpu => 3.0 * timeout_s + 10.0,
        }
    }
}

impl Section for ExecConfig {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        if !(self.timeout_s > 0.0 && self.timeout_s <= 3600.0) {
            problems.push(
                &format!("{path}.timeout_s"),
                self.timeout_s,
                "must be in (0, 3600] seconds",
            );
        }
        // A backstop below the CPU limit would make the clock choice moot.
        if self.wall_timeout_s != 0.0
            && !(self.wall_timeout_s >= self.timeout_s && self.wall_timeout_s <= 3.0 * 3600.0)
        {
            problems.push(
                &format!("{path}.wall_timeout_s"),
                self.wall_timeout_s,
                "must be 0 (= 3 x timeout_s + 10) or in [timeout_s, 10800] seconds",
            );
        }
        if !(self.cuda_memory_fraction > 0.0 && self.cuda_memory_fraction <= 1.0) {
            problems.push(
                &format!("{path}.cuda_memory_fraction"),
                self.cuda_memory_fraction,
                "must be in (0, 1]",
            );
        }
        if self.workers > 1024 {
            problems.push(
                &format!("{path}.workers"),
                self.workers,
                "must be at most 1024 (0 = one per CPU)",
            );
        }
        for (key, value, min) in [
            ("memory_mb", self.memory_mb, 64),
            ("file_size_mb", self.file_size_mb, 1),
            ("disk_mb", self.disk_mb, 1),
            ("open_files", self.open_files, 16),
            ("processes", self.processes, 1),
            ("max_result_mb", self.max_result_mb, 1),
        ] {
            if value < min {
                problems.push(
                    &format!("{path}.{key}"),
                    value,
                    &format!("must be >= {min}"),
                );
            }
        }
        if self.python.trim().is_empty() {
            problems.push(
                &format!("{path}.python"),
                &self.python,
                "must name a Python 3 interpreter",
            );
        }
        if self.bwrap.trim().is_empty() {
            problems.push(
                &format!("{path}.bwrap"),
                &self.bwrap,
                "must name the bubblewrap binary",
            );
        }
        if self.backend == ExecBackend::Remote && self.remote.urls.is_empty() {
            problems.push(
                &format!("{path}.remote.urls"),
                "[]",
                "must list at least one server (http://host:port) with backend = \"remote\"",
            );
        }
        for (i, url) in self.remote.urls.iter().enumerate() {
            let ok = url
                .strip_prefix("http://")
                .or_else(|| url.strip_prefix("https://"));
            if !ok.is_some_and(|rest| !rest.is_empty() && !rest.contains(char::is_whitespace)) {
                problems.push(
                    &format!("{path}.remote.urls[{i}]"),
                    url,
                    "must be an http:// or https:// URL",
                );
            }
        }
        if self.remote.concurrency == 0 || self.remote.concurrency > 4096 {
            problems.push(
                &format!("{path}.remote.concurrency"),
                self.remote.concurrency,
                "must be in [1, 4096]",
            );
        }
        if !(self.remote.timeout_s >= 0.0 && self.remote.timeout_s <= 86400.0) {
            problems.push(
                &format!("{path}.remote.timeout_s"),
                self.remote.timeout_s,
                "must be 0 (derived from the limits) or in (0, 86400] seconds",
            );
        }
        if self.remote.retries > 100 {
            problems.push(
                &format!("{path}.remote.retries"),
                self.remote.retries,
                "must be at most 100",
            );
        }
        if self.uid_base == 0
            || self
                .uid_base
                .checked_add(self.workers.max(1024) as u32)
                .is_none()
        {
            problems.push(
                &format!("{path}.uid_base"),
                self.uid_base,
                "must be > 0 and leave room for one uid per worker",
            );
        }
    }
}
