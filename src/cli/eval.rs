//! `falcon eval`: a strategy on `[eval]`'s tasks (`--out` keeps the result
//! and, with `[eval] checkpoint_tasks`, its finished groups); `eval compare`
//! and `eval rescore`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use super::{hold_lock, open_policy, usage, LockArgs, Progress, SetArgs, UsageError};
use falcon_rl::config::{Job, RunConfig, StrategyKind};
use falcon_rl::eval::job::{needs_policy, partial_dir, prepare_output, Progress as EvalProgress};
use falcon_rl::eval::{eval_tasks, rescore, EvalError, EvalResult};
use falcon_rl::exec::Sandbox;
use falcon_rl::model::ModelSpec;
use falcon_rl::run_dir::Start;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct EvalArgs {
    #[command(subcommand)]
    cmd: Option<EvalCmd>,
    /// Run configuration: `[model]`, `[generation]`, `[tasks]`/`[eval]`, `[exec]`.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Evaluate this training checkpoint (`runs/NAME/step-N`) instead of `[model]`.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Where the result JSON goes (default: print the summary only).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Prompt with FALCON's Table 7: the `[memory] top_k` most similar
    /// entries of this run's long-term memory (`RUN_DIR/memory.sqlite`,
    /// searched with `[memory] embedder`) instead of the zero-shot prompt.
    #[arg(long, value_name = "RUN_DIR")]
    memory: Option<PathBuf>,
    /// Continue the partial evaluation kept beside --out (`[eval]
    /// checkpoint_tasks`).
    #[arg(long, conflicts_with = "overwrite")]
    resume: bool,
    /// Replace an earlier evaluation at --out (and its partial groups).
    #[arg(long)]
    overwrite: bool,
    #[command(flatten)]
    lock: LockArgs,
    #[command(flatten)]
    set: SetArgs,
}

#[derive(Subcommand)]
enum EvalCmd {
    /// Compare two result files: pass@k and exec@k side by side, and
    /// McNemar's exact test on the tasks both evaluated (first sample each).
    Compare { a: PathBuf, b: PathBuf },
    /// Score a result's saved final answers again (after a fix to code
    /// extraction, the sandbox or the tests) without generating anything:
    /// exact for single-shot strategies; a repairing strategy's loop keeps
    /// the scoring it saw.
    Rescore {
        /// The result JSON to rescore (left as it is).
        result: PathBuf,
        /// The configuration it was evaluated with (`[eval]`/`[tasks]` for
        /// the task set, `[exec]` for the sandbox).
        #[arg(long)]
        config: PathBuf,
        /// Where the rescored result goes (and its `.tasks.jsonl`).
        #[arg(long)]
        out: PathBuf,
    },
}

/// An evaluation error as the CLI reports it: a config or task file that
/// does not work is the user's to fix.
fn eval_error(e: EvalError) -> anyhow::Error {
    match e {
        EvalError::Config(_)
        | EvalError::Task(_)
        | EvalError::Exec(falcon_rl::exec::ExecError::MissingModules { .. }) => usage(e),
        e => e.into(),
    }
}

/// The eval's progress bar, fed by the library.
struct Bar(Option<Progress>);

impl EvalProgress for Bar {
    fn message(&mut self, m: &str) {
        match &self.0 {
            Some(p) => p.println(m),
            None => eprintln!("falcon: {m}"),
        }
    }

    fn samples(&mut self, done: u64, total: u64) {
        let p = self
            .0
            .get_or_insert_with(|| Progress::new(total, "samples"));
        p.set_len(total);
        p.set(done);
    }
}

pub fn run(args: EvalArgs) -> Result<()> {
    match &args.cmd {
        Some(EvalCmd::Compare { a, b }) => return compare(a, b),
        Some(EvalCmd::Rescore {
            result,
            config,
            out,
        }) => return rescore_result(result, config, out),
        None => {}
    }
    let Some(config) = &args.config else {
        return Err(UsageError(
            "falcon eval needs --config FILE (or `compare A B`, `rescore RESULT`)".into(),
        )
        .into());
    };
    let mut cfg = RunConfig::from_file_with(config, &args.set.set).map_err(usage)?;
    // --memory RUN_DIR is FALCON prompting whatever [strategy] kind says.
    if let Some(run) = &args.memory {
        cfg.strategy.kind = StrategyKind::Falcon;
        cfg.strategy.memory_run = Some(run.clone());
    }
    cfg.check(Job::Eval).map_err(usage)?;
    // One writer per result file and its partial groups, for the whole run.
    let _lock = match &args.out {
        Some(out) => out_lock(out, args.lock)?,
        None => None,
    };
    if let Some(out) = &args.out {
        let start = match (args.resume, args.overwrite) {
            (true, _) => Start::Resume,
            (_, true) => Start::Overwrite,
            _ => Start::New,
        };
        prepare_output(out, start).map_err(usage)?;
    } else if args.resume || args.overwrite {
        return Err(usage("--resume and --overwrite go with --out FILE"));
    }
    let policy = match (&args.checkpoint, needs_policy(&cfg)) {
        (Some(dir), _) => Some(
            falcon_rl::train::checkpoint_policy(dir)
                .map_err(super::train::train_error)
                .with_context(|| format!("loading checkpoint {}", dir.display()))?
                .1,
        ),
        (None, true) => Some(open_policy(&ModelSpec::of(&cfg.model))?),
        (None, false) => None,
    };
    let mut bar = Bar(None);
    let result = falcon_rl::eval::job::run(
        &cfg,
        policy.as_ref(),
        args.checkpoint.as_deref(),
        args.out.as_deref(),
        &mut bar,
    )
    .map_err(eval_error)?;
    if let Some(p) = bar.0 {
        p.finish();
    }
    print_summary(&result);
    if let Some(out) = &args.out {
        write_result(&result, out)?;
        let dir = partial_dir(out);
        if dir.exists() {
            // The result is written: the groups are no longer needed.
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                eprintln!("falcon: warning: could not remove {}: {e}", dir.display());
            }
        }
    }
    Ok(())
}

