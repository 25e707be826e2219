//! The vLLM engine behind the [`Generator`] seam (docs/engines.md): a
//! managed server (vLLM's OpenAI-compatible server as falcon's child), a
//! client for servers at given URLs, and the engine that keeps a server's
//! weights on the policy's and generates from it.
//!
//! Prompts are encoded here with the policy's own tokenizer and sent as
//! token ids to `/v1/completions`, so the trainer scores exactly the ids the
//! server generated from, and each completion comes back with its token ids
//! and the log-prob of each sampled token under the model's own
//! distribution (vLLM's `raw_logprobs`, before temperature and top-k/p: the
//! log-probs the trainer recomputes, so the two can be compared).
//!
//! A managed server runs in its own process group with a parent-death
//! signal, so it goes when falcon goes, however falcon goes (error, Ctrl-C,
//! SIGKILL). Its log is a file the caller names; every start failure quotes
//! it.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Value};

use super::generate::encode_prompts;
use super::TextTokenizer;
use super::{Completion, Dtype, GenerationParams, Generator, ModelError, Policy};
use crate::config::VllmConfig;

/// How much of a response body or a log an error message quotes.
const EXCERPT_CHARS: usize = 600;
/// vLLM accepts only these `--max-lora-rank` values.
const VLLM_LORA_RANKS: [usize; 9] = [1, 8, 16, 32, 64, 128, 256, 320, 512];
/// The process-group leader of a managed server: runs the server, and on
/// SIGTERM (falcon's stop, or falcon's death through the parent-death
/// signal) passes it on, waits up to 15 s, then SIGKILLs the group.
const GROUP_GUARD: &str = r#"trap 'kill -TERM "$pid" 2>/dev/null; i=0; while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 150 ]; do sleep 0.1; i=$((i+1)); done; kill -KILL 0' TERM INT
"$@" &
pid=$!
wait "$pid"
"#;
/// The name the managed server serves the base model under.
const BASE_NAME: &str = "base";

/// Where `scripts/setup-vllm` puts its virtualenv's Python.
pub fn default_python() -> PathBuf {
    crate::config::cache_dir().join("venv-vllm-0.32.0/bin/python")
}

/// How to start a managed server.
#[derive(Debug, Clone)]
pub struct ServerSpec {
    pub python: PathBuf,
    /// An HF model directory (`model::export`).
    pub model_dir: PathBuf,
    pub dtype: Dtype,
    /// 0: a free port.
    pub port: u16,
    pub max_model_len: usize,
    /// LoRA adapters loaded at run time, up to this rank.
    pub max_lora_rank: Option<usize>,
    /// Adapters one batch may mix (vLLM's `--max-loras`).
    pub max_loras: usize,
    /// `Some(GiB)`: a CPU server with this much KV cache; `None`: CUDA.
    pub cpu_kv_cache_gib: Option<f64>,
    pub gpu_memory_utilization: f64,
    pub extra_args: Vec<String>,
    /// The server's stdout and stderr go here (appended).
    pub log: PathBuf,
    pub start_timeout: Duration,
}

impl ServerSpec {
    /// The spec `[rollout.vllm]` implies for serving `model_dir` like `policy`.
    pub fn from_config(
        cfg: &VllmConfig,
        policy: &Policy,
        adapters: usize,
        model_dir: &Path,
        log: &Path,
    ) -> Self {
        let python = if cfg.python.is_empty() {
            default_python()
        } else {
            PathBuf::from(&cfg.python)
        };
        ServerSpec {
            python,
            model_dir: model_dir.to_path_buf(),
            dtype: policy.dtype,
            port: cfg.port,
            max_model_len: cfg.max_model_len,
            max_lora_rank: policy.lora.as_ref().map(|l| l.rank),
            max_loras: adapters.max(1),
            cpu_kv_cache_gib: (!policy.device().is_cuda()).then_some(cfg.cpu_kv_cache_gib),
            gpu_memory_utilization: cfg.gpu_memory_utilization,
            extra_args: cfg.extra_args.clone(),
            log: log.to_path_buf(),
            start_timeout: Duration::from_secs(cfg.start_timeout_s),
        }
    }

