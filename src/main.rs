//! `falcon`: the command line. Subcommands, progress on stderr, exit codes
//! (0 ok, 1 failure, 2 bad usage or input). Library errors become `anyhow`
//! errors with context here and nowhere else.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use falcon_rl::config::RunConfig;
use falcon_rl::model::device::{cuda_status, parse_device};
use falcon_rl::model::export::{export_hf, export_peft, load_peft};
use falcon_rl::model::gguf::{convert_to_hf, OutDtype};
use falcon_rl::model::hub;
use falcon_rl::model::sampling::Sampler;
use falcon_rl::model::{ChatMessage, Dtype, GenerationParams, Generator, Policy};
use falcon_rl::task::{LoadOptions, TaskFormat, TaskKind, TaskSet};

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
    Generate(GenerateArgs),
    /// Chat with a model interactively (one user turn per line; `/reset`, `/quit`).
    Chat(ChatArgs),
    /// Convert between model formats.
    #[command(subcommand)]
    Convert(ConvertCmd),
    /// Write an HF model directory (and a PEFT adapter directory when LoRA is on).
    Export(ExportArgs),
    /// Check or show a run configuration.
    #[command(subcommand)]
    Config(ConfigCmd),
    /// Write the model's logits for token ids to a safetensors file (parity checks).
    Score(ScoreArgs),
    /// Load a task file and report what it holds (or where it is malformed).
    #[command(subcommand)]
    Tasks(TasksCmd),
    /// Run code samples against their tasks in the sandbox and score them.
    Exec(ExecArgs),
    /// Train the policy with RL from execution feedback (the single-level loop).
    Train(TrainArgs),
    /// Supervised fine-tuning on the task set's reference solutions (same
    /// config, checkpoints and metrics as `train`; warm-starts an RL run
    /// through `[train] init_from`).
    Sft(TrainArgs),
    /// Evaluate the config's model (or a checkpoint) on `[eval]`'s tasks:
    /// pass@k / exec@k, per-task results, error kinds.
    Eval(EvalArgs),
    /// Inspect, query, export or import a run's memory database.
    #[command(subcommand)]
    Memory(MemoryCmd),
    /// Plots (PNG and SVG) and an index.html with tables for a run directory
    /// (metrics.jsonl, eval/step-N.json) or a directory of `falcon eval --out`
    /// results; see docs/report.md.
    Report(ReportArgs),
    /// Train every variant of a grid (a base config plus named overrides)
    /// with the same seeds, one after the other; a finished variant is not
    /// rerun, an interrupted one resumes. Then summary.md, summary.csv and
    /// plots; see docs/train.md ("Ablations").
    Ablate(AblateArgs),
}