/// The writer lock of `--out FILE`: `.FILE.lock` beside it.
fn out_lock(out: &Path, args: LockArgs) -> Result<Option<falcon_rl::fsutil::lock::DirLock>> {
    let (dir, name) = falcon_rl::fsutil::parent_and_name(out);
    hold_lock(dir, &format!(".{name}.lock"), args)
}

/// pass@k and exec@k on stdout, then [`eprint_details`].
fn print_summary(result: &EvalResult) {
    // EvalPlus's two figures side by side: base tests, then base + plus.
    for (k, v) in &result.base_pass_at {
        println!("base pass@{k}\t{:.4}", v);
    }
    if !result.base_pass_at.is_empty() {
        eprintln!("(HumanEval+/MBPP+ tasks: pass@k below counts base and plus tests, EvalPlus's \"plus\")");
    }
    for (k, v) in &result.pass_at {
        println!("pass@{k}\t{:.4}", v);
    }
    for (k, v) in &result.exec_at {
        println!("exec@{k}\t{:.4}", v);
    }
    eprint_details(result);
}

/// Outcomes, where kernels ran and the strategy's stats, on stderr.
fn eprint_details(result: &EvalResult) {
    let kinds: Vec<String> = result
        .outcomes
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    eprintln!(
        "falcon: {} tasks x {} samples in {:.1}s; outcomes: {}",
        result.tasks.len(),
        result.samples_per_task,
        result.seconds,
        kinds.join(", ")
    );
    if let Some(where_) = &result.cuda {
        eprintln!(
            "falcon: numba-cuda kernels ran on the {where_}{}",
            if where_ == "simulator" {
                ": these are simulator scores, not GPU scores"
            } else {
                ""
            }
        );
    }
    if !result.strategy_stats.is_empty() {
        let stats: Vec<String> = result
            .strategy_stats
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        eprintln!("falcon: {}: {}", result.strategy, stats.join(", "));
    }
}

/// The result as JSON at `out`, and one line per task beside it (for jq /
/// pandas), each written atomically.
fn write_result(result: &EvalResult, out: &Path) -> Result<()> {
    falcon_rl::fsutil::write_atomic(out, serde_json::to_string_pretty(result)?.as_bytes())
        .with_context(|| format!("writing {}", out.display()))?;
    let lines = out.with_extension("tasks.jsonl");
    let mut text = String::new();
    for t in &result.tasks {
        text.push_str(&serde_json::to_string(t)?);
        text.push('\n');
    }
    falcon_rl::fsutil::write_atomic(&lines, text.as_bytes())
        .with_context(|| format!("writing {}", lines.display()))?;
    eprintln!(
        "falcon: results in {} (one line per task: {})",
        out.display(),
        lines.display()
    );
    Ok(())
}

/// Tokens short of the limit at which an answer of an old result counts
/// as cut off.
const CUT_OFF_SLACK: usize = 8;