    /// The server's command line after the interpreter.
    fn args(&self, port: u16) -> Vec<String> {
        let mut a: Vec<String> = [
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            &self.model_dir.display().to_string(),
            "--served-model-name",
            BASE_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--dtype",
            self.dtype.hf_name(),
            "--max-model-len",
            &self.max_model_len.to_string(),
            // Log-probs of the model's own distribution (before temperature
            // and top-k/p), which is what the trainer computes: the check
            // then compares like with like.
            "--logprobs-mode",
            "raw_logprobs",
            "--disable-uvicorn-access-log",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(r) = self.max_lora_rank {
            let r = VLLM_LORA_RANKS
                .iter()
                .copied()
                .find(|&k| k >= r)
                .unwrap_or(r);
            for x in [
                "--enable-lora".to_owned(),
                "--max-loras".to_owned(),
                self.max_loras.to_string(),
                "--max-lora-rank".to_owned(),
                r.to_string(),
            ] {
                a.push(x);
            }
        }
        if self.cpu_kv_cache_gib.is_none() {
            a.push("--gpu-memory-utilization".into());
            a.push(self.gpu_memory_utilization.to_string());
        }
        a.extend(self.extra_args.iter().cloned());
        a
    }
}

/// A vLLM server started by falcon. Dropping it stops it.
#[derive(Debug)]
pub struct VllmServer {
    child: Child,
    url: String,
    log: PathBuf,
    /// Where this start's output begins in the log.
    log_start: u64,
}

impl VllmServer {
    /// Start the server and wait until `/health` answers. Fails, quoting the
    /// end of the log, as soon as the server exits, or at the start timeout;
    /// `progress` hears how long it has waited, every 15 s.
    pub fn start(spec: &ServerSpec, progress: &mut dyn FnMut(&str)) -> Result<Self, ModelError> {
        if !spec.python.is_file() {
            return Err(ModelError::Invalid(format!(
                "vLLM's Python {} does not exist: run scripts/setup-vllm (or set [rollout.vllm] python)",
                spec.python.display()
            )));
        }
        if !spec.model_dir.join("config.json").is_file() {
            return Err(ModelError::Invalid(format!(
                "{}: not an HF model directory (no config.json) for vLLM to serve",
                spec.model_dir.display()
            )));
        }
        let port = if spec.port == 0 {
            free_port()?
        } else {
            spec.port
        };
        if let Some(dir) = spec.log.parent() {
            std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log)
            .map_err(|e| ModelError::io(&spec.log, e))?;
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let err_log = log.try_clone().map_err(|e| ModelError::io(&spec.log, e))?;
        // A small shell leads the server's process group: vLLM's own
        // SIGTERM shutdown can hang (seen here: the API server outlived
        // falcon by over a minute), so the shell gives it 15 s and then
        // SIGKILLs the whole group, engine and workers included.
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(GROUP_GUARD)
            .arg("falcon-vllm")
            .arg(&spec.python)
            .args(spec.args(port))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err_log)
            .env("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
            // `/collective_rpc` and `/reset_prefix_cache`: full-weight sync.
            .env("VLLM_SERVER_DEV_MODE", "1")
            .env("VLLM_NO_USAGE_STATS", "1")
            .env("DO_NOT_TRACK", "1")
            .env("HF_HUB_OFFLINE", "1");
        if let Some(gib) = spec.cpu_kv_cache_gib {
            // Else vLLM reserves 92% of the machine for its KV cache.
            cmd.env("VLLM_CPU_KVCACHE_SPACE", format!("{}", gib.ceil().max(1.0)));
        }
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: between fork and exec only async-signal-safe calls
        // (setpgid, prctl, getppid, _exit).
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(move || {
                // Its own group, so stopping it stops vLLM's engine and
                // worker processes too.
                libc::setpgid(0, 0);
                // SIGTERM to the guard when falcon dies, however it dies.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| ModelError::Invalid(format!("starting {}: {e}", spec.python.display())))?;
        let mut server = VllmServer {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log: spec.log.clone(),
            log_start,
        };
        let t0 = Instant::now();
        let mut told = 0;
        let agent = agent(Duration::from_secs(5));
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(server.failed(&format!("exited ({status}) while starting")));
            }
            if let Ok(r) = agent.get(format!("{}/health", server.url)).call() {
                if r.status().as_u16() == 200 {
                    return Ok(server);
                }
            }
            let waited = t0.elapsed();
            if waited >= spec.start_timeout {
                let e = server.failed(&format!(
                    "did not answer /health within {} s ([rollout.vllm] start_timeout_s)",
                    spec.start_timeout.as_secs()
                ));
                server.stop();
                return Err(e);
            }
            if waited.as_secs() / 15 > told {
                told = waited.as_secs() / 15;
                progress(&format!(
                    "waiting for vLLM at {} ({} s; log {})",
                    server.url,
                    waited.as_secs(),
                    server.log.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The server's process id (its process group's too).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the server process still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The error for a server that failed: `what`, the log's path and its
    /// last lines since this start.
    fn failed(&self, what: &str) -> ModelError {
        ModelError::Invalid(format!(
            "vLLM server {what}; its log is {}; it ends with: {}",
            self.log.display(),
            log_tail(&self.log, self.log_start)
        ))
    }

    /// SIGTERM to the server's guard (which passes it on and SIGKILLs the
    /// group after 15 s), SIGKILL to the group after 20 s; waits.
    pub fn stop(&mut self) {
        let pgid = self.child.id() as libc::pid_t;
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pgid, libc::SIGTERM) };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(20) {
            if !matches!(self.child.try_wait(), Ok(None)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // Whatever of the group is left (the engine core outliving its
        // parent, or a server that ignored SIGTERM).
        unsafe { libc::killpg(pgid, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for VllmServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> Result<u16, ModelError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| ModelError::Invalid(format!("finding a free port for vLLM: {e}")))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| ModelError::Invalid(format!("finding a free port for vLLM: {e}")))
}

/// The last lines of `path` written after byte `since`: error lines first
/// when there are any (a Python traceback ends with the one that matters).
fn log_tail(path: &Path, since: u64) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.seek(SeekFrom::Start(since));
        let _ = f.take(1 << 20).read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let errors: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.contains("Error") || l.contains("ERROR"))
        .collect();
    let pick = if errors.is_empty() { &lines } else { &errors };
    let tail = pick[pick.len().saturating_sub(3)..].join(" | ");
    if tail.is_empty() {
        "(nothing)".into()
    } else {
        crate::text::body_excerpt(&tail, EXCERPT_CHARS)
    }
}

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .build()
        .into()
}

/// A client for one or more vLLM servers (requests spread over them).
#[derive(Debug)]
pub struct VllmClient {
    urls: Vec<String>,
    agent: ureq::Agent,
    parallel: usize,
    next: AtomicUsize,
    /// Whether requests carry their seed ([`VllmClient::seeded`]).
    seeded: bool,
}

impl Clone for VllmClient {
    fn clone(&self) -> Self {
        VllmClient {
            urls: self.urls.clone(),
            agent: self.agent.clone(),
            parallel: self.parallel,
            next: AtomicUsize::new(self.next.load(Ordering::Relaxed)),
            seeded: self.seeded,
        }
    }
}

/// A generation running in the background ([`VllmEngine::spawn_generate`]).
pub struct Pending {
    handle: std::thread::JoinHandle<Result<Vec<Completion>, ModelError>>,
}

impl Pending {
    /// Wait for the completions.
    pub fn wait(self) -> Result<Vec<Completion>, ModelError> {
        self.handle.join().unwrap_or_else(|_| {
            Err(ModelError::Invalid(
                "the background generation panicked".into(),
            ))
        })
    }
}

impl VllmClient {
    pub fn new(urls: &[String], request_timeout: Duration, parallel: usize) -> Self {
        VllmClient {
            urls: urls
                .iter()
                .map(|u| {
                    let u = u.trim_end_matches('/');
                    u.strip_suffix("/v1").unwrap_or(u).to_owned()
                })
                .collect(),
            agent: agent(request_timeout),
            parallel: parallel.max(1),
            next: AtomicUsize::new(0),
            seeded: true,
        }
    }

    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// With `false`, requests go without their seed (see
    /// `[rollout.vllm] seed_requests`).
    pub fn seeded(mut self, on: bool) -> Self {
        self.seeded = on;
        self
    }

    /// POST `body` to `path` on `url`; the JSON answer, or an error quoting it.
    fn post(&self, url: &str, path: &str, body: &Value) -> Result<Value, ModelError> {
        let at = format!("{url}{path}");
        let fail = |what: String| ModelError::Invalid(format!("POST {at}: {what}"));
        let mut resp = self
            .agent
            .post(&at)
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .map_err(|e| fail(e.to_string()))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| fail(format!("HTTP {status}, reading the body: {e}")))?;
        if !(200..300).contains(&status) {
            return Err(fail(format!(
                "HTTP {status}: {}",
                crate::text::body_excerpt(&text, EXCERPT_CHARS)
            )));
        }
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// The model names each server serves (`GET /v1/models`), first server's.
    pub fn models(&self) -> Result<Vec<String>, ModelError> {
        let url = format!("{}/v1/models", self.urls[0]);
        let mut resp = self
            .agent
            .get(&url)
            .call()
            .map_err(|e| ModelError::Invalid(format!("GET {url}: {e}")))?;
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| ModelError::Invalid(format!("GET {url}: {e}")))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            ModelError::Invalid(format!(
                "GET {url}: not JSON ({e}): {}",
                crate::text::body_excerpt(&text, EXCERPT_CHARS)
            ))
        })?;
        Ok(v["data"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|m| m["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Load the PEFT adapter at `dir` as `name` on every server.
    pub fn load_adapter(&self, name: &str, dir: &Path) -> Result<(), ModelError> {
        let body = json!({"lora_name": name, "lora_path": dir.display().to_string()});
        for u in &self.urls {
            self.post(u, "/v1/load_lora_adapter", &body)?;
        }
        Ok(())
    }

    /// Unload adapter `name` from every server.
    pub fn unload_adapter(&self, name: &str) -> Result<(), ModelError> {
        let body = json!({"lora_name": name});
        for u in &self.urls {
            self.post(u, "/v1/unload_lora_adapter", &body)?;
        }
        Ok(())
    }

    /// Reload full weights from the HF directory `dir` on every server, then
    /// drop its prefix cache, whose blocks were computed with the old ones
    /// (vLLM does not drop them itself). Needs `VLLM_SERVER_DEV_MODE=1`.
    pub fn reload_weights(&self, dir: &Path) -> Result<(), ModelError> {
        let body = json!({"method": "reload_weights",
                          "kwargs": {"weights_path": dir.display().to_string()}});
        for u in &self.urls {
            self.post(u, "/collective_rpc", &body)?;
            self.post(u, "/reset_prefix_cache", &json!({}))?;
        }
        Ok(())
    }

    /// One completion of `prompt` (token ids) from `model`; `seed` when the
    /// sampling is seeded.
    pub fn complete(
        &self,
        url: &str,
        model: &str,
        prompt: &[i64],
        params: &GenerationParams,
        seed: Option<u64>,
    ) -> Result<Completion, ModelError> {
        let s = &params.sampler;
        let mut body = json!({
            "model": model,
            "prompt": prompt,
            "max_tokens": params.max_new_tokens,
            "temperature": s.temperature.max(0.0),
            "top_p": s.top_p,
            "top_k": if s.top_k > 0 { s.top_k } else { -1 },
            // The sampled token's log-prob only.
            "logprobs": 0,
            "return_token_ids": true,
            "ignore_eos": params.ignore_eos,
        });
        if !params.stop.is_empty() {
            body["stop"] = json!(params.stop);
        }
        if let Some(seed) = seed.filter(|_| self.seeded) {
            body["seed"] = json!(seed);
        }
        let v = self.post(url, "/v1/completions", &body)?;
        let bad = |what: &str| {
            ModelError::Invalid(format!(
                "POST {url}/v1/completions: {what}: {}",
                crate::text::body_excerpt(&v.to_string(), EXCERPT_CHARS)
            ))
        };
        let resp: CompletionResponse = serde_json::from_value(v.clone())
            .map_err(|e| bad(&format!("unexpected answer ({e})")))?;
        let c = resp
            .choices
            .into_iter()
            .next()
            .ok_or_else(|| bad("no choices"))?;
        let token_ids = c
            .token_ids
            .ok_or_else(|| bad("no token_ids (a vLLM older than 0.10 does not return them)"))?;
        let logprobs: Vec<f32> = c
            .logprobs
            .map(|l| {
                l.token_logprobs
                    .into_iter()
                    .map(|x| x.unwrap_or(f64::NEG_INFINITY) as f32)
                    .collect()
            })
            .unwrap_or_default();
        if logprobs.len() != token_ids.len() {
            return Err(bad(&format!(
                "{} log-probs for {} tokens",
                logprobs.len(),
                token_ids.len()
            )));
        }
        let finish = super::openai::finish_reason(
            c.finish_reason.as_deref(),
            c.stop_reason.as_ref(),
            &params.stop,
        );
        Ok(Completion {
            text: c.text,
            prompt_ids: prompt.to_vec(),
            token_ids,
            logprobs,
            finish,
        })
    }

    /// One completion per prompt from `model`, `parallel` requests in
    /// flight, spread over the servers; row i is seeded
    /// `row_seed(seed, row_offset + i)`.
    pub fn complete_all(
        &self,
        model: &str,
        prompts: &[Vec<i64>],
        params: &GenerationParams,
    ) -> Result<Vec<Completion>, ModelError> {
        let rows: Vec<Row> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| Row {
                model,
                prompt: p,
                seed: params
                    .seed
                    .map(|s| row_seed(s, params.row_offset + i as u64)),
            })
            .collect();
        self.complete_rows(&rows, params)
    }

    /// One completion per row, each from its own model (adapter) name and
    /// seed, all in flight together: K adapters' samples in one batch on
    /// the server.
    pub fn complete_rows(
        &self,
        rows: &[Row],
        params: &GenerationParams,
    ) -> Result<Vec<Completion>, ModelError> {
        let n = rows.len();
        let out: Vec<Mutex<Option<Result<Completion, ModelError>>>> =
            (0..n).map(|_| Mutex::new(None)).collect();
        let next = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..self.parallel.min(n) {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let k = self.next.fetch_add(1, Ordering::Relaxed) % self.urls.len();
                    let r = &rows[i];
                    let c = self.complete(&self.urls[k], r.model, r.prompt, params, r.seed);
                    *out[i].lock().expect("not poisoned") = Some(c);
                });
            }
        });
        out.into_iter()
            .map(|m| {
                m.into_inner()
                    .expect("not poisoned")
                    .expect("every row ran")
            })
            .collect()
    }
}

