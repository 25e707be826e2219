//! Running untrusted, model-written Python: the sandbox.
//!
//! A [`Sandbox`] owns a bounded pool of warm workers. Each worker is a Python
//! interpreter inside its own bubblewrap sandbox (no network, own pid
//! namespace, read-only system, a private size-capped tmpfs, scrubbed
//! environment). It never runs candidate code itself: for every test it forks
//! a child that drops to a uid of its own, applies rlimits and runs the
//! candidate under a timer on its own CPU time (`[exec] clock`); a wall-clock
//! deadline kills the child's process group and every process of that uid. In the default (trusted) mode the worker evaluates the
//! test itself and reaches candidate code only through proxies that return
//! plain data, so no trick of the candidate can make a test pass (see
//! `docs/sandbox.md` for the exact guarantee and its limits). A worker also
//! runs whole programs as scripts ([`script`]), SandboxFusion's `run_code`.
//!
//! With `[exec] backend = "remote"` the same [`Sandbox`] sends samples to
//! sandbox services instead (the remote backend: `falcon sandbox serve`'s
//! [`service`] or SandboxFusion servers, whose wire is [`fusion`]).
//!
//! Shape follows STYLE.md §10 (mistral.rs `mistralrs-sandbox`): limits are
//! named constants in `config`, outcomes are enums ([`outcome`]), and the
//! no-isolation fallback exists only with a loud warning. Failures of the
//! sandbox itself give [`ExecReport::no_signal`], never a runtime error of
//! the sample (STYLE.md §6).
//!
//! ```no_run
//! # use falcon_rl::{config::ExecConfig, exec::Sandbox, task::Task};
//! # fn demo(task: &Task) -> Result<(), falcon_rl::exec::ExecError> {
//! let sandbox = Sandbox::new(&ExecConfig::default())?;
//! let report = sandbox.run(task, "def add(a, b):\n    return a + b\n");
//! println!("{:?} {}/{}", report.outcome, report.n_pass(), report.tests.len());
//! # Ok(()) }
//! ```

pub mod fusion;
mod http;
pub mod isolation;
pub mod outcome;
mod pool;
pub mod program;
pub mod protocol;
mod remote;
pub mod script;
pub mod servers;
pub mod service;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

pub use self::outcome::{
    ErrorKind, ExecReport, MemoCoderClass, RewardClass, TestResult, TestStatus,
};
pub use self::pool::WORKER_PY;
pub use self::protocol::CheckMode;
pub use self::remote::RunTestsRequest;
pub use self::script::{Script, ScriptError, ScriptRun, ScriptStatus};
use crate::config::{ExecBackend, ExecConfig, Isolation};
use crate::task::Task;

/// Errors from building a [`Sandbox`]. Running a sample never errors: a
/// broken run is an [`ExecReport::no_signal`].
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The config asks for something impossible.
    #[error("invalid [exec] config: {0}")]
    Config(String),
    /// A program the sandbox needs is missing.
    #[error("{what} not found: {hint}")]
    Missing { what: String, hint: String },
    /// The sandbox's interpreter cannot import what the tasks need.
    #[error(
        "the sandbox's Python ({python}) cannot import {}: run scripts/setup, which provisions the project's virtualenv with what the bundled task kinds need, or set [exec] python to an interpreter that has {}",
        missing.iter().map(|m| format!("{} (needed by {})", m.module, m.needed_by)).collect::<Vec<_>>().join("; "),
        if missing.len() == 1 { "it" } else { "them" }
    )]
    MissingModules {
        python: String,
        missing: Vec<MissingModule>,
    },
    /// numba-cuda imports but cannot compile and launch a kernel.
    #[error(
        "numba-cuda cannot compile and launch a test kernel with {python} ({mode}): {error}\n\
         Every numba_cuda task ({needed_by}) would fail as a runtime error, and a run would \
         learn nothing. Fix that Python's numba-cuda (e.g. a release that supports its numpy), \
         set [exec] cuda = \"sim\" if the simulator works, or leave these tasks out."
    )]
    CudaKernel {
        python: String,
        mode: String,
        needed_by: String,
        error: String,
    },
    /// `[exec] backend = "remote"` and no server of `[exec.remote] urls` answered.
    #[error("cannot use the remote sandbox ([exec.remote] urls): {0}")]
    Remote(String),
    /// Namespaces could not be made (or the first worker would not start).
    #[error(
        "cannot create the execution sandbox: {detail}\n\
         Install bubblewrap (`apt-get install -y bubblewrap`) and run where it can create \
         user/pid/net namespaces (as root, or with unprivileged user namespaces enabled), \
         or set `[exec] isolation = \"none\"` to run candidate code with rlimits and \
         timeouts only (much weaker)."
    )]
    Isolation { detail: String },
}

