//! `falcon train` and `falcon sft`: a training session from a config, with
//! a progress bar on a terminal (plain lines otherwise) and the closing
//! held-out comparison.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;
use clap::Args;

use super::{hold_lock, usage, LockArgs, SetArgs};
use falcon_rl::config::{Job, RunConfig};
use falcon_rl::eval::EvalResult;
use falcon_rl::run_dir::RunDir;
use falcon_rl::train::{Observer, Start, StepRecord, TrainError};

#[derive(Args)]
pub struct TrainArgs {
    /// Run configuration (TOML); see docs/config.md and docs/train.md.
    #[arg(long)]
    config: PathBuf,
    /// Continue the run in <output_dir>/<name> from its newest valid checkpoint.
    #[arg(long, conflicts_with = "overwrite")]
    resume: bool,
    /// Delete what <output_dir>/<name> holds and start the run over.
    #[arg(long)]
    overwrite: bool,
    #[command(flatten)]
    lock: LockArgs,
    #[command(flatten)]
    set: SetArgs,
}

pub fn run(args: TrainArgs, job: Job) -> Result<()> {
    let cfg = RunConfig::from_file_with(&args.config, &args.set.set).map_err(usage)?;
    if args.resume {
        resume_keeps_what_was_trained(&cfg, &args.set.set)?;
    }
    let start = match (args.resume, args.overwrite) {
        (true, _) => Start::Resume,
        (_, true) => Start::Overwrite,
        _ => Start::New,
    };
    train(&cfg, job, start, args.lock)
}

/// The `--set` keys that may differ from the run being resumed: how long
/// it goes on, how often it saves and evaluates, and the held-out
/// evaluation itself (docs/config.md lists them).
pub const RESUMABLE: &[&str] = &[
    "train.steps",
    "train.max_minutes",
    "train.checkpoint_every",
    "train.keep_last",
    "train.eval_every",
    "train.eval_after",
    "eval.",
    "exec.workers",
];

/// On `--resume`, a `--set` that changes what the checkpoint was trained
/// with (anything outside [`RESUMABLE`]) is refused, naming the key and
/// both values.
fn resume_keeps_what_was_trained(
    cfg: &RunConfig,
    set: &[falcon_rl::config::Override],
) -> Result<()> {
    let saved_path = falcon_rl::run_dir::RunDir::of(cfg).config();
    let Ok(saved) = std::fs::read_to_string(&saved_path) else {
        return Ok(());
    };
    let saved: toml::Table = toml::from_str(&saved)
        .map_err(|e| usage(format!("{}: not a run config: {e}", saved_path.display())))?;
    let now: toml::Table = toml::from_str(&cfg.to_toml_string()?)?;
    let get = |t: &toml::Table, key: &str| -> Option<toml::Value> {
        let mut v = toml::Value::Table(t.clone());
        for part in key.split('.') {
            v = v.get(part)?.clone();
        }
        Some(v)
    };
    let mut changed = Vec::new();
    for (key, _) in set {
        if RESUMABLE
            .iter()
            .any(|r| key == r || (r.ends_with('.') && key.starts_with(r)))
        {
            continue;
        }
        let (was, is) = (get(&saved, key), get(&now, key));
        if was != is {
            let show = |v: Option<toml::Value>| v.map_or("(unset)".into(), |v| v.to_string());
            changed.push(format!(
                "{key}: trained with {}, now {}",
                show(was),
                show(is)
            ));
        }
    }
    if changed.is_empty() {
        return Ok(());
    }
    Err(usage(format!(
        "--resume: --set would change what {} was trained with:\n  {}\nstart a new run (another run.name) or resume without it; keys that may change on resume: {}",
        saved_path.parent().unwrap_or(&saved_path).display(),
        changed.join("\n  "),
        RESUMABLE.join(", ")
    )))
}