/// One request of [`VllmClient::complete_rows`].
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    /// The served name: the base model or a loaded adapter.
    pub model: &'a str,
    pub prompt: &'a [i64],
    pub seed: Option<u64>,
}

/// A failed request's error, naming a managed server's `log` (a vLLM 500
/// says no more than "see the stack trace above").
fn with_log(e: ModelError, log: Option<&Path>) -> ModelError {
    match log {
        Some(l) => ModelError::Invalid(format!("{e} (the vLLM server's log: {})", l.display())),
        None => e,
    }
}

/// The seed of row `row` of a call seeded `seed`: rows differ, and a row
/// draws the same wherever it is sent (a data-parallel shard's rows).
pub fn row_seed(seed: u64, row: u64) -> u64 {
    let mut z = seed ^ row.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    // vLLM takes any int; below 2^63 for every JSON reader on the way.
    (z ^ (z >> 31)) >> 1
}

#[derive(Deserialize)]
struct CompletionResponse {
    choices: Vec<CompletionChoice>,
}

#[derive(Deserialize)]
struct CompletionChoice {
    text: String,
    #[serde(default)]
    token_ids: Option<Vec<i64>>,
    #[serde(default)]
    logprobs: Option<ChoiceLogprobs>,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    stop_reason: Option<Value>,
}

