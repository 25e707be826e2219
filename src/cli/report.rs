//! `falcon report`: plots and an index.html for a run directory or a
//! directory of evaluation results.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use super::usage;
use falcon_rl::report::{load_run, write_report};
use falcon_rl::run_dir::RunDir;

#[derive(Args)]
pub struct ReportArgs {
    /// A run directory (`runs/NAME`) or a directory of evaluation result files.
    run_dir: PathBuf,
    /// Where the plots and index.html go (default: RUN_DIR/report).
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(args: ReportArgs) -> Result<()> {
    // Whatever is wrong with what the user pointed at is theirs to fix.
    let data = load_run(&args.run_dir).map_err(usage)?;
    for n in &data.notes {
        eprintln!("falcon: {n}");
    }
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| RunDir::new(&args.run_dir).report());
    let w = write_report(&data, &out)?;
    eprintln!(
        "falcon: {} steps, {} evaluation results: {} files in {}",
        data.metrics.len(),
        data.evals.len(),
        w.files.len(),
        out.display()
    );
    println!("{}", w.index.display());
    Ok(())
}
