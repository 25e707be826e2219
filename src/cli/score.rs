//! `falcon score`: the model's logits for given token ids, as safetensors
//! (parity checks against transformers).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use super::{ModelArgs, UsageError};

#[derive(Args)]
pub struct ScoreArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// JSON file: a list of equal-length lists of token ids.
    #[arg(long)]
    ids: PathBuf,
    /// Output safetensors file with one fp32 tensor `logits` [batch, seq, vocab].
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: ScoreArgs) -> Result<()> {
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
    let policy = args.model.load()?;
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