#[derive(Deserialize)]
struct ChoiceLogprobs {
    token_logprobs: Vec<Option<f64>>,
}

/// The vLLM engine: a managed server or given URLs, the model name requests
/// use, and which policy version the servers hold.
pub struct VllmEngine {
    server: Option<VllmServer>,
    /// How the managed server was started, to start it again.
    spec: Option<ServerSpec>,
    client: VllmClient,
    tokenizer: TextTokenizer,
    /// Where adapters and full weights for the servers are written.
    work: PathBuf,
    /// The base model's served name.
    base: String,
    /// Adapters loaded beside the policy's (a meta-step's fast weights).
    extra: Vec<(String, PathBuf)>,
    /// The adapter requests name (LoRA), with its directory.
    adapter: Option<(String, PathBuf)>,
    /// Earlier adapters still loaded (newest last): a generation in flight
    /// may still use them.
    retired: std::collections::VecDeque<(String, PathBuf)>,
    /// How many earlier adapters stay loaded (1 with overlap).
    keep_previous: usize,
    lora: bool,
    synced: Option<u64>,
}

impl std::fmt::Debug for VllmEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VllmEngine")
            .field("urls", &self.client.urls)
            .field("managed", &self.server.is_some())
            .field("adapter", &self.adapter)
            .field("synced", &self.synced)
            .finish()
    }
}

