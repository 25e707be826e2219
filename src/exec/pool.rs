//! The bounded pool of warm workers. Each slot holds at most one worker
//! process (one bubblewrap sandbox with a warm interpreter); a job takes an
//! idle slot, and a worker that dies, hangs past its deadline or answers
//! nonsense is killed with its whole sandbox and replaced on the next use.

use std::io::{BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::isolation::{self, SANDBOX_JOBDIR};
use super::protocol::{read_frame, write_frame, ReadError};
use crate::config::{ExecConfig, Isolation};

/// The trusted worker program, embedded in the binary.
pub const WORKER_PY: &str = include_str!("worker.py");

/// Prefix of the error for a job that could not be sent (it never ran).
pub const WORKER_GONE: &str = "worker gone before the job was sent";
/// Prefix of the error for a worker whose reply ended early (it died).
pub const WORKER_DIED: &str = "worker died";
/// Prefix of the error for a worker that did not answer by the job's
/// deadline (its own per-test limits would have answered first: it stalled).
pub const WORKER_LATE: &str = "worker did not answer before the job deadline";
/// Prefix of the error for a slot whose worker could not be started.
pub const WORKER_UNSTARTED: &str = "cannot start a sandbox worker";

/// Starts `cmd` from a thread that lives as long as the process. bubblewrap's
/// `--die-with-parent` (PR_SET_PDEATHSIG) fires when the *thread* that
/// forked it exits, not the process: a worker started by a short-lived
/// thread (a batch's scoped thread, the service's per-connection thread,
/// the pool's warm-up thread) was killed as soon as that thread ended, and
/// the next job paid for a new worker.
fn spawn_from_keeper(cmd: Command) -> std::io::Result<Child> {
    type Order = (Command, std::sync::mpsc::SyncSender<std::io::Result<Child>>);
    static KEEPER: std::sync::OnceLock<Mutex<std::sync::mpsc::Sender<Order>>> =
        std::sync::OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Order>();
        std::thread::Builder::new()
            .name("falcon-exec-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("a thread to start sandbox workers from");
        Mutex::new(tx)
    });
    let (reply, answer) = std::sync::mpsc::sync_channel(1);
    let sent = keeper
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, reply));
    match sent {
        Ok(()) => answer
            .recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("the worker-starting thread is gone"))),
        // Only if that thread died: start from here rather than not at all.
        Err(std::sync::mpsc::SendError((mut c, _))) => c.spawn(),
    }
}

/// Whether a job's error says it never got to run (a worker that died
/// while idle, would not start, or did not answer in time): the sandbox's
/// failure, so it is tried once more on a fresh worker.
pub fn never_ran(e: &str) -> bool {
    [WORKER_GONE, WORKER_DIED, WORKER_LATE, WORKER_UNSTARTED]
        .iter()
        .any(|p| e.starts_with(p))
}

/// How long a fresh worker may take to import its preloads and say ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Everything needed to start workers, resolved once.
#[derive(Debug, Clone)]
pub struct Launch {
    pub cfg: ExecConfig,
    pub python: PathBuf,
    /// The interpreter's prefixes (bound back into hidden home directories).
    pub python_roots: Vec<PathBuf>,
    pub bwrap: PathBuf,
    pub root: bool,
}

/// One live worker process.
pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Host directory used as the job dir when not in bubblewrap.
    host_dir: Option<PathBuf>,
    pub jobs: u64,
}

