//! The wire between the trainer and a worker (length-prefixed JSON over the
//! worker's stdin/stdout), and the pure mapping from a worker's reply to an
//! [`ExecReport`]. Everything here is deterministic and unit-tested; process
//! handling lives in `pool.rs`.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::outcome::{ErrorKind, ExecReport, TestResult, TestStatus};
use crate::config::{ExecClock, ExecConfig};
use crate::task::{Task, TaskKind};

/// How the worker checks a test (see docs/sandbox.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckMode {
    /// The trusted side runs the test; candidate code is reached only through
    /// proxies that return plain data. Results cannot be forged.
    Trusted,
    /// The whole test program runs in the candidate process (numba kernels
    /// that write into device arrays). Contained, but forgeable.
    Program,
}

impl CheckMode {
    /// The mode a task's tests run in.
    pub fn for_task(task: &Task) -> CheckMode {
        match task.kind {
            // Program tasks never reach a test job (`exec::program`).
            TaskKind::Python | TaskKind::Stdio => CheckMode::Trusted,
            TaskKind::NumbaCuda => CheckMode::Program,
        }
    }
}

/// One job as the worker reads it.
#[derive(Debug, Serialize)]
pub struct Job<'a> {
    pub code: &'a str,
    /// Run before `code`, in the candidate's process ([`Task::prelude`]).
    pub prelude: Option<&'a str>,
    pub setup: Option<&'a str>,
    pub tests: &'a [String],
    pub mode: CheckMode,
    /// Seconds per test on `clock`.
    pub timeout: f64,
    /// `"cpu"` or `"wall"`: what `timeout` measures.
    pub clock: ExecClock,
    /// Wall-clock seconds per test after which the worker kills the child.
    pub wall: f64,
}

impl<'a> Job<'a> {
    pub fn new(task: &'a Task, code: &'a str, cfg: &ExecConfig) -> Self {
        let timeout = task
            .time_limit_ms
            .map_or(cfg.timeout_s, |ms| ms as f64 / 1000.0);
        Job {
            code,
            prelude: task.prelude.as_deref().filter(|s| !s.trim().is_empty()),
            setup: task.test_setup.as_deref().filter(|s| !s.trim().is_empty()),
            tests: &task.tests,
            mode: CheckMode::for_task(task),
            timeout,
            clock: cfg.clock,
            wall: cfg.wall_limit_for(timeout, cfg.clock),
        }
    }
}

/// One test's result as the worker sends it.
#[derive(Debug, Deserialize)]
pub struct WireTest {
    pub status: String,
    pub kind: Option<String>,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub lines: Vec<i64>,
    #[serde(default)]
    pub seconds: f64,
}

/// A worker's reply to a job.
#[derive(Debug, Deserialize)]
pub struct WireReply {
    #[serde(default)]
    pub tests: Vec<WireTest>,
    #[serde(default)]
    pub output: String,
    #[serde(default)]
    pub seconds: f64,
    /// Set when the worker could not judge the sample (our limitation).
    pub no_signal: Option<String>,
}

/// Maps a worker's error-kind name: our two tokens, else a Python exception name.
pub fn kind_from_wire(name: &str) -> ErrorKind {
    match name {
        "WrongAnswer" => ErrorKind::WrongAnswer,
        "Timeout" => ErrorKind::Timeout,
        other => ErrorKind::from_python_exception(other),
    }
}

/// Turns a reply into the report; a reply that does not fit the job is no signal.
pub fn report_from_reply(reply: WireReply, n_tests: usize, output_cap: usize) -> ExecReport {
    if let Some(reason) = reply.no_signal {
        return ExecReport::no_signal(format!("sandbox: {reason}"));
    }
    if reply.tests.len() != n_tests {
        return ExecReport::no_signal(format!(
            "sandbox: worker returned {} results for {n_tests} tests",
            reply.tests.len()
        ));
    }
    let mut tests = Vec::with_capacity(n_tests);
    for (index, t) in reply.tests.into_iter().enumerate() {
        let status = match t.status.as_str() {
            "pass" => TestStatus::Pass,
            "fail" => TestStatus::Fail,
            "error" => TestStatus::Error {
                kind: kind_from_wire(t.kind.as_deref().unwrap_or("")),
                message: t.message,
            },
            other => {
                return ExecReport::no_signal(format!("sandbox: unknown test status {other:?}"))
            }
        };
        let mut error_lines: Vec<u32> = t
            .lines
            .iter()
            .filter_map(|&l| u32::try_from(l).ok().filter(|&l| l > 0))
            .collect();
        error_lines.sort_unstable();
        error_lines.dedup();
        tests.push(TestResult {
            index,
            status,
            error_lines,
            seconds: t.seconds,
        });
    }
    ExecReport::from_tests(tests, tail(&reply.output, output_cap), reply.seconds)
}

