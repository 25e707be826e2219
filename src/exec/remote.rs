//! The remote backend: samples run on sandbox services over HTTP (`falcon
//! sandbox serve`, or SandboxFusion servers through `/run_code`, one call
//! per test). Requests go to the least busy server within its concurrency,
//! and a request that got no answer is tried again after a backoff on the
//! next server. A sample's result is taken from exactly one answer; a sample
//! no server answered is [`ExecReport::no_signal`], never a failure.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::fusion::{self, RunCodeRequest, RunCodeResponse};
use super::outcome::ExecReport;
use super::script::{Script, ScriptError, ScriptRun};
use crate::config::{ExecConfig, RemoteApi};
use crate::task::Task;

/// The body of `POST /falcon/run_tests`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct RunTestsRequest {
    pub task: Task,
    pub code: String,
}

/// How long reaching a server at start may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// First backoff; doubled each try, with jitter, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Why a request got no usable answer.
enum Failure {
    /// No answer, or the server said it could not run it now: try again.
    Retry(String),
    /// The server refused the request itself: trying again cannot help.
    Refused(String),
}

impl Failure {
    fn into_message(self) -> String {
        match self {
            Failure::Retry(e) | Failure::Refused(e) => e,
        }
    }
}

/// Counters of the remote backend, for the logs and the metrics.
#[derive(Debug, Default)]
pub struct RemoteStats {
    pub requests: AtomicU64,
    pub retries: AtomicU64,
    pub unanswered: AtomicU64,
}

pub(crate) struct Remote {
    urls: Vec<String>,
    api: RemoteApi,
    concurrency: usize,
    retries: u32,
    exec: ExecConfig,
    token: Option<String>,
    agent: ureq::Agent,
    busy: Mutex<Vec<usize>>,
    freed: Condvar,
    next: AtomicUsize,
    /// Where the servers run numba kernels (`/health`), `remote` if unknown.
    pub cuda: &'static str,
    pub stats: RemoteStats,
}

impl Remote {
    /// Connects to `cfg.remote.urls` and checks that at least one answers.
    pub fn new(cfg: &ExecConfig) -> Result<Remote, String> {
        let r = &cfg.remote;
        let token = std::env::var(&r.token_env)
            .ok()
            .filter(|t| !t.trim().is_empty());
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut remote = Remote {
            urls: r
                .urls
                .iter()
                .map(|u| u.trim_end_matches('/').to_owned())
                .collect(),
            api: r.api,
            concurrency: r.concurrency.max(1),
            retries: r.retries,
            exec: cfg.clone(),
            token,
            agent,
            busy: Mutex::new(vec![0; r.urls.len()]),
            freed: Condvar::new(),
            next: AtomicUsize::new(0),
            cuda: "remote",
            stats: RemoteStats::default(),
        };
        let mut down = Vec::new();
        let mut cuda = None;
        for i in 0..remote.urls.len() {
            match remote.probe(i) {
                Ok(c) => {
                    cuda = cuda.or(c);
                }
                Err(e) => down.push(format!("{}: {e}", remote.urls[i])),
            }
        }
        if down.len() == remote.urls.len() {
            return Err(format!("no sandbox service answered: {}", down.join("; ")));
        }
        for d in &down {
            eprintln!("warning: sandbox service not answering (requests will fail over): {d}");
        }
        remote.cuda = match cuda.as_deref() {
            Some("device") => "device",
            Some("simulator") => "simulator",
            _ => "remote",
        };
        Ok(remote)
    }

    /// Requests the servers take at once, all together.
    pub fn capacity(&self) -> usize {
        self.urls.len() * self.concurrency
    }

