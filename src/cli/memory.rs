//! `falcon memory stats|query|export|import`: a run's memory database.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Subcommand;

use super::{hold_lock, usage, LockArgs, UsageError};
use falcon_rl::config::RunConfig;
use falcon_rl::exec::MemoCoderClass;
use falcon_rl::memory::fixes::{
    FixEntry, FixKnowledge, Mentor, FIX_RECORD_KIND, MENTOR_RECORD_KEY, MENTOR_RECORD_KIND,
};
use falcon_rl::memory::guidelines::MemCoderMemory;
use falcon_rl::memory::render::{defined_functions, View};
use falcon_rl::memory::stats::ErrorStats;
use falcon_rl::memory::{long_term, open_long_term, Access, MemoryStore};
use falcon_rl::run_dir::RunDir;

#[derive(Subcommand)]
pub enum MemoryCmd {
    /// Entries by kind, vector spaces, P_error and mentor versions.
    Stats { run_dir: PathBuf },
    /// What would be retrieved for a text, and why (scores).
    Query {
        run_dir: PathBuf,
        /// The task text (long-term), error message (fixes) or API name (api).
        #[arg(long)]
        text: String,
        /// long-term, fixes or api.
        #[arg(long, default_value = "long-term")]
        what: String,
        /// How many results (default: [memory] top_k, or fixes.top_k).
        #[arg(long)]
        k: Option<usize>,
        /// Run config whose [memory] section applies (embedder, index);
        /// default: the run's own RUN_DIR/config.toml.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Also print FALCON's Table 7 prompt built from the long-term hits,
        /// rendered as the config's `[memory] render` says.
        #[arg(long)]
        prompt: bool,
    },
    /// Write the whole memory as JSONL (atomically).
    Export {
        run_dir: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
    /// Read a JSONL export into the run's memory (all or nothing).
    Import {
        run_dir: PathBuf,
        #[arg(long = "in")]
        input: PathBuf,
        #[command(flatten)]
        lock: LockArgs,
    },
}

/// A reading command must not create a database where there was none.
fn existing(dir: &Path) -> Result<MemoryStore> {
    let db = RunDir::new(dir).memory_db();
    if !db.is_file() {
        return Err(UsageError(format!(
            "{}: no memory database here (a `falcon train` run with [meta] long_term = true writes one)",
            db.display()
        ))
        .into());
    }
    Ok(MemoryStore::open(dir)?)
}

/// The config whose `[memory]` applies to `run_dir`: `--config`, else the
/// run's own `config.toml`, else the defaults.
fn run_config(run_dir: &Path, config: Option<&Path>) -> Result<RunConfig> {
    let own = RunDir::new(run_dir).config();
    match config {
        Some(f) => RunConfig::load(f).map_err(usage),
        None if own.is_file() => RunConfig::load(&own).map_err(usage),
        None => Ok(RunConfig::default()),
    }
}

pub fn run(cmd: MemoryCmd) -> Result<()> {
    match cmd {
        MemoryCmd::Stats { run_dir } => stats(&run_dir),
        MemoryCmd::Query {
            run_dir,
            text,
            what,
            k,
            config,
            prompt,
        } => query(&run_dir, &text, &what, k, config.as_deref(), prompt),
        MemoryCmd::Export { run_dir, out } => {
            let store = existing(&run_dir)?;
            let n = falcon_rl::fsutil::write_atomic_with(&out, |w, _| -> Result<u64> {
                Ok(store.export_jsonl(w)?)
            })?;
            println!("wrote {n} lines to {}", out.display());
            Ok(())
        }
        MemoryCmd::Import {
            run_dir,
            input,
            lock,
        } => {
            let f = std::fs::File::open(&input)
                .with_context(|| format!("reading {}", input.display()))?;
            // A run that is training writes this database too.
            let _lock = hold_lock(&run_dir, falcon_rl::run_dir::LOCK, lock)?;
            let mut store = MemoryStore::open(&run_dir)?;
            let sum = store
                .import_jsonl(std::io::BufReader::new(f))
                .map_err(|e| UsageError(format!("{}: {e}", input.display())))?;
            println!(
                "imported {} long-term entries and {} records into {}",
                sum.long_term,
                sum.records,
                store.path().display()
            );
            Ok(())
        }
    }
}

fn stats(run_dir: &Path) -> Result<()> {
    let store = existing(run_dir)?;
    println!("{}", store.path().display());
    for (kind, n) in store.counts()? {
        println!("  {kind:<24} {n}");
    }
    for (name, n) in store.embedders()? {
        println!("  vector space {name:<12} {n} long-term entries");
    }
    if let Some(stats) = ErrorStats::load(&store)? {
        println!(
            "  P_error over {} samples ({}):",
            stats.samples(),
            stats.mode().name()
        );
        for (kind, p) in stats.p_error() {
            println!("    {}: {p:.3}", kind.name());
        }
    }
    if let Some(m) = store.get_record::<Mentor>(MENTOR_RECORD_KIND, MENTOR_RECORD_KEY)? {
        for c in [
            MemoCoderClass::CompileError,
            MemoCoderClass::Exception,
            MemoCoderClass::AssertionFailure,
            MemoCoderClass::Timeout,
        ] {
            let s = m.class(c);
            println!(
                "  mentor {}: version {}, {} suggestions, {} new fixes pending",
                c.name(),
                s.version,
                s.suggestions.len(),
                s.pending.len()
            );
        }
    }
    Ok(())
}

fn query(
    run_dir: &Path,
    text: &str,
    what: &str,
    k: Option<usize>,
    config: Option<&Path>,
    prompt: bool,
) -> Result<()> {
    let cfg = run_config(run_dir, config)?;
    match what {
        "long-term" => {
            let k = k.unwrap_or(cfg.memory.top_k);
            let mut lt = open_long_term(&cfg.memory, run_dir, tch::Device::Cpu, Access::Read)
                .map_err(usage)?;
            let hits = lt
                .retrieve(&[text], k)?
                .into_iter()
                .next()
                .unwrap_or_default();
            println!(
                "{} of {} entries, {}",
                hits.len(),
                lt.entries.index().len(),
                lt.entries.index().describe()
            );
            for h in &hits {
                let r = &h.record;
                println!(
                    "  cos {:.4}  id {}  step {}  task {}  outcome {}\n    {}",
                    h.score,
                    h.id,
                    r.step,
                    r.task_id,
                    r.report.outcome_label(),
                    r.feedback.lines().next().unwrap_or("")
                );
            }
            if prompt {
                // The entry point is the first function the text defines.
                let entry = defined_functions(text)
                    .into_iter()
                    .next()
                    .unwrap_or_default();
                let mut view = View::new(cfg.memory.render, entry, cfg.memory.render_chars);
                println!("\n{}", long_term::table7_prompt(text, &hits, &mut view));
            }
        }
        "fixes" => {
            let store = existing(run_dir)?;
            let k = k.unwrap_or(cfg.memory.fixes.top_k);
            let fk = FixKnowledge::from_records(store.records::<FixEntry>(FIX_RECORD_KIND)?)?;
            let hits = fk.retrieve(text, k);
            println!(
                "{} of {} fixes share words with the query",
                hits.len(),
                fk.len()
            );
            for h in hits {
                println!(
                    "  {} words in a row  fix {}  {}: {}",
                    h.score,
                    h.id,
                    h.entry.error_kind.name(),
                    h.entry.error_message.lines().next().unwrap_or("")
                );
            }
        }
        "api" => {
            let store = existing(run_dir)?;
            let Some(mem) = MemCoderMemory::load(&store)? else {
                bail!(UsageError("this run has no MEMCoder memory".into()));
            };
            let Some(api) = mem.api(text) else {
                bail!(UsageError(format!("no API entry named {text:?}")));
            };
            println!(
                "{}{}\n  {}",
                api.name, api.doc.signature, api.doc.description
            );
            println!("  {} snippets, guidelines by weight:", api.snippets.len());
            for g in api.top_guidelines(usize::MAX) {
                println!("    [{}] w={:.2}  {}", g.id, g.weight, g.text);
            }
        }
        other => {
            return Err(UsageError(format!("--what {other}: use long-term, fixes or api")).into())
        }
    }
    Ok(())
}
