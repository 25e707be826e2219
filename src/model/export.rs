//! The two artifacts inference servers take (STYLE.md §8):
//!
//! - an HF model directory: merged weights in `model.safetensors` under HF
//!   names, `config.json`, `generation_config.json` and the tokenizer files —
//!   what `transformers`, vLLM and TGI load unchanged;
//! - a PEFT adapter directory (`adapter_config.json`,
//!   `adapter_model.safetensors`) when LoRA is on — vLLM's `--lora-modules`
//!   and TGI's adapters take it, as does `peft.PeftModel.from_pretrained`.
//!
//! Both are written into a temporary sibling directory and renamed into
//! place, so a crash never leaves a half-written export behind.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tch::Tensor;

use super::generate::Policy;
use super::weights::{read_all, save_safetensors, write_atomic};
use super::{Dtype, LoraConfig, ModelError, TorchKind};
use crate::fsutil::publish_dir;

/// Files copied verbatim from the source model directory, when present.
const TOKENIZER_FILES: [&str; 6] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
];

/// PEFT's key prefix for a causal LM.
const PEFT_PREFIX: &str = "base_model.model.";

fn write_json(path: &Path, v: &serde_json::Value) -> Result<(), ModelError> {
    let text = serde_json::to_string_pretty(v)
        .map_err(|e| ModelError::Invalid(format!("serialising {}: {e}", path.display())))?;
    write_atomic(path, format!("{text}\n").as_bytes())
}

/// The base-model tensors, with any LoRA delta folded in when `merge`,
/// under HF names, cast to `dtype`.
fn merged_tensors(policy: &Policy, dtype: Dtype, merge: bool) -> Vec<(String, Tensor)> {
    let deltas: HashMap<String, Tensor> = policy
        .model
        .projections()
        .into_iter()
        .filter(|(_, lin)| merge && !lin.is_merged())
        .filter_map(|(name, lin)| lin.delta().map(|d| (format!("{name}.weight"), d)))
        .collect();
    let mut out: Vec<(String, Tensor)> = tch::no_grad(|| {
        policy
            .vs
            .variables()
            .into_iter()
            .filter(|(name, _)| !name.contains(".lora_"))
            .map(|(name, t)| {
                let t = match deltas.get(&name) {
                    Some(d) => &t + d,
                    None => t.shallow_clone(),
                };
                (name, t.to_kind(dtype.kind()))
            })
            .collect()
    });
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Write an HF model directory for `policy` (LoRA merged) at `out`.
pub fn export_hf(
    policy: &Policy,
    out: &Path,
    dtype: Dtype,
    overwrite: bool,
) -> Result<PathBuf, ModelError> {
    write_hf(policy, out, dtype, overwrite, true)
}

/// [`export_hf`] without the LoRA deltas: the base a PEFT adapter from
/// [`export_peft`] applies to (a server that loads adapters at run time).
/// Adapters merged into their layers stay merged.
pub fn export_hf_base(
    policy: &Policy,
    out: &Path,
    dtype: Dtype,
    overwrite: bool,
) -> Result<PathBuf, ModelError> {
    write_hf(policy, out, dtype, overwrite, false)
}

fn write_hf(
    policy: &Policy,
    out: &Path,
    dtype: Dtype,
    overwrite: bool,
    merge: bool,
) -> Result<PathBuf, ModelError> {
    publish_dir(out, overwrite, |dir| -> Result<(), ModelError> {
        let tensors = merged_tensors(policy, dtype, merge);
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        save_safetensors(&dir.join("model.safetensors"), &tensors, Some(meta))?;

        let mut cfg = policy.hf_config.clone();
        if let Some(o) = cfg.as_object_mut() {
            // transformers 5 reads `dtype`, older versions `torch_dtype`.
            o.insert("torch_dtype".into(), dtype.hf_name().into());
            o.insert("dtype".into(), dtype.hf_name().into());
        }
        write_json(&dir.join("config.json"), &cfg)?;

        let src_gen = policy.source_dir.join("generation_config.json");
        let gen = if src_gen.is_file() {
            let text =
                std::fs::read_to_string(&src_gen).map_err(|e| ModelError::io(&src_gen, e))?;
            serde_json::from_str(&text)
                .map_err(|e| ModelError::bad(&src_gen, format!("invalid JSON: {e}")))?
        } else {
            let mut g = serde_json::json!({ "_from_model_config": true });
            for k in ["bos_token_id", "eos_token_id", "pad_token_id"] {
                if let Some(v) = policy.hf_config.get(k) {
                    g[k] = v.clone();
                }
            }
            g
        };
        write_json(&dir.join("generation_config.json"), &gen)?;

        for f in TOKENIZER_FILES {
            let src = policy.source_dir.join(f);
            if src.is_file() {
                let bytes = std::fs::read(&src).map_err(|e| ModelError::io(&src, e))?;
                write_atomic(&dir.join(f), &bytes)?;
            }
        }
        Ok(())
    })?;
    Ok(out.to_path_buf())
}

/// Write the LoRA adapters of `policy` as a PEFT adapter directory.
pub fn export_peft(policy: &Policy, out: &Path, overwrite: bool) -> Result<PathBuf, ModelError> {
    export_peft_with(policy, &[], out, overwrite)
}

/// [`export_peft`] with the factors named in `fast` (VarStore names, as
/// `Policy::swap_adapters` takes them: a MAML task's fast weights θ_i) in
/// place of the policy's own.
pub fn export_peft_with(
    policy: &Policy,
    fast: &[(String, Tensor)],
    out: &Path,
    overwrite: bool,
) -> Result<PathBuf, ModelError> {
    let cfg = policy.lora.as_ref().ok_or_else(|| {
        ModelError::Invalid("no LoRA adapters attached: nothing to export".into())
    })?;
    let fast: HashMap<&str, &Tensor> = fast.iter().map(|(n, t)| (n.as_str(), t)).collect();
    publish_dir(out, overwrite, |dir| -> Result<(), ModelError> {
        let mut tensors: Vec<(String, Tensor)> = policy
            .vs
            .variables()
            .into_iter()
            .filter(|(name, _)| name.contains(".lora_"))
            .map(|(name, t)| {
                let t = fast.get(name.as_str()).map_or(t.detach(), |f| f.detach());
                (format!("{PEFT_PREFIX}{name}"), t)
            })
            .collect();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        save_safetensors(&dir.join("adapter_model.safetensors"), &tensors, Some(meta))?;
        let adapter_config = serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": policy.source_dir.display().to_string(),
            "r": cfg.rank,
            "lora_alpha": cfg.alpha,
            "lora_dropout": cfg.dropout,
            "target_modules": cfg.targets,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "use_rslora": false,
            "use_dora": false,
            "modules_to_save": null,
            "layers_to_transform": null,
            "layers_pattern": null,
            "rank_pattern": {},
            "alpha_pattern": {},
            "revision": null,
        });
        write_json(&dir.join("adapter_config.json"), &adapter_config)
    })?;
    Ok(out.to_path_buf())
}

