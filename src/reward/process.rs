//! Running a trusted helper tool (ruff, a Python `ast` script) on candidate
//! code given on stdin, with a wall-clock timeout, capped output and a
//! scrubbed environment. The candidate code is only ever *parsed* by these
//! tools, never executed, so no sandbox is needed; the timeout and the caps
//! guard against pathological inputs (huge or deeply nested code).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// Bytes of stdout or stderr kept per run; the rest is drained and dropped.
pub(crate) const OUTPUT_CAP: usize = 8 << 20;

/// How often the child is polled while it runs.
const POLL: Duration = Duration::from_millis(2);

/// What a finished helper run produced.
#[derive(Debug)]
pub(crate) struct ToolOutput {
    /// The exit code; `None` when killed by a signal.
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Why a helper run produced no output.
#[derive(Debug)]
pub(crate) enum ToolRunError {
    /// It could not be started at all.
    Spawn(std::io::Error),
    /// It ran past the timeout and was killed.
    Timeout,
}

/// Finds an executable (see [`crate::config::locate_tool`]).
pub(crate) fn resolve_tool(setting: &str, name: &str) -> Result<PathBuf, Vec<PathBuf>> {
    crate::config::locate_tool(setting, name)
}

/// Reads a pipe to its end, keeping at most [`OUTPUT_CAP`] bytes.
fn drain(mut r: impl Read) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    loop {
        match r.read(&mut buf) {
            Ok(0) | Err(_) => return kept,
            Ok(n) => {
                let room = OUTPUT_CAP.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

/// Runs `program args…` with `input` on stdin and an empty environment
/// (plus `env`), killing it after `timeout`.
pub(crate) fn run_tool(
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    input: &[u8],
    timeout: Duration,
) -> Result<ToolOutput, ToolRunError> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(env.iter().copied())
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(ToolRunError::Spawn)?;
    let start = Instant::now();
    let mut stdin = child.stdin.take().expect("piped");
    let input = input.to_vec();
    // A broken pipe (the tool quit early) is not our error; its exit code says why.
    let writer = thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    let out_reader = thread::spawn(move || drain(out));
    let err_reader = thread::spawn(move || drain(err));
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if start.elapsed() >= timeout => break None,
            Ok(None) => thread::sleep(POLL),
            Err(_) => break None,
        }
    };
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        let _ = writer.join();
        let _ = out_reader.join();
        let _ = err_reader.join();
        return Err(ToolRunError::Timeout);
    };
    let _ = writer.join();
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    Ok(ToolOutput {
        code: status.code(),
        stdout,
        stderr,
    })
}
