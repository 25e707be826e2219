//! `falcon exec`: run code samples against their tasks in the sandbox and
//! score them with the same reward pipeline training uses.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;

use super::{usage, ModelArgs, UsageError};
use falcon_rl::config::RunConfig;
use falcon_rl::exec::Sandbox;
use falcon_rl::memory::stats::ErrorStats;
use falcon_rl::model::{Completion, FinishReason, Policy};
use falcon_rl::reward::{CustomSample, Rewards};
use falcon_rl::task::{LoadOptions, Task, TaskFormat, TaskSet};

#[derive(Args)]
pub struct ExecArgs {
    /// Task file: any supported format (own JSONL, HumanEval, MBPP, PriCoder, APPS/TACO, CodeContests, LiveCodeBench, KodCode, verl), parquet/arrow, or a directory of them.
    #[arg(long)]
    tasks: PathBuf,
    /// Samples: JSONL with `task_id` and `code` per line; or `canonical` to run
    /// every task's canonical solution.
    #[arg(long)]
    samples: String,
    /// Where the per-sample reports go (JSONL); default: stdout.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run config whose [exec] and [reward] sections apply (default: built-in defaults).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Skip malformed task or sample records (reported and counted) instead of failing.
    #[arg(long)]
    skip_invalid: bool,
    /// Model for `[reward] judge = "lm"` (a local dir, .gguf, cached repo id or `embedded`).
    #[arg(long)]
    judge_model: Option<String>,
}

/// One sample: which task, which code.
#[derive(serde::Deserialize)]
struct Sample {
    task_id: String,
    code: String,
}

fn read_samples(arg: &str, tasks: &TaskSet, skip_invalid: bool) -> Result<Vec<Sample>> {
    if arg == "canonical" {
        return Ok(tasks
            .iter()
            .filter_map(|t| {
                t.canonical_solution.as_ref().map(|c| Sample {
                    task_id: t.id.clone(),
                    code: c.clone(),
                })
            })
            .collect());
    }
    let text = std::fs::read_to_string(arg).with_context(|| format!("reading samples {arg}"))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let parsed = serde_json::from_str::<Sample>(line)
            .map_err(|e| e.to_string())
            .and_then(|s| match tasks.get(&s.task_id) {
                Some(_) => Ok(s),
                None => Err(format!("task_id `{}` is not in the task file", s.task_id)),
            });
        match parsed {
            Ok(s) => out.push(s),
            Err(reason) if skip_invalid => eprintln!("skipped {arg}:{}: {reason}", i + 1),
            Err(reason) => return Err(UsageError(format!("{arg}:{}: {reason}", i + 1)).into()),
        }
    }
    Ok(out)
}

impl ExecArgs {
    /// Whether a model runs in this process (the LM judge).
    pub fn uses_model(&self) -> bool {
        self.judge_model.is_some()
    }
}

