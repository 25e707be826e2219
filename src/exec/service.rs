//! `falcon sandbox serve`: the sandbox as an HTTP service. It speaks
//! SandboxFusion's API where its client and verl's code reward use it
//! (`POST /run_code`, `POST /submit` for tests given in the request), and our
//! own `POST /falcon/run_tests`, which returns a whole per-test
//! [`ExecReport`](super::ExecReport); `GET /health` and `GET /metrics` (Prometheus text) need no
//! token. Each connection carries one request ([`super::http`]); at most
//! `concurrency` runs go on at once and `queue` more wait, beyond which the
//! answer is 503; a body over the limit is 413, a malformed request 400 with
//! the reason, and a handler that panics 500: no input stops the server.

use std::io::{BufReader, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::json;

use super::fusion::{self, RunCodeRequest, SubmitRequest};
use super::http::{self, ReadFailure};
use super::remote::RunTestsRequest;
use super::Sandbox;

/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Most bytes of a refused (413) body read and thrown away.
const DRAIN_BYTES: usize = 256 << 20;
/// Connections served at once beyond the queue and the handlers (health
/// checks, metrics, refusals); more are refused with 503 at once.
const SPARE_CONNECTIONS: usize = 64;

/// How the service listens and what it accepts.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// `127.0.0.1:8080` by default: reachable from this machine only.
    pub addr: String,
    /// A bearer token every request but `/health` and `/metrics` must carry.
    pub token: Option<String>,
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
    /// Runs handled at once (0 = twice the sandbox's workers).
    pub concurrency: usize,
    /// Runs waiting beyond those; more are answered 503.
    pub queue: usize,
    /// Largest `run_timeout` a `/run_code` request may ask for, seconds.
    pub max_run_timeout_s: f64,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            addr: "127.0.0.1:8080".into(),
            token: None,
            max_body_bytes: 16 << 20,
            concurrency: 0,
            queue: 1024,
            max_run_timeout_s: 300.0,
        }
    }
}

/// Errors starting the service.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("cannot listen on {addr}: {why}")]
    Bind { addr: String, why: String },
}

/// The endpoints, as `/metrics` labels them.
const KNOWN: [&str; 6] = [
    "/run_code",
    "/submit",
    "/falcon/run_tests",
    "/health",
    "/metrics",
    "/v1/ping",
];