    /// Checks server `i`: our `/health` (which says where kernels run), or
    /// a one-line program through SandboxFusion's `/run_code`.
    fn probe(&self, i: usize) -> Result<Option<String>, String> {
        match self.api {
            RemoteApi::Falcon => {
                let text = self
                    .call(i, "GET", "/health", None, PROBE_TIMEOUT)
                    .map_err(Failure::into_message)?;
                let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
                    format!("/health is not JSON ({e}): is this `falcon sandbox serve`?")
                })?;
                Ok(v["cuda"].as_str().map(str::to_owned))
            }
            RemoteApi::SandboxFusion => {
                let req = probe_request();
                let text = self
                    .call(i, "POST", "/run_code", Some(&req), PROBE_TIMEOUT)
                    .map_err(Failure::into_message)?;
                let resp: RunCodeResponse = serde_json::from_str(&text)
                    .map_err(|e| format!("/run_code answer is not a RunCodeResponse: {e}"))?;
                match resp.run_result.and_then(|r| r.stdout) {
                    Some(out) if out.trim() == "ok" => Ok(None),
                    _ => Err(format!(
                        "/run_code did not run `print('ok')`: {}",
                        resp.message
                    )),
                }
            }
        }
    }

    /// One HTTP exchange with server `i`.
    fn call(
        &self,
        i: usize,
        method: &str,
        path: &str,
        body: Option<&str>,
        deadline: Duration,
    ) -> Result<String, Failure> {
        let url = format!("{}{path}", self.urls[i]);
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let result = if method == "GET" {
            let mut req = self.agent.get(&url);
            if let Some(t) = &self.token {
                req = req.header("Authorization", &format!("Bearer {t}"));
            }
            req.config().timeout_global(Some(deadline)).build().call()
        } else {
            let mut req = self
                .agent
                .post(&url)
                .header("Content-Type", "application/json");
            if let Some(t) = &self.token {
                req = req.header("Authorization", &format!("Bearer {t}"));
            }
            req.config()
                .timeout_global(Some(deadline))
                .build()
                .send(body.unwrap_or(""))
        };
        let mut resp = result.map_err(|e| Failure::Retry(format!("{method} {url}: {e}")))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(256 << 20)
            .read_to_string()
            .map_err(|e| {
                Failure::Retry(format!(
                    "{method} {url}: HTTP {status}, reading the body: {e}"
                ))
            })?;
        match status {
            200..=299 => Ok(text),
            // Busy, overloaded, restarting or behind a gateway that timed out.
            408 | 429 | 500..=599 => Err(Failure::Retry(format!(
                "{method} {url}: HTTP {status}: {}",
                excerpt(&text)
            ))),
            _ => Err(Failure::Refused(format!(
                "{method} {url}: HTTP {status}: {}",
                excerpt(&text)
            ))),
        }
    }

    /// Takes a request slot on the least busy server, preferring one other
    /// than `avoid` (the one that just failed).
    fn acquire(&self, avoid: Option<usize>) -> usize {
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let n = busy.len();
            let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
            let pick = (0..n)
                .map(|k| (start + k) % n)
                .filter(|&i| busy[i] < self.concurrency)
                .min_by_key(|&i| (Some(i) == avoid && n > 1, busy[i]));
            if let Some(i) = pick {
                busy[i] += 1;
                return i;
            }
            busy = self.freed.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn release(&self, i: usize) {
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        busy[i] -= 1;
        self.freed.notify_one();
    }

    /// POSTs `body` to `path` until one server answers, trying again on
    /// the next server after a backoff; `Err` carries every failure.
    fn post(&self, path: &str, body: &str, deadline: Duration) -> Result<String, String> {
        let mut errors = Vec::new();
        let mut avoid = None;
        for attempt in 0..=self.retries {
            if attempt > 0 {
                self.stats.retries.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(backoff(attempt));
            }
            let i = self.acquire(avoid);
            let r = self.call(i, "POST", path, Some(body), deadline);
            self.release(i);
            match r {
                Ok(text) => return Ok(text),
                Err(Failure::Refused(e)) => {
                    errors.push(e);
                    break;
                }
                Err(Failure::Retry(e)) => {
                    errors.push(e);
                    avoid = Some(i);
                }
            }
        }
        self.stats.unanswered.fetch_add(1, Ordering::Relaxed);
        Err(errors.join("; then "))
    }

    /// The deadline of one request running `n_tests` tests.
    fn deadline(&self, n_tests: usize) -> Duration {
        if self.exec.remote.timeout_s > 0.0 {
            return Duration::from_secs_f64(self.exec.remote.timeout_s);
        }
        Duration::from_secs_f64((self.exec.wall_limit_s() + 2.0) * n_tests.max(1) as f64 + 30.0)
    }

    /// Runs every test of `task` against `code` on a server.
    pub fn run(&self, task: &Task, code: &str) -> ExecReport {
        let t0 = Instant::now();
        let mut report = match self.api {
            RemoteApi::Falcon => self.run_falcon(task, code),
            RemoteApi::SandboxFusion => self.run_per_test(task, code),
        };
        report.seconds = t0.elapsed().as_secs_f64();
        report
    }

    fn run_falcon(&self, task: &Task, code: &str) -> ExecReport {
        let body = match serde_json::to_string(&RunTestsRequest {
            task: task.clone(),
            code: code.to_owned(),
        }) {
            Ok(b) => b,
            Err(e) => return ExecReport::no_signal(format!("remote sandbox: cannot encode: {e}")),
        };
        match self.post("/falcon/run_tests", &body, self.deadline(task.tests.len())) {
            Ok(text) => match serde_json::from_str::<ExecReport>(&text) {
                Ok(r) if r.no_signal.is_some() || r.tests.len() == task.tests.len() => r,
                Ok(r) => ExecReport::no_signal(format!(
                    "remote sandbox: {} results for {} tests",
                    r.tests.len(),
                    task.tests.len()
                )),
                Err(e) => ExecReport::no_signal(format!(
                    "remote sandbox: answer is not an ExecReport ({e}): {}",
                    excerpt(&text)
                )),
            },
            Err(e) => ExecReport::no_signal(format!("remote sandbox: {e}")),
        }
    }

    /// SandboxFusion: each test is its own program and its own call.
    fn run_per_test(&self, task: &Task, code: &str) -> ExecReport {
        let code_lines = code.lines().count();
        let mut tests = Vec::with_capacity(task.tests.len());
        let mut output = String::new();
        for i in 0..task.tests.len() {
            let (program, first) = fusion::test_program(task, code, i);
            let req = RunCodeRequest {
                memory_limit_mb: Some(self.exec.memory_mb),
                ..RunCodeRequest::python(program, self.exec.timeout_s)
            };
            let resp = self
                .post(
                    "/run_code",
                    &serde_json::to_string(&req).unwrap_or_default(),
                    self.deadline(1),
                )
                .and_then(|text| {
                    serde_json::from_str::<RunCodeResponse>(&text).map_err(|e| {
                        format!("answer is not a RunCodeResponse ({e}): {}", excerpt(&text))
                    })
                });
            let resp = match resp {
                Ok(r) => r,
                Err(e) => return ExecReport::no_signal(format!("remote sandbox, test {i}: {e}")),
            };
            let Some(t) = fusion::test_result_from_response(&resp, i, first, code_lines) else {
                return ExecReport::no_signal(format!(
                    "remote sandbox, test {i}: the server could not run it: {} {}",
                    resp.status, resp.message
                ));
            };
            if let Some(r) = &resp.run_result {
                output.push_str(r.stdout.as_deref().unwrap_or(""));
                output.push_str(r.stderr.as_deref().unwrap_or(""));
            }
            tests.push(t);
        }
        let tail = super::protocol::tail(&output, self.exec.output_bytes);
        ExecReport::from_tests(tests, tail, 0.0)
    }

    /// Runs a whole program on a server through `/run_code`.
    pub fn run_script(&self, s: &Script) -> Result<ScriptRun, ScriptError> {
        let timeout = s.timeout_s.unwrap_or(self.exec.timeout_s);
        let req = RunCodeRequest {
            stdin: Some(s.stdin.clone()),
            files: s
                .files
                .iter()
                .map(|(k, v)| (k.clone(), Some(v.clone())))
                .collect(),
            fetch_files: s.fetch_files.clone(),
            memory_limit_mb: s.memory_mb,
            ..RunCodeRequest::python(s.code.clone(), timeout)
        };
        let body = serde_json::to_string(&req).map_err(|e| ScriptError::Sandbox(e.to_string()))?;
        let deadline = Duration::from_secs_f64(3.0 * timeout + 40.0);
        let text = self
            .post("/run_code", &body, deadline)
            .map_err(|e| ScriptError::Sandbox(format!("remote sandbox: {e}")))?;
        let resp: RunCodeResponse = serde_json::from_str(&text).map_err(|e| {
            ScriptError::Sandbox(format!("remote sandbox: not a RunCodeResponse ({e})"))
        })?;
        fusion::run_from_response(resp)
            .map_err(|e| ScriptError::Sandbox(format!("remote sandbox: {e}")))
    }
}

