//! `falcon ablate --grid FILE`: train every variant of a grid, then the
//! summary table and plots.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use super::{usage, LockArgs, SetArgs};
use falcon_rl::config::Job;
use falcon_rl::report::ablation::{finish_variant, summary_markdown, write_summary, SummaryError};
use falcon_rl::run_dir::RunDir;
use falcon_rl::train::ablate::{prepare_variant, AblateError, Grid, VariantState};
use falcon_rl::train::Start;

#[derive(Args)]
pub struct AblateArgs {
    /// The grid (TOML): `base`, `name`, optional `set`, and `[[variant]]`
    /// tables with `name` and `set` (dotted config keys).
    #[arg(long)]
    grid: PathBuf,
    /// Resolve and check every variant (as `falcon config check` does) and
    /// say what would run; train nothing.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    lock: LockArgs,
    /// Applied to every variant after the grid's own top-level `set` and
    /// before each variant's keys.
    #[command(flatten)]
    set: SetArgs,
}

/// A failed write is ours; a grid, base or run directory that cannot be
/// read or used is the user's to fix.
fn ablate_error(e: AblateError) -> anyhow::Error {
    match e {
        AblateError::Io(_) => e.into(),
        e => usage(e),
    }
}

/// The same split for the summary: a failed write is ours, a run directory
/// that cannot be summarised or drawn is the user's.
fn summary_error(e: SummaryError) -> anyhow::Error {
    match e {
        SummaryError::Io(_) => e.into(),
        e => usage(e),
    }
}

pub fn run(args: AblateArgs) -> Result<()> {
    let mut grid = Grid::load(&args.grid).map_err(ablate_error)?;
    grid.set.extend(args.set.set.iter().cloned());
    let out = grid.output_dir().map_err(ablate_error)?;
    // Every variant's config first: a typo in the last one should not
    // surface after hours of training the others.
    let cfgs = grid
        .variants
        .iter()
        .map(|v| grid.resolve(v))
        .collect::<Result<Vec<_>, _>>()
        .map_err(ablate_error)?;
    let n = cfgs.len();
    if args.dry_run {
        for (v, cfg) in grid.variants.iter().zip(&cfgs) {
            let dir = RunDir::of(cfg);
            let state = if dir.ablate_done().is_file() {
                "finished"
            } else if dir.path().exists() {
                "started"
            } else {
                "new"
            };
            let set: Vec<String> = grid
                .set
                .iter()
                .chain(&v.set)
                .map(|(k, v)| format!("{k} = {v}"))
                .collect();
            println!(
                "{}\t{state}\t{}\t{}",
                v.name,
                dir.path().display(),
                if set.is_empty() {
                    "(base)".into()
                } else {
                    set.join(", ")
                }
            );
        }
        let mut unusable = Vec::new();
        for cfg in &cfgs {
            for p in falcon_rl::reward::custom::check_all(&cfg.reward.custom) {
                unusable.push(format!("  {}: {p}", cfg.run.name));
            }
        }
        if !unusable.is_empty() {
            return Err(usage(format!(
                "the grid resolves, but reward terms are not usable:\n{}",
                unusable.join("\n")
            )));
        }
        eprintln!(
            "falcon: {n} variants of {} resolve and validate",
            grid.base.display()
        );
        return Ok(());
    }
    let mut rows = Vec::with_capacity(n);
    for (i, cfg) in cfgs.iter().enumerate() {
        let name = &cfg.run.name;
        let state = prepare_variant(cfg).map_err(ablate_error)?;
        let resume = match state {
            VariantState::Finished(row) => {
                eprintln!(
                    "falcon: variant {}/{n} {name}: finished before, not rerun",
                    i + 1
                );
                rows.push(row);
                continue;
            }
            VariantState::Started => true,
            VariantState::New => false,
        };
        eprintln!(
            "falcon: variant {}/{n} {name}{} in {}",
            i + 1,
            if resume { ", resuming" } else { "" },
            RunDir::of(cfg).path().display()
        );
        let start = if resume { Start::Resume } else { Start::New };
        super::train::train(cfg, Job::Train, start, args.lock)
            .with_context(|| format!("variant `{name}`"))?;
        rows.push(finish_variant(cfg).map_err(summary_error)?);
    }
    let files = write_summary(&grid, &out, &rows).map_err(summary_error)?;
    print!("{}", summary_markdown(&grid, &rows));
    eprintln!(
        "falcon: {n} variants; summary {} ({} files in {})",
        out.join("summary.md").display(),
        files.len(),
        out.display()
    );
    Ok(())
}