/// Counters behind `/metrics`.
#[derive(Default)]
struct Metrics {
    queued: AtomicI64,
    in_flight: AtomicI64,
    runs: AtomicU64,
    run_seconds_micros: AtomicU64,
    /// (endpoint, HTTP status) → count, and outcome → count.
    responses: Mutex<std::collections::BTreeMap<(String, u16), u64>>,
    outcomes: Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Metrics {
    fn count_response(&self, endpoint: &str, status: u16) {
        // Only known names become labels: a client's made-up paths must not
        // grow the map.
        let endpoint = if KNOWN.contains(&endpoint) {
            endpoint
        } else {
            "other"
        };
        let mut m = self.responses.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((endpoint.to_owned(), status)).or_default() += 1;
    }

    fn count_run(&self, outcome: &str, seconds: f64) {
        self.runs.fetch_add(1, Ordering::Relaxed);
        self.run_seconds_micros
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
        let mut m = self.outcomes.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry(outcome.to_owned()).or_default() += 1;
    }
}

struct Shared {
    sandbox: Sandbox,
    opts: ServeOptions,
    metrics: Metrics,
    started: Instant,
    /// Runs in progress, against `opts.concurrency`.
    running: Mutex<usize>,
    freed: Condvar,
    connections: AtomicUsize,
}

/// A running service; [`Service::stop`] stops it.
pub struct Service {
    addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    accept: JoinHandle<()>,
}

impl Service {
    /// Binds and starts serving `sandbox` in background threads.
    pub fn start(sandbox: Sandbox, mut opts: ServeOptions) -> Result<Service, ServiceError> {
        if opts.concurrency == 0 {
            opts.concurrency = (sandbox.workers() * 2).max(2);
        }
        let bind = |why: String| ServiceError::Bind {
            addr: opts.addr.clone(),
            why,
        };
        let listener = TcpListener::bind(&opts.addr).map_err(|e| bind(e.to_string()))?;
        let addr = listener.local_addr().map_err(|e| bind(e.to_string()))?;
        let max_connections = opts.concurrency + opts.queue + SPARE_CONNECTIONS;
        let shared = Arc::new(Shared {
            sandbox,
            opts,
            metrics: Metrics::default(),
            started: Instant::now(),
            running: Mutex::new(0),
            freed: Condvar::new(),
            connections: AtomicUsize::new(0),
        });
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&stopping);
        let accept = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(mut conn) = conn else {
                    // Out of file descriptors or the like: wait, go on.
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                if shared.connections.load(Ordering::Relaxed) >= max_connections {
                    http::respond(
                        &mut conn,
                        503,
                        "application/json",
                        br#"{"detail": "the server is at capacity: try again"}"#,
                        true,
                    );
                    shared.metrics.count_response("other", 503);
                    continue;
                }
                shared.connections.fetch_add(1, Ordering::Relaxed);
                let sh = Arc::clone(&shared);
                std::thread::spawn(move || {
                    serve_connection(conn, &sh);
                    sh.connections.fetch_sub(1, Ordering::Relaxed);
                });
            }
        });
        Ok(Service {
            addr,
            stopping,
            accept,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until the process ends.
    pub fn wait(self) {
        let _ = self.accept.join();
    }

    /// Stops accepting and closes the port; runs in progress finish and
    /// are answered.
    pub fn stop(self) {
        self.stopping.store(true, Ordering::Relaxed);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        let _ = self.accept.join();
    }
}

/// One exchange on one connection.
fn serve_connection(conn: TcpStream, sh: &Shared) {
    let _ = conn.set_read_timeout(Some(READ_TIMEOUT));
    let _ = conn.set_write_timeout(Some(READ_TIMEOUT));
    let _ = conn.set_nodelay(true);
    let Ok(read_half) = conn.try_clone() else {
        return;
    };
    let mut conn = conn;
    let mut reader = BufReader::new(read_half);
    let req = match http::read_head(&mut reader) {
        Ok(r) => r,
        Err(ReadFailure(Some((status, why)))) => {
            return answer_json(&mut conn, sh, "other", status, json!({ "detail": why }));
        }
        Err(ReadFailure(None)) => return,
    };
    let path = req.path.as_str();
    match (req.method.as_str(), path) {
        ("GET", "/health" | "" | "/v1/ping") => {
            let body = json!({
                "status": "ok",
                "server": "falcon-rl",
                "version": env!("CARGO_PKG_VERSION"),
                "workers": sh.sandbox.workers(),
                "cuda": sh.sandbox.cuda_label(),
                "isolation": format!("{:?}", sh.sandbox.config().isolation).to_lowercase(),
            });
            answer_json(&mut conn, sh, path, 200, body);
        }
        ("GET", "/metrics") => {
            let text = metrics_text(sh);
            http::respond(
                &mut conn,
                200,
                "text/plain; version=0.0.4",
                text.as_bytes(),
                false,
            );
            sh.metrics.count_response(path, 200);
        }
        (method, "/run_code" | "/submit" | "/falcon/run_tests") => {
            if method != "POST" {
                return answer_json(&mut conn, sh, path, 405, json!({"detail": "use POST"}));
            }
            if !authorized(req.header("Authorization"), sh.opts.token.as_deref()) {
                return answer_json(
                    &mut conn,
                    sh,
                    path,
                    401,
                    json!({"detail": "missing or wrong bearer token (Authorization: Bearer ...)"}),
                );
            }
            let body = match http::read_body(&mut reader, &req, sh.opts.max_body_bytes) {
                Ok(b) => b,
                Err(ReadFailure(Some((status, why)))) => {
                    answer_json(&mut conn, sh, path, status, json!({ "detail": why }));
                    if status == 413 {
                        // Read what the client still sends (within reason),
                        // so that closing does not reset the connection
                        // before it has read the answer.
                        let n = req.content_length.unwrap_or(0).min(DRAIN_BYTES) as u64;
                        let _ = std::io::copy(&mut (&mut reader).take(n), &mut std::io::sink());
                    }
                    return;
                }
                Err(ReadFailure(None)) => return,
            };
            let Some(_slot) = Slot::take(sh) else {
                let body = json!({"detail": "the server is at capacity: try again"});
                sh.metrics.count_response(path, 503);
                http::respond(
                    &mut conn,
                    503,
                    "application/json",
                    body.to_string().as_bytes(),
                    true,
                );
                return;
            };
            let (status, body) =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| answer(path, &body, sh)))
                    .unwrap_or_else(|_| {
                        (
                            500,
                            json!({"detail": "internal error while handling the request"}),
                        )
                    });
            answer_json(&mut conn, sh, path, status, body);
        }
        _ => answer_json(
            &mut conn,
            sh,
            path,
            404,
            json!({"detail": format!("no endpoint {path}: try /run_code, /submit, /falcon/run_tests, /health, /metrics")}),
        ),
    }
}

