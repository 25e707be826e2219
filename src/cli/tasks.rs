//! `falcon tasks check`: parse a task file and say what it holds.

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;

use super::{usage, UsageError};
use falcon_rl::task::{LoadOptions, TaskFormat, TaskKind, TaskSet};

#[derive(Subcommand)]
pub enum TasksCmd {
    /// Parse a task file (own JSONL, HumanEval, MBPP, PriCoder) and print a summary.
    Check {
        file: PathBuf,
        /// auto, jsonl, humaneval, mbpp or pricoder.
        #[arg(long, default_value = "auto")]
        format: String,
        /// Skip malformed records (each is reported and counted) instead of failing.
        #[arg(long)]
        skip_invalid: bool,
        /// Also write the tasks as falcon JSONL to this file.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

pub fn run(cmd: TasksCmd) -> Result<()> {
    let TasksCmd::Check {
        file,
        format,
        skip_invalid,
        out,
    } = cmd;
    let format: TaskFormat = serde_json::from_value(serde_json::Value::String(format.clone()))
        .map_err(|_| {
            UsageError(format!(
                "--format {format}: use auto, jsonl, humaneval, mbpp or pricoder"
            ))
        })?;
    let set = TaskSet::load(&file, format, LoadOptions { skip_invalid }).map_err(usage)?;
    for s in &set.skipped {
        eprintln!("skipped {}:{}: {}", file.display(), s.line, s.reason);
    }
    let numba = set.iter().filter(|t| t.kind == TaskKind::NumbaCuda).count();
    let tests: usize = set.iter().map(|t| t.tests.len()).sum();
    println!(
        "{}: {} tasks ({} python, {numba} numba_cuda), {tests} tests, {} skipped",
        file.display(),
        set.len(),
        set.len() - numba,
        set.skipped.len()
    );
    if let Some(out) = out {
        set.write_jsonl(&out)?;
        println!("wrote {}", out.display());
    }
    Ok(())
}
