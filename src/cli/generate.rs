//! `falcon generate`: completions for one or more prompts.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;

use super::{ModelArgs, SamplingArgs, UsageError};
use falcon_rl::model::Generator;

#[derive(Args)]
pub struct GenerateArgs {
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

pub fn run(args: GenerateArgs) -> Result<()> {
    let prompts = read_prompts(&args)?;
    let params = args.sampling.params(args.chat)?;
    let policy = args.model.load()?;
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
                println!(
                    "--- [{i}] ({}, {} tokens)",
                    c.finish.name(),
                    c.token_ids.len()
                );
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
