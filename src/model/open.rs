//! The one way a command gets a policy: a model spec (a local HF directory,
//! a `.gguf` file, an HF repo id already in the local cache, or `embedded`)
//! resolved, loaded in a dtype on a device, with an optional PEFT adapter
//! attached. `[model]` and the `--model/--dtype/--device/--adapter` flags
//! are two ways of writing the same [`ModelSpec`].

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::device::parse_device;
use super::export::load_peft;
use super::{hub, Dtype, ModelError, Policy};
use crate::config::ModelConfig;

/// Which model to load, and how.
#[derive(Debug, Clone)]
pub struct ModelSpec<'a> {
    /// A local HF directory, a `.gguf` file, a cached HF repo id, or `embedded`.
    pub model: &'a str,
    pub dtype: Dtype,
    /// `auto`, `cpu`, `cuda` or `cuda:N`.
    pub device: &'a str,
    /// A PEFT LoRA adapter directory to attach.
    pub adapter: Option<&'a Path>,
}

impl<'a> ModelSpec<'a> {
    /// The model `[model]` names (its LoRA section is the trainer's: a
    /// fresh adapter is attached by the run, not loaded here).
    pub fn of(cfg: &'a ModelConfig) -> Self {
        ModelSpec {
            model: &cfg.path,
            dtype: cfg.dtype,
            device: &cfg.device,
            adapter: None,
        }
    }
}

/// A loaded policy and where it came from.
pub struct Opened {
    pub policy: Policy,
    /// The resolved HF directory.
    pub dir: PathBuf,
    pub seconds: f64,
    /// The GGUF that was converted into the cache to load it (once per file).
    pub converted: Option<PathBuf>,
}

impl Opened {
    /// `loaded DIR (llama, fp32, cpu) in 1.2s`, for the command's log.
    pub fn describe(&self, dtype: Dtype) -> String {
        let converted = match &self.converted {
            Some(g) => format!("converted {} to an HF directory (once); ", g.display()),
            None => String::new(),
        };
        format!(
            "{converted}loaded {} ({}, {}, {}) in {:.1}s",
            self.dir.display(),
            self.policy.family.name(),
            dtype.as_str(),
            device_name(self.policy.device()),
            self.seconds
        )
    }
}

/// `cpu` or `cuda:N`.
pub fn device_name(d: tch::Device) -> String {
    match d {
        tch::Device::Cuda(i) => format!("cuda:{i}"),
        tch::Device::Mps => "mps".into(),
        tch::Device::Vulkan => "vulkan".into(),
        _ => "cpu".into(),
    }
}

/// Load the policy `spec` names.
pub fn open(spec: &ModelSpec) -> Result<Opened, ModelError> {
    let device = parse_device(spec.device)?;
    let (dir, converted) = hub::resolve_noting(spec.model)?;
    let t0 = Instant::now();
    let mut policy = Policy::load(&dir, spec.dtype, device).map_err(|e| {
        ModelError::Invalid(format!("loading the model from {}: {e}", dir.display()))
    })?;
    if let Some(a) = spec.adapter {
        load_peft(&mut policy, a).map_err(|e| {
            ModelError::Invalid(format!("loading the adapter {}: {e}", a.display()))
        })?;
    }
    Ok(Opened {
        policy,
        dir,
        seconds: t0.elapsed().as_secs_f64(),
        converted,
    })
}
