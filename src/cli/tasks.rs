//! `falcon tasks check` and `falcon tasks convert`: read a task file in any
//! supported format, say what it holds (and why rows were invalid), and write
//! it as our JSONL.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand};

use super::{usage, UsageError};
use falcon_rl::task::{LoadOptions, SkippedRecord, TaskFormat, TaskKind, TaskSet};

#[derive(Subcommand)]
pub enum TasksCmd {
    /// Read a task file (or a directory of parquet/arrow files) and print a
    /// summary, with invalid rows counted by reason.
    Check {
        #[command(flatten)]
        input: Input,
        /// Also write the tasks as falcon JSONL to this file.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Write any supported task file as falcon JSONL (HumanEval+/MBPP+ with
    /// their plus tests, expected values computed in the sandbox).
    Convert {
        #[command(flatten)]
        input: Input,
        /// The JSONL file to write.
        out: PathBuf,
    },
}

#[derive(Args)]
pub struct Input {
    /// A .jsonl/.json/.parquet/.arrow file, or a directory of parquet or
    /// arrow files (an HF `datasets` cache directory).
    file: PathBuf,
    /// auto, jsonl, humaneval, mbpp, pricoder, apps, codecontests,
    /// livecodebench, kodcode or verl.
    #[arg(long, default_value = "auto")]
    format: String,
    /// Skip malformed records (counted by reason) instead of failing.
    #[arg(long)]
    skip_invalid: bool,
    /// Read the file's column FOUND as EXPECTED (repeatable), as [tasks.columns].
    #[arg(long = "column", value_name = "EXPECTED=FOUND")]
    columns: Vec<String>,
    /// In a directory, read only this split's files (train, test, ...).
    #[arg(long)]
    split: Option<String>,
}

const FORMATS: &str =
    "auto, jsonl, humaneval, mbpp, pricoder, apps, codecontests, livecodebench, kodcode or verl";

impl Input {
    fn load(&self) -> Result<TaskSet> {
        let format: TaskFormat =
            serde_json::from_value(serde_json::Value::String(self.format.clone()))
                .map_err(|_| UsageError(format!("--format {}: use {FORMATS}", self.format)))?;
        let mut columns = BTreeMap::new();
        for c in &self.columns {
            let Some((want, found)) = c
                .split_once('=')
                .filter(|(w, f)| !w.is_empty() && !f.is_empty())
            else {
                return Err(UsageError(format!(
                    "--column {c:?}: write EXPECTED=FOUND, e.g. --column question=problem"
                ))
                .into());
            };
            columns.insert(want.to_owned(), found.to_owned());
        }
        let opts = LoadOptions {
            skip_invalid: self.skip_invalid,
            columns,
            split: self.split.clone(),
        };
        TaskSet::load(&self.file, format, opts).map_err(usage)
    }
}

pub fn run(cmd: TasksCmd) -> Result<()> {
    match cmd {
        TasksCmd::Check { input, out } => {
            let set = input.load()?;
            summarise(&input, &set);
            if let Some(out) = out {
                set.write_jsonl(&out)?;
                println!("wrote {}", out.display());
            }
        }
        TasksCmd::Convert { input, out } => {
            let mut set = input.load()?;
            if falcon_rl::eval::plus::needs_expansion(&set) {
                // HumanEval+/MBPP+: the written tests carry their expected
                // values, computed once from the canonical solutions.
                let sandbox = falcon_rl::exec::Sandbox::new(&Default::default())?;
                let n = falcon_rl::eval::plus::expand(&mut set, &sandbox)?;
                println!("EvalPlus: computed the base and plus tests of {n} tasks");
            }
            summarise(&input, &set);
            set.write_jsonl(&out)?;
            println!("wrote {} tasks to {}", set.len(), out.display());
        }
    }
    Ok(())
}

fn summarise(input: &Input, set: &TaskSet) {
    let file = input.file.display();
    for s in set.skipped.iter().take(20) {
        eprintln!("skipped {file}:{}: {}", s.line, s.reason);
    }
    if set.skipped.len() > 20 {
        eprintln!("... and {} more skipped", set.skipped.len() - 20);
    }
    let count = |k: TaskKind| set.iter().filter(|t| t.kind == k).count();
    let tests: usize = set.iter().map(|t| t.tests.len()).sum();
    println!(
        "{file}: {} tasks ({} python, {} numba_cuda, {} stdio), {tests} tests, {} skipped",
        set.len(),
        count(TaskKind::Python),
        count(TaskKind::NumbaCuda),
        count(TaskKind::Stdio),
        set.skipped.len()
    );
    for (reason, n) in by_reason(&set.skipped) {
        println!("  {n:>6} skipped: {reason}");
    }
}

/// Skipped records counted by the kind of reason, most frequent first.
fn by_reason(skipped: &[SkippedRecord]) -> Vec<(String, usize)> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for s in skipped {
        *counts.entry(s.category()).or_default() += 1;
    }
    let mut v: Vec<(String, usize)> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}