#[derive(Args)]
struct AblateArgs {
    /// The grid (TOML): `base`, `name`, optional `set`, and `[[variant]]`
    /// tables with `name` and `set` (dotted config keys).
    #[arg(long)]
    grid: PathBuf,
    /// Resolve and validate every variant and say what would run; train nothing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Args)]
struct ReportArgs {
    /// A run directory (`runs/NAME`) or a directory of evaluation result files.
    run_dir: PathBuf,
    /// Where the plots and index.html go (default: RUN_DIR/report).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Args)]
struct TrainArgs {
    /// Run configuration (TOML); see docs/config.md and docs/train.md.
    #[arg(long)]
    config: PathBuf,
    /// Continue the run in <output_dir>/<name> from its newest valid checkpoint.
    #[arg(long)]
    resume: bool,
}

#[derive(Subcommand)]
enum MemoryCmd {
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
        /// Run config whose [memory] section applies (embedder, index).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Also print FALCON's Table 7 prompt built from the long-term hits.
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
    },
}

#[derive(Args)]
struct ExecArgs {
    /// Task file (own JSONL, HumanEval, MBPP, PriCoder).
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

#[derive(Subcommand)]
enum TasksCmd {
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

#[derive(Args)]
struct ScoreArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// JSON file: a list of equal-length lists of token ids.
    #[arg(long)]
    ids: PathBuf,
    /// Output safetensors file with one fp32 tensor `logits` [batch, seq, vocab].
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args, Clone)]
struct ModelArgs {
    /// Local HF directory, .gguf file, HF repo id in the local cache, or `embedded`.
    #[arg(long, default_value = hub::EMBEDDED)]
    model: String,
    /// fp32, bf16 or fp16.
    #[arg(long, default_value = "fp32")]
    dtype: String,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    device: String,
    /// A PEFT LoRA adapter directory to attach.
    #[arg(long)]
    adapter: Option<PathBuf>,
}

#[derive(Args, Clone)]
struct SamplingArgs {
    #[arg(long, default_value_t = 256)]
    max_new_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// 0 = off.
    #[arg(long, default_value_t = 0)]
    top_k: i64,
    /// 1 = off.
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop when this string appears (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// System message (chat mode).
    #[arg(long)]
    system: Option<String>,
    /// Do not stop at end-of-sequence tokens (fixed-length benchmarks).
    #[arg(long)]
    ignore_eos: bool,
}

impl SamplingArgs {
    fn params(&self, chat: bool) -> Result<GenerationParams> {
        if self.temperature < 0.0 {
            bail!("--temperature {}: must be >= 0", self.temperature);
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            bail!("--top-p {}: must be in (0, 1]", self.top_p);
        }
        if self.top_k < 0 {
            bail!("--top-k {}: must be >= 0", self.top_k);
        }
        Ok(GenerationParams {
            max_new_tokens: self.max_new_tokens,
            sampler: Sampler {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
            },
            seed: Some(self.seed),
            stop: self.stop.clone(),
            chat,
            system: self.system.clone(),
            ignore_eos: self.ignore_eos,
        })
    }
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// A prompt (repeatable; each is one row of the batch).
    #[arg(long)]
    prompt: Vec<String>,
    /// A file with one JSON string or plain line per prompt.
    #[arg(long)]
    prompts_file: Option<PathBuf>,
    /// Format each prompt as a user turn with the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Repeat the prompt list N times in one batch (for throughput runs).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Print one JSON object per completion plus a summary line.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
}

#[derive(Subcommand)]
enum ConvertCmd {
    /// GGUF (F32/F16/BF16/Q8_0/Q4_0/Q4_1) → HF directory (safetensors, config, tokenizer).
    Gguf {
        input: PathBuf,
        output: PathBuf,
        /// Weight dtype written: f32, bf16 or f16.
        #[arg(long, default_value = "f32")]
        dtype: String,
    },
}

#[derive(Args)]
struct ExportArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Export a training checkpoint (`runs/NAME/step-N`) instead of --model/--adapter.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Where the HF model directory goes.
    #[arg(long)]
    out: PathBuf,
    /// Where the PEFT adapter directory goes (default: <out>-adapter when an adapter is loaded).
    #[arg(long)]
    peft_out: Option<PathBuf>,
    /// Replace existing output directories.
    #[arg(long)]
    overwrite: bool,
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
struct EvalArgs {
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

#[derive(Subcommand)]
enum ConfigCmd {
    /// Parse and validate; print every problem with its key path.
    Check { file: PathBuf },
    /// Print the resolved configuration, defaults included.
    Show { file: PathBuf },
}

/// An error that is the user's to fix (exit code 2), not a failure of ours.
#[derive(Debug)]
struct UsageError(String);
impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for UsageError {}

fn load_policy(m: &ModelArgs) -> Result<Policy> {
    let dtype: Dtype = m.dtype.parse().map_err(UsageError)?;
    let device = parse_device(&m.device)?;
    let dir = hub::resolve(&m.model)?;
    let t0 = Instant::now();
    let mut policy = Policy::load(&dir, dtype, device)
        .with_context(|| format!("loading model from {}", dir.display()))?;
    if let Some(a) = &m.adapter {
        load_peft(&mut policy, a).with_context(|| format!("loading adapter {}", a.display()))?;
    }
    eprintln!(
        "falcon: loaded {} ({:?}, {}, {:?}) in {:.1}s",
        dir.display(),
        policy.family,
        dtype.as_str(),
        device,
        t0.elapsed().as_secs_f64()
    );
    Ok(policy)
}

/// The policy of a run config's `[model]` section.
fn load_config_policy(cfg: &RunConfig) -> Result<Policy> {
    load_policy(&ModelArgs {
        model: cfg.model.path.clone(),
        dtype: cfg.model.dtype.as_str().to_owned(),
        device: cfg.model.device.clone(),
        adapter: None,
    })
}

fn read_prompts(args: &GenerateArgs) -> Result<Vec<String>> {
    let mut prompts = args.prompt.clone();
    if let Some(f) = &args.prompts_file {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let p = if line.trim_start().starts_with('"') {
                serde_json::from_str::<String>(line).map_err(|e| {
                    UsageError(format!("{}:{}: not a JSON string: {e}", f.display(), i + 1))
                })?
            } else {
                line.to_string()
            };
            prompts.push(p);
        }
    }
    if prompts.is_empty() {
        return Err(UsageError("no prompt: pass --prompt or --prompts-file".into()).into());
    }
    let n = prompts.len();
    Ok(prompts
        .into_iter()
        .cycle()
        .take(n * args.repeat.max(1))
        .collect())
}

fn cmd_generate(args: GenerateArgs) -> Result<()> {
    let prompts = read_prompts(&args)?;
    let params = args.sampling.params(args.chat)?;
    let policy = load_policy(&args.model)?;
    let t0 = Instant::now();
    let outs = policy.generate(&prompts, &params)?;
    let secs = t0.elapsed().as_secs_f64();
    let new_tokens: usize = outs.iter().map(|c| c.token_ids.len()).sum();
    let tps = new_tokens as f64 / secs.max(1e-9);
    if args.json {
        for (p, c) in prompts.iter().zip(&outs) {
            let v = serde_json::json!({ "prompt": p, "completion": c });
            println!("{v}");
        }
        let summary = serde_json::json!({
            "summary": { "batch": outs.len(), "new_tokens": new_tokens, "seconds": secs,
                         "tokens_per_second": tps }
        });
        println!("{summary}");
    } else {
        for (i, c) in outs.iter().enumerate() {
            if outs.len() > 1 {
                println!("--- [{i}] ({:?}, {} tokens)", c.finish, c.token_ids.len());
            }
            println!("{}", c.text);
        }
    }
    eprintln!(
        "falcon: {} sequence(s), {new_tokens} new tokens in {secs:.2}s = {tps:.1} tokens/s",
        outs.len()
    );
    Ok(())
}

fn cmd_chat(args: ChatArgs) -> Result<()> {
    let params = args.sampling.params(true)?;
    let policy = load_policy(&args.model)?;
    let tok = policy.tokenizer()?;
    let mut history: Vec<ChatMessage> = Vec::new();
    if let Some(s) = &params.system {
        history.push(ChatMessage::new("system", s));
    }
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    loop {
        write!(out, "> ")?;
        out.flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim();
        match line {
            "" => continue,
            "/quit" | "/exit" => break,
            "/reset" => {
                history.retain(|m| m.role == "system");
                continue;
            }
            _ => {}
        }
        history.push(ChatMessage::new("user", line));
        let text = tok.apply_chat_template(&history, true)?;
        let ids = tok.encode(&text, false)?;
        let c = policy
            .generate_ids(&[ids], &params)?
            .pop()
            .context("no completion returned")?;
        println!("{}", c.text.trim_end());
        history.push(ChatMessage::new("assistant", c.text.trim_end()));
    }
    Ok(())
}

fn cmd_export(args: ExportArgs) -> Result<()> {
    let (policy, dtype) = match &args.checkpoint {
        Some(dir) => {
            let (cfg, policy) = falcon_rl::train::rl::policy_from_checkpoint(dir)
                .with_context(|| format!("loading checkpoint {}", dir.display()))?;
            (policy, cfg.model.dtype)
        }
        None => (
            load_policy(&args.model)?,
            args.model.dtype.parse().map_err(UsageError)?,
        ),
    };
    let out = export_hf(&policy, &args.out, dtype, args.overwrite)?;
    println!("wrote HF model directory {}", out.display());
    if policy.lora.is_some() {
        let peft_out = args
            .peft_out
            .clone()
            .unwrap_or_else(|| sibling(&args.out, "-adapter"));
        let p = export_peft(&policy, &peft_out, args.overwrite)?;
        println!("wrote PEFT adapter directory {}", p.display());
    }
    Ok(())
}

fn sibling(p: &Path, suffix: &str) -> PathBuf {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    p.with_file_name(format!("{name}{suffix}"))
}

fn cmd_config(cmd: ConfigCmd) -> Result<()> {
    let (ConfigCmd::Check { file } | ConfigCmd::Show { file }) = &cmd;
    let cfg = RunConfig::load(file).map_err(|e| UsageError(e.to_string()))?;
    match cmd {
        ConfigCmd::Check { file } => println!("{}: ok", file.display()),
        ConfigCmd::Show { .. } => print!("{}", cfg.to_toml_string()?),
    }
    Ok(())
}

fn cmd_score(args: ScoreArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.ids)
        .with_context(|| format!("reading {}", args.ids.display()))?;
    let ids: Vec<Vec<i64>> = serde_json::from_str(&text).map_err(|e| {
        UsageError(format!(
            "{}: not a list of lists of ids: {e}",
            args.ids.display()
        ))
    })?;
    let width = ids.first().map(Vec::len).unwrap_or(0);
    if width == 0 || ids.iter().any(|r| r.len() != width) {
        return Err(UsageError(format!(
            "{}: rows must be non-empty and equally long",
            args.ids.display()
        ))
        .into());
    }
    let policy = load_policy(&args.model)?;
    let flat: Vec<i64> = ids.iter().flatten().copied().collect();
    let input = tch::Tensor::from_slice(&flat)
        .view([ids.len() as i64, width as i64])
        .to_device(policy.device());
    let logits = tch::no_grad(|| {
        policy.model.forward(
            &input,
            None,
            None,
            falcon_rl::model::decoder::LogitsFor::All,
            false,
        )
    })?
    .to_kind(tch::Kind::Float);
    falcon_rl::model::weights::save_safetensors(
        &args.out,
        &[("logits".to_string(), logits)],
        None,
    )?;
    println!("wrote {}", args.out.display());
    Ok(())
}

fn cmd_tasks(cmd: TasksCmd) -> Result<()> {
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
    let set = TaskSet::load(&file, format, LoadOptions { skip_invalid })
        .map_err(|e| UsageError(e.to_string()))?;
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

/// One `falcon exec` sample: which task, which code.
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

fn cmd_exec(args: ExecArgs) -> Result<()> {
    use falcon_rl::exec::Sandbox;
    use falcon_rl::reward::{composite, judge_from_config, Aspect, SampleSignals};
    use std::collections::BTreeMap;

    let cfg = match &args.config {
        Some(f) => {
            let c = RunConfig::from_file(f).map_err(|e| UsageError(e.to_string()))?;
            c.validate().map_err(|e| UsageError(e.to_string()))?;
            c
        }
        None => RunConfig::default(),
    };
    let tasks = TaskSet::load(
        &args.tasks,
        TaskFormat::Auto,
        LoadOptions {
            skip_invalid: args.skip_invalid,
        },
    )
    .map_err(|e| UsageError(e.to_string()))?;
    let samples = read_samples(&args.samples, &tasks, args.skip_invalid)?;
    if samples.is_empty() {
        return Err(UsageError("no samples to run".into()).into());
    }
    let sandbox = Sandbox::new(&cfg.exec)?;
    let judge_policy = match &args.judge_model {
        Some(m) => Some(load_policy(&ModelArgs {
            model: m.clone(),
            dtype: "fp32".into(),
            device: "auto".into(),
            adapter: None,
        })?),
        None => None,
    };
    let judge = judge_from_config(&cfg.reward, judge_policy.as_ref())?;

    let t0 = Instant::now();
    let bar = indicatif::ProgressBar::new(samples.len() as u64).with_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} samples {per_sec} eta {eta}")
            .expect("static template"),
    );
    let mut reports = Vec::with_capacity(samples.len());
    for chunk in samples.chunks(64) {
        let jobs: Vec<(&falcon_rl::task::Task, &str)> = chunk
            .iter()
            .map(|s| (tasks.get(&s.task_id).expect("checked"), s.code.as_str()))
            .collect();
        reports.extend(sandbox.run_batch(&jobs));
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    let exec_secs = t0.elapsed().as_secs_f64();

    let codes: Vec<&str> = samples.iter().map(|s| s.code.as_str()).collect();
    let style = if cfg.reward.style.computed() {
        judge.score(Aspect::Style, &codes)?
    } else {
        vec![None; codes.len()]
    };
    let complexity = if cfg.reward.complexity.computed() {
        judge.score(Aspect::Complexity, &codes)?
    } else {
        vec![None; codes.len()]
    };
    // Standalone, the error-type statistics P_error come from this batch:
    // the share of each error kind among all failing tests.
    let mut stats = falcon_rl::memory::stats::ErrorStats::new(Default::default())?;
    for r in &reports {
        stats.observe(r);
    }
    let p_error = stats.p_error();

    let mut lines = String::new();
    let mut by_outcome: BTreeMap<String, usize> = BTreeMap::new();
    let mut reward_sum = 0.0;
    let mut rewarded = 0usize;
    for (i, (s, r)) in samples.iter().zip(&reports).enumerate() {
        let signals = SampleSignals::from_report(r, p_error.clone(), style[i], complexity[i]);
        let rewards = composite(&cfg.reward, &signals);
        if let Some(b) = &rewards {
            reward_sum += b.total;
            rewarded += 1;
        }
        let key = match (&r.outcome, &r.error_kind) {
            (None, _) => "no signal".to_string(),
            (Some(_), None) => "pass".to_string(),
            (Some(_), Some(k)) => format!("{k:?}"),
        };
        *by_outcome.entry(key).or_insert(0) += 1;
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
    eprintln!(
        "{n} samples in {exec_secs:.1}s ({:.1}/s) on {} workers",
        n as f64 / exec_secs.max(1e-9),
        sandbox.workers()
    );
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

fn cmd_info() -> Result<()> {
    let cuda = cuda_status();
    println!("falcon-rl {}", env!("CARGO_PKG_VERSION"));
    println!("libtorch threads: {}", tch::get_num_threads());
    println!("cuda library loaded: {}", cuda.library_loaded);
    println!("cuda devices: {}", cuda.device_count);
    if let Some(r) = &cuda.reason {
        println!("cuda unavailable: {r}");
    }
    match hub::embedded_gguf() {
        Ok(p) => println!("embedded model: {}", p.display()),
        Err(e) => println!("embedded model: {e}"),
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    if let Some(n) = cli.threads {
        if n < 1 {
            return Err(UsageError(format!("--threads {n}: must be >= 1")).into());
        }
        tch::set_num_threads(n);
    }
    // Probe CUDA before any tensor exists, so a GPU machine's libtorch_cuda
    // registers itself first.
    let _ = cuda_status();
    match cli.cmd {
        Cmd::Info => cmd_info(),
        Cmd::Generate(a) => cmd_generate(a),
        Cmd::Chat(a) => cmd_chat(a),
        Cmd::Convert(ConvertCmd::Gguf {
            input,
            output,
            dtype,
        }) => {
            let dt = match dtype.as_str() {
                "f32" | "fp32" => OutDtype::F32,
                "bf16" => OutDtype::BF16,
                "f16" | "fp16" => OutDtype::F16,
                o => return Err(UsageError(format!("--dtype {o}: use f32, bf16 or f16")).into()),
            };
            convert_to_hf(&input, &output, dt)?;
            println!("wrote {}", output.display());
            Ok(())
        }
        Cmd::Export(a) => cmd_export(a),
        Cmd::Config(c) => cmd_config(c),
        Cmd::Score(a) => cmd_score(a),
        Cmd::Tasks(t) => cmd_tasks(t),
        Cmd::Exec(a) => cmd_exec(a),
        Cmd::Memory(c) => cmd_memory(c),
        Cmd::Train(a) => cmd_train(a, falcon_rl::train::rl::Mode::Rl),
        Cmd::Sft(a) => cmd_train(a, falcon_rl::train::rl::Mode::Sft),
        Cmd::Eval(a) => cmd_eval(a),
        Cmd::Report(a) => cmd_report(a),
        Cmd::Ablate(a) => cmd_ablate(a),
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

fn main() -> ExitCode {
    passive_openmp();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

fn cmd_memory(cmd: MemoryCmd) -> Result<()> {
    use falcon_rl::memory::fixes::{
        FixEntry, FixKnowledge, Mentor, FIX_RECORD_KIND, MENTOR_RECORD_KEY, MENTOR_RECORD_KIND,
    };
    use falcon_rl::memory::memcoder::MemCoderMemory;
    use falcon_rl::memory::stats::ErrorStats;
    use falcon_rl::memory::{
        embedder_from_config, index_from_config, long_term, LongTerm, MemoryStore,
    };

    // Reading commands must not create a database where there was none.
    let existing = |dir: &Path| -> Result<MemoryStore> {
        let db = dir.join(falcon_rl::memory::store::DB_FILE);
        if !db.is_file() {
            return Err(UsageError(format!("{}: no memory database here", db.display())).into());
        }
        Ok(MemoryStore::open(dir)?)
    };
    match cmd {
        MemoryCmd::Stats { run_dir } => {
            let store = existing(&run_dir)?;
            println!("{}", store.path().display());
            for (kind, n) in store.counts()? {
                println!("  {kind:<24} {n}");
            }
            for (name, n) in store.embedders()? {
                println!("  vector space {name:<12} {n} long-term entries");
            }
            if let Some(stats) = ErrorStats::load(&store)? {
                println!(
                    "  P_error over {} samples ({:?}):",
                    stats.samples(),
                    stats.mode()
                );
                for (kind, p) in stats.p_error() {
                    println!("    {kind:?}: {p:.3}");
                }
            }
            if let Some(m) = store.get_record::<Mentor>(MENTOR_RECORD_KIND, MENTOR_RECORD_KEY)? {
                for c in [
                    falcon_rl::exec::MemoCoderClass::CompileError,
                    falcon_rl::exec::MemoCoderClass::Exception,
                    falcon_rl::exec::MemoCoderClass::AssertionFailure,
                    falcon_rl::exec::MemoCoderClass::Timeout,
                ] {
                    let s = m.class(c);
                    println!(
                        "  mentor {c:?}: version {}, {} suggestions, {} new fixes pending",
                        s.version,
                        s.suggestions.len(),
                        s.pending.len()
                    );
                }
            }
            Ok(())
        }
        MemoryCmd::Query {
            run_dir,
            text,
            what,
            k,
            config,
            prompt,
        } => {
            let cfg = match &config {
                Some(f) => {
                    let c = RunConfig::from_file(f).map_err(|e| UsageError(e.to_string()))?;
                    c.validate().map_err(|e| UsageError(e.to_string()))?;
                    c
                }
                None => RunConfig::default(),
            };
            let store = existing(&run_dir)?;
            match what.as_str() {
                "long-term" => {
                    let k = k.unwrap_or(cfg.memory.top_k);
                    let device = tch::Device::Cpu;
                    let embedder = embedder_from_config(&cfg.memory, device)?;
                    let index = index_from_config(&cfg.memory, embedder.dim(), device)?;
                    let spaces = store.embedders()?;
                    if !spaces.contains_key(&embedder.name()) {
                        bail!(
                            "no long-term entries embedded by {} (vector spaces here: {:?}); pass --config with the run's [memory] embedder",
                            embedder.name(),
                            spaces
                        );
                    }
                    let mut lt = LongTerm::with_store(store, embedder.as_ref(), index)?;
                    let hits = lt.retrieve(embedder.as_ref(), &[text.as_str()], k)?;
                    let hits = hits.into_iter().next().unwrap_or_default();
                    println!(
                        "{} of {} entries, {}",
                        hits.len(),
                        lt.index().len(),
                        lt.index().describe()
                    );
                    for h in &hits {
                        let r = &h.record;
                        println!(
                            "  cos {:.4}  id {}  step {}  task {}  outcome {:?}\n    {}",
                            h.score,
                            r.id,
                            r.step,
                            r.task_id,
                            r.report.outcome,
                            r.feedback.lines().next().unwrap_or("")
                        );
                    }
                    if prompt {
                        println!("\n{}", long_term::table7_prompt(&text, &hits));
                    }
                }
                "fixes" => {
                    let k = k.unwrap_or(cfg.memory.fixes.top_k);
                    let fk =
                        FixKnowledge::from_records(store.records::<FixEntry>(FIX_RECORD_KIND)?)?;
                    let hits = fk.retrieve(&text, k);
                    println!(
                        "{} of {} fixes share words with the query",
                        hits.len(),
                        fk.len()
                    );
                    for h in hits {
                        println!(
                            "  {} words in a row  fix {}  {:?}: {}",
                            h.score,
                            h.id,
                            h.entry.error_kind,
                            h.entry.error_message.lines().next().unwrap_or("")
                        );
                    }
                }
                "api" => {
                    let Some(mem) = MemCoderMemory::load(&store)? else {
                        bail!("this run has no MEMCoder memory");
                    };
                    let Some(api) = mem.api(&text) else {
                        bail!("no API entry named {text:?}");
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
                    return Err(
                        UsageError(format!("--what {other}: use long-term, fixes or api")).into(),
                    )
                }
            }
            Ok(())
        }
        MemoryCmd::Export { run_dir, out } => {
            let store = existing(&run_dir)?;
            let n = falcon_rl::fsutil::write_atomic_with(&out, |w, _| -> Result<u64> {
                Ok(store.export_jsonl(w)?)
            })?;
            println!("wrote {n} lines to {}", out.display());
            Ok(())
        }
        MemoryCmd::Import { run_dir, input } => {
            let f = std::fs::File::open(&input)
                .with_context(|| format!("reading {}", input.display()))?;
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

/// Progress for `falcon train`: a bar on a terminal, plain lines otherwise.
struct TrainProgress {
    bar: Option<indicatif::ProgressBar>,
    evals: Vec<(u64, falcon_rl::eval::EvalResult)>,
}

impl falcon_rl::train::rl::Observer for TrainProgress {
    fn on_start(&mut self, first: u64, steps: u64) {
        use std::io::IsTerminal;
        if std::io::stderr().is_terminal() {
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

    fn on_step(&mut self, r: &falcon_rl::train::rl::StepRecord) {
        let secs: f64 = r.seconds.values().sum();
        let loss = r.loss.get("total").copied().unwrap_or(f64::NAN);
        let msg = if r.samples == 0 {
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
        match &self.bar {
            Some(b) => {
                b.set_message(msg);
                b.inc(1);
            }
            None => eprintln!("step {} {msg} ({secs:.1}s)", r.step + 1),
        }
    }

    fn on_eval(&mut self, step: u64, path: &std::path::Path, r: &falcon_rl::eval::EvalResult) {
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
        self.evals.push((step, r.clone()));
    }

    fn on_message(&mut self, m: &str) {
        match &self.bar {
            Some(b) => b.println(m),
            None => eprintln!("falcon: {m}"),
        }
    }
}

/// A config's task file filtered by tags (and cut to `max_tasks`), with a
/// clear error when nothing is left.
fn load_tagged_tasks(
    path: &std::path::Path,
    format: falcon_rl::config::TaskFormat,
    skip_invalid: bool,
    tags: &[String],
    max_tasks: usize,
    what: &str,
) -> Result<TaskSet> {
    let all = TaskSet::load(path, format, LoadOptions { skip_invalid })
        .map_err(|e| UsageError(e.to_string()))?;
    let mut set = all.with_any_tag(tags);
    if max_tasks > 0 {
        set.tasks.truncate(max_tasks);
    }
    if set.is_empty() {
        return Err(UsageError(format!(
            "{what}: no task of {} ({} in all) carries any of the tags {tags:?}",
            path.display(),
            all.len()
        ))
        .into());
    }
    Ok(set)
}

/// `[eval]`'s tasks: its file (else `[tasks] path`) filtered by its tags and
/// cut to `max_tasks`. `config` names the file in the error for no path.
fn load_eval_tasks(cfg: &RunConfig, config: &Path) -> Result<TaskSet> {
    let Some(path) = cfg.eval.path.as_ref().or(cfg.tasks.path.as_ref()) else {
        return Err(UsageError(format!(
            "{}: neither [eval] path nor [tasks] path is set",
            config.display()
        ))
        .into());
    };
    load_tagged_tasks(
        path,
        cfg.eval.format,
        cfg.tasks.skip_invalid,
        &cfg.eval.tags,
        cfg.eval.max_tasks,
        "[eval]",
    )
}

fn cmd_train(args: TrainArgs, mode: falcon_rl::train::rl::Mode) -> Result<()> {
    let cfg = RunConfig::load(&args.config).map_err(|e| UsageError(e.to_string()))?;
    train_config(&cfg, &args.config, mode, args.resume)
}

/// Train (or resume, with `resume`) the run `cfg` describes in
/// `<output_dir>/<name>`, with its held-out evaluations, as `falcon train`
/// and each variant of `falcon ablate` do. `source` names the file the
/// config came from in messages.
fn train_config(
    cfg: &RunConfig,
    source: &Path,
    mode: falcon_rl::train::rl::Mode,
    resume: bool,
) -> Result<()> {
    use falcon_rl::exec::Sandbox;
    use falcon_rl::train::rl::Trainer;

    let Some(task_path) = &cfg.tasks.path else {
        return Err(UsageError(format!("{}: [tasks] path is not set", source.display())).into());
    };
    let tasks = load_tagged_tasks(
        task_path,
        cfg.tasks.format,
        cfg.tasks.skip_invalid,
        &cfg.tasks.tags,
        0,
        "[tasks]",
    )?;
    let eval_tasks = if cfg.train.eval_before || cfg.train.eval_after || cfg.train.eval_every > 0 {
        Some(load_eval_tasks(cfg, source)?)
    } else {
        None
    };
    let mut policy = load_config_policy(cfg)?;
    falcon_rl::train::rl::prepare_policy(cfg, &mut policy)?;
    let sandbox = Sandbox::new(&cfg.exec)?;
    let run_dir = cfg.run.output_dir.join(&cfg.run.name);
    let mut progress = TrainProgress {
        bar: None,
        evals: Vec::new(),
    };
    let t0 = Instant::now();
    let mut trainer = Trainer::new(
        cfg.clone(),
        mode,
        &run_dir,
        &mut policy,
        &tasks,
        &sandbox,
        resume,
        &mut progress,
    )?;
    if let Some(e) = &eval_tasks {
        trainer = trainer.with_eval_tasks(e);
    }
    let records = trainer.run(&mut progress)?;
    if let Some(b) = &progress.bar {
        b.finish_and_clear();
    }
    let steps = trainer.step();
    eprintln!(
        "falcon: {} steps in {:.1}s; metrics {}, samples {}, checkpoints {}/step-N",
        records.len(),
        t0.elapsed().as_secs_f64(),
        run_dir.join("metrics.jsonl").display(),
        run_dir.join("samples.jsonl").display(),
        run_dir.display()
    );
    drop(trainer);
    // Before and after, on the same held-out tasks: paired, so McNemar.
    let before = progress.evals.iter().find(|(s, _)| *s == 0);
    let after = progress
        .evals
        .iter()
        .find(|(s, _)| *s == steps && steps > 0);
    if let (Some((_, b)), Some((_, a))) = (before, after) {
        let (only_after, only_before, p) = a.mcnemar_vs(b);
        let k1 = |r: &falcon_rl::eval::EvalResult| 100.0 * r.pass(1).unwrap_or(f64::NAN);
        eprintln!(
            "falcon: held-out pass@1 {:.1}% -> {:.1}% ({} tasks; solved only after: {only_after}, only before: {only_before}; McNemar exact p = {p:.3})",
            k1(b),
            k1(a),
            a.tasks.len()
        );
    }
    Ok(())
}

fn cmd_eval(args: EvalArgs) -> Result<()> {
    use falcon_rl::config::{GeneratorSource, StrategyKind};
    use falcon_rl::eval::{evaluate_in_groups, evaluate_strategy, EvalSpec, Partial};
    use falcon_rl::exec::Sandbox;
    use falcon_rl::model::openai::OpenAiGenerator;
    use falcon_rl::model::Generator;
    use falcon_rl::rollout::memcoder::DocStrategy;
    use falcon_rl::rollout::repair::{Repair, RepairConfig};
    use falcon_rl::rollout::solve::Prompted;
    use falcon_rl::rollout::Strategy;

    match &args.cmd {
        Some(EvalCmd::Compare { a, b }) => return cmd_eval_compare(a, b),
        Some(EvalCmd::Rescore {
            result,
            config,
            out,
        }) => return cmd_eval_rescore(result, config, out),
        None => {}
    }
    let Some(config) = &args.config else {
        return Err(UsageError(
            "falcon eval needs --config FILE (or `compare A B`, `rescore RESULT`)".into(),
        )
        .into());
    };
    let cfg = RunConfig::load(config).map_err(|e| UsageError(e.to_string()))?;
    let tasks = load_eval_tasks(&cfg, config)?;
    let sc = &cfg.strategy;
    // --memory RUN_DIR is FALCON prompting whatever [strategy] kind says.
    let kind = if args.memory.is_some() {
        StrategyKind::Falcon
    } else {
        sc.kind
    };
    let reflects = matches!(kind, StrategyKind::Memocoder | StrategyKind::Memcoder);
    let uses_policy = matches!(sc.generator, GeneratorSource::Policy)
        || (reflects && matches!(cfg.memory.reflector, GeneratorSource::Policy));
    let policy = match (&args.checkpoint, uses_policy) {
        (Some(dir), _) => Some(falcon_rl::train::rl::policy_from_checkpoint(dir)?.1),
        (None, true) => Some(load_config_policy(&cfg)?),
        (None, false) => None,
    };
    let server = |src: &GeneratorSource| -> Result<Option<OpenAiGenerator>> {
        Ok(match src {
            GeneratorSource::Policy => None,
            GeneratorSource::Openai(o) => Some(OpenAiGenerator::new(o)?),
        })
    };
    let answer_server = server(&sc.generator)?;
    let reflect_server = server(&cfg.memory.reflector)?;
    fn pick<'a>(s: &'a Option<OpenAiGenerator>, policy: &'a Option<Policy>) -> &'a dyn Generator {
        match (s, policy) {
            (Some(s), _) => s,
            (None, Some(p)) => p,
            (None, None) => unreachable!("a policy is loaded whenever a source is `policy`"),
        }
    }
    let generator = pick(&answer_server, &policy);
    let reflector = pick(&reflect_server, &policy);
    let sandbox = Sandbox::new(&cfg.exec)?;
    let list: Vec<&falcon_rl::task::Task> = tasks.iter().collect();
    let spec = EvalSpec {
        instruction: &cfg.train.instruction,
        generation: &cfg.generation,
        eval: &cfg.eval,
        seed: falcon_rl::eval::seed_of(&cfg),
        prompts: None,
    };
    let env = spec.env(generator, reflector, &sandbox);
    let mut strategy: Box<dyn Strategy> = match kind {
        StrategyKind::ZeroShot => Box::new(Prompted::zero_shot()),
        StrategyKind::Falcon => {
            let Some(run) = args.memory.as_ref().or(sc.memory_run.as_ref()) else {
                return Err(UsageError(
                    "strategy falcon needs [strategy] memory_run or --memory RUN_DIR".into(),
                )
                .into());
            };
            Box::new(Prompted::given(
                "falcon",
                &list,
                memory_prompts(&cfg, run, &list)?,
            )?)
        }
        StrategyKind::SelfRepair => Box::new(Repair::new(RepairConfig::self_repair(sc))),
        StrategyKind::Memocoder => {
            let mut r = Repair::new(RepairConfig::memocoder(sc, &cfg.memory.fixes));
            if let Some(path) = &sc.accumulate_on {
                let acc = load_tagged_tasks(
                    path,
                    falcon_rl::config::TaskFormat::Auto,
                    cfg.tasks.skip_invalid,
                    &[],
                    sc.accumulate_max_tasks,
                    "[strategy] accumulate_on",
                )?;
                let acc_list: Vec<&falcon_rl::task::Task> = acc.iter().collect();
                eprintln!(
                    "falcon: accumulating fixing knowledge on {} tasks of {}",
                    acc_list.len(),
                    path.display()
                );
                r.accumulate(&env, &acc_list)?;
                eprintln!(
                    "falcon: {} fixes known, {} mentor rewrites",
                    r.knowledge().len(),
                    r.stats.mentor_rewrites
                );
            }
            Box::new(r)
        }
        StrategyKind::DocRag | StrategyKind::Memcoder | StrategyKind::MemcoderAccum => {
            Box::new(DocStrategy::from_config(kind, &cfg)?)
        }
    };
    eprintln!(
        "falcon: strategy {} on {} tasks x {} samples",
        strategy.name(),
        list.len(),
        cfg.eval.n
    );
    let mut progress = Progress::new(list.len() as u64 * cfg.eval.n as u64, "samples");
    let mut tick = |done: usize, _| progress.set(done as u64);
    let partial_dir = args.out.as_ref().map(|o| o.with_extension("partial"));
    let result = if cfg.eval.checkpoint_tasks == 0 {
        evaluate_strategy(strategy.as_mut(), &env, &list, &cfg.eval, &mut tick)?
    } else {
        let partial = partial_dir.as_deref().map(|dir| Partial {
            dir,
            made_with: serde_json::json!({
                "config": &cfg,
                "checkpoint": &args.checkpoint,
                "memory": &args.memory,
                "tasks": list.iter().map(|t| &t.id).collect::<Vec<_>>(),
            }),
        });
        if let Some(p) = &partial {
            if p.dir.join("manifest.json").exists() {
                eprintln!(
                    "falcon: continuing the partial evaluation in {}",
                    p.dir.display()
                );
            }
        }
        evaluate_in_groups(
            strategy.as_mut(),
            &env,
            &list,
            &cfg.eval,
            cfg.eval.checkpoint_tasks,
            partial.as_ref(),
            &mut tick,
        )?
    };
    progress.finish();
    print_eval_summary(&result);
    if let Some(out) = &args.out {
        write_eval_result(&result, out)?;
        if let Some(dir) = partial_dir.filter(|d| d.exists()) {
            // The result is written: the groups are no longer needed.
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                eprintln!("falcon: warning: could not remove {}: {e}", dir.display());
            }
        }
    }
    Ok(())
}

/// pass@k and exec@k on stdout, then [`eprint_eval_details`].
fn print_eval_summary(result: &falcon_rl::eval::EvalResult) {
    for (k, v) in &result.pass_at {
        println!("pass@{k}\t{:.4}", v);
    }
    for (k, v) in &result.exec_at {
        println!("exec@{k}\t{:.4}", v);
    }
    eprint_eval_details(result);
}

/// Outcomes, where kernels ran and the strategy's stats, on stderr.
fn eprint_eval_details(result: &falcon_rl::eval::EvalResult) {
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
fn write_eval_result(result: &falcon_rl::eval::EvalResult, out: &Path) -> Result<()> {
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

fn cmd_eval_rescore(result: &Path, config: &Path, out: &Path) -> Result<()> {
    use falcon_rl::eval::{rescore, EvalResult};
    use falcon_rl::exec::Sandbox;
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
    let old = EvalResult::load(result).map_err(|e| UsageError(e.to_string()))?;
    let cfg = RunConfig::load(config).map_err(|e| UsageError(e.to_string()))?;
    let tasks = load_eval_tasks(&cfg, config)?;
    let list: Vec<&falcon_rl::task::Task> = tasks.iter().collect();
    let sandbox = Sandbox::new(&cfg.exec)?;
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
    let r = rescore(&old, &list, &sandbox).map_err(|e| UsageError(e.to_string()))?;
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
    eprint_eval_details(&r.result);
    write_eval_result(&r.result, out)
}

/// FALCON's Table 7 prompts for `tasks` from the long-term memory of
/// `run_dir` (read only: nothing is added).
fn memory_prompts(
    cfg: &RunConfig,
    run_dir: &Path,
    tasks: &[&falcon_rl::task::Task],
) -> Result<Vec<String>> {
    use falcon_rl::memory::{embedder_from_config, index_from_config, LongTerm, MemoryStore};
    if !run_dir.join("memory.sqlite").is_file() {
        return Err(UsageError(format!(
            "--memory {}: no memory.sqlite there (a run with [meta] long_term = true writes it)",
            run_dir.display()
        ))
        .into());
    }
    let device = falcon_rl::model::device::device_of(cfg);
    let embedder = embedder_from_config(&cfg.memory, device)?;
    let index = index_from_config(&cfg.memory, embedder.dim(), device)?;
    let mut lt = LongTerm::with_store(MemoryStore::open(run_dir)?, embedder.as_ref(), index)?;
    let texts: Vec<&str> = tasks.iter().map(|t| t.prompt.as_str()).collect();
    let hits = lt.retrieve(embedder.as_ref(), &texts, cfg.memory.top_k)?;
    eprintln!(
        "falcon: prompts with {} retrieved entries per task from {} ({} stored)",
        cfg.memory.top_k,
        run_dir.display(),
        lt.store().count_long_term()?
    );
    Ok(tasks
        .iter()
        .zip(&hits)
        .map(|(t, h)| falcon_rl::rollout::falcon_prompt(t, h))
        .collect())
}

fn cmd_eval_compare(a: &Path, b: &Path) -> Result<()> {
    use falcon_rl::eval::EvalResult;
    let ra = EvalResult::load(a).map_err(|e| UsageError(e.to_string()))?;
    let rb = EvalResult::load(b).map_err(|e| UsageError(e.to_string()))?;
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
    let ids: std::collections::BTreeSet<&str> = ra.tasks.iter().map(|t| t.id.as_str()).collect();
    let common = rb
        .tasks
        .iter()
        .filter(|t| ids.contains(t.id.as_str()))
        .count();
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

/// Progress of a long job on stderr: a bar on a terminal; otherwise (the
/// log of an unattended run, where a bar draws nothing) a line at most once
/// a minute, so an hour-long evaluation is not silent.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    len: u64,
    unit: &'static str,
    start: Instant,
    last: Instant,
    /// Work already done when this process began (a resumed evaluation's
    /// finished groups): the rate, and so the eta, counts only what is
    /// done here.
    base: Option<u64>,
}

impl Progress {
    const LINE_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

    fn new(len: u64, unit: &'static str) -> Self {
        use std::io::IsTerminal;
        let bar = std::io::stderr().is_terminal().then(|| {
            indicatif::ProgressBar::new(len).with_style(
                indicatif::ProgressStyle::with_template(&format!(
                    "{{pos}}/{{len}} {unit} {{bar:30}} eta {{eta}}"
                ))
                .expect("static template"),
            )
        });
        let now = Instant::now();
        Progress {
            bar,
            len,
            unit,
            start: now,
            last: now,
            base: None,
        }
    }

    fn set(&mut self, done: u64) {
        let base = *self.base.get_or_insert(done);
        if let Some(b) = &self.bar {
            b.set_position(done);
            if done == base {
                b.reset_eta();
            }
            return;
        }
        if done == 0 || done >= self.len || self.last.elapsed() < Self::LINE_EVERY {
            return;
        }
        self.last = Instant::now();
        let secs = self.start.elapsed().as_secs_f64();
        let Some(eta) = eta_secs(secs, base, done, self.len) else {
            return;
        };
        eprintln!(
            "falcon: {done}/{} {} ({:.0}%) in {}, eta {}",
            self.len,
            self.unit,
            100.0 * done as f64 / self.len.max(1) as f64,
            minutes(secs),
            minutes(eta)
        );
    }

    fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}

/// Seconds left at the rate of the work done since `base`, in `secs`.
fn eta_secs(secs: f64, base: u64, done: u64, len: u64) -> Option<f64> {
    let here = done.checked_sub(base).filter(|&d| d > 0)?;
    Some(secs * len.saturating_sub(done) as f64 / here as f64)
}

/// `1h02m`, `12m05s` or `42s`.
fn minutes(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, _) => format!("{h}h{m:02}m"),
    }
}

fn cmd_report(args: ReportArgs) -> Result<()> {
    use falcon_rl::eval::report::{load_run, write_report};
    // Whatever is wrong with what the user pointed at is theirs to fix.
    let data = load_run(&args.run_dir).map_err(|e| UsageError(e.to_string()))?;
    for n in &data.notes {
        eprintln!("falcon: {n}");
    }
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.run_dir.join("report"));
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

fn cmd_ablate(args: AblateArgs) -> Result<()> {
    use falcon_rl::train::ablate::{
        finish_variant, prepare_variant, write_summary, AblateError, Grid, VariantState,
    };
    let usage = |e: AblateError| -> anyhow::Error {
        match e {
            // A failed write is ours; a grid, base or run directory that
            // cannot be read or used is the user's to fix.
            AblateError::Write(_) => e.into(),
            e => UsageError(e.to_string()).into(),
        }
    };
    let grid = Grid::load(&args.grid).map_err(usage)?;
    let out = grid.output_dir().map_err(usage)?;
    // Every variant's config first: a typo in the last one should not
    // surface after hours of training the others.
    let cfgs = grid
        .variants
        .iter()
        .map(|v| grid.resolve(v))
        .collect::<Result<Vec<_>, _>>()
        .map_err(usage)?;
    let n = cfgs.len();
    if args.dry_run {
        for (v, cfg) in grid.variants.iter().zip(&cfgs) {
            let dir = cfg.run.run_dir();
            let state = if dir.join(falcon_rl::train::ablate::DONE_FILE).is_file() {
                "finished"
            } else if dir.exists() {
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
                dir.display(),
                if set.is_empty() {
                    "(base)".into()
                } else {
                    set.join(", ")
                }
            );
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
        let state = prepare_variant(cfg).map_err(usage)?;
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
            cfg.run.run_dir().display()
        );
        train_config(cfg, &args.grid, falcon_rl::train::rl::Mode::Rl, resume)
            .with_context(|| format!("variant `{name}`"))?;
        rows.push(finish_variant(cfg).map_err(usage)?);
    }
    let files = write_summary(&grid, &out, &rows).map_err(usage)?;
    print!(
        "{}",
        falcon_rl::train::ablate::summary_markdown(&grid, &rows)
    );
    eprintln!(
        "falcon: {n} variants; summary {} ({} files in {})",
        out.join("summary.md").display(),
        files.len(),
        out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{eta_secs, minutes};

    #[test]
    fn durations_read_like_a_clock() {
        assert_eq!(minutes(42.4), "42s");
        assert_eq!(minutes(725.0), "12m05s");
        assert_eq!(minutes(3725.0), "1h02m");
        assert_eq!(minutes(-3.0), "0s");
    }

    #[test]
    fn a_resumed_job_counts_only_its_own_rate() {
        // 600 of 1640 were done before this process; 60 more took 60 s.
        assert_eq!(eta_secs(60.0, 600, 660, 1640), Some(980.0));
        assert_eq!(eta_secs(60.0, 0, 60, 1640), Some(1580.0));
        assert_eq!(eta_secs(60.0, 600, 600, 1640), None);
    }
}