/// The last `cap` bytes of `s`, cut at a character boundary.
pub fn tail(s: &str, cap: usize) -> String {
    if s.len() <= cap {
        return s.to_owned();
    }
    let mut start = s.len() - cap;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_owned()
}

/// Why a frame could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The deadline passed first.
    Timeout,
    /// End of stream: the worker is gone.
    Eof,
    /// The frame announced more bytes than the cap.
    TooLarge(usize),
    Io(io::Error),
}

/// Writes one frame: a 4-byte big-endian length, then the bytes.
pub fn write_frame(w: &mut impl Write, body: &[u8]) -> io::Result<()> {
    let n = u32::try_from(body.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame over 4 GiB"))?;
    w.write_all(&n.to_be_bytes())?;
    w.write_all(body)?;
    w.flush()
}

/// Reads one frame before `deadline`, waiting with poll(2) so that a hung
/// worker can never hang the caller.
pub fn read_frame<R: Read + AsRawFd>(
    r: &mut R,
    deadline: Instant,
    cap: usize,
) -> Result<Vec<u8>, ReadError> {
    let mut head = [0u8; 4];
    read_exact_by(r, &mut head, deadline)?;
    let n = u32::from_be_bytes(head) as usize;
    if n > cap {
        return Err(ReadError::TooLarge(n));
    }
    let mut body = vec![0u8; n];
    read_exact_by(r, &mut body, deadline)?;
    Ok(body)
}

fn read_exact_by<R: Read + AsRawFd>(
    r: &mut R,
    mut buf: &mut [u8],
    deadline: Instant,
) -> Result<(), ReadError> {
    while !buf.is_empty() {
        let now = Instant::now();
        if now >= deadline {
            return Err(ReadError::Timeout);
        }
        let ms = (deadline - now).as_millis().min(i32::MAX as u128) as i32;
        let mut pfd = libc::pollfd {
            fd: r.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, count 1.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms.max(1)) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(ReadError::Io(e));
        }
        if rc == 0 {
            continue;
        }
        match r.read(buf) {
            Ok(0) => return Err(ReadError::Eof),
            Ok(k) => buf = &mut buf[k..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::outcome::RewardClass;

    fn reply(json: &str) -> WireReply {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn reply_maps_to_per_test_results() {
        let r = report_from_reply(
            reply(
                r#"{"tests":[{"status":"pass","kind":null,"lines":[],"seconds":0.1},
                {"status":"fail","kind":"WrongAnswer","lines":[3,2,3]},
                {"status":"error","kind":"ZeroDivisionError","message":"division by zero","lines":[4,0,-1]}],
                "output":"hello","seconds":0.3}"#,
            ),
            3,
            100,
        );
        assert_eq!((r.n_pass(), r.n_fail()), (1, 2));
        assert_eq!(r.outcome, Some(RewardClass::Failure));
        assert_eq!(r.tests[1].error_lines, vec![2, 3]);
        assert_eq!(r.tests[2].error_lines, vec![4]);
        assert_eq!(r.error_lines, vec![2, 3, 4]);
        assert_eq!(
            r.tests[2].status,
            TestStatus::Error {
                kind: ErrorKind::ZeroDivisionError,
                message: "division by zero".into()
            }
        );
        assert_eq!(r.output_tail, "hello");
    }

    #[test]
    fn wrong_shape_or_no_signal_reply_gives_no_signal() {
        let r = report_from_reply(reply(r#"{"tests":[{"status":"pass"}]}"#), 2, 10);
        assert!(r.outcome.is_none() && r.no_signal.unwrap().contains("1 results for 2"));
        let r = report_from_reply(reply(r#"{"no_signal":"test 0: cannot send"}"#), 1, 10);
        assert!(r.outcome.is_none());
        let r = report_from_reply(reply(r#"{"tests":[{"status":"maybe"}]}"#), 1, 10);
        assert!(r.outcome.is_none());
    }

    #[test]
    fn wire_kinds() {
        assert_eq!(kind_from_wire("Timeout"), ErrorKind::Timeout);
        assert_eq!(kind_from_wire("TimeoutError"), ErrorKind::Timeout);
        assert_eq!(kind_from_wire("WrongAnswer"), ErrorKind::WrongAnswer);
        assert_eq!(
            kind_from_wire("IndentationError"),
            ErrorKind::IndentationError
        );
        assert_eq!(kind_from_wire("SystemExit"), ErrorKind::Other);
        assert_eq!(kind_from_wire(""), ErrorKind::Other);
    }

    #[test]
    fn tail_cuts_at_char_boundary() {
        assert_eq!(tail("abc", 5), "abc");
        assert_eq!(tail("abcdef", 2), "ef");
        assert_eq!(tail("aé", 1), "");
        assert_eq!(tail("aéb", 2), "b");
    }

    #[test]
    fn frames_round_trip_and_cap() {
        let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        write_frame(&mut a, b"{\"x\":1}").unwrap();
        let deadline = Instant::now() + std::time::Duration::from_secs(1);
        assert_eq!(read_frame(&mut b, deadline, 100).unwrap(), b"{\"x\":1}");
        write_frame(&mut a, &[0u8; 50]).unwrap();
        assert!(matches!(
            read_frame(&mut b, deadline, 10),
            Err(ReadError::TooLarge(50))
        ));
        let (_a2, mut b2) = std::os::unix::net::UnixStream::pair().unwrap();
        let soon = Instant::now() + std::time::Duration::from_millis(50);
        assert!(matches!(
            read_frame(&mut b2, soon, 10),
            Err(ReadError::Timeout)
        ));
        drop(a);
        let mut rest = Vec::new();
        let _ = b.read_to_end(&mut rest);
    }

    #[test]
    fn job_takes_setup_and_mode_from_task() {
        let mut task = Task {
            id: "t".into(),
            prompt: String::new(),
            entry_point: "f".into(),
            tests: vec!["assert f() == 1".into()],
            kind: TaskKind::Python,
            canonical_solution: None,
            docs: None,
            tags: vec![],
            test_setup: Some("  \n".into()),
            prelude: Some("from typing import List".into()),
            extra: Default::default(),
            ..Default::default()
        };
        let cfg = ExecConfig {
            timeout_s: 2.0,
            ..ExecConfig::default()
        };
        let j = Job::new(&task, "def f(): return 1", &cfg);
        assert_eq!((j.setup, j.mode), (None, CheckMode::Trusted));
        assert_eq!(j.prelude, Some("from typing import List"));
        // The CPU clock's wall-clock backstop defaults to 3 x the limit + 10 s.
        assert_eq!((j.timeout, j.clock, j.wall), (2.0, ExecClock::Cpu, 16.0));
        let wall = ExecConfig {
            clock: ExecClock::Wall,
            wall_timeout_s: 9.0,
            ..cfg.clone()
        };
        let j = Job::new(&task, "def f(): return 1", &wall);
        assert_eq!((j.clock, j.wall), (ExecClock::Wall, 2.0));
        task.kind = TaskKind::NumbaCuda;
        task.test_setup = Some("import numpy as np".into());
        let j = Job::new(&task, "", &cfg);
        assert_eq!(
            (j.setup, j.mode),
            (Some("import numpy as np"), CheckMode::Program)
        );
        let text = serde_json::to_string(&j).unwrap();
        assert!(text.contains("\"mode\":\"program\""), "{text}");
        assert!(text.contains("\"clock\":\"cpu\""), "{text}");
    }
}