/// `print('ok')` as a `/run_code` request.
fn probe_request() -> String {
    serde_json::to_string(&RunCodeRequest::python("print('ok')".into(), 10.0)).unwrap_or_default()
}

/// The wait before try `attempt` (1-based): exponential with ±25% jitter.
fn backoff(attempt: u32) -> Duration {
    let base = FIRST_BACKOFF
        .saturating_mul(1 << attempt.min(10).saturating_sub(1))
        .min(MAX_BACKOFF);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let jitter = 0.75 + 0.5 * (nanos % 1000) as f64 / 1000.0;
    base.mul_f64(jitter)
}

/// The first characters of a body, on one line.
fn excerpt(body: &str) -> String {
    crate::text::body_excerpt(body, 300)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let b1 = backoff(1);
        let b3 = backoff(3);
        assert!(
            b1 >= Duration::from_millis(150) && b1 <= Duration::from_millis(250),
            "{b1:?}"
        );
        assert!(
            b3 >= Duration::from_millis(600) && b3 <= Duration::from_millis(1000),
            "{b3:?}"
        );
        assert!(backoff(30) <= MAX_BACKOFF.mul_f64(1.25));
    }

    #[test]
    fn a_remote_with_no_server_answering_says_which_and_why() {
        // A port nobody listens on: bind, read the port, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cfg = ExecConfig::default();
        cfg.remote.urls = vec![format!("http://127.0.0.1:{port}")];
        let err = Remote::new(&cfg).err().expect("nothing listens there");
        assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    }
}
