//! `falcon convert gguf`: a GGUF file to an HF model directory.

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;

use super::UsageError;
use falcon_rl::model::gguf::{convert_to_hf, OutDtype};

#[derive(Subcommand)]
pub enum ConvertCmd {
    /// GGUF (F32/F16/BF16, Q4_0-Q8_0, the k-quants Q2_K-Q6_K, IQ4_NL/IQ4_XS) → HF directory (safetensors, config, tokenizer).
    Gguf {
        input: PathBuf,
        output: PathBuf,
        /// Weight dtype written: f32, bf16 or f16.
        #[arg(long, default_value = "f32")]
        dtype: String,
    },
}

pub fn run(cmd: ConvertCmd) -> Result<()> {
    let ConvertCmd::Gguf {
        input,
        output,
        dtype,
    } = cmd;
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