pub fn run(args: ExecArgs) -> Result<()> {
    let cfg = match &args.config {
        Some(f) => RunConfig::load(f).map_err(usage)?,
        None => RunConfig::default(),
    };
    let mut tasks = TaskSet::load(
        &args.tasks,
        TaskFormat::Auto,
        LoadOptions {
            skip_invalid: args.skip_invalid,
            ..falcon_rl::task::LoadOptions::of(&cfg.tasks)
        },
    )
    .map_err(usage)?;
    let samples = read_samples(&args.samples, &tasks, args.skip_invalid)?;
    if samples.is_empty() {
        return Err(UsageError("no samples to run".into()).into());
    }
    let sandbox = Sandbox::new(&cfg.exec)?;
    falcon_rl::eval::plus::expand(&mut tasks, &sandbox)?;
    let used: Vec<&Task> = tasks
        .iter()
        .filter(|t| samples.iter().any(|s| s.task_id == t.id))
        .collect();
    sandbox.require_modules(&used).map_err(usage)?;
    let judge_policy: Option<Policy> = match &args.judge_model {
        Some(m) => Some(
            ModelArgs {
                model: m.clone(),
                dtype: "fp32".into(),
                device: "auto".into(),
                adapter: None,
            }
            .load()?,
        ),
        None => None,
    };
    let rewards = Rewards::new(&cfg.reward, judge_policy.as_ref())?;

    let t0 = Instant::now();
    let bar = indicatif::ProgressBar::new(samples.len() as u64).with_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} samples {per_sec} eta {eta}")
            .expect("static template"),
    );
    let mut reports = Vec::with_capacity(samples.len());
    for chunk in samples.chunks(64) {
        let jobs: Vec<(&Task, &str)> = chunk
            .iter()
            .map(|s| (tasks.get(&s.task_id).expect("checked"), s.code.as_str()))
            .collect();
        reports.extend(sandbox.run_batch(&jobs));
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    let exec_secs = t0.elapsed().as_secs_f64();

    // Standalone, the error-type statistics P_error come from this batch:
    // the share of each error kind among all failing tests.
    let mut stats = ErrorStats::new(Default::default())?;
    for r in &reports {
        stats.observe(r);
    }
    let codes: Vec<&str> = samples.iter().map(|s| s.code.as_str()).collect();
    // A custom term sees each code as the completion that wrote it.
    let completions: Vec<Completion> = samples
        .iter()
        .map(|s| Completion::text_only(s.code.clone(), FinishReason::Eos))
        .collect();
    let jobs: Vec<(&Task, &Completion)> = samples
        .iter()
        .zip(&completions)
        .map(|(s, completion)| (tasks.get(&s.task_id).expect("checked"), completion))
        .collect();
    let custom = rewards.custom(0, &CustomSample::batch(&jobs, &reports));
    let scored = rewards.score(&reports, &codes, &stats.p_error(), &custom)?;

    let mut lines = String::new();
    let mut by_outcome: BTreeMap<String, usize> = BTreeMap::new();
    let mut reward_sum = 0.0;
    let mut rewarded = 0usize;
    for (i, ((s, r), rewards)) in samples.iter().zip(&reports).zip(&scored).enumerate() {
        if let Some(b) = rewards {
            reward_sum += b.total;
            rewarded += 1;
        }
        *by_outcome.entry(r.outcome_label()).or_insert(0) += 1;
        let v = serde_json::json!({
            "task_id": s.task_id,
            "sample": i,
            "report": r,
            "n_pass": r.n_pass(),
            "n_fail": r.n_fail(),
            "rewards": rewards.as_ref().map(|b| b.to_log("")),
        });
        lines.push_str(&v.to_string());
        lines.push('\n');
    }
    match &args.out {
        Some(p) => {
            falcon_rl::fsutil::write_atomic(p, lines.as_bytes())?;
            eprintln!("wrote {}", p.display());
        }
        None => print!("{lines}"),
    }
    let n = reports.len();
    if sandbox.is_remote() {
        let (sent, retried, unanswered) = sandbox.remote_counts();
        eprintln!(
            "{n} samples in {exec_secs:.1}s ({:.1}/s) on {} ({} requests at once); {sent} requests, {retried} tried again, {unanswered} never answered (no signal)",
            n as f64 / exec_secs.max(1e-9),
            cfg.exec.remote.urls.join(", "),
            sandbox.workers()
        );
    } else {
        eprintln!(
            "{n} samples in {exec_secs:.1}s ({:.1}/s) on {} workers",
            n as f64 / exec_secs.max(1e-9),
            sandbox.workers()
        );
    }
    eprintln!("{:<20} {:>7} {:>7}", "outcome", "samples", "share");
    for (k, c) in &by_outcome {
        eprintln!("{k:<20} {c:>7} {:>6.1}%", 100.0 * *c as f64 / n as f64);
    }
    if rewarded > 0 {
        eprintln!(
            "mean reward {:.3} over {rewarded} scored samples",
            reward_sum / rewarded as f64
        );
    }
    Ok(())
}