impl VllmEngine {
    /// Start (managed) or reach (`urls`) the servers for `policy`, with
    /// `work` for what the servers read (base model, adapters, weights) and
    /// `log` for a managed server's output. A managed server for full
    /// fine-tuning starts with `policy`'s weights, as `version`; otherwise
    /// the servers hold no policy version until [`VllmEngine::sync`].
    /// `adapters`: how many adapters one batch mixes (a meta-step's K fast
    /// adapters and the policy's).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        cfg: &VllmConfig,
        policy: &Policy,
        version: u64,
        adapters: usize,
        work: &Path,
        log: &Path,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Self, ModelError> {
        let lora = policy.lora.is_some();
        let tied = policy.hf_config.get("tie_word_embeddings") == Some(&Value::Bool(true));
        if !lora && tied {
            // Measured here: after `reload_weights` vLLM 0.32 logs
            // "ParallelLMHead: Failed to load weights" and keeps the old
            // output layer, so every step would sample from stale logits.
            return Err(ModelError::Invalid(
                "full fine-tuning of a model with tied input/output embeddings \
                 (tie_word_embeddings) cannot sync to vLLM 0.32: its weight reload leaves the \
                 tied output layer stale; enable [model.lora] or use the native engine"
                    .into(),
            ));
        }
        let tokenizer = policy.tokenizer()?.clone();
        std::fs::create_dir_all(work).map_err(|e| ModelError::io(work, e))?;
        // Absolute, because the server resolves paths from its own cwd.
        let work = std::fs::canonicalize(work).map_err(|e| ModelError::io(work, e))?;
        let timeout = Duration::from_secs(cfg.request_timeout_s);
        let (server, client, base) = if cfg.managed() {
            let dir = work.join(if lora { "base" } else { "weights" });
            progress(&format!("writing the model for vLLM to {}", dir.display()));
            if lora {
                super::export::export_hf_base(policy, &dir, policy.dtype, true)?;
            } else {
                super::export::export_hf(policy, &dir, policy.dtype, true)?;
            }
            let spec = ServerSpec::from_config(cfg, policy, adapters, &dir, log);
            progress(&format!(
                "starting vLLM ({} {}); log {}",
                spec.python.display(),
                spec.args(0)[1],
                log.display()
            ));
            let t0 = Instant::now();
            let server = VllmServer::start(&spec, progress)?;
            progress(&format!(
                "vLLM ready at {} in {:.0} s",
                server.url(),
                t0.elapsed().as_secs_f64()
            ));
            let client = VllmClient::new(
                &[server.url().to_owned()],
                timeout,
                cfg.max_parallel_requests,
            );
            (Some((server, spec)), client, BASE_NAME.to_owned())
        } else {
            let client = VllmClient::new(&cfg.urls, timeout, cfg.max_parallel_requests);
            let models = client.models()?;
            let base = models.first().cloned().ok_or_else(|| {
                ModelError::Invalid(format!("{}: serves no model", client.urls[0]))
            })?;
            (None, client, base)
        };
        let synced = (server.is_some() && !lora).then_some(version);
        let on_cpu = !policy.device().is_cuda();
        let client = client.seeded(cfg.seed_requests.unwrap_or(!(cfg.managed() && on_cpu)));
        let (server, spec) = server.unzip();
        Ok(VllmEngine {
            server,
            spec,
            client,
            tokenizer,
            work,
            base,
            extra: Vec::new(),
            adapter: None,
            retired: Default::default(),
            keep_previous: 0,
            lora,
            synced,
        })
    }

