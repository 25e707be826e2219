//! `falcon sandbox serve`: run the execution sandbox as an HTTP service
//! (SandboxFusion's `/run_code` and `/submit`, our `/falcon/run_tests`) for
//! trainers on other machines; see docs/sandbox.md ("The sandbox as a
//! service").

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand};

use super::usage;
use falcon_rl::config::RunConfig;
use falcon_rl::exec::service::{ServeOptions, Service};
use falcon_rl::exec::Sandbox;

#[derive(Subcommand)]
pub enum SandboxCmd {
    /// Serve the sandbox over HTTP until stopped (Ctrl-C).
    Serve(ServeArgs),
}

#[derive(Args)]
pub struct ServeArgs {
    /// Address to listen on. The default is this machine only; give
    /// `0.0.0.0:8080` (with a token) to serve other hosts.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Run config whose [exec] section sets the pool (workers, limits, Python).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Environment variable holding the bearer token requests must carry
    /// (unset or empty = no token). A token on the command line would show
    /// in `ps`.
    #[arg(long, default_value = "FALCON_SANDBOX_TOKEN")]
    token_env: String,
    /// Largest request body, MiB.
    #[arg(long, default_value_t = 16)]
    max_body_mb: usize,
    /// Runs handled at once (0 = twice the workers); more wait in the queue.
    #[arg(long, default_value_t = 0)]
    concurrency: usize,
    /// Runs that may wait beyond those; more are answered 503.
    #[arg(long, default_value_t = 1024)]
    queue: usize,
    /// Largest `run_timeout` a request may ask for, seconds.
    #[arg(long, default_value_t = 300.0)]
    max_run_timeout: f64,
}

pub fn run(cmd: SandboxCmd) -> Result<()> {
    let SandboxCmd::Serve(a) = cmd;
    let cfg = match &a.config {
        Some(f) => RunConfig::load(f).map_err(usage)?,
        None => RunConfig::default(),
    };
    if a.max_body_mb == 0 || a.queue == 0 {
        return Err(usage("--max-body-mb and --queue must be at least 1"));
    }
    if !(a.max_run_timeout > 0.0 && a.max_run_timeout <= 3600.0) {
        return Err(usage("--max-run-timeout must be in (0, 3600] seconds"));
    }
    // A service is the local pool, whatever backend the config names.
    let sandbox = Sandbox::local(&cfg.exec)?;
    let token = std::env::var(&a.token_env)
        .ok()
        .filter(|t| !t.trim().is_empty());
    let opts = ServeOptions {
        addr: a.listen.clone(),
        token: token.clone(),
        max_body_bytes: a.max_body_mb << 20,
        concurrency: a.concurrency,
        queue: a.queue,
        max_run_timeout_s: a.max_run_timeout,
    };
    let service = Service::start(sandbox.clone(), opts).map_err(usage)?;
    if !service.addr().ip().is_loopback() && token.is_none() {
        eprintln!(
            "warning: listening on {} without a token: anyone who reaches this port can run code in the sandbox; set {}",
            service.addr(),
            a.token_env
        );
    }
    eprintln!(
        "falcon sandbox: serving on http://{} ({} workers, numba kernels: {}, token: {}); POST /run_code, /submit, /falcon/run_tests; GET /health, /metrics",
        service.addr(),
        sandbox.workers(),
        sandbox.cuda_label(),
        if token.is_some() { "required" } else { "none" },
    );
    service.wait();
    Ok(())
}