/// Attach the adapters of a PEFT directory (ours or PEFT's own) to `policy`.
pub fn load_peft(policy: &mut Policy, dir: &Path) -> Result<LoraConfig, ModelError> {
    let cfg_path = dir.join("adapter_config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| ModelError::io(&cfg_path, e))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ModelError::bad(&cfg_path, format!("invalid JSON: {e}")))?;
    let bad = |m: &str| ModelError::bad(&cfg_path, m.to_string());
    if v.get("peft_type").and_then(|p| p.as_str()) != Some("LORA") {
        return Err(bad("only peft_type = LORA adapters are supported"));
    }
    if v.get("use_dora").and_then(|d| d.as_bool()) == Some(true)
        || v.get("use_rslora").and_then(|d| d.as_bool()) == Some(true)
    {
        return Err(bad("DoRA / rsLoRA adapters are not supported"));
    }
    let rank = v
        .get("r")
        .and_then(|r| r.as_u64())
        .ok_or_else(|| bad("missing integer `r`"))? as usize;
    let alpha = v
        .get("lora_alpha")
        .and_then(|a| a.as_f64())
        .ok_or_else(|| bad("missing number `lora_alpha`"))?;
    let targets: Vec<String> = match v.get("target_modules") {
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|t| t.as_str().map(str::to_owned))
            .collect(),
        Some(serde_json::Value::String(s)) => vec![s.clone()],
        _ => return Err(bad("missing `target_modules` list")),
    };
    let cfg = LoraConfig {
        enabled: true,
        rank,
        alpha,
        dropout: v
            .get("lora_dropout")
            .and_then(|d| d.as_f64())
            .unwrap_or(0.0),
        targets,
    };
    policy.attach_lora(&cfg)?;

    let wpath = dir.join("adapter_model.safetensors");
    let tensors = read_all(&wpath)?;
    let vars = policy.vs.variables();
    let mut loaded = 0usize;
    for (name, t) in tensors {
        let key = name.strip_prefix(PEFT_PREFIX).unwrap_or(&name);
        // PEFT sometimes names the adapter (`lora_A.default.weight`).
        let key = key.replace(".default.weight", ".weight");
        let var = vars.get(&key).ok_or_else(|| {
            ModelError::bad(
                &wpath,
                format!("tensor `{name}` matches no adapter of this model"),
            )
        })?;
        if var.size() != t.size() {
            return Err(ModelError::bad(
                &wpath,
                format!(
                    "tensor `{name}` has shape {:?}, expected {:?}",
                    t.size(),
                    var.size()
                ),
            ));
        }
        tch::no_grad(|| var.shallow_clone().copy_(&t.to_kind(var.kind())));
        loaded += 1;
    }
    let expected = vars.keys().filter(|k| k.contains(".lora_")).count();
    if loaded != expected {
        return Err(ModelError::bad(
            &wpath,
            format!("{loaded} adapter tensors found, the config implies {expected}"),
        ));
    }
    Ok(cfg)
}
