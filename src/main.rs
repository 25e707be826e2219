//! `falcon`: the command line. This file only parses the command and
//! dispatches; each subcommand lives in its own file under `cli/`, which
//! parses its arguments, calls the library and prints. Exit codes: 0 ok,
//! 1 failure, 2 bad usage or input. Library errors become `anyhow` errors
//! with context in `cli/` and nowhere else.

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use cli::UsageError;

#[derive(Parser)]
#[command(
    name = "falcon",
    version,
    about = "falcon-rl: RL from execution feedback for code LMs"
)]
struct Cli {
    /// CPU threads for libtorch (default: libtorch's own choice).
    #[arg(long, global = true)]
    threads: Option<i32>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Show versions, threads and whether CUDA is usable.
    Info,
    /// Generate completions for one or more prompts.
    Generate(cli::generate::GenerateArgs),
    /// Chat with a model interactively (one user turn per line; `/reset`, `/quit`).
    Chat(cli::chat::ChatArgs),
    /// Convert between model formats.
    #[command(subcommand)]
    Convert(cli::convert::ConvertCmd),
    /// Write an HF model directory (and a PEFT adapter directory when LoRA is on).
    Export(cli::export::ExportArgs),
    /// Check or show a run configuration.
    #[command(subcommand)]
    Config(cli::config::ConfigCmd),
    /// Write the model's logits for token ids to a safetensors file (parity checks).
    Score(cli::score::ScoreArgs),
    /// Load a task file and report what it holds (or where it is malformed).
    #[command(subcommand)]
    Tasks(cli::tasks::TasksCmd),
    /// Run code samples against their tasks in the sandbox and score them.
    Exec(cli::exec::ExecArgs),
    /// Serve the execution sandbox over HTTP (SandboxFusion's API and ours).
    #[command(subcommand)]
    Sandbox(cli::sandbox::SandboxCmd),
    /// Train the policy with RL from execution feedback: the single-level
    /// loop, or FALCON's meta-RL when `[meta] algorithm` is set.
    Train(cli::train::TrainArgs),
    /// Supervised fine-tuning on the task set's reference solutions (same
    /// config, checkpoints and metrics as `train`; warm-starts an RL run
    /// through `[train] init_from`).
    Sft(cli::train::TrainArgs),
    /// Evaluate the config's model (or a checkpoint) on `[eval]`'s tasks:
    /// pass@k / exec@k, per-task results, error kinds.
    Eval(cli::eval::EvalArgs),
    /// Inspect, query, export or import a run's memory database.
    #[command(subcommand)]
    Memory(cli::memory::MemoryCmd),
    /// Plots (PNG and SVG) and an index.html with tables for a run directory
    /// (metrics.jsonl, eval/step-N.json) or a directory of `falcon eval --out`
    /// results; see docs/report.md.
    Report(cli::report::ReportArgs),
    /// Train every variant of a grid (a base config plus named overrides)
    /// with the same seeds, one after the other; a finished variant is not
    /// rerun, an interrupted one resumes. Then summary.md, summary.csv and
    /// plots; see docs/train.md ("Ablations").
    Ablate(cli::ablate::AblateArgs),
    /// Compile the custom CUDA kernels (no GPU needed), or measure one
    /// against its libtorch reference on a GPU.
    #[command(subcommand)]
    Kernels(cli::kernels::KernelsCmd),
}

fn run(cli: Cli) -> anyhow::Result<()> {
    if let Some(n) = cli.threads {
        if n < 1 {
            return Err(UsageError(format!("--threads {n}: must be >= 1")).into());
        }
        tch::set_num_threads(n);
    }
    // Probe CUDA before any tensor exists, so a GPU machine's libtorch_cuda
    // registers itself first.
    let _ = falcon_rl::model::device::cuda_status();
    match cli.cmd {
        Cmd::Info => cli::info::run(),
        Cmd::Kernels(c) => cli::kernels::run(c),
        Cmd::Generate(a) => cli::generate::run(a),
        Cmd::Chat(a) => cli::chat::run(a),
        Cmd::Convert(c) => cli::convert::run(c),
        Cmd::Export(a) => cli::export::run(a),
        Cmd::Config(c) => cli::config::run(c),
        Cmd::Score(a) => cli::score::run(a),
        Cmd::Tasks(t) => cli::tasks::run(t),
        Cmd::Exec(a) => cli::exec::run(a),
        Cmd::Sandbox(c) => cli::sandbox::run(c),
        Cmd::Train(a) => cli::train::run(a, falcon_rl::config::Job::Train),
        Cmd::Sft(a) => cli::train::run(a, falcon_rl::config::Job::Sft),
        Cmd::Eval(a) => cli::eval::run(a),
        Cmd::Memory(c) => cli::memory::run(c),
        Cmd::Report(a) => cli::report::run(a),
        Cmd::Ablate(a) => cli::ablate::run(a),
    }
}

/// libtorch's OpenMP threads spin between parallel regions by default. When
/// another process holds a core (the sandbox, a build, a second job), the
/// spinning threads fight it and decoding got 10-17x slower here (5.8 vs
/// 98 tokens/s, batch 8). libgomp reads `OMP_WAIT_POLICY` when it is
/// loaded, before `main`, so the variable is set and the binary re-executed
/// once; a value the user set is left alone.
fn passive_openmp() {
    use std::os::unix::process::CommandExt;
    if std::env::var_os("OMP_WAIT_POLICY").is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("OMP_WAIT_POLICY", "PASSIVE")
        .exec();
    // exec only returns on failure; carry on with the default policy.
    eprintln!("falcon: could not re-execute with OMP_WAIT_POLICY=PASSIVE: {err}");
}

/// Keep freed tensor memory in the heap instead of handing it back to the
/// kernel at each free. glibc maps allocations from 128 KiB up (the limit
/// moves up to 32 MiB as they are freed) and trims the heap's top past twice
/// that, so the per-step tensors of a batched decode (a 32 × 49152 logits
/// tensor is 6 MiB) came back as fresh pages, each faulted and zeroed again:
/// about 10% of a batch-32 generation's main thread (perf). With the
/// threshold at its 32 MiB maximum and the heap trimmed past 512 MiB, batch-
/// 32 generation took 7% less time for about 210 MiB more peak memory (median of
/// 5 alternated runs).
fn keep_freed_memory() {
    // SAFETY: mallopt only sets allocator parameters; called before any
    // other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
    }
}

impl Cmd {
    /// Whether the command may run libtorch (its OpenMP threads, its
    /// tensors). The others (the sandbox, task files, configs, reports) skip
    /// the re-execution of [`passive_openmp`], which was half of a short
    /// `falcon exec`'s start, and keep glibc's own heap policy, under which
    /// loading a large task file peaks lower than under [`keep_freed_memory`].
    fn uses_libtorch(&self) -> bool {
        match self {
            Cmd::Exec(a) => a.uses_model(),
            Cmd::Sandbox(_) | Cmd::Tasks(_) | Cmd::Config(_) | Cmd::Report(_) => false,
            _ => true,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.cmd.uses_libtorch() {
        passive_openmp();
        keep_freed_memory();
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", cli::report(&e));
            if e.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}
