//! `falcon sandbox serve`: the sandbox as an HTTP service. It speaks
//! SandboxFusion's API where its client and verl's code reward use it
//! (`POST /run_code`, `POST /submit` for tests given in the request), and our
//! own `POST /falcon/run_tests`, which returns a whole per-test
//! [`ExecReport`]; `GET /health` and `GET /metrics` (Prometheus text) need no
//! token. Requests queue in a bounded queue in front of a fixed number of
//! handler threads; a full queue answers 503, a body over the limit 413, a
//! malformed one 400 with the reason, and a handler that panics 500: no
//! input stops the server.

use std::io::Read;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use serde_json::json;
use tiny_http::{Header, Method, Request, Response, Server};

use super::fusion::{self, RunCodeRequest, SubmitRequest};
use super::remote::RunTestsRequest;
use super::script::Script;
use super::Sandbox;

/// How the service listens and what it accepts.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// `127.0.0.1:8080` by default: reachable from this machine only.
    pub addr: String,
    /// A bearer token every request but `/health` and `/metrics` must carry.
    pub token: Option<String>,
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
    /// Requests handled at once.
    pub concurrency: usize,
    /// Requests waiting beyond those; more are answered 503.
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
}

/// A running service; dropping it does not stop it ([`Service::stop`] does).
pub struct Service {
    server: Arc<Server>,
    addr: SocketAddr,
    threads: Vec<JoinHandle<()>>,
}