/// A run slot: waits while `concurrency` runs are in progress; `None` when
/// `queue` others already wait.
struct Slot<'a>(&'a Shared);

impl<'a> Slot<'a> {
    fn take(sh: &'a Shared) -> Option<Slot<'a>> {
        let mut running = sh.running.lock().unwrap_or_else(|e| e.into_inner());
        if *running >= sh.opts.concurrency {
            if sh.metrics.queued.load(Ordering::Relaxed) >= sh.opts.queue as i64 {
                return None;
            }
            sh.metrics.queued.fetch_add(1, Ordering::Relaxed);
            while *running >= sh.opts.concurrency {
                running = sh.freed.wait(running).unwrap_or_else(|e| e.into_inner());
            }
            sh.metrics.queued.fetch_sub(1, Ordering::Relaxed);
        }
        *running += 1;
        sh.metrics.in_flight.fetch_add(1, Ordering::Relaxed);
        Some(Slot(sh))
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut running = self.0.running.lock().unwrap_or_else(|e| e.into_inner());
        *running -= 1;
        self.0.metrics.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.freed.notify_one();
    }
}

fn authorized(given: Option<&str>, token: Option<&str>) -> bool {
    let Some(token) = token else { return true };
    let given = given
        .and_then(|v| v.trim().strip_prefix("Bearer "))
        .unwrap_or("")
        .trim()
        .as_bytes();
    // Compared in time independent of where they differ.
    given.len() == token.len()
        && given
            .iter()
            .zip(token.as_bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

fn answer_json(
    conn: &mut TcpStream,
    sh: &Shared,
    path: &str,
    status: u16,
    body: serde_json::Value,
) {
    sh.metrics.count_response(path, status);
    http::respond(
        conn,
        status,
        "application/json",
        body.to_string().as_bytes(),
        status == 503,
    );
}

/// Runs a `/run_code` request (a submission is one too) and counts it;
/// `Err` is the 400 for a request that cannot run here.
fn run_fusion(
    req: RunCodeRequest,
    sh: &Shared,
) -> Result<fusion::RunCodeResponse, (u16, serde_json::Value)> {
    let script = fusion::script_from_request(req, sh.opts.max_run_timeout_s)
        .map_err(|e| (400, json!({ "detail": e })))?;
    let run = sh.sandbox.run_script(&script);
    if let Err(super::ScriptError::BadRequest(e)) = &run {
        return Err((400, json!({ "detail": e })));
    }
    let resp = fusion::response_from_run(run);
    let outcome = match &resp.run_result {
        Some(r) if r.status == "TimeLimitExceeded" => "TimeLimitExceeded",
        _ => resp.status.as_str(),
    };
    let secs = resp
        .run_result
        .as_ref()
        .and_then(|r| r.execution_time)
        .unwrap_or(0.0);
    sh.metrics.count_run(outcome, secs);
    Ok(resp)
}

/// The status and JSON body for a POST to `path`.
fn answer(path: &str, body: &[u8], sh: &Shared) -> (u16, serde_json::Value) {
    let bad = |what: &str, e: &dyn std::fmt::Display| {
        (400, json!({"detail": format!("malformed {what}: {e}")}))
    };
    match path {
        "/run_code" => {
            let req: RunCodeRequest = match serde_json::from_slice(body) {
                Ok(r) => r,
                Err(e) => return bad("RunCodeRequest", &e),
            };
            match run_fusion(req, sh) {
                Ok(resp) => (200, serde_json::to_value(&resp).unwrap_or_default()),
                Err(refusal) => refusal,
            }
        }
        "/submit" => {
            let req: SubmitRequest = match serde_json::from_slice(body) {
                Ok(r) => r,
                Err(e) => return bad("SubmitRequest", &e),
            };
            let test = match fusion::submit_test_code(&req) {
                Ok(t) => t,
                Err(e) => return (400, json!({"detail": e})),
            };
            let code = fusion::extract_code(&req.completion);
            let full = format!("{code}\n{test}\n");
            let run_timeout = req.config.run_timeout.unwrap_or(10.0);
            let resp = match run_fusion(RunCodeRequest::python(full.clone(), run_timeout), sh) {
                Ok(resp) => resp,
                Err(refusal) => return refusal,
            };
            let passed = resp.status == "Success";
            let extracted_type = if code == req.completion {
                "empty"
            } else {
                "fenced"
            };
            (
                200,
                json!({
                    "id": req.id,
                    "accepted": passed,
                    "extracted_code": code,
                    "full_code": full,
                    "test_code": test,
                    "tests": [{"passed": passed, "exec_info": resp, "test_info": null}],
                    "extracted_type": extracted_type,
                    "extra": null,
                }),
            )
        }
        "/falcon/run_tests" => {
            let req: RunTestsRequest = match serde_json::from_slice(body) {
                Ok(r) => r,
                Err(e) => return bad("run_tests request", &e),
            };
            if let Err(e) = req.task.validate() {
                return (
                    400,
                    json!({"detail": format!("task {:?}: {e}", req.task.id)}),
                );
            }
            let report = sh.sandbox.run(&req.task, &req.code);
            sh.metrics
                .count_run(&report.outcome_label(), report.seconds);
            (200, serde_json::to_value(&report).unwrap_or_default())
        }
        _ => (404, json!({"detail": "no such endpoint"})),
    }
}

fn metrics_text(sh: &Shared) -> String {
    let m = &sh.metrics;
    let up = sh.started.elapsed().as_secs_f64();
    let runs = m.runs.load(Ordering::Relaxed);
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line("# TYPE falcon_sandbox_queue_depth gauge".into());
    line(format!(
        "falcon_sandbox_queue_depth {}",
        m.queued.load(Ordering::Relaxed).max(0)
    ));
    line("# TYPE falcon_sandbox_in_flight gauge".into());
    line(format!(
        "falcon_sandbox_in_flight {}",
        m.in_flight.load(Ordering::Relaxed).max(0)
    ));
    line("# TYPE falcon_sandbox_workers gauge".into());
    line(format!("falcon_sandbox_workers {}", sh.sandbox.workers()));
    line("# TYPE falcon_sandbox_uptime_seconds gauge".into());
    line(format!("falcon_sandbox_uptime_seconds {up:.3}"));
    line("# TYPE falcon_sandbox_runs_total counter".into());
    line(format!("falcon_sandbox_runs_total {runs}"));
    line("# TYPE falcon_sandbox_runs_per_second gauge".into());
    line(format!(
        "falcon_sandbox_runs_per_second {:.3}",
        runs as f64 / up.max(1e-9)
    ));
    line("# TYPE falcon_sandbox_run_seconds_sum counter".into());
    line(format!(
        "falcon_sandbox_run_seconds_sum {:.6}",
        m.run_seconds_micros.load(Ordering::Relaxed) as f64 / 1e6
    ));
    line("# TYPE falcon_sandbox_outcomes_total counter".into());
    for (k, v) in m.outcomes.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        line(format!(
            "falcon_sandbox_outcomes_total{{outcome=\"{}\"}} {v}",
            k.replace(['"', '\\', '\n'], "_")
        ));
    }
    line("# TYPE falcon_sandbox_responses_total counter".into());
    for ((p, s), v) in m.responses.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        line(format!(
            "falcon_sandbox_responses_total{{endpoint=\"{p}\",code=\"{s}\"}} {v}"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_token_is_authorized() {
        assert!(authorized(None, None));
        assert!(authorized(Some("Bearer abc"), Some("abc")));
        assert!(authorized(Some("  Bearer abc "), Some("abc")));
        assert!(!authorized(Some("Bearer abd"), Some("abc")));
        assert!(!authorized(Some("Bearer ab"), Some("abc")));
        assert!(!authorized(Some("abc"), Some("abc")));
        assert!(!authorized(None, Some("abc")));
    }
}