fn rescore_result(result: &Path, config: &Path, out: &Path) -> Result<()> {
    // The original is the only record of the old scoring: never replace it.
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same(result, out)
        || same(
            &result.with_extension("tasks.jsonl"),
            &out.with_extension("tasks.jsonl"),
        )
    {
        return Err(UsageError(format!(
            "--out {} would replace the result being rescored: write it elsewhere",
            out.display()
        ))
        .into());
    }
    let old = EvalResult::load(result).map_err(usage)?;
    let cfg = RunConfig::load(config).map_err(usage)?;
    let mut tasks = eval_tasks(&cfg).map_err(eval_error)?;
    let sandbox = Sandbox::new(&cfg.exec)?;
    falcon_rl::eval::plus::expand(&mut tasks, &sandbox)?;
    let list: Vec<&falcon_rl::task::Task> = tasks.iter().collect();
    sandbox.require_modules(&list).map_err(usage)?;
    let samples: usize = old.tasks.iter().map(|t| t.samples.len()).sum();
    eprintln!(
        "falcon: rescoring {samples} answers of {} tasks ({}) from {}",
        old.tasks.len(),
        old.strategy,
        result.display()
    );
    if old
        .tasks
        .iter()
        .flat_map(|t| &t.samples)
        .any(|s| !s.attempts.is_empty())
    {
        eprintln!(
            "falcon: note: {} repaired its answers; only the final answers are rescored, the repair loop saw the old scoring",
            old.strategy
        );
    }
    // Results written before `finish` was recorded: an answer whose text
    // re-encodes to within CUT_OFF_SLACK tokens of the limit ran into it
    // (re-encoding can merge a few of the sampled tokens).
    let unrecorded = old
        .tasks
        .iter()
        .flat_map(|t| &t.samples)
        .filter(|s| s.finish.is_none())
        .count();
    let policy = if unrecorded > 0 {
        eprintln!(
            "falcon: {unrecorded} answers do not say why they ended; those within {CUT_OFF_SLACK} tokens of max_new_tokens = {} count as cut off",
            cfg.generation.max_new_tokens
        );
        Some(open_policy(&ModelSpec::of(&cfg.model))?)
    } else {
        None
    };
    let limit = cfg.generation.max_new_tokens;
    let estimated = std::cell::Cell::new(0usize);
    let cut_off = |s: &falcon_rl::eval::SampleResult| -> bool {
        let Some(tok) = policy.as_ref().and_then(|p| p.tokenizer().ok()) else {
            return false;
        };
        let cut = tok
            .encode(&s.completion, false)
            .map(|ids| ids.len() + CUT_OFF_SLACK >= limit)
            .unwrap_or(false);
        estimated.set(estimated.get() + cut as usize);
        cut
    };
    let custom = falcon_rl::reward::CustomTerms::new(&cfg.reward.custom).map_err(usage)?;
    let r = rescore(&old, &list, &sandbox, &cut_off, Some(&custom)).map_err(usage)?;
    if unrecorded > 0 {
        eprintln!(
            "falcon: {} of the {unrecorded} count as cut off: only their complete statements ran",
            estimated.get()
        );
    }
    let moved: usize = r.changed.values().sum();
    eprintln!("falcon: {moved} of {samples} outcomes changed");
    for ((from, to), n) in &r.changed {
        eprintln!("falcon:   {from} -> {to}: {n}");
    }
    println!("metric\tbefore\tafter");
    for (name, before, after) in [
        ("pass", &old.pass_at, &r.result.pass_at),
        ("exec", &old.exec_at, &r.result.exec_at),
    ] {
        for (k, a) in after {
            match before.get(k) {
                Some(b) => println!("{name}@{k}\t{b:.4}\t{a:.4}"),
                None => println!("{name}@{k}\t-\t{a:.4}"),
            }
        }
    }
    // The user's own terms: their mean over the answers that got a value.
    let mut means: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    for (k, v) in r
        .result
        .tasks
        .iter()
        .flat_map(|t| &t.samples)
        .flat_map(|s| &s.rewards)
    {
        let e = means.entry(k).or_insert((0.0, 0));
        (e.0, e.1) = (e.0 + v, e.1 + 1);
    }
    for (k, (sum, n)) in means {
        println!("reward/{k}\t-\t{:.4}", sum / n as f64);
        eprintln!("falcon: reward/{k}: {n} of {samples} answers got a value");
    }
    eprint_details(&r.result);
    write_result(&r.result, out)
}

fn compare(a: &Path, b: &Path) -> Result<()> {
    let ra = EvalResult::load(a).map_err(usage)?;
    let rb = EvalResult::load(b).map_err(usage)?;
    let ids: std::collections::BTreeSet<&str> = ra.tasks.iter().map(|t| t.id.as_str()).collect();
    let common = rb
        .tasks
        .iter()
        .filter(|t| ids.contains(t.id.as_str()))
        .count();
    if common == 0 {
        return Err(usage(format!(
            "{} ({} tasks) and {} ({} tasks) share no task: their pass@k are not comparable and McNemar has nothing to pair; compare two evaluations of the same task set",
            a.display(),
            ra.tasks.len(),
            b.display(),
            rb.tasks.len()
        )));
    }
    if common < ra.tasks.len().max(rb.tasks.len()) {
        eprintln!(
            "falcon: note: only {common} tasks are in both; pass@k below is over each file's own tasks, the tests over the {common} in common"
        );
    }
    println!("metric\tA\tB\tB - A");
    for (name, ma, mb) in [
        ("pass", &ra.pass_at, &rb.pass_at),
        ("exec", &ra.exec_at, &rb.exec_at),
    ] {
        for (k, va) in ma {
            if let Some(vb) = mb.get(k) {
                println!("{name}@{k}\t{va:.4}\t{vb:.4}\t{:+.4}", vb - va);
            }
        }
    }
    let (only_a, only_b, p) = ra.mcnemar_vs(&rb);
    println!(
        "tasks\t{}\t{}\t{common} in common",
        ra.tasks.len(),
        rb.tasks.len()
    );
    println!(
        "McNemar (first sample per task): solved only by A {only_a}, only by B {only_b}, exact p = {p:.4}"
    );
    let (more_a, more_b, p) = ra.sign_test_vs(&rb);
    println!(
        "Sign test (share of passing samples per task): higher in A {more_a}, higher in B {more_b}, exact p = {p:.4}"
    );
    Ok(())
}