impl Worker {
    /// Starts a worker for `slot` and waits for its ready message.
    pub fn spawn(l: &Launch, slot: usize) -> Result<Worker, String> {
        let (jobdir, host_dir) = match l.cfg.isolation {
            Isolation::Bwrap => (SANDBOX_JOBDIR.to_owned(), None),
            Isolation::None => {
                let d = std::env::temp_dir().join(format!(
                    "falcon-exec-{}-{slot}-{}",
                    std::process::id(),
                    unique()
                ));
                std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
                (d.display().to_string(), Some(d))
            }
        };
        let limits = isolation::worker_limits(&l.cfg, slot, &jobdir, l.root);
        let limits_json = serde_json::to_string(&limits).expect("limits serialize");
        let argv = isolation::worker_argv(
            &l.cfg,
            &l.bwrap,
            &l.python,
            &l.python_roots,
            WORKER_PY,
            &limits_json,
            l.root,
        );
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if l.cfg.isolation == Isolation::None {
            cmd.env_clear()
                .envs(isolation::sandbox_env(&l.cfg))
                .current_dir(&jobdir);
        }
        let mut child =
            spawn_from_keeper(cmd).map_err(|e| format!("cannot start {}: {e}", argv[0]))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut w = Worker {
            child,
            stdin,
            stdout,
            host_dir,
            jobs: 0,
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        match read_frame(w.stdout.get_mut(), deadline, 1 << 20) {
            Ok(body) if body.starts_with(b"{\"ready\":true") => Ok(w),
            other => {
                let why = match other {
                    Ok(_) => "unexpected first message".to_owned(),
                    Err(ReadError::Timeout) => "no ready message within 60 s".to_owned(),
                    Err(ReadError::Eof) => "exited before it was ready".to_owned(),
                    Err(e) => format!("{e:?}"),
                };
                w.kill();
                let mut err = String::new();
                if let Some(mut s) = w.child.stderr.take() {
                    let _ = s.read_to_string(&mut err);
                }
                let err = super::protocol::tail(err.trim(), 2000);
                Err(format!("worker {why}; its stderr: {err}"))
            }
        }
    }

    /// Sends one job and waits for the reply until `deadline`.
    pub fn call(&mut self, job: &[u8], deadline: Instant, cap: usize) -> Result<Vec<u8>, String> {
        write_frame(&mut self.stdin, job).map_err(|e| format!("{WORKER_GONE}: {e}"))?;
        self.jobs += 1;
        read_frame(self.stdout.get_mut(), deadline, cap).map_err(|e| match e {
            ReadError::Timeout => WORKER_LATE.to_owned(),
            ReadError::Eof => {
                std::thread::sleep(Duration::from_millis(20));
                let status = self.child.try_wait().ok().flatten();
                format!(
                    "{WORKER_DIED} ({})",
                    status.map_or("still running".into(), |s| s.to_string())
                )
            }
            ReadError::TooLarge(n) => format!("worker reply of {n} bytes over the cap"),
            ReadError::Io(e) => format!("reading from worker: {e}"),
        })
    }

    /// Kills the worker's whole sandbox (its process group; bubblewrap's
    /// --die-with-parent and the pid namespace take everything inside down).
    pub fn kill(&mut self) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: plain syscalls on our own child's process group.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
            libc::kill(pid, libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

impl Worker {
    /// Has the worker process already exited (reaped here if so)?
    fn has_exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
        if let Some(d) = &self.host_dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

enum Slot {
    Idle(Worker),
    Empty,
    Busy,
}

/// A fixed number of slots; a caller blocks until one is free.
pub struct Pool {
    pub launch: Launch,
    slots: Mutex<Vec<Slot>>,
    freed: Condvar,
    /// Workers started after the first set (a measure of how often workers die).
    pub respawns: std::sync::atomic::AtomicU64,
}

impl Pool {
    pub fn new(launch: Launch, size: usize) -> Pool {
        Pool {
            launch,
            slots: Mutex::new((0..size).map(|_| Slot::Empty).collect()),
            freed: Condvar::new(),
            respawns: Default::default(),
        }
    }

    pub fn size(&self) -> usize {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Puts a ready worker into an empty slot (used at start-up).
    pub fn put(&self, slot: usize, w: Worker) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots[slot] = Slot::Idle(w);
        self.freed.notify_one();
    }

    /// Puts a worker started in the background into its slot if the slot is
    /// still empty (a caller may have started one there meanwhile).
    pub fn put_if_empty(&self, slot: usize, w: Worker) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(slots[slot], Slot::Empty) {
            slots[slot] = Slot::Idle(w);
            self.freed.notify_one();
        }
    }

    /// Runs `f` with a live worker, starting one if the slot is empty. A
    /// worker for which `f` fails is dropped (killed), never reused.
    pub fn with_worker<T>(
        &self,
        fresh: bool,
        f: impl FnOnce(&mut Worker) -> Result<T, String>,
    ) -> Result<T, String> {
        let (slot, existing) = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(i) = slots.iter().position(|s| matches!(s, Slot::Idle(_))) {
                    let Slot::Idle(w) = std::mem::replace(&mut slots[i], Slot::Busy) else {
                        unreachable!()
                    };
                    break (i, Some(w));
                }
                if let Some(i) = slots.iter().position(|s| matches!(s, Slot::Empty)) {
                    slots[i] = Slot::Busy;
                    break (i, None);
                }
                slots = self.freed.wait(slots).unwrap_or_else(|e| e.into_inner());
            }
        };
        // An idle worker that has exited is replaced here rather than found
        // dead when the job is written to it; `fresh` replaces any idle one
        // (the retry of a job that never ran: on an H200 in device mode,
        // several idle workers were found dead at once, so the next idle
        // one is no better a bet).
        let existing = existing.and_then(|mut w| (!fresh && !w.has_exited()).then_some(w));
        let mut worker = match existing {
            Some(w) => w,
            None => {
                self.respawns
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                match Worker::spawn(&self.launch, slot) {
                    Ok(w) => w,
                    Err(e) => {
                        self.release(slot, None);
                        return Err(format!("{WORKER_UNSTARTED}: {e}"));
                    }
                }
            }
        };
        let out = f(&mut worker);
        self.release(slot, out.is_ok().then_some(worker));
        out
    }

    fn release(&self, slot: usize, w: Option<Worker>) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots[slot] = w.map_or(Slot::Empty, Slot::Idle);
        self.freed.notify_one();
    }
}
