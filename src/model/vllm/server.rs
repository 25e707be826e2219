//! A managed vLLM server: vLLM's OpenAI-compatible server as falcon's
//! child, in its own process group with a parent-death signal, so it goes
//! when falcon goes (error, Ctrl-C, SIGKILL); its log is a file the caller
//! names, and every start failure quotes it.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::client::agent;
use super::*;
use crate::config::VllmConfig;
use crate::model::{Dtype, ModelError, Policy};

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
    pub(super) fn args(&self, port: u16) -> Vec<String> {
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
    pub(super) fn failed(&self, what: &str) -> ModelError {
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
