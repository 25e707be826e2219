//! Throughput of the exec sandbox: runs every task's canonical solution
//! through the pool `repeats` times and prints executions per second as JSON.
//! Used by scripts/bench-exec. Usage:
//!   exec_bench TASKS.jsonl [--format humaneval|mbpp|jsonl|auto] [--repeats N] [--workers N]
use std::path::PathBuf;
use std::time::Instant;

use falcon_rl::config::{ExecConfig, TaskFormat};
use falcon_rl::exec::Sandbox;
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
    let mut rates = Vec::new();
    for _ in 0..repeats {
        let t0 = Instant::now();
        let rs = sandbox.run_batch(&jobs);
        let dt = t0.elapsed().as_secs_f64();
        assert_eq!(rs.len(), jobs.len());
        rates.push(jobs.len() as f64 / dt);
    }
    println!(
        "{}",
        serde_json::json!({
            "tasks": jobs.len(), "workers": sandbox.workers(), "repeats": repeats,
            "rates": rates, "passed": jobs.len() - failed.len(), "failed": failed,
        })
    );
}