impl Service {
    /// Binds and starts serving `sandbox` in background threads.
    pub fn start(sandbox: Sandbox, mut opts: ServeOptions) -> Result<Service, ServiceError> {
        if opts.concurrency == 0 {
            opts.concurrency = (sandbox.workers() * 2).max(2);
        }
        let server = Server::http(&opts.addr).map_err(|e| ServiceError::Bind {
            addr: opts.addr.clone(),
            why: e.to_string(),
        })?;
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| ServiceError::Bind {
                addr: opts.addr.clone(),
                why: "not an IP address".into(),
            })?;
        let server = Arc::new(server);
        let (tx, rx) = sync_channel::<Request>(opts.queue.max(1));
        let rx = Arc::new(Mutex::new(rx));
        let shared = Arc::new(Shared {
            sandbox,
            opts: opts.clone(),
            metrics: Metrics::default(),
            started: Instant::now(),
        });
        let mut threads = Vec::new();
        for _ in 0..opts.concurrency {
            let (rx, shared) = (Arc::clone(&rx), Arc::clone(&shared));
            threads.push(std::thread::spawn(move || handler_loop(&rx, &shared)));
        }
        let (srv, sh) = (Arc::clone(&server), Arc::clone(&shared));
        threads.push(std::thread::spawn(move || {
            // Cheap answers (health, metrics, refusals) come from here, so
            // they are never stuck behind a queue of runs.
            while let Ok(req) = srv.recv() {
                let Some(req) = triage(req, &sh) else {
                    continue;
                };
                sh.metrics.queued.fetch_add(1, Ordering::Relaxed);
                match tx.try_send(req) {
                    Ok(()) => {}
                    Err(TrySendError::Full(req)) | Err(TrySendError::Disconnected(req)) => {
                        sh.metrics.queued.fetch_sub(1, Ordering::Relaxed);
                        let path = endpoint(req.url());
                        respond(
                            req,
                            &sh,
                            &path,
                            503,
                            json!({"detail": "the server is at capacity: try again"}),
                        );
                    }
                }
            }
        }));
        Ok(Service {
            server,
            addr,
            threads,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until the process ends.
    pub fn wait(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }

    /// Stops accepting, lets the handlers finish what they hold, and returns.
    pub fn stop(self) {
        self.server.unblock();
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// The path without its query string.
fn endpoint(url: &str) -> String {
    url.split('?')
        .next()
        .unwrap_or("")
        .trim_end_matches('/')
        .to_owned()
}

/// Answers what needs no handler; returns the requests that do.
fn triage(req: Request, sh: &Shared) -> Option<Request> {
    let path = endpoint(req.url());
    match (req.method(), path.as_str()) {
        (Method::Get, "/health") | (Method::Get, "" | "/v1/ping") => {
            let body = json!({
                "status": "ok",
                "server": "falcon-rl",
                "version": env!("CARGO_PKG_VERSION"),
                "workers": sh.sandbox.workers(),
                "cuda": sh.sandbox.cuda_label(),
                "isolation": format!("{:?}", sh.sandbox.config().isolation).to_lowercase(),
            });
            respond(req, sh, &path, 200, body);
            None
        }
        (Method::Get, "/metrics") => {
            let text = metrics_text(sh);
            let _ = req.respond(
                Response::from_string(text)
                    .with_header(header("Content-Type", "text/plain; version=0.0.4")),
            );
            sh.metrics.count_response(&path, 200);
            None
        }
        (_, "/run_code" | "/submit" | "/falcon/run_tests") => {
            if *req.method() != Method::Post {
                respond(req, sh, &path, 405, json!({"detail": "use POST"}));
                return None;
            }
            if !authorized(&req, sh.opts.token.as_deref()) {
                respond(
                    req,
                    sh,
                    &path,
                    401,
                    json!({"detail": "missing or wrong bearer token (Authorization: Bearer ...)"}),
                );
                return None;
            }
            if req
                .body_length()
                .is_some_and(|n| n > sh.opts.max_body_bytes)
            {
                let max = sh.opts.max_body_bytes;
                respond(
                    req,
                    sh,
                    &path,
                    413,
                    json!({"detail": format!("request body over the limit of {max} bytes")}),
                );
                return None;
            }
            Some(req)
        }
        _ => {
            respond(
                req,
                sh,
                &path,
                404,
                json!({"detail": format!("no endpoint {path}: try /run_code, /submit, /falcon/run_tests, /health, /metrics")}),
            );
            None
        }
    }
}

fn authorized(req: &Request, token: Option<&str>) -> bool {
    let Some(token) = token else { return true };
    let given = req
        .headers()
        .iter()
        .find(|h| h.field.equiv("Authorization"))
        .map(|h| h.value.as_str().trim().to_owned())
        .unwrap_or_default();
    let given = given
        .strip_prefix("Bearer ")
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

fn handler_loop(rx: &Mutex<Receiver<Request>>, sh: &Shared) {
    loop {
        let req = {
            let rx = rx.lock().unwrap_or_else(|e| e.into_inner());
            match rx.recv() {
                Ok(r) => r,
                Err(_) => return,
            }
        };
        sh.metrics.queued.fetch_sub(1, Ordering::Relaxed);
        sh.metrics.in_flight.fetch_add(1, Ordering::Relaxed);
        handle(req, sh);
        sh.metrics.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

fn handle(mut req: Request, sh: &Shared) {
    let path = endpoint(req.url());
    let mut body = Vec::new();
    let limit = sh.opts.max_body_bytes;
    let read = req
        .as_reader()
        .take(limit as u64 + 1)
        .read_to_end(&mut body);
    if let Err(e) = read {
        respond(
            req,
            sh,
            &path,
            400,
            json!({"detail": format!("reading the body: {e}")}),
        );
        return;
    }
    if body.len() > limit {
        respond(
            req,
            sh,
            &path,
            413,
            json!({"detail": format!("request body over the limit of {limit} bytes")}),
        );
        return;
    }
    let answer =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| answer(&path, &body, sh)))
            .unwrap_or_else(|_| {
                (
                    500,
                    json!({"detail": "internal error while handling the request"}),
                )
            });
    respond(req, sh, &path, answer.0, answer.1);
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
            let script = match fusion::script_from_request(req, sh.opts.max_run_timeout_s) {
                Ok(s) => s,
                Err(e) => return (400, json!({"detail": e})),
            };
            let run = sh.sandbox.run_script(&script);
            if let Err(super::ScriptError::BadRequest(e)) = &run {
                return (400, json!({"detail": e}));
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
            (200, serde_json::to_value(&resp).unwrap_or_default())
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
            let timeout = req.config.run_timeout.unwrap_or(10.0);
            if !(timeout > 0.0 && timeout <= sh.opts.max_run_timeout_s) {
                return (
                    400,
                    json!({"detail": format!("run_timeout = {timeout} must be in (0, {}]", sh.opts.max_run_timeout_s)}),
                );
            }
            let run = sh.sandbox.run_script(&Script {
                code: full.clone(),
                timeout_s: Some(timeout),
                clock: Some(crate::config::ExecClock::Wall),
                ..Script::default()
            });
            let resp = fusion::response_from_run(run);
            let passed = resp.status == "Success";
            sh.metrics.count_run(&resp.status, 0.0);
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

fn header(k: &str, v: &str) -> Header {
    Header::from_bytes(k.as_bytes(), v.as_bytes()).expect("valid header")
}

fn respond(req: Request, sh: &Shared, path: &str, status: u16, body: serde_json::Value) {
    sh.metrics.count_response(path, status);
    let mut resp = Response::from_string(body.to_string())
        .with_status_code(status)
        .with_header(header("Content-Type", "application/json"));
    if status == 503 {
        resp = resp.with_header(header("Retry-After", "1"));
    }
    // A client that went away is not the server's problem.
    let _ = req.respond(resp);
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
    fn endpoints_ignore_query_and_trailing_slash() {
        assert_eq!(endpoint("/run_code?x=1"), "/run_code");
        assert_eq!(endpoint("/health/"), "/health");
    }
}