    /// The managed server, if falcon started one.
    pub fn server(&mut self) -> Option<&mut VllmServer> {
        self.server.as_mut()
    }

    /// The servers' base URLs.
    pub fn urls(&self) -> &[String] {
        self.client.urls()
    }

    /// The model name requests name: the current adapter, else the base.
    pub fn model_name(&self) -> &str {
        self.adapter
            .as_ref()
            .map(|a| a.0.as_str())
            .unwrap_or(&self.base)
    }

    /// The policy version the servers hold.
    pub fn synced(&self) -> Option<u64> {
        self.synced
    }

    /// Bring the servers to `policy` as version `version`, unless they
    /// already hold it; returns the seconds it took (0 when nothing was
    /// done). LoRA: the adapter is written to a new directory under a new
    /// name, loaded, and the previous one unloaded and deleted, so no stale
    /// prefix-cache block or adapter outlives its step. Full weights: a
    /// merged directory reloaded in place, and the prefix cache reset.
    /// A managed server found dead here is started again once.
    pub fn sync(&mut self, policy: &Policy, version: u64) -> Result<f64, ModelError> {
        if self.synced == Some(version) {
            return Ok(0.0);
        }
        let t0 = Instant::now();
        match self.sync_now(policy, version) {
            Ok(secs) => Ok(secs),
            Err(e) if !self.server_died() => Err(e),
            Err(_) => {
                self.restart(policy, version)?;
                Ok(t0.elapsed().as_secs_f64())
            }
        }
    }

    /// Whether falcon's own server has died.
    fn server_died(&mut self) -> bool {
        self.server.as_mut().is_some_and(|s| !s.alive())
    }

    fn sync_now(&mut self, policy: &Policy, version: u64) -> Result<f64, ModelError> {
        let t0 = Instant::now();
        if self.lora {
            let name = format!("policy-v{version}");
            let dir = self.work.join("adapters").join(&name);
            super::export::export_peft(policy, &dir, true)?;
            self.client.load_adapter(&name, &dir)?;
            if let Some(old) = self.adapter.replace((name, dir)) {
                self.retired.push_back(old);
            }
            while self.retired.len() > self.keep_previous {
                let (old, old_dir) = self.retired.pop_front().expect("non-empty");
                self.client.unload_adapter(&old)?;
                let _ = std::fs::remove_dir_all(old_dir);
            }
        } else {
            let dir = self.work.join("weights");
            super::export::export_hf(policy, &dir, policy.dtype, true)?;
            self.client.reload_weights(&dir)?;
        }
        self.synced = Some(version);
        Ok(t0.elapsed().as_secs_f64())
    }

    /// Generate from the servers; a managed server found dead is started
    /// again once (same port, so the client's URL holds), brought to
    /// `policy` as `version`, and asked again. An error from a server that
    /// lives, or from the second try, is returned.
    pub fn generate_or_restart(
        &mut self,
        policy: &Policy,
        version: u64,
        prompts: &[String],
        params: &GenerationParams,
    ) -> Result<Vec<Completion>, ModelError> {
        if !self.server_died() {
            match self.generate(prompts, params) {
                Ok(c) => return Ok(c),
                Err(e) if !self.server_died() => return Err(e),
                Err(_) => {}
            }
        }
        self.restart(policy, version)?;
        self.generate(prompts, params)
    }

    /// A managed server's log.
    fn log(&self) -> Option<&Path> {
        self.server.as_ref().map(VllmServer::log)
    }