/// A module some tasks need that the sandbox's interpreter cannot import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingModule {
    pub module: String,
    /// Which tasks need it, in words (`36 numba_cuda tasks, e.g. numba_cuda/vector_add`).
    pub needed_by: String,
    /// What the import said.
    pub error: String,
}

/// The modules a task needs before any candidate code runs: what its kind
/// needs (numba tasks: numpy and numba) and what its own prelude and test
/// set-up import.
pub fn required_modules(task: &Task) -> Vec<String> {
    let mut out: Vec<String> = match task.kind {
        crate::task::TaskKind::NumbaCuda => vec!["numpy".into(), "numba".into()],
        crate::task::TaskKind::Python | crate::task::TaskKind::Stdio => Vec::new(),
    };
    for src in [&task.prelude, &task.test_setup].into_iter().flatten() {
        for line in src.lines().map(str::trim) {
            let names: Vec<&str> = if let Some(rest) = line.strip_prefix("import ") {
                rest.split(',').collect()
            } else if let Some(rest) = line.strip_prefix("from ") {
                rest.split_whitespace().next().into_iter().collect()
            } else {
                continue;
            };
            for n in names {
                let top = n
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .split('.')
                    .next()
                    .unwrap_or("");
                let ok = !top.is_empty()
                    && top.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !top.starts_with(|c: char| c.is_ascii_digit());
                if ok && !out.iter().any(|m| m == top) {
                    out.push(top.to_owned());
                }
            }
        }
    }
    out
}

/// The execution sandbox: a pool of warm, isolated workers, or the sandbox
/// services of `[exec.remote]`. Cheap to clone (clones share the pool or
/// the connections); usable from many threads at once.
#[derive(Clone)]
pub struct Sandbox {
    backend: Backend,
    cfg: Arc<ExecConfig>,
}

#[derive(Clone)]
enum Backend {
    Local(Arc<pool::Pool>),
    Remote(Arc<remote::Remote>),
}

static WEAK_WARNING: Once = Once::new();

/// Bytes of stdout and of stderr a script keeps (its tail): a script's
/// output is its answer, so more than a test's `[exec] output_bytes`.
pub const SCRIPT_OUTPUT_BYTES: usize = 1 << 20;

