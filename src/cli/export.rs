//! `falcon export`: a model (with an adapter) or a training checkpoint as an
//! HF directory, plus a PEFT adapter directory when LoRA is on.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;

use super::ModelArgs;
use falcon_rl::model::export::{export_hf, export_peft};

#[derive(Args)]
pub struct ExportArgs {
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

pub fn run(args: ExportArgs) -> Result<()> {
    let (policy, dtype) = match &args.checkpoint {
        Some(dir) => {
            let (cfg, policy) = falcon_rl::train::checkpoint_policy(dir)
                .map_err(super::train::train_error)
                .with_context(|| format!("loading checkpoint {}", dir.display()))?;
            (policy, cfg.model.dtype)
        }
        None => (args.model.load()?, args.model.dtype()?),
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
