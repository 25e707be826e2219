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
//! `docs/sandbox.md` for the exact guarantee and its limits).
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

pub mod isolation;
pub mod outcome;
mod pool;
pub mod protocol;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

pub use self::outcome::{
    ErrorKind, ExecReport, MemoCoderClass, RewardClass, TestResult, TestStatus,
};
pub use self::pool::WORKER_PY;
pub use self::protocol::CheckMode;
use crate::config::{ExecConfig, Isolation};
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

/// The execution sandbox: a pool of warm, isolated workers. Cheap to clone
/// (clones share the pool); usable from many threads at once.
#[derive(Clone)]
pub struct Sandbox {
    pool: Arc<pool::Pool>,
}

static WEAK_WARNING: Once = Once::new();

impl Sandbox {
    /// Where `numba_cuda` kernels run in this sandbox: `"simulator"`
    /// (numba's CUDA simulator on the CPU) or `"device"`. Scores of such
    /// tasks must say which.
    pub fn cuda_label(&self) -> &'static str {
        match isolation::resolve_cuda(self.pool.launch.cfg.cuda) {
            crate::config::CudaMode::Device => "device",
            _ => "simulator",
        }
    }

    /// Starts the pool (`cfg.workers` workers; 0 = one per CPU) and checks
    /// that isolation works by starting the first worker before returning.
    pub fn new(cfg: &ExecConfig) -> Result<Sandbox, ExecError> {
        if !(cfg.timeout_s > 0.0 && cfg.timeout_s.is_finite()) {
            return Err(ExecError::Config(format!(
                "timeout_s = {} must be > 0",
                cfg.timeout_s
            )));
        }
        let python_name = cfg.python.clone();
        let python = isolation::which(&python_name).ok_or_else(|| ExecError::Missing {
            what: format!("Python interpreter {python_name:?}"),
            hint: "install Python 3 or set [exec] python".into(),
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
        let size = if cfg.workers == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            cfg.workers
        };
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
        Ok(Sandbox { pool })
    }

    /// Number of workers (the most jobs that run at once).
    pub fn workers(&self) -> usize {
        self.pool.size()
    }

    /// The config the sandbox was built with.
    pub fn config(&self) -> &ExecConfig {
        &self.pool.launch.cfg
    }

    /// Runs every test of `task` against `code` (a complete program defining
    /// `task.entry_point`), each test on its own. Never panics or errors: a
    /// failure of the sandbox itself is [`ExecReport::no_signal`].
    pub fn run(&self, task: &Task, code: &str) -> ExecReport {
        let t0 = Instant::now();
        let cfg = &self.pool.launch.cfg;
        let job = protocol::Job::new(task, code, cfg);
        let body = match serde_json::to_vec(&job) {
            Ok(b) => b,
            Err(e) => return ExecReport::no_signal(format!("sandbox: cannot encode job: {e}")),
        };
        // Each test gets its limit plus the worker's grace and clean-up; a
        // worker that overruns this is hung and is killed.
        let per_test = cfg.wall_limit_s() + 2.0;
        let deadline = t0 + Duration::from_secs_f64(per_test * task.tests.len() as f64 + 10.0);
        let cap = (cfg.output_bytes + (1 << 20)) * 4 + 64 * task.tests.len() * 1024;
        let attempt = || {
            self.pool.with_worker(|w| {
                let bytes = w.call(&body, deadline, cap)?;
                serde_json::from_slice::<protocol::WireReply>(&bytes)
                    .map_err(|e| format!("malformed worker reply: {e}"))
            })
        };
        // A worker that died while idle is found when the job cannot be
        // written to it, or (the pipe buffer took the job) when its reply
        // ends early. The candidate runs under another uid and cannot signal
        // the worker, so a dead worker is ours, not the sample's: run the job
        // once more on a fresh worker. (Seen: rare SIGKILLs of idle workers
        // under heavy load, cause not yet found.)
        let reply = match attempt() {
            Err(e) if e.starts_with(pool::WORKER_GONE) || e.starts_with(pool::WORKER_DIED) => {
                attempt()
            }
            other => other,
        };
        match reply {
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

    /// How many workers have been started lazily (replacements for dead or
    /// killed ones, and slots that were not warm yet).
    pub fn lazy_starts(&self) -> u64 {
        self.pool.respawns.load(Ordering::Relaxed)
    }
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