impl Sandbox {
    /// Where `numba_cuda` kernels run in this sandbox: `"simulator"`
    /// (numba's CUDA simulator on the CPU) or `"device"`. Scores of such
    /// tasks must say which; `"remote"` when a remote service does not say.
    pub fn cuda_label(&self) -> &'static str {
        match &self.backend {
            Backend::Remote(r) => r.cuda,
            Backend::Local(_) => match isolation::resolve_cuda(self.cfg.cuda) {
                crate::config::CudaMode::Device => "device",
                _ => "simulator",
            },
        }
    }

    /// The sandbox `cfg` describes: with `backend = "local"`, starts the
    /// pool (`cfg.workers` workers; 0 = one per CPU) and checks that
    /// isolation works by starting the first worker before returning; with
    /// `"remote"`, checks that at least one server of `[exec.remote] urls`
    /// answers.
    pub fn new(cfg: &ExecConfig) -> Result<Sandbox, ExecError> {
        match cfg.backend {
            ExecBackend::Local => Sandbox::local(cfg),
            ExecBackend::Remote => Ok(Sandbox {
                backend: Backend::Remote(Arc::new(
                    remote::Remote::new(cfg).map_err(ExecError::Remote)?,
                )),
                cfg: Arc::new(cfg.clone()),
            }),
        }
    }

    /// A local pool, whatever `cfg.backend` says (what a service serves).
    pub fn local(cfg: &ExecConfig) -> Result<Sandbox, ExecError> {
        if !(cfg.timeout_s > 0.0 && cfg.timeout_s.is_finite()) {
            return Err(ExecError::Config(format!(
                "timeout_s = {} must be > 0",
                cfg.timeout_s
            )));
        }
        let python = crate::config::locate_tool(&cfg.python, "python").map_err(|tried| {
            ExecError::Missing {
                what: format!("the Python interpreter of [exec] python = \"{}\"", cfg.python),
                hint: format!(
                    "looked at {}; run scripts/setup (it provisions the project's virtualenv) or set [exec] python",
                    crate::config::tried_list(&tried)
                ),
            }
        })?;
        // Resolve shims (pyenv, ...) to the real interpreter: shims need the
        // environment the sandbox scrubs.
        let probe = std::process::Command::new(&python)
            .args(["-c", "import sys; print(sys.executable); print(sys.prefix); print(sys.base_prefix); print(sys.exec_prefix)"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).lines().map(std::path::PathBuf::from).collect::<Vec<_>>())
            .filter(|l| l.len() == 4 && l[0].is_file())
            .ok_or_else(|| ExecError::Missing {
                what: format!("a working Python at {}", python.display()),
                hint: "`python -c 'import sys'` failed; set [exec] python".into(),
            })?;
        // Run it by its real directory (symlinked directories, e.g. a `.venv`
        // link, may point where the sandbox sees nothing), keeping the file
        // name so a virtualenv's `bin/python` still finds its `pyvenv.cfg`.
        let python = match (probe[0].parent(), probe[0].file_name()) {
            (Some(dir), Some(name)) => std::fs::canonicalize(dir)
                .map(|d| d.join(name))
                .unwrap_or_else(|_| probe[0].clone()),
            _ => probe[0].clone(),
        };
        let mut python_roots: Vec<std::path::PathBuf> = probe[1..].to_vec();
        // A prefix reached through a symlink (a project `.venv` linking into
        // a cache under a hidden home) must be bound where it really lives.
        let real: Vec<_> = python_roots
            .iter()
            .filter_map(|r| std::fs::canonicalize(r).ok())
            .collect();
        python_roots.extend(real);
        python_roots.sort();
        python_roots.dedup();
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let bwrap = match cfg.isolation {
            Isolation::Bwrap => {
                isolation::which(&cfg.bwrap).ok_or_else(|| ExecError::Isolation {
                    detail: format!("bubblewrap ({:?}) is not installed", cfg.bwrap),
                })?
            }
            Isolation::None => {
                WEAK_WARNING.call_once(|| {
                    eprintln!(
                        "\n!!! falcon-rl WARNING: [exec] isolation = \"none\": candidate code runs \
                         WITHOUT namespaces (it can reach the network and write wherever the \
                         {} user can). Use only on a throwaway machine. !!!\n",
                        if root { "candidate" } else { "trainer's" }
                    );
                });
                std::path::PathBuf::from(&cfg.bwrap)
            }
        };
        let size = cfg.pool_size();
        let launch = pool::Launch {
            cfg: cfg.clone(),
            python,
            python_roots,
            bwrap,
            root,
        };
        let first =
            pool::Worker::spawn(&launch, 0).map_err(|detail| ExecError::Isolation { detail })?;
        let pool = Arc::new(pool::Pool::new(launch, size));
        pool.put(0, first);
        // Warm the rest in the background; a slot still starting is simply
        // started on first use instead.
        let spawn_from = Arc::clone(&pool);
        std::thread::spawn(move || {
            for slot in 1..size {
                if let Ok(w) = pool::Worker::spawn(&spawn_from.launch, slot) {
                    spawn_from.put_if_empty(slot, w);
                }
            }
        });
        Ok(Sandbox {
            backend: Backend::Local(pool),
            cfg: Arc::new(cfg.clone()),
        })
    }

    /// The most jobs that run at once: local workers, or the remote
    /// servers' concurrency all together.
    pub fn workers(&self) -> usize {
        match &self.backend {
            Backend::Local(pool) => pool.size(),
            Backend::Remote(r) => r.capacity(),
        }
    }

    /// The config the sandbox was built with.
    pub fn config(&self) -> &ExecConfig {
        &self.cfg
    }

    /// Whether samples run on remote services.
    pub fn is_remote(&self) -> bool {
        matches!(self.backend, Backend::Remote(_))
    }

    /// Remote requests so far: (sent, tried again, never answered).
    pub fn remote_counts(&self) -> (u64, u64, u64) {
        match &self.backend {
            Backend::Local(_) => (0, 0, 0),
            Backend::Remote(r) => (
                r.stats().requests.load(Ordering::Relaxed),
                r.stats().retries.load(Ordering::Relaxed),
                r.stats().unanswered.load(Ordering::Relaxed),
            ),
        }
    }

    /// Runs every test of `task` against `code` (a complete program defining
    /// `task.entry_point`, or for a program task one that reads stdin), each
    /// test on its own. Never panics or errors: a
    /// failure of the sandbox itself is [`ExecReport::no_signal`].
    pub fn run(&self, task: &Task, code: &str) -> ExecReport {
        if task.kind == crate::task::TaskKind::Stdio {
            let t0 = Instant::now();
            let mut report = program::run(self, task, code);
            report.seconds = t0.elapsed().as_secs_f64();
            return report;
        }
        let pool = match &self.backend {
            Backend::Local(pool) => pool,
            Backend::Remote(r) => return r.run(task, code),
        };
        let t0 = Instant::now();
        let cfg = &self.cfg;
        let job = protocol::Job::new(task, code, cfg);
        let body = match serde_json::to_vec(&job) {
            Ok(b) => b,
            Err(e) => return ExecReport::no_signal(format!("sandbox: cannot encode job: {e}")),
        };
        // Each test gets its limit plus the worker's grace and clean-up; a
        // worker that overruns this is hung and is killed. The budget starts
        // when a worker has the job: waiting for a free slot or for a worker
        // to start is the pool's time, never the sample's.
        let per_test = cfg.wall_limit_for(job.timeout, cfg.clock) + 2.0;
        let budget = Duration::from_secs_f64(per_test * task.tests.len() as f64 + 10.0);
        let cap = (cfg.output_bytes + (1 << 20)) * 4 + 64 * task.tests.len() * 1024;
        let attempt = |fresh: bool| {
            pool.with_worker(fresh, |w| {
                let bytes = w.call(&body, Instant::now() + budget, cap)?;
                serde_json::from_slice::<protocol::WireReply>(&bytes)
                    .map_err(|e| format!("malformed worker reply: {e}"))
            })
        };
        // A sample that never got to run is the sandbox's failure, not the
        // sample's, so it runs once more on a fresh worker: a worker that
        // died while idle (found when the job cannot be written to it, or
        // when its reply ends early; the candidate runs under another uid
        // and cannot signal the worker; seen: rare SIGKILLs of idle workers
        // under heavy load), a worker that would not start or answer in
        // time, and a candidate starved of CPU until the wall-clock backstop
        // (the machine's load). A second failure is no signal.
        let never_ran = |r: &Result<protocol::WireReply, String>| match r {
            Err(e) => pool::never_ran(e),
            Ok(reply) => reply
                .no_signal
                .as_deref()
                .is_some_and(|why| why.contains("starved")),
        };
        match once_more(attempt, never_ran) {
            Ok(r) => {
                let mut report = protocol::report_from_reply(r, task.tests.len(), cfg.output_bytes);
                report.seconds = t0.elapsed().as_secs_f64();
                report
            }
            Err(e) => {
                let mut r = ExecReport::no_signal(format!("sandbox: {e}"));
                r.seconds = t0.elapsed().as_secs_f64();
                r
            }
        }
    }

    /// Runs many samples on the pool in parallel; reports come back in order.
    pub fn run_batch(&self, jobs: &[(&Task, &str)]) -> Vec<ExecReport> {
        let next = AtomicUsize::new(0);
        let threads = self.workers().min(jobs.len()).max(1);
        let mut out: Vec<Option<ExecReport>> = vec![None; jobs.len()];
        let results = std::sync::Mutex::new(&mut out);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((task, code)) = jobs.get(i) else {
                        break;
                    };
                    let r = self.run(task, code);
                    results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
                });
            }
        });
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| ExecReport::no_signal("sandbox: job was not run")))
            .collect()
    }

    /// Runs a whole program as a script (stdin in; stdout, stderr and exit
    /// status out): SandboxFusion's `run_code`. `Err` only when the sandbox
    /// could not run it, or the request itself is unusable.
    pub fn run_script(&self, s: &Script) -> Result<ScriptRun, ScriptError> {
        let pool = match &self.backend {
            Backend::Local(pool) => pool,
            Backend::Remote(r) => return r.run_script(s),
        };
        let cfg = &self.cfg;
        let timeout = s.timeout_s.unwrap_or(cfg.timeout_s);
        if !(timeout > 0.0 && timeout <= 3600.0) {
            return Err(ScriptError::BadRequest(format!(
                "timeout of {timeout} s must be in (0, 3600]"
            )));
        }
        let clock = s.clock.unwrap_or(cfg.clock);
        let wall = cfg.wall_limit_for(timeout, clock);
        let out_cap = cfg.output_bytes.max(SCRIPT_OUTPUT_BYTES);
        let job = script::ScriptJob {
            script: &s.code,
            stdin: &s.stdin,
            files: &s.files,
            fetch_files: &s.fetch_files,
            timeout,
            clock,
            wall,
            out_cap,
            address_space: s.memory_mb.map_or(0, |m| m.max(16) << 20),
        };
        let body = serde_json::to_vec(&job).map_err(|e| ScriptError::Sandbox(e.to_string()))?;
        let budget = Duration::from_secs_f64(wall + 12.0);
        let cap = out_cap * 8 + (s.fetch_files.len() + 1) * out_cap * 2 + (1 << 20);
        let attempt = |fresh: bool| {
            pool.with_worker(fresh, |w| {
                let bytes = w.call(&body, Instant::now() + budget, cap)?;
                serde_json::from_slice::<script::WireScriptReply>(&bytes)
                    .map_err(|e| format!("malformed worker reply: {e}"))
            })
        };
        let never_ran =
            |r: &Result<script::WireScriptReply, String>| matches!(r, Err(e) if pool::never_ran(e));
        match once_more(attempt, never_ran) {
            Ok(script::WireScriptReply {
                script: Some(run), ..
            }) => Ok(run),
            Ok(script::WireScriptReply {
                script_error: Some(e),
                ..
            }) => Err(ScriptError::BadRequest(e)),
            Ok(r) => Err(ScriptError::Sandbox(format!(
                "sandbox: {}",
                r.no_signal.unwrap_or_else(|| "empty worker reply".into())
            ))),
            Err(e) => Err(ScriptError::Sandbox(format!("sandbox: {e}"))),
        }
    }

    /// Runs one program on each of `stdins` in the local pool, the tests in
    /// turn in one candidate process (a new one after a test that ends it),
    /// as LiveCodeBench's runner does; `None` on a remote backend, whose
    /// protocol runs one script per call.
    pub(crate) fn run_programs(
        &self,
        code: &str,
        stdins: &[String],
        timeout: f64,
        memory_mb: Option<u64>,
    ) -> Option<Result<Vec<ScriptRun>, ScriptError>> {
        let pool = match &self.backend {
            Backend::Local(pool) => pool,
            Backend::Remote(_) => return None,
        };
        let cfg = &self.cfg;
        let wall = cfg.wall_limit_for(timeout, cfg.clock);
        let out_cap = cfg.output_bytes.max(SCRIPT_OUTPUT_BYTES);
        let job = script::ProgramsJob {
            programs: code,
            stdins,
            timeout,
            clock: cfg.clock,
            wall,
            out_cap,
            address_space: memory_mb.map_or(0, |m| m.max(16) << 20),
        };
        let body = match serde_json::to_vec(&job) {
            Ok(b) => b,
            Err(e) => return Some(Err(ScriptError::Sandbox(e.to_string()))),
        };
        let budget = Duration::from_secs_f64((wall + 2.0) * stdins.len() as f64 + 12.0);
        let cap = stdins.len() * (out_cap * 8 + 4096) + (1 << 20);
        let attempt = |fresh: bool| {
            pool.with_worker(fresh, |w| {
                let bytes = w.call(&body, Instant::now() + budget, cap)?;
                serde_json::from_slice::<script::WireProgramsReply>(&bytes)
                    .map_err(|e| format!("malformed worker reply: {e}"))
            })
        };
        let never_ran = |r: &Result<script::WireProgramsReply, String>| matches!(r, Err(e) if pool::never_ran(e));
        Some(match once_more(attempt, never_ran) {
            Ok(script::WireProgramsReply {
                programs: Some(runs),
                ..
            }) if runs.len() == stdins.len() => Ok(runs),
            Ok(script::WireProgramsReply {
                script_error: Some(e),
                ..
            }) => Err(ScriptError::Sandbox(format!("sandbox: {e}"))),
            Ok(r) => Err(ScriptError::Sandbox(format!(
                "sandbox: {}",
                r.no_signal
                    .unwrap_or_else(|| "a programs reply that does not fit the job".into())
            ))),
            Err(e) => Err(ScriptError::Sandbox(format!("sandbox: {e}"))),
        })
    }

    /// Checks, before any sample runs, that the sandbox's interpreter can
    /// import every module `tasks` need ([`required_modules`]): a task kind
    /// whose imports fail would otherwise score every sample as a runtime
    /// error, and a run would learn nothing, silently. The imports run in
    /// the interpreter's isolated mode (no current directory on the path).
    pub fn require_modules(&self, tasks: &[&Task]) -> Result<(), ExecError> {
        let mut needed: Vec<(String, Vec<&Task>)> = Vec::new();
        for t in tasks {
            for m in required_modules(t) {
                match needed.iter_mut().find(|(n, _)| *n == m) {
                    Some((_, ts)) => ts.push(t),
                    None => needed.push((m, vec![t])),
                }
            }
        }
        if needed.is_empty() {
            return Ok(());
        }
        let probe = "import sys\nfor m in sys.argv[1:]:\n    try:\n        __import__(m)\n    except BaseException as e:\n        print(m + '\\t' + type(e).__name__ + ': ' + str(e).replace('\\n', ' '))\n";
        let args: Vec<String> = needed.iter().map(|(m, _)| m.clone()).collect();
        let out = self.python_probe(probe, &args, false, "the tasks' imports")?;
        let text = out.stdout;
        let missing: Vec<MissingModule> = text
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .filter_map(|(m, err)| {
                let (_, ts) = needed.iter().find(|(n, _)| n == m)?;
                let kinds: std::collections::BTreeSet<&str> =
                    ts.iter().map(|t| t.kind.name()).collect();
                let kinds = kinds.into_iter().collect::<Vec<_>>().join("/");
                Some(MissingModule {
                    module: m.to_owned(),
                    needed_by: tasks_in_words(ts, &format!("{kinds} ")),
                    error: err.to_owned(),
                })
            })
            .collect();
        if !missing.is_empty() {
            return Err(ExecError::MissingModules {
                python: self.python_label(),
                missing,
            });
        }
        let numba: Vec<&Task> = tasks
            .iter()
            .copied()
            .filter(|t| t.kind == crate::task::TaskKind::NumbaCuda)
            .collect();
        if !numba.is_empty() {
            self.require_cuda_kernel(&tasks_in_words(&numba, ""))?;
        }
        Ok(())
    }

    /// The interpreter candidate code runs in, in words.
    fn python_label(&self) -> String {
        match &self.backend {
            Backend::Local(pool) => pool.launch.python.display().to_string(),
            Backend::Remote(_) => format!(
                "the Python of the remote sandbox at {}",
                self.cfg.remote.urls.join(", ")
            ),
        }
    }

    /// Runs `code` with `args` in the sandbox's interpreter (locally in its
    /// isolated mode, with the sandbox's environment when `sandbox_env`; on
    /// a remote service as a script) to check `what` before any sample runs.
    fn python_probe(
        &self,
        code: &str,
        args: &[String],
        sandbox_env: bool,
        what: &str,
    ) -> Result<ProbeOutput, ExecError> {
        let pool = match &self.backend {
            Backend::Local(pool) => pool,
            Backend::Remote(r) => {
                let argv = serde_json::to_string(args).unwrap_or_else(|_| "[]".into());
                let run = r
                    .run_script(&Script {
                        code: format!("import sys\nsys.argv[1:] = {argv}\n{code}"),
                        timeout_s: Some(120.0),
                        ..Script::default()
                    })
                    .map_err(|e| ExecError::Remote(format!("checking {what}: {e}")))?;
                return Ok(ProbeOutput {
                    ok: run.succeeded(),
                    stdout: run.stdout,
                    stderr: run.stderr,
                });
            }
        };
        let python = &pool.launch.python;
        let mut cmd = std::process::Command::new(python);
        cmd.arg("-I").arg("-c").arg(code).args(args);
        if sandbox_env {
            cmd.env_clear().envs(isolation::sandbox_env(self.config()));
        }
        let out = cmd.output().map_err(|e| ExecError::Missing {
            what: format!("a working Python at {}", python.display()),
            hint: format!("it could not be started to check {what}: {e}"),
        })?;
        Ok(ProbeOutput {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// numba-cuda can import and still fail at its first kernel (numba-cuda
    /// 0.30.4 with numpy 2.5 does: it registers `np.row_stack`, which numpy
    /// removed), and then every numba_cuda sample is a runtime error. One
    /// small kernel over arrays, compiled and launched in the sandbox's CUDA
    /// mode (device or simulator), tells before any sample runs.
    fn require_cuda_kernel(&self, needed_by: &str) -> Result<(), ExecError> {
        let probe = "import numpy as np\nfrom numba import cuda\n@cuda.jit\ndef k(a, out):\n    i = cuda.grid(1)\n    if i < out.size:\n        out[i] = a[i] * 2.0\na = np.arange(8, dtype=np.float64)\nout = np.zeros_like(a)\nk[1, 8](a, out)\nassert (out == 2 * a).all(), out\n";
        let out = self.python_probe(probe, &[], true, "numba-cuda")?;
        let mode = match isolation::resolve_cuda(self.config().cuda) {
            crate::config::CudaMode::Sim => "numba's CUDA simulator",
            _ => "the GPU",
        };
        if out.ok {
            return Ok(());
        }
        let last = exception_text(&out.stderr);
        Err(ExecError::CudaKernel {
            python: self.python_label(),
            mode: mode.into(),
            needed_by: needed_by.into(),
            error: last,
        })
    }

    /// How many workers have been started lazily (replacements for dead or
    /// killed ones, and slots that were not warm yet).
    pub fn lazy_starts(&self) -> u64 {
        match &self.backend {
            Backend::Local(pool) => pool.respawns.load(Ordering::Relaxed),
            Backend::Remote(_) => 0,
        }
    }
}

/// `attempt(false)`, and when its result says the job never got to run,
/// `attempt(true)` on a fresh worker: the sandbox's failure is not the
/// sample's, but a second one is no signal.
fn once_more<T>(
    attempt: impl Fn(bool) -> Result<T, String>,
    never_ran: impl Fn(&Result<T, String>) -> bool,
) -> Result<T, String> {
    let first = attempt(false);
    if never_ran(&first) {
        attempt(true)
    } else {
        first
    }
}

/// What a check run in the sandbox's interpreter printed.
struct ProbeOutput {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// `N <kind>task(s), e.g. ID` for the tasks `ts` (at least one); `kind`
/// is put before "task" as given (empty, or ending in a space).
fn tasks_in_words(ts: &[&Task], kind: &str) -> String {
    format!(
        "{} {kind}task{}, e.g. {}",
        ts.len(),
        if ts.len() == 1 { "" } else { "s" },
        ts[0].id
    )
}

/// The exception a Python traceback ends with (`Type: message`, the
/// message's own lines joined), or its last line.
fn exception_text(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().collect();
    let is_exception = |l: &str| {
        let head = l.split(':').next().unwrap_or("");
        !l.starts_with(char::is_whitespace)
            && l.contains(':')
            && !head.is_empty()
            && head
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
    };
    let from = lines.iter().rposition(|l| is_exception(l));
    let text = match from {
        Some(i) => lines[i..]
            .iter()
            .map(|l| l.trim())
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" "),
        None => lines
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map_or("no error output".to_owned(), |l| l.trim().to_owned()),
    };
    text.chars().take(400).collect()
}

/// Pass/fail counts over a subset of a report's tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TestCounts {
    pub pass: usize,
    pub fail: usize,
}

/// MemoCoder's guiding test: the first `n_visible` tests are shown to the
/// model, the rest are hidden. Returns (visible, hidden) counts.
pub fn split_visible(report: &ExecReport, n_visible: usize) -> (TestCounts, TestCounts) {
    let mut vis = TestCounts::default();
    let mut hid = TestCounts::default();
    for t in &report.tests {
        let c = if t.index < n_visible {
            &mut vis
        } else {
            &mut hid
        };
        if t.status == TestStatus::Pass {
            c.pass += 1;
        } else {
            c.fail += 1;
        }
    }
    (vis, hid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceback_gives_its_exception_with_the_message_lines() {
        let tb = "Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\n    raise E(\"a:\")\nnumba.cuda.cudadrv.error.CudaSupportError: Error at driver init: \n\nCUDA driver library cannot be found.\n:\n";
        assert_eq!(
            exception_text(tb),
            "numba.cuda.cudadrv.error.CudaSupportError: Error at driver init: CUDA driver library cannot be found. :"
        );
        let tb = "Traceback (most recent call last):\n  File \"a.py\", line 6860, in <module>\n    overload(np.row_stack)(impl)\nAttributeError: module 'numpy' has no attribute 'row_stack'\n";
        assert_eq!(
            exception_text(tb),
            "AttributeError: module 'numpy' has no attribute 'row_stack'"
        );
        assert_eq!(exception_text("  only indented\n"), "only indented");
        assert_eq!(exception_text(""), "no error output");
    }

    #[test]
    fn a_tasks_required_modules_come_from_its_kind_prelude_and_setup() {
        let task = |kind, prelude: &str, setup: &str| Task {
            id: "t".into(),
            prompt: String::new(),
            entry_point: "f".into(),
            tests: vec!["assert True".into()],
            kind,
            canonical_solution: None,
            docs: None,
            tags: vec![],
            test_setup: Some(setup.into()),
            prelude: Some(prelude.into()),
            extra: Default::default(),
            ..Default::default()
        };
        use crate::task::TaskKind;
        let t = task(
            TaskKind::Python,
            "import ndonnx as ndx\nimport os.path, json\n",
            "from numpy.testing import assert_allclose\nx = 1  # import nothing\n",
        );
        assert_eq!(required_modules(&t), ["ndonnx", "os", "json", "numpy"]);
        let t = task(TaskKind::NumbaCuda, "from numba import cuda", "");
        assert_eq!(required_modules(&t), ["numpy", "numba"]);
    }

    #[test]
    fn split_visible_counts_first_tests_apart() {
        let t = |index, status| TestResult {
            index,
            status,
            error_lines: vec![],
            seconds: 0.0,
        };
        let r = ExecReport::from_tests(
            vec![
                t(0, TestStatus::Pass),
                t(1, TestStatus::Fail),
                t(2, TestStatus::Pass),
            ],
            String::new(),
            0.0,
        );
        assert_eq!(
            split_visible(&r, 1),
            (
                TestCounts { pass: 1, fail: 0 },
                TestCounts { pass: 1, fail: 1 }
            )
        );
        assert_eq!(split_visible(&r, 0).0, TestCounts::default());
    }
}