    /// Start a dead managed server again, at the same port, and bring it
    /// to `policy` as `version`.
    fn restart(&mut self, policy: &Policy, version: u64) -> Result<(), ModelError> {
        let (Some(server), Some(spec)) = (self.server.take(), self.spec.as_mut()) else {
            unreachable!("only a managed server is found dead")
        };
        let why = server.failed("died");
        // The port it had, so requests keep their URL.
        spec.port = server
            .url()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        drop(server);
        eprintln!("falcon: {why}; starting it again (once)");
        let server = VllmServer::start(spec, &mut |m| eprintln!("falcon: {m}"))
            .map_err(|e| ModelError::Invalid(format!("{why}; starting it again failed: {e}")))?;
        self.server = Some(server);
        self.adapter = None;
        self.retired.clear();
        self.synced = None;
        self.sync_now(policy, version).map(|_| ())
    }
}

impl VllmEngine {
    /// Keep the `n` adapters before the current one loaded: a generation
    /// started with one of them (overlap) finishes after the next sync.
    pub fn keep_previous(&mut self, n: usize) {
        self.keep_previous = n;
    }

    /// [`Generator::generate`] on a thread of its own, with the adapter the
    /// servers hold now: the trainer updates meanwhile (one-step off-policy).
    pub fn spawn_generate(
        &self,
        prompts: &[String],
        params: &GenerationParams,
    ) -> Result<Pending, ModelError> {
        let ids = self.encode(prompts, params)?;
        let client = self.client.clone();
        let model = self.model_name().to_owned();
        let params = params.clone();
        let log = self.log().map(Path::to_path_buf);
        let tok = self.tokenizer.clone();
        let handle = std::thread::spawn(move || {
            let comps = client
                .complete_all(&model, &ids, &params)
                .map_err(|e| with_log(e, log.as_deref()))?;
            cut_all(comps, &tok, &params)
        });
        Ok(Pending { handle })
    }

    /// Token ids of `prompts` as the servers get them.
    pub fn encode(
        &self,
        prompts: &[String],
        params: &GenerationParams,
    ) -> Result<Vec<Vec<i64>>, ModelError> {
        encode_prompts(&self.tokenizer, prompts, params)
    }

    /// Load `fast` (LoRA factors by VarStore name, e.g. a MAML task's θ_i)
    /// over the policy's other adapters as adapter `name`, until
    /// [`VllmEngine::unload_extra`].
    pub fn load_extra(
        &mut self,
        policy: &Policy,
        fast: &[(String, tch::Tensor)],
        name: &str,
    ) -> Result<(), ModelError> {
        let dir = self.work.join("fast").join(name);
        super::export::export_peft_with(policy, fast, &dir, true)?;
        self.client.load_adapter(name, &dir)?;
        self.extra.push((name.to_owned(), dir));
        Ok(())
    }

    /// Unload and delete every adapter [`VllmEngine::load_extra`] loaded.
    pub fn unload_extra(&mut self) -> Result<(), ModelError> {
        for (name, dir) in std::mem::take(&mut self.extra) {
            self.client.unload_adapter(&name)?;
            let _ = std::fs::remove_dir_all(dir);
        }
        Ok(())
    }

    /// One completion per row (served name, prompt ids, seed), all in
    /// flight together.
    pub fn generate_rows(
        &self,
        rows: &[Row],
        params: &GenerationParams,
    ) -> Result<Vec<Completion>, ModelError> {
        let comps = self
            .client
            .complete_rows(rows, params)
            .map_err(|e| with_log(e, self.log()))?;
        cut_all(comps, &self.tokenizer, params)
    }

    /// `n` completions of each `(fast, prompt, seed)`: every fast weight
    /// set (a MAML task's θ_i) loaded as its own adapter, all rows sent
    /// together so the servers batch the adapters at once (row `j` of an
    /// entry seeded from its `seed` by [`row_seed`]), then unloaded. In
    /// entry order, `n` per entry; `tag` names the adapters.
    pub fn generate_adapted(
        &mut self,
        policy: &Policy,
        each: &[(&[(String, tch::Tensor)], &str, u64)],
        n: usize,
        params: &GenerationParams,
        tag: &str,
    ) -> Result<Vec<Completion>, ModelError> {
        let mut names = Vec::with_capacity(each.len());
        let mut ids = Vec::with_capacity(each.len());
        for (k, (fast, prompt, _)) in each.iter().enumerate() {
            let name = format!("fast-{tag}-t{k}");
            self.load_extra(policy, fast, &name)?;
            names.push(name);
            ids.push(self.encode(&[prompt.to_string()], params)?);
        }
        let mut rows = Vec::with_capacity(each.len() * n);
        for (k, (_, _, seed)) in each.iter().enumerate() {
            for j in 0..n {
                rows.push(Row {
                    model: &names[k],
                    prompt: &ids[k][0],
                    seed: Some(row_seed(*seed, j as u64)),
                });
            }
        }
        let comps = self.generate_rows(&rows, params);
        let unloaded = self.unload_extra();
        let comps = comps?;
        unloaded?;
        Ok(comps)
    }
}

