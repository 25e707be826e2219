//! A process kept between steps that answers JSON lines: a Python reward
//! worker or a user's command. It runs in a process group of its own (so a
//! kill takes its children too), its stdout is read by a thread that hands
//! over whole lines, and every read has a deadline. A slot holds at most one
//! such process and starts a fresh one after a failure.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Instant;

/// Longest line an answer may be; a longer one is a broken process.
const MAX_LINE: usize = 64 << 20;

/// Why no answer came.
#[derive(Debug)]
pub(super) enum Failure {
    /// The deadline passed; the process was killed.
    Timeout,
    /// The process could not start, or died, or closed its stdout.
    Died(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Timeout => f.write_str("no answer before the deadline (killed)"),
            Failure::Died(why) => f.write_str(why),
        }
    }
}

/// One running process.
pub(super) struct Kept {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Result<String, String>>,
    what: String,
}

impl Kept {
    /// Starts `program args…` in `cwd`; stderr goes to ours.
    pub fn spawn(
        program: &Path,
        args: &[String],
        cwd: Option<&Path>,
        what: &str,
    ) -> Result<Kept, Failure> {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0);
        if let Some(d) = cwd {
            cmd.current_dir(d);
        }
        let mut child = cmd.spawn().map_err(|e| {
            Failure::Died(format!("{what}: cannot start {}: {e}", program.display()))
        })?;
        let stdout = child.stdout.take().expect("piped");
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let mut buf = Vec::new();
                let n = match (&mut r).take(MAX_LINE as u64).read_until(b'\n', &mut buf) {
                    Ok(n) => n,
                    Err(e) => {
                        let _ = tx.send(Err(format!("reading its answer: {e}")));
                        return;
                    }
                };
                if n == 0 {
                    let _ = tx.send(Err("it closed its stdout".into()));
                    return;
                }
                if !buf.ends_with(b"\n") && buf.len() >= MAX_LINE {
                    let _ = tx.send(Err(format!("an answer line over {MAX_LINE} bytes")));
                    return;
                }
                let line = String::from_utf8_lossy(&buf).trim_end().to_owned();
                if tx.send(Ok(line)).is_err() {
                    return;
                }
            }
        });
        Ok(Kept {
            child,
            stdin,
            lines,
            what: what.to_owned(),
        })
    }

    /// Writes `text` (whole lines) to its stdin.
    pub fn send(&mut self, text: &str) -> Result<(), Failure> {
        let stdin = self.stdin.as_mut().expect("open until dropped");
        stdin
            .write_all(text.as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(|e| self.died(&format!("writing to it: {e}")))
    }

    /// The next line it writes, by `deadline`.
    pub fn recv(&mut self, deadline: Instant) -> Result<String, Failure> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok(Ok(line)) => Ok(line),
            Ok(Err(why)) => Err(self.died(&why)),
            Err(RecvTimeoutError::Timeout) => {
                self.kill();
                Err(Failure::Timeout)
            }
            Err(RecvTimeoutError::Disconnected) => Err(self.died("it closed its stdout")),
        }
    }

    fn died(&mut self, why: &str) -> Failure {
        // Give a dying process a moment so its exit status can be named.
        let mut status = None;
        for _ in 0..50 {
            if let Ok(Some(s)) = self.child.try_wait() {
                status = Some(s);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        self.kill();
        match status {
            Some(s) => Failure::Died(format!("{}: {why} ({s})", self.what)),
            None => Failure::Died(format!("{}: {why}", self.what)),
        }
    }

    fn kill(&mut self) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: signals the process group this process leads; no memory is touched.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        drop(self.stdin.take());
        self.kill();
    }
}
