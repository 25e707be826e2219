//! The remote backend: samples run on sandbox services over HTTP (`falcon
//! sandbox serve`, or SandboxFusion servers through `/run_code`, one call
//! per test). Requests go to the least busy server within its concurrency,
//! and a request that got no answer is tried again after a backoff on the
//! next server. A sample's result is taken from exactly one answer; a sample
//! no server answered is [`ExecReport::no_signal`], never a failure.

use std::time::{Duration, Instant};

use super::fusion::{self, RunCodeRequest, RunCodeResponse};
use super::outcome::ExecReport;
use super::script::{Script, ScriptError, ScriptRun};
use super::servers::{excerpt, Failure, RemoteStats, Servers};
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
pub(crate) struct Remote {
    servers: Servers,
    api: RemoteApi,
    exec: ExecConfig,
    /// Where the servers run numba kernels (`/health`), `remote` if unknown.
    pub cuda: &'static str,
}

impl Remote {
    /// Connects to `cfg.remote.urls` and checks that at least one answers.
    pub fn new(cfg: &ExecConfig) -> Result<Remote, String> {
        let r = &cfg.remote;
        let mut remote = Remote {
            servers: Servers::new(&r.urls, r.concurrency, r.retries, &r.token_env),
            api: r.api,
            exec: cfg.clone(),
            cuda: "remote",
        };
        let mut down = Vec::new();
        let mut cuda = None;
        let n = remote.servers.urls().len();
        for i in 0..n {
            match remote.probe(i) {
                Ok(c) => {
                    cuda = cuda.or(c);
                }
                Err(e) => down.push(format!("{}: {e}", remote.servers.urls()[i])),
            }
        }
        if down.len() == n {
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
        self.servers.capacity()
    }

    pub fn stats(&self) -> &RemoteStats {
        &self.servers.stats
    }

    /// Checks server `i`: our `/health` (which says where kernels run), or
    /// a one-line program through SandboxFusion's `/run_code`.
    fn probe(&self, i: usize) -> Result<Option<String>, String> {
        match self.api {
            RemoteApi::Falcon => {
                let text = self
                    .servers
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
                    .servers
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
        match self
            .servers
            .post("/falcon/run_tests", &body, self.deadline(task.tests.len()))
        {
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
                ..RunCodeRequest::python(
                    program,
                    task.time_limit_ms
                        .map_or(self.exec.timeout_s, |ms| ms as f64 / 1000.0),
                )
            };
            let resp = self
                .servers
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
            .servers
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

#[cfg(test)]
mod tests {
    use super::*;

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