/// A training error as the CLI reports it: a config or task file that does
/// not work is the user's to fix (exit code 2).
pub fn train_error(e: TrainError) -> anyhow::Error {
    match e {
        TrainError::Config(_)
        | TrainError::Task(_)
        | TrainError::RunExists { .. }
        | TrainError::Checkpoint(_)
        | TrainError::Exec(falcon_rl::exec::ExecError::MissingModules { .. }) => usage(e),
        e => e.into(),
    }
}

/// Train (or resume) the run `cfg` describes, as `falcon train`, `falcon
/// sft` and each variant of `falcon ablate` do, holding the run
/// directory's writer lock throughout (rank 0 of a data-parallel run; the
/// other ranks never write it).
pub fn train(cfg: &RunConfig, job: Job, start: Start, lock: LockArgs) -> Result<()> {
    // In a data-parallel run rank 0 reports; the others say only what
    // concerns them (messages, tagged with their rank), as torchrun users
    // expect.
    let rank = falcon_rl::dist::Launch::from_env().map_or(0, |l| l.rank);
    let _lock = if rank == 0 {
        hold_lock(RunDir::of(cfg).path(), falcon_rl::run_dir::LOCK, lock)?
    } else {
        None
    };
    let mut progress = TrainProgress { bar: None, rank };
    let t0 = Instant::now();
    let outcome = falcon_rl::train::train(cfg, job, start, &mut progress).map_err(train_error)?;
    if let Some(b) = &progress.bar {
        b.finish_and_clear();
    }
    if rank > 0 {
        eprintln!(
            "falcon[rank {rank}]: {} steps in {:.1}s; rank 0 wrote the run",
            outcome.records.len(),
            t0.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    let d = &outcome.run_dir;
    eprintln!(
        "falcon: {} steps ({}) in {:.1}s; metrics {}, samples {}, checkpoints {}/step-N",
        outcome.records.len(),
        outcome.recipe.name(),
        t0.elapsed().as_secs_f64(),
        d.metrics().display(),
        d.samples().display(),
        d.path().display()
    );
    if !outcome.reward_means.is_empty() {
        let terms: Vec<String> = outcome
            .reward_means
            .iter()
            .map(|(k, v)| format!("{k} {v:+.3}"))
            .collect();
        eprintln!(
            "falcon: mean reward over the run's {} steps: {}",
            outcome.steps,
            terms.join(", ")
        );
    }
    let m = &outcome.memory;
    if m.long_term.is_some() || m.short_term.is_some() {
        let mut held = Vec::new();
        if let Some(n) = m.long_term {
            held.push(format!("{n} long-term entries"));
        }
        if let Some(n) = m.short_term {
            held.push(format!("{n} short-term rows"));
        }
        let top: Vec<String> = m
            .p_error
            .iter()
            .take(3)
            .map(|(k, p)| format!("{k} {p:.2}"))
            .collect();
        eprintln!(
            "falcon: memory holds {}; P_error over {} samples, top error kinds: {}",
            held.join(", "),
            m.p_error_samples,
            if top.is_empty() {
                "none yet".to_owned()
            } else {
                top.join(", ")
            }
        );
    }
    if let Some((b, a)) = &outcome.before_after {
        eprintln!("falcon: {}", before_after_line(b, a));
    }
    Ok(())
}

/// Held-out pass@1 before and after, on the same tasks: paired, so McNemar.
pub fn before_after_line(b: &EvalResult, a: &EvalResult) -> String {
    let (only_after, only_before, p) = a.mcnemar_vs(b);
    let k1 = |r: &EvalResult| 100.0 * r.pass(1).unwrap_or(f64::NAN);
    format!(
        "held-out pass@1 {:.1}% -> {:.1}% ({} tasks; solved only after: {only_after}, only before: {only_before}; McNemar exact p = {p:.3})",
        k1(b),
        k1(a),
        a.tasks.len()
    )
}

/// Progress for `falcon train`: a bar on a terminal, plain lines otherwise;
/// messages only on a data-parallel rank other than 0.
struct TrainProgress {
    bar: Option<indicatif::ProgressBar>,
    rank: usize,
}

impl Observer for TrainProgress {
    fn on_start(&mut self, first: u64, steps: u64) {
        use std::io::IsTerminal;
        if self.rank == 0 && std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new(steps).with_style(
                indicatif::ProgressStyle::with_template(
                    "step {pos}/{len} {bar:30} {msg} eta {eta}",
                )
                .expect("static template"),
            );
            bar.set_position(first);
            self.bar = Some(bar);
        }
    }

    fn on_step(&mut self, r: &StepRecord) {
        if self.rank > 0 {
            return;
        }
        let secs: f64 = r.seconds.values().sum();
        let msg = step_line(r);
        match &self.bar {
            Some(b) => {
                b.set_message(msg);
                b.inc(1);
            }
            // `step N` as metrics.jsonl and the plots count it.
            None => eprintln!("step {} {msg} ({secs:.1}s)", r.step),
        }
    }

    fn on_eval(&mut self, step: u64, path: &Path, r: &EvalResult) {
        let figures: Vec<String> = r
            .pass_at
            .iter()
            .map(|(k, v)| format!("pass@{k} {:.1}%", 100.0 * v))
            .chain(
                r.exec_at
                    .iter()
                    .map(|(k, v)| format!("exec@{k} {:.1}%", 100.0 * v)),
            )
            .collect();
        self.on_message(&format!(
            "eval at step {step}: {} on {} tasks in {:.1}s ({})",
            figures.join(", "),
            r.tasks.len(),
            r.seconds,
            path.display()
        ));
    }

    fn on_message(&mut self, m: &str) {
        match &self.bar {
            Some(b) => b.println(format!("falcon: {m}")),
            None if self.rank > 0 => eprintln!("falcon[rank {}]: {m}", self.rank),
            None => eprintln!("falcon: {m}"),
        }
    }
}

/// A step's figures in words, as the progress line shows them.
fn step_line(r: &StepRecord) -> String {
    let secs: f64 = r.seconds.values().sum();
    let loss = r.loss.get("total").copied().unwrap_or(f64::NAN);
    let mut msg = if r.samples == 0 {
        // SFT: nothing generated, nothing scored.
        format!("loss {loss:.4} lr {:.2e}", r.lr)
    } else {
        format!(
            "reward {:+.3} pass {:.0}% loss {loss:.4} {:.0} tok/s",
            r.reward.get("total").copied().unwrap_or(f64::NAN),
            100.0 * r.pass_rate,
            r.tokens_generated as f64
                / r.seconds.get("generate").copied().unwrap_or(secs).max(1e-9)
        )
    };
    if r.no_signal > 0 {
        // The sandbox (local or remote) could not run these: excluded
        // from the reward, and worth seeing before it becomes a trend.
        msg.push_str(&format!(
            "; {} of {} samples no signal (excluded)",
            r.no_signal, r.samples
        ));
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_line_says_how_many_samples_got_no_signal() {
        let mut r = StepRecord {
            step: 3,
            lr: 1e-4,
            loss: [("total".to_owned(), 0.5)].into(),
            reward: [("total".to_owned(), 1.25)].into(),
            pass_rate: 0.5,
            samples: 32,
            no_signal: 0,
            error_kinds: Default::default(),
            grad_norm: 1.0,
            tokens_generated: 100,
            seconds: [("generate".to_owned(), 2.0)].into(),
            mismatch: Default::default(),
        };
        assert_eq!(step_line(&r), "reward +1.250 pass 50% loss 0.5000 50 tok/s");
        r.no_signal = 4;
        assert!(
            step_line(&r).ends_with("; 4 of 32 samples no signal (excluded)"),
            "{}",
            step_line(&r)
        );
    }
}
