//! Throughput of the exec sandbox: runs every task's canonical solution
//! through the pool `repeats` times, then the same through `falcon sandbox
//! serve`'s service on loopback (serving the same pool) with our API and
//! with SandboxFusion's (one `/run_code` per test), and prints executions
//! per second of each as JSON. Used by `scripts/bench/run exec`. Usage:
//!   exec_bench TASKS.jsonl [--format humaneval|mbpp|jsonl|auto] [--repeats N] [--workers N]
use std::path::PathBuf;
use std::time::Instant;

use falcon_rl::config::{ExecBackend, ExecConfig, RemoteApi, RemoteConfig, TaskFormat};
use falcon_rl::exec::service::{ServeOptions, Service};
use falcon_rl::exec::{ExecReport, RewardClass, Sandbox};
use falcon_rl::task::{LoadOptions, TaskSet};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut path = None;
    let (mut format, mut repeats, mut workers) = (TaskFormat::Auto, 3usize, 0usize);
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--format" => {
                format = toml::Value::String(args[i + 1].clone())
                    .try_into()
                    .expect("format");
                i += 1
            }
            "--repeats" => {
                repeats = args[i + 1].parse().expect("repeats");
                i += 1
            }
            "--workers" => {
                workers = args[i + 1].parse().expect("workers");
                i += 1
            }
            p => path = Some(PathBuf::from(p)),
        }
        i += 1;
    }
    let set = TaskSet::load(&path.expect("task file"), format, LoadOptions::default())
        .expect("tasks load");
    let cfg = ExecConfig {
        workers,
        ..ExecConfig::default()
    };
    let sandbox = Sandbox::new(&cfg).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    let jobs: Vec<(&falcon_rl::task::Task, &str)> = set
        .tasks
        .iter()
        .map(|t| (t, t.canonical_solution.as_deref().unwrap_or("")))
        .collect();
    // Warm-up round (all workers up), also the correctness check.
    let reports = sandbox.run_batch(&jobs);
    let failed: Vec<String> = reports
        .iter()
        .zip(&set.tasks)
        .filter(|(r, _)| r.outcome != Some(falcon_rl::exec::RewardClass::Pass))
        .map(|(r, t)| {
            format!(
                "{}: {:?} {:?} {}",
                t.id,
                r.error_kind,
                r.no_signal,
                r.tests
                    .first()
                    .map(|t| format!("{:?}", t.status))
                    .unwrap_or_default()
            )
        })
        .collect();
    let rates_of = |sb: &Sandbox| -> Vec<f64> {
        let mut rates = Vec::new();
        for _ in 0..repeats {
            let t0 = Instant::now();
            let rs: Vec<ExecReport> = sb.run_batch(&jobs);
            let dt = t0.elapsed().as_secs_f64();
            assert_eq!(rs.len(), jobs.len());
            let passed = rs
                .iter()
                .filter(|r| r.outcome == Some(RewardClass::Pass))
                .count();
            assert_eq!(
                passed,
                jobs.len() - failed.len(),
                "a repeat changed the outcomes"
            );
            rates.push(jobs.len() as f64 / dt);
        }
        rates
    };
    let rates = rates_of(&sandbox);
    // The service serves this same pool: the remote rows measure HTTP,
    // JSON and the client, not a second pool.
    let service = Service::start(
        sandbox.clone(),
        ServeOptions {
            addr: "127.0.0.1:0".into(),
            ..ServeOptions::default()
        },
    )
    .expect("service starts");
    let remote = |api| {
        let cfg = ExecConfig {
            backend: ExecBackend::Remote,
            remote: RemoteConfig {
                urls: vec![format!("http://{}", service.addr())],
                api,
                concurrency: sandbox.workers() * 2,
                ..RemoteConfig::default()
            },
            ..cfg.clone()
        };
        Sandbox::new(&cfg).expect("remote sandbox")
    };
    let remote_rates = rates_of(&remote(RemoteApi::Falcon));
    let fusion_rates = rates_of(&remote(RemoteApi::SandboxFusion));
    service.stop();
    println!(
        "{}",
        serde_json::json!({
            "tasks": jobs.len(), "workers": sandbox.workers(), "repeats": repeats,
            "rates": rates, "remote_rates": remote_rates, "fusion_rates": fusion_rates,
            "passed": jobs.len() - failed.len(), "failed": failed,
        })
    );
}