/// The servers know stop strings but not the end of a code block: cut
/// each completion there afterwards, with its token ids and log-probs.
fn cut_all(
    comps: Vec<Completion>,
    tok: &TextTokenizer,
    params: &GenerationParams,
) -> Result<Vec<Completion>, ModelError> {
    comps
        .into_iter()
        .map(|c| super::generate::cut_at_block_end(c, Some(tok), params))
        .collect()
}

impl Generator for VllmEngine {
    fn generate(
        &self,
        prompts: &[String],
        params: &GenerationParams,
    ) -> Result<Vec<Completion>, ModelError> {
        let ids = self.encode(prompts, params)?;
        let comps = self
            .client
            .complete_all(self.model_name(), &ids, params)
            .map_err(|e| with_log(e, self.log()))?;
        cut_all(comps, &self.tokenizer, params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spec for `model_dir`, run by `python`, with a short start deadline.
    fn spec(python: PathBuf, model_dir: &Path, timeout_s: u64) -> ServerSpec {
        ServerSpec {
            python,
            model_dir: model_dir.to_path_buf(),
            dtype: Dtype::Fp32,
            port: 0,
            max_model_len: 64,
            max_lora_rank: None,
            max_loras: 1,
            cpu_kv_cache_gib: Some(1.0),
            gpu_memory_utilization: 0.3,
            extra_args: vec![],
            log: model_dir.join("server.log"),
            start_timeout: Duration::from_secs(timeout_s),
        }
    }

    #[test]
    fn row_seeds_differ_by_row_and_fit_i64() {
        let a: Vec<u64> = (0..64).map(|r| row_seed(7, r)).collect();
        let mut b = a.clone();
        b.sort();
        b.dedup();
        assert_eq!(b.len(), a.len());
        assert!(a.iter().all(|&s| s < (1 << 63)));
        assert_ne!(row_seed(7, 0), row_seed(8, 0));
    }

    #[test]
    fn lora_rank_rounds_up_to_one_vllm_takes() {
        let spec = ServerSpec {
            max_lora_rank: Some(12),
            max_loras: 3,
            extra_args: vec!["--seed".into(), "3".into()],
            ..spec("python".into(), Path::new("m"), 1)
        };
        let a = spec.args(9);
        let at = a.iter().position(|x| x == "--max-lora-rank").unwrap();
        assert_eq!(a[at + 1], "16");
        let at = a.iter().position(|x| x == "--max-loras").unwrap();
        assert_eq!(a[at + 1], "3");
        assert_eq!(&a[a.len() - 2..], &["--seed", "3"]);
        assert!(!a.iter().any(|x| x == "--gpu-memory-utilization"));
    }

    #[test]
    fn a_missing_python_or_model_is_named_before_anything_starts() {
        let d = std::env::temp_dir().join(format!("falcon-vllm-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let mut spec = spec(d.join("no-python"), &d, 5);
        let e = VllmServer::start(&spec, &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(e.contains("scripts/setup-vllm"), "{e}");
        spec.python = PathBuf::from("/bin/sh");
        let e = VllmServer::start(&spec, &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(e.contains("no config.json"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn full_weights_of_a_tied_model_are_refused_before_a_server_starts() {
        let d = std::env::temp_dir().join(format!("falcon-vllm-tied-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let config = json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
            "vocab_size": 64, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "tie_word_embeddings": true, "hidden_act": "silu",
        });
        super::super::generate::write_random_model(&d, &config, 1, 0.3).unwrap();
        let policy = Policy::load(&d, Dtype::Fp32, tch::Device::Cpu).unwrap();
        let e = VllmEngine::start(
            &VllmConfig::default(),
            &policy,
            0,
            1,
            &d.join("work"),
            &d.join("server.log"),
            &mut |_| {},
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("tie_word_embeddings"), "{e}");
        assert!(
            !d.join("work").exists(),
            "nothing written for a refused engine"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_server_that_exits_is_reported_with_its_log_at_once() {
        // /bin/sh stands in for Python only to exit at once with a message:
        // what is checked is falcon's side (exit noticed, log quoted).
        let d = std::env::temp_dir().join(format!("falcon-vllm-exit-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("config.json"), "{}").unwrap();
        let script = d.join("fake-python");
        std::fs::write(
            &script,
            "#!/bin/sh\necho 'ValueError: no such model' >&2\nexit 3\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let spec = spec(script, &d, 60);
        let t0 = Instant::now();
        let e = VllmServer::start(&spec, &mut |_| {})
            .unwrap_err()
            .to_string();
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "took {:?}",
            t0.elapsed()
        );
        assert!(e.contains("exited"), "{e}");
        assert!(e.contains("ValueError: no such model"), "{e}");
        assert!(e.contains("server.log"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
