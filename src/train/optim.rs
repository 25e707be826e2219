//! Our own optimizers: AdamW and SGD over named parameter tensors, with
//! named, checkpointable state; the functional SGD step that MAML's inner loop
//! takes on fast weights (FALCON §4.2, Algorithm 1 line 11:
//! `θ_i ← θ_i − α∇L_inner(θ_i)`); global gradient-norm clipping; and the
//! learning-rate schedule.
//!
//! The update rules follow PyTorch's single-tensor paths (`foreach=False`) of
//! `torch.optim.AdamW` and `torch.optim.SGD`, op for op, so the tests can
//! compare against numbers from `scripts/fixtures/optim-reference.py`.
//!
//! Precision: moments are fp32 (fp64 for fp64 parameters). For a bf16/fp16
//! parameter the update is computed on an fp32 copy and rounded once into the
//! parameter; no fp32 master copy is kept, so updates smaller than the
//! parameter's precision are lost. Keep trained tensors (e.g. LoRA adapters)
//! in fp32 when that matters.
//!
//! State files are safetensors: tensors `exp_avg.<param>`, `exp_avg_sq.<param>`,
//! `step.<param>` (AdamW) or `momentum.<param>` (SGD), and the kind,
//! hyperparameters and step count as JSON metadata. Loading checks every name
//! and shape against the parameters; a resume on the CPU then reproduces the
//! uninterrupted run bit for bit.
//!
//! One coherent thing over ~1,200 lines: the optimizers share their state
//! layout, checkpoint format and tests against PyTorch's reference numbers.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tch::{Kind, TchError, Tensor};

use crate::model::weights;
use crate::model::ModelError;

/// Version of the state-file layout written by [`Optimizer::save`].
const STATE_FORMAT: u64 = 1;
/// safetensors metadata key that holds our JSON metadata.
const METADATA_KEY: &str = "falcon_rl.optimizer";
/// A safetensors header larger than this is not one of ours (the safetensors
/// crate uses the same bound).
const MAX_HEADER_BYTES: u64 = 100_000_000;
/// Added to the total norm before dividing, as `torch.nn.utils.clip_grad_norm_`.
const CLIP_EPS: f64 = 1e-6;

/// Errors from optimizer steps and from saving or loading optimizer state.
/// Each names the parameter, state tensor or file it concerns.
#[derive(Debug, thiserror::Error)]
pub enum OptimError {
    /// A hyperparameter or learning rate that cannot work.
    #[error("invalid optimizer setting: {0}")]
    Config(String),
    /// A parameter that does not fit what the optimizer holds or was given.
    #[error("parameter `{param}`: {reason}")]
    Param { param: String, reason: String },
    /// A state tensor with an unknown name, no parameter, or the wrong shape.
    #[error("optimizer state tensor `{tensor}`: {reason}")]
    State { tensor: String, reason: String },
    /// State metadata that is missing, malformed or from another optimizer.
    #[error("optimizer state metadata: {0}")]
    Metadata(String),
    /// One of the errors above, found in a state file.
    #[error("{path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: Box<OptimError>,
    },
    /// The state file could not be opened or its header read.
    #[error("{path}: cannot read optimizer state: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Writing or reading the safetensors payload failed (names the file).
    #[error("optimizer state: {0}")]
    Weights(#[from] ModelError),
    /// libtorch refused an operation on this parameter's tensors.
    #[error("parameter `{param}`: libtorch: {source}")]
    Torch {
        param: String,
        #[source]
        source: TchError,
    },
}

fn torch_err(param: &str) -> impl FnOnce(TchError) -> OptimError + '_ {
    move |source| OptimError::Torch {
        param: param.to_owned(),
        source,
    }
}

/// An optimizer over named parameters. Parameter names key the state, so
/// the order of `params` does not matter, but a name must always denote the
/// same tensor.
pub trait Optimizer {
    /// Update every parameter that has a gradient, in place and without
    /// recording autograd history, with learning rate `lr`. Parameters whose
    /// `.grad()` is undefined are skipped and keep their state untouched.
    fn step(&mut self, params: &[(String, Tensor)], lr: f64) -> Result<(), OptimError>;

    /// How many times [`Optimizer::step`] has run (restored by `load`).
    fn steps(&self) -> u64;

    /// The state as named tensors (aliasing the live state: copy before
    /// mutating) plus JSON metadata: format, kind, hyperparameters, steps.
    fn state_dict(&self) -> (Vec<(String, Tensor)>, Value);

    /// Replace the state with `tensors`/`metadata` from [`Optimizer::state_dict`].
    /// Every tensor must belong to one of `params` with the matching shape,
    /// and the kind and hyperparameters must be this optimizer's; on error
    /// the current state is left as it was. Tensors move to their
    /// parameter's device.
    fn load_state_dict(
        &mut self,
        tensors: BTreeMap<String, Tensor>,
        metadata: &Value,
        params: &[(String, Tensor)],
    ) -> Result<(), OptimError>;

    /// Write the state to `path` as one safetensors file, atomically.
    fn save(&self, path: &Path) -> Result<(), OptimError> {
        let (tensors, metadata) = self.state_dict();
        let metadata = HashMap::from([(METADATA_KEY.to_owned(), metadata.to_string())]);
        weights::save_safetensors(path, &tensors, Some(metadata))?;
        Ok(())
    }

    /// Restore the state written by [`Optimizer::save`] (see
    /// [`Optimizer::load_state_dict`] for the checks).
    fn load(&mut self, path: &Path, params: &[(String, Tensor)]) -> Result<(), OptimError> {
        let metadata = read_metadata(path)?;
        let tensors = weights::read_all(path)?;
        self.load_state_dict(tensors, &metadata, params)
            .map_err(|e| match e {
                e @ (OptimError::State { .. } | OptimError::Metadata(_)) => OptimError::File {
                    path: path.to_path_buf(),
                    source: Box::new(e),
                },
                e => e,
            })
    }
}

/// Set every parameter's gradient to zero, in place. Unlike PyTorch's default
/// (`set_to_none`), a zeroed gradient stays defined, so the next `step` still
/// applies weight decay and moment decay to a parameter that got no new
/// gradient; tch offers no way to reset `.grad()` to undefined.
pub fn zero_grad(params: &[(String, Tensor)]) {
    for (_, p) in params {
        p.shallow_clone().zero_grad();
    }
}

/// The dtype moments are kept in for a parameter of dtype `kind`.
fn moment_kind(kind: Kind) -> Kind {
    if kind == Kind::Double {
        Kind::Double
    } else {
        Kind::Float
    }
}

fn check_lr(lr: f64) -> Result<(), OptimError> {
    if lr.is_finite() && lr >= 0.0 {
        Ok(())
    } else {
        Err(OptimError::Config(format!(
            "learning rate {lr} must be finite and >= 0"
        )))
    }
}

/// A view of `param` in the compute dtype `kind`: the parameter itself when
/// it already has that dtype, else a converted copy that [`write_back`] stores.
fn compute_view(param: &Tensor, kind: Kind) -> Result<Tensor, TchError> {
    if param.kind() == kind {
        Ok(param.shallow_clone())
    } else {
        param.f_to_kind(kind)
    }
}

fn write_back(param: &Tensor, updated: &Tensor) -> Result<(), TchError> {
    if param.kind() != updated.kind() {
        param.shallow_clone().f_copy_(updated)?;
    }
    Ok(())
}

// ---------------------------------------------------------------- AdamW

/// AdamW hyperparameters (Loshchilov & Hutter, decoupled weight decay).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdamWConfig {
    /// Decay rates of the first and second moment.
    pub betas: (f64, f64),
    /// Added to the bias-corrected `sqrt(v)`.
    pub eps: f64,
    /// Decoupled weight decay: `p -= lr * weight_decay * p` before the update.
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

impl AdamWConfig {
    /// Reject settings that would make the update undefined.
    pub fn validate(&self) -> Result<(), OptimError> {
        let (b1, b2) = self.betas;
        for (name, b) in [("betas[0]", b1), ("betas[1]", b2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(OptimError::Config(format!(
                    "AdamW {name} = {b} must be in [0, 1)"
                )));
            }
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(OptimError::Config(format!(
                "AdamW eps = {} must be finite and > 0",
                self.eps
            )));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(OptimError::Config(format!(
                "AdamW weight_decay = {} must be finite and >= 0",
                self.weight_decay
            )));
        }
        Ok(())
    }
}

struct AdamState {
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// Per parameter, as PyTorch: a parameter that first gets a gradient at
    /// step 5 starts its bias correction at 1.
    step: u64,
}

/// AdamW with `torch.optim.AdamW` semantics (no amsgrad, no maximize).
pub struct AdamW {
    config: AdamWConfig,
    steps: u64,
    state: BTreeMap<String, AdamState>,
}

impl AdamW {
    /// An optimizer with empty state; moments are created at a parameter's
    /// first gradient.
    pub fn new(config: AdamWConfig) -> Result<Self, OptimError> {
        config.validate()?;
        Ok(AdamW {
            config,
            steps: 0,
            state: BTreeMap::new(),
        })
    }

    /// The hyperparameters.
    pub fn config(&self) -> &AdamWConfig {
        &self.config
    }
}

fn adamw_update(
    param: &Tensor,
    grad: &Tensor,
    s: &mut AdamState,
    lr: f64,
    c: &AdamWConfig,
) -> Result<(), TchError> {
    let (beta1, beta2) = c.betas;
    s.step += 1;
    let kind = s.exp_avg.kind();
    let mut p = compute_view(param, kind)?;
    let g = grad.f_to_kind(kind)?;
    if c.weight_decay != 0.0 {
        let _ = p.f_mul_scalar_(1.0 - lr * c.weight_decay)?;
    }
    let _ = s.exp_avg.f_lerp_(&g, 1.0 - beta1)?;
    let _ = s.exp_avg_sq.f_mul_scalar_(beta2)?;
    // tch's addcmul_/addcdiv_ take no `value`; scaling the first factor
    // beforehand rounds exactly as ATen's `self + value * t1 * t2` does.
    let _ = s.exp_avg_sq.f_addcmul_(&g.f_mul_scalar(1.0 - beta2)?, &g)?;
    let step = s.step as f64;
    let bias_correction1 = 1.0 - beta1.powf(step);
    let bias_correction2 = 1.0 - beta2.powf(step);
    let step_size = lr / bias_correction1;
    // `** 0.5`, not sqrt(), because that is what PyTorch computes.
    let bias_correction2_sqrt = bias_correction2.powf(0.5);
    let mut denom = s.exp_avg_sq.f_sqrt()?.f_div_scalar(bias_correction2_sqrt)?;
    let _ = denom.f_add_scalar_(c.eps)?;
    let _ = p.f_addcdiv_(&s.exp_avg.f_mul_scalar(-step_size)?, &denom)?;
    write_back(param, &p)
}

impl Optimizer for AdamW {
    fn step(&mut self, params: &[(String, Tensor)], lr: f64) -> Result<(), OptimError> {
        check_lr(lr)?;
        tch::no_grad(|| -> Result<(), OptimError> {
            for (name, param) in params {
                let grad = param.grad();
                if !grad.defined() {
                    continue;
                }
                if !self.state.contains_key(name) {
                    let opts = (moment_kind(param.kind()), param.device());
                    let zeros = || Tensor::f_zeros(param.size(), opts).map_err(torch_err(name));
                    let state = AdamState {
                        exp_avg: zeros()?,
                        exp_avg_sq: zeros()?,
                        step: 0,
                    };
                    self.state.insert(name.clone(), state);
                }
                let state = self.state.get_mut(name).expect("inserted above");
                check_state_shape(name, param, &state.exp_avg)?;
                adamw_update(param, &grad, state, lr, &self.config).map_err(torch_err(name))?;
            }
            Ok(())
        })?;
        self.steps += 1;
        Ok(())
    }

    fn steps(&self) -> u64 {
        self.steps
    }

    fn state_dict(&self) -> (Vec<(String, Tensor)>, Value) {
        let mut tensors = Vec::with_capacity(3 * self.state.len());
        for (name, s) in &self.state {
            tensors.push((format!("exp_avg.{name}"), s.exp_avg.shallow_clone()));
            tensors.push((format!("exp_avg_sq.{name}"), s.exp_avg_sq.shallow_clone()));
            tensors.push((format!("step.{name}"), Tensor::from(s.step as i64)));
        }
        (tensors, metadata("adamw", &self.config, self.steps))
    }

    fn load_state_dict(
        &mut self,
        tensors: BTreeMap<String, Tensor>,
        metadata: &Value,
        params: &[(String, Tensor)],
    ) -> Result<(), OptimError> {
        let steps = check_metadata(metadata, "adamw", &self.config)?;
        let slots = [
            ("exp_avg", Slot::Moment),
            ("exp_avg_sq", Slot::Moment),
            ("step", Slot::Count),
        ];
        let mut state = BTreeMap::new();
        for (param, mut found) in group_by_param(tensors, &slots, params)? {
            let mut take = |slot: &str| {
                found.remove(slot).ok_or_else(|| OptimError::State {
                    tensor: format!("{slot}.{param}"),
                    reason: "missing, though other state of this parameter is present".into(),
                })
            };
            let (exp_avg, exp_avg_sq, step) =
                (take("exp_avg")?, take("exp_avg_sq")?, take("step")?);
            let step = step
                .f_int64_value(&[])
                .ok()
                .and_then(|s| u64::try_from(s).ok())
                .filter(|&s| s > 0)
                .ok_or_else(|| OptimError::State {
                    tensor: format!("step.{param}"),
                    reason: "must hold a positive integer".into(),
                })?;
            state.insert(
                param,
                AdamState {
                    exp_avg,
                    exp_avg_sq,
                    step,
                },
            );
        }
        self.state = state;
        self.steps = steps;
        Ok(())
    }
}

// ---------------------------------------------------------------- SGD

/// SGD hyperparameters (`torch.optim.SGD` with dampening 0, no Nesterov).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SgdConfig {
    /// Heavy-ball momentum; 0 keeps no state.
    pub momentum: f64,
    /// L2 penalty added to the gradient (coupled, unlike AdamW).
    pub weight_decay: f64,
}

impl SgdConfig {
    /// Reject settings that would make the update undefined.
    pub fn validate(&self) -> Result<(), OptimError> {
        if !(0.0..1.0).contains(&self.momentum) {
            return Err(OptimError::Config(format!(
                "SGD momentum = {} must be in [0, 1)",
                self.momentum
            )));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(OptimError::Config(format!(
                "SGD weight_decay = {} must be finite and >= 0",
                self.weight_decay
            )));
        }
        Ok(())
    }
}

/// SGD with `torch.optim.SGD` semantics: `g += wd * p`; with momentum
/// `buf = momentum * buf + g` (the first buffer is `g` itself); `p -= lr * buf`.
pub struct Sgd {
    config: SgdConfig,
    steps: u64,
    momentum: BTreeMap<String, Tensor>,
}

impl Sgd {
    /// An optimizer with empty state.
    pub fn new(config: SgdConfig) -> Result<Self, OptimError> {
        config.validate()?;
        Ok(Sgd {
            config,
            steps: 0,
            momentum: BTreeMap::new(),
        })
    }

    /// The hyperparameters.
    pub fn config(&self) -> &SgdConfig {
        &self.config
    }
}

fn sgd_update(
    param: &Tensor,
    grad: &Tensor,
    buf: Option<&mut Tensor>,
    lr: f64,
    c: &SgdConfig,
) -> Result<Option<Tensor>, TchError> {
    let kind = moment_kind(param.kind());
    let mut p = compute_view(param, kind)?;
    let mut g = grad.f_to_kind(kind)?;
    if c.weight_decay != 0.0 {
        g = g.f_add(&p.f_mul_scalar(c.weight_decay)?)?;
    }
    let mut new_buf = None;
    if c.momentum != 0.0 {
        g = match buf {
            Some(b) => {
                let _ = b.f_mul_scalar_(c.momentum)?;
                let _ = b.f_add_(&g)?;
                b.shallow_clone()
            }
            None => {
                let b = g.f_detach_copy()?;
                new_buf = Some(b.shallow_clone());
                b
            }
        };
    }
    let _ = p.f_add_(&g.f_mul_scalar(-lr)?)?;
    write_back(param, &p)?;
    Ok(new_buf)
}

impl Optimizer for Sgd {
    fn step(&mut self, params: &[(String, Tensor)], lr: f64) -> Result<(), OptimError> {
        check_lr(lr)?;
        tch::no_grad(|| -> Result<(), OptimError> {
            for (name, param) in params {
                let grad = param.grad();
                if !grad.defined() {
                    continue;
                }
                let buf = self.momentum.get_mut(name);
                if let Some(b) = &buf {
                    check_state_shape(name, param, b)?;
                }
                let new_buf =
                    sgd_update(param, &grad, buf, lr, &self.config).map_err(torch_err(name))?;
                if let Some(b) = new_buf {
                    self.momentum.insert(name.clone(), b);
                }
            }
            Ok(())
        })?;
        self.steps += 1;
        Ok(())
    }

    fn steps(&self) -> u64 {
        self.steps
    }

    fn state_dict(&self) -> (Vec<(String, Tensor)>, Value) {
        let tensors = self
            .momentum
            .iter()
            .map(|(name, b)| (format!("momentum.{name}"), b.shallow_clone()))
            .collect();
        (tensors, metadata("sgd", &self.config, self.steps))
    }

    fn load_state_dict(
        &mut self,
        tensors: BTreeMap<String, Tensor>,
        metadata: &Value,
        params: &[(String, Tensor)],
    ) -> Result<(), OptimError> {
        let steps = check_metadata(metadata, "sgd", &self.config)?;
        if self.config.momentum == 0.0 {
            if let Some(tensor) = tensors.keys().next() {
                return Err(OptimError::State {
                    tensor: tensor.clone(),
                    reason: "SGD without momentum keeps no state".into(),
                });
            }
        }
        let momentum = group_by_param(tensors, &[("momentum", Slot::Moment)], params)?
            .into_iter()
            .filter_map(|(param, mut found)| found.remove("momentum").map(|b| (param, b)))
            .collect();
        self.momentum = momentum;
        self.steps = steps;
        Ok(())
    }
}

// ---------------------------------------------------------------- state files

fn check_state_shape(name: &str, param: &Tensor, state: &Tensor) -> Result<(), OptimError> {
    if state.size() == param.size() {
        Ok(())
    } else {
        Err(OptimError::Param {
            param: name.to_owned(),
            reason: format!(
                "has shape {:?} but the optimizer state for it has {:?}",
                param.size(),
                state.size()
            ),
        })
    }
}

fn metadata<C: Serialize>(kind: &str, config: &C, steps: u64) -> Value {
    json!({
        "format": STATE_FORMAT,
        "kind": kind,
        "config": config,
        "steps": steps,
    })
}

/// Check format, kind and hyperparameters; return the step count.
fn check_metadata<C: Serialize>(
    metadata: &Value,
    kind: &str,
    config: &C,
) -> Result<u64, OptimError> {
    let bad = |m: String| OptimError::Metadata(m);
    let format = metadata.get("format").and_then(Value::as_u64);
    if format != Some(STATE_FORMAT) {
        return Err(bad(format!(
            "format {}, this build reads format {STATE_FORMAT}",
            metadata.get("format").unwrap_or(&Value::Null)
        )));
    }
    let saved_kind = metadata.get("kind").and_then(Value::as_str).unwrap_or("?");
    if saved_kind != kind {
        return Err(bad(format!(
            "the file holds `{saved_kind}` state, this optimizer is `{kind}`"
        )));
    }
    let ours = serde_json::to_value(config).expect("configs serialise");
    let saved = metadata.get("config").unwrap_or(&Value::Null);
    if let Some(diff) = settings_differ(saved, &ours, "") {
        // Moments are only meaningful for the hyperparameters that built
        // them; an exact resume needs the same settings.
        return Err(bad(format!(
            "saved with {kind} setting {diff}; construct the optimizer with the saved settings to resume"
        )));
    }
    metadata
        .get("steps")
        .and_then(Value::as_u64)
        .ok_or_else(|| bad("no `steps` count".into()))
}

/// The first setting in which `saved` and `ours` differ, as a message.
/// Numbers compare with a relative tolerance because JSON parsing may be off
/// by one ulp.
fn settings_differ(saved: &Value, ours: &Value, at: &str) -> Option<String> {
    match (saved, ours) {
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (a.as_f64()?, b.as_f64()?);
            let same = (a - b).abs() <= 1e-12 * a.abs().max(b.abs());
            (!same).then(|| format!("`{at}` = {a}, this optimizer has {b}"))
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (x, y))| settings_differ(x, y, &format!("{at}[{i}]"))),
        (Value::Object(a), Value::Object(b)) if a.len() == b.len() => {
            b.iter().find_map(|(k, y)| {
                let x = a.get(k).unwrap_or(&Value::Null);
                let at = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                settings_differ(x, y, &at)
            })
        }
        (a, b) if a == b => None,
        (a, b) => Some(format!("`{at}` = {a}, this optimizer has {b}")),
    }
}

#[derive(Clone, Copy)]
enum Slot {
    /// Same shape as the parameter, kept in the moment dtype.
    Moment,
    /// A 0-dim integer.
    Count,
}

/// Sort state tensors (`<slot>.<param>`) by parameter, checking that each
/// names a known slot and parameter and has the right shape. Moments come
/// back in their compute dtype on their parameter's device.
fn group_by_param(
    tensors: BTreeMap<String, Tensor>,
    slots: &[(&'static str, Slot)],
    params: &[(String, Tensor)],
) -> Result<BTreeMap<String, HashMap<&'static str, Tensor>>, OptimError> {
    let by_name: HashMap<&str, &Tensor> = params.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut grouped: BTreeMap<String, HashMap<&'static str, Tensor>> = BTreeMap::new();
    for (tensor, value) in tensors {
        let Some((slot, kind, param_name)) = slots.iter().find_map(|&(slot, kind)| {
            let rest = tensor.strip_prefix(slot)?.strip_prefix('.')?;
            Some((slot, kind, rest))
        }) else {
            let known: Vec<String> = slots.iter().map(|(s, _)| format!("`{s}.`")).collect();
            return Err(OptimError::State {
                tensor,
                reason: format!("name does not start with {}", known.join(" or ")),
            });
        };
        let Some(param) = by_name.get(param_name) else {
            return Err(OptimError::State {
                reason: format!(
                    "no parameter `{param_name}` among the {} being optimized",
                    params.len()
                ),
                tensor,
            });
        };
        let want = match kind {
            Slot::Moment => param.size(),
            Slot::Count => Vec::new(),
        };
        if value.size() != want {
            return Err(OptimError::State {
                reason: format!(
                    "shape {:?} does not match parameter `{param_name}` (state shape {want:?})",
                    value.size()
                ),
                tensor,
            });
        }
        let value = match kind {
            Slot::Moment => value
                .f_to_kind(moment_kind(param.kind()))
                .and_then(|v| v.f_to_device(param.device()))
                .map_err(torch_err(param_name))?,
            Slot::Count => value,
        };
        grouped
            .entry(param_name.to_owned())
            .or_default()
            .insert(slot, value);
    }
    Ok(grouped)
}

/// Our JSON metadata from the safetensors header of `path`, read without
/// loading the tensors (a full fine-tune's moments are large).
fn read_metadata(path: &Path) -> Result<Value, OptimError> {
    let io = |source| OptimError::Io {
        path: path.to_path_buf(),
        source,
    };
    let bad = |reason: String| OptimError::File {
        path: path.to_path_buf(),
        source: Box::new(OptimError::Metadata(reason)),
    };
    let mut file = File::open(path).map_err(io)?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(io)?;
    let len = u64::from_le_bytes(len);
    if len > MAX_HEADER_BYTES {
        return Err(bad(format!(
            "safetensors header of {len} bytes: not a safetensors file"
        )));
    }
    let mut header = vec![0u8; len as usize];
    file.read_exact(&mut header).map_err(io)?;
    let header: Value = serde_json::from_slice(&header)
        .map_err(|e| bad(format!("safetensors header is not JSON: {e}")))?;
    let text = header
        .get("__metadata__")
        .and_then(|m| m.get(METADATA_KEY))
        .and_then(Value::as_str)
        .ok_or_else(|| {
            bad(format!(
                "no `{METADATA_KEY}` entry: not an optimizer state file"
            ))
        })?;
    serde_json::from_str(text).map_err(|e| bad(format!("`{METADATA_KEY}` is not JSON: {e}")))
}

// ---------------------------------------------------------------- MAML, clipping

/// One functional SGD step for MAML's inner loop: new tensors `p - lr * g`
/// for the fast weights θ_i, leaving `params` untouched.
///
/// The result keeps the autograd graph back to `params` (and to `grads`):
/// with `grads` from `Tensor::run_backward(.., create_graph = true)` the
/// meta-gradient is second-order MAML; with detached grads it is
/// first-order MAML. An undefined gradient (a parameter the inner loss does
/// not reach) leaves that fast weight equal to the parameter itself.
/// `grads[i]` belongs to `params[i]`.
pub fn sgd_fast_weights(
    params: &[(String, Tensor)],
    grads: &[Tensor],
    lr: f64,
) -> Result<Vec<(String, Tensor)>, OptimError> {
    check_lr(lr)?;
    if params.len() != grads.len() {
        return Err(OptimError::Config(format!(
            "{} parameters but {} gradients for the fast-weight step",
            params.len(),
            grads.len()
        )));
    }
    params
        .iter()
        .zip(grads)
        .map(|((name, p), g)| {
            if !g.defined() {
                return Ok((name.clone(), p.shallow_clone()));
            }
            if g.size() != p.size() {
                return Err(OptimError::Param {
                    param: name.clone(),
                    reason: format!(
                        "has shape {:?} but its gradient has {:?}",
                        p.size(),
                        g.size()
                    ),
                });
            }
            let fast = g
                .f_mul_scalar(lr)
                .and_then(|step| p.f_sub(&step))
                .map_err(torch_err(name))?;
            Ok((name.clone(), fast))
        })
        .collect()
}

/// Clip the gradients of `params` to a global L2 norm of at most `max_norm`
/// and return the norm before clipping, as `torch.nn.utils.clip_grad_norm_`
/// (scale factor `max_norm / (norm + 1e-6)`, applied only when below 1).
/// Undefined gradients are ignored; none at all gives 0. A `max_norm` that
/// is not positive (e.g. 0, the usual "off" setting) only measures. A
/// non-finite norm is returned as is, and the gradients then scale to
/// NaN/0 as in PyTorch: check it and skip the step.
pub fn clip_grad_norm(params: &[(String, Tensor)], max_norm: f64) -> f64 {
    tch::no_grad(|| {
        let grads: Vec<Tensor> = params
            .iter()
            .map(|(_, p)| p.grad())
            .filter(Tensor::defined)
            .collect();
        let Some(first) = grads.first() else {
            return 0.0;
        };
        let device = first.device();
        let kind = if grads.iter().any(|g| g.kind() == Kind::Double) {
            Kind::Double
        } else {
            Kind::Float
        };
        // Per-tensor norms, then the norm of norms: PyTorch's order, so the
        // result matches it bit for bit in fp32.
        let norms: Vec<Tensor> = grads
            .iter()
            .map(|g| {
                let g = if matches!(g.kind(), Kind::Half | Kind::BFloat16) {
                    g.to_kind(Kind::Float)
                } else {
                    g.shallow_clone()
                };
                g.norm().to_kind(kind).to_device(device)
            })
            .collect();
        let total = Tensor::stack(&norms, 0).norm();
        let total_norm = total.double_value(&[]);
        if max_norm > 0.0 {
            // `max_norm / t` in Python is `t.reciprocal() * max_norm`.
            let coef = (&total + CLIP_EPS).reciprocal() * max_norm;
            if coef.double_value(&[]) < 1.0 {
                for g in &grads {
                    let mut g = g.shallow_clone();
                    g *= coef.to_device(g.device());
                }
            }
        }
        total_norm
    })
}

// ---------------------------------------------------------------- schedule

pub use crate::config::ScheduleKind;

/// Learning rate per optimizer step, with HF transformers' conventions
/// (`get_cosine_schedule_with_warmup` & co.): `lr_at(0)` is the rate of the
/// first update; it is 0 when `warmup_steps > 0`, rises linearly to
/// `base_lr` at `warmup_steps`, then decays to `min_lr_ratio * base_lr` at
/// `total_steps` and stays there.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LrSchedule {
    /// Peak learning rate, reached at the end of warm-up.
    pub base_lr: f64,
    /// Updates of linear warm-up from 0 (0: start at `base_lr`).
    pub warmup_steps: u64,
    /// Updates after which the rate stays at its minimum.
    pub total_steps: u64,
    /// Final rate as a fraction of `base_lr` (ignored by `Constant`).
    pub min_lr_ratio: f64,
    /// Shape of the decay.
    pub kind: ScheduleKind,
}

impl LrSchedule {
    /// Reject schedules that cannot mean what they say.
    pub fn validate(&self) -> Result<(), OptimError> {
        check_lr(self.base_lr)?;
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return Err(OptimError::Config(format!(
                "min_lr_ratio = {} must be in [0, 1]",
                self.min_lr_ratio
            )));
        }
        if self.kind != ScheduleKind::Constant && self.warmup_steps > self.total_steps {
            return Err(OptimError::Config(format!(
                "warmup_steps = {} exceeds total_steps = {}; lower the warm-up or raise the total",
                self.warmup_steps, self.total_steps
            )));
        }
        Ok(())
    }

    /// The learning rate for the update after `step` completed updates.
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.base_lr * step as f64 / self.warmup_steps as f64;
        }
        let decay_steps = self.total_steps.saturating_sub(self.warmup_steps).max(1);
        let progress = ((step - self.warmup_steps) as f64 / decay_steps as f64).min(1.0);
        let factor = match self.kind {
            ScheduleKind::Constant => return self.base_lr,
            ScheduleKind::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
            ScheduleKind::Linear => 1.0 - progress,
        };
        self.base_lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * factor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A0: [f32; 6] = [0.5, -1.0, 2.0, 0.25, -0.75, 1.5];
    const B0: [f32; 4] = [0.1, -0.2, 0.3, -0.4];
    /// Gradients of `a` and `b` per step; `b` has none at step 1.
    const GRADS: [([f32; 6], Option<[f32; 4]>); 3] = [
        ([0.1, -0.2, 0.3, -0.4, 0.5, -0.6], None),
        (
            [1.0, 0.5, -0.25, 0.0, -2.0, 3.0],
            Some([0.01, -0.02, 0.03, -0.04]),
        ),
        (
            [-0.3, 0.3, -0.3, 0.7, -0.1, 0.2],
            Some([1.0, 2.0, -3.0, 4.0]),
        ),
    ];
    const LRS: [f64; 3] = [1e-2, 5e-3, 2e-2];

    fn leaf(values: &[f32], shape: &[i64]) -> Tensor {
        Tensor::from_slice(values)
            .reshape(shape)
            .set_requires_grad(true)
    }

    fn fresh_params() -> Vec<(String, Tensor)> {
        vec![
            ("a".to_owned(), leaf(&A0, &[2, 3])),
            ("b".to_owned(), leaf(&B0, &[4])),
        ]
    }

    /// Give each parameter exactly the gradient `g` (via `sum(p * g)`), or
    /// none when `g` is `None` and it never had one.
    fn set_grads(params: &[(String, Tensor)], grads: &[Option<&[f32]>]) {
        zero_grad(params);
        let mut loss: Option<Tensor> = None;
        for ((_, p), g) in params.iter().zip(grads) {
            if let Some(g) = g {
                let term = (p * Tensor::from_slice(g).reshape(p.size())).sum(Kind::Float);
                loss = Some(match loss {
                    Some(l) => l + term,
                    None => term,
                });
            }
        }
        if let Some(l) = loss {
            l.backward();
        }
    }

    fn run_steps(
        opt: &mut dyn Optimizer,
        params: &[(String, Tensor)],
        steps: std::ops::Range<usize>,
    ) {
        for i in steps {
            let (ga, gb) = &GRADS[i];
            set_grads(params, &[Some(ga), gb.as_ref().map(|g| &g[..])]);
            opt.step(params, LRS[i]).unwrap();
        }
    }

    fn values(t: &Tensor) -> Vec<f32> {
        Vec::<f32>::try_from(t.flatten(0, -1)).unwrap()
    }

    fn max_abs_diff(got: &[f32], want: &[f32]) -> f32 {
        assert_eq!(got.len(), want.len());
        got.iter()
            .zip(want)
            .map(|(g, w)| (g - w).abs())
            .fold(0.0, f32::max)
    }

    fn adamw() -> AdamW {
        AdamW::new(AdamWConfig {
            weight_decay: 0.1,
            ..AdamWConfig::default()
        })
        .unwrap()
    }

    fn sgd() -> Sgd {
        Sgd::new(SgdConfig {
            momentum: 0.9,
            weight_decay: 0.01,
        })
        .unwrap()
    }

    // Expected values printed by `scripts/fixtures/optim-reference.py` (torch 2.11.0),
    // which in short runs, with the A0/B0/GRADS/LRS above:
    //   a = torch.tensor(A0, requires_grad=True); b = torch.tensor(B0, requires_grad=True)
    //   opt = torch.optim.AdamW([a, b], lr=0.0, betas=(0.9, 0.999), eps=1e-8,
    //                           weight_decay=0.1, foreach=False)
    //         # or torch.optim.SGD([a, b], lr=0.0, momentum=0.9, weight_decay=0.01, foreach=False)
    //   for (ga, gb), lr in zip(GRADS, LRS):
    //       a.grad = torch.tensor(ga); b.grad = None if gb is None else torch.tensor(gb)
    //       opt.param_groups[0]["lr"] = lr; opt.step()
    //   print(a.flatten(), b)
    #[test]
    fn adamw_matches_pytorch() {
        let params = fresh_params();
        let mut opt = adamw();
        run_steps(&mut opt, &params, 0..3);
        let want_a: [f32; 6] = [
            0.4759498, -1.0009272, 1.9901618, 0.25648454, -0.7453016, 1.4916798,
        ];
        let want_b: [f32; 4] = [0.079744175, -0.20925826, 0.3090084, -0.4087585];
        let err = max_abs_diff(&values(&params[0].1), &want_a)
            .max(max_abs_diff(&values(&params[1].1), &want_b));
        eprintln!("AdamW max |rust - torch| = {err:e}");
        assert!(err <= 1e-6, "AdamW differs from PyTorch by {err}");
        assert_eq!(opt.steps(), 3);
    }

    #[test]
    fn sgd_momentum_matches_pytorch() {
        let params = fresh_params();
        let mut opt = sgd();
        run_steps(&mut opt, &params, 0..3);
        let want_a: [f32; 6] = [
            0.47956306, -1.0106236, 2.0010674, 0.24809368, -0.7167967, 1.4443144,
        ];
        let want_b: [f32; 4] = [0.07972702, -0.23945403, 0.35918105, -0.47890806];
        let err = max_abs_diff(&values(&params[0].1), &want_a)
            .max(max_abs_diff(&values(&params[1].1), &want_b));
        // About 1 ulp off: ATen's `add(g, alpha)` fuses the multiply-add,
        // and tch exposes no `alpha`, so we multiply first.
        eprintln!("SGD max |rust - torch| = {err:e}");
        assert!(err <= 1e-6, "SGD differs from PyTorch by {err}");
    }

    #[test]
    fn weight_decay_applies_with_zero_grad() {
        let params = vec![("w".to_owned(), leaf(&[2.0, -4.0], &[2]))];
        set_grads(&params, &[Some(&[0.0, 0.0])]);
        let mut opt = adamw();
        opt.step(&params, 0.01).unwrap();
        // m = v = 0, so the Adam term is 0 / eps = 0: only p *= 1 - lr * wd.
        let want: Vec<f32> = [2.0f32, -4.0]
            .iter()
            .map(|p| p * (1.0 - 0.01 * 0.1) as f32)
            .collect();
        assert_eq!(values(&params[0].1), want);

        let params = vec![("w".to_owned(), leaf(&[2.0, -4.0], &[2]))];
        set_grads(&params, &[Some(&[0.0, 0.0])]);
        let mut opt = Sgd::new(SgdConfig {
            momentum: 0.0,
            weight_decay: 0.5,
        })
        .unwrap();
        opt.step(&params, 0.1).unwrap();
        // g = 0 + 0.5 p; p -= 0.1 g, i.e. p * 0.95.
        let got = values(&params[0].1);
        assert!(max_abs_diff(&got, &[1.9, -3.8]) <= 1e-6, "{got:?}");
    }

    #[test]
    fn undefined_grads_are_skipped() {
        let params = fresh_params();
        set_grads(&params, &[Some(&GRADS[0].0), None]);
        let mut opt = adamw();
        opt.step(&params, 0.1).unwrap();
        assert_eq!(values(&params[1].1), B0.to_vec());
        let (tensors, _) = opt.state_dict();
        let names: Vec<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["exp_avg.a", "exp_avg_sq.a", "step.a"]);
    }

    #[test]
    fn bf16_param_gets_fp32_moments_and_one_rounding() {
        let p32 = vec![("w".to_owned(), leaf(&[1.0, -2.0, 3.0], &[3]))];
        let p16 = vec![(
            "w".to_owned(),
            Tensor::from_slice(&[1.0f32, -2.0, 3.0])
                .to_kind(Kind::BFloat16)
                .set_requires_grad(true),
        )];
        for params in [&p32, &p16] {
            set_grads(params, &[Some(&[0.5, 0.25, -1.0])]);
        }
        let (mut o32, mut o16) = (adamw(), adamw());
        o32.step(&p32, 0.1).unwrap();
        o16.step(&p16, 0.1).unwrap();
        assert_eq!(p16[0].1.kind(), Kind::BFloat16);
        assert!(p16[0].1.equal(&p32[0].1.to_kind(Kind::BFloat16)));
        let (tensors, _) = o16.state_dict();
        assert!(tensors
            .iter()
            .filter(|(n, _)| n.starts_with("exp_avg"))
            .all(|(_, t)| t.kind() == Kind::Float));
    }

    #[test]
    fn clip_grad_norm_scales_above_max_norm() {
        let params = vec![
            ("x".to_owned(), leaf(&[0.0, 0.0], &[2])),
            ("y".to_owned(), leaf(&[0.0], &[1])),
            ("unused".to_owned(), leaf(&[0.0], &[1])),
        ];
        set_grads(&params, &[Some(&[3.0, 4.0]), Some(&[12.0]), None]);
        // sqrt(9 + 16 + 144) = 13; coef = 6.5 / (13 + 1e-6).
        let norm = clip_grad_norm(&params, 6.5);
        assert!((norm - 13.0).abs() < 1e-6, "{norm}");
        let coef = 6.5 / (13.0 + 1e-6);
        let got = [values(&params[0].1.grad()), values(&params[1].1.grad())].concat();
        let want: Vec<f32> = [3.0, 4.0, 12.0].iter().map(|g| (g * coef) as f32).collect();
        assert!(max_abs_diff(&got, &want) <= 1e-6, "{got:?}");

        // Below the threshold: the norm is reported, nothing changes.
        let norm = clip_grad_norm(&params, 100.0);
        assert!((norm - 6.5).abs() < 1e-5, "{norm}");
        assert_eq!(
            [values(&params[0].1.grad()), values(&params[1].1.grad())].concat(),
            got
        );
        // Not positive: measure only.
        clip_grad_norm(&params, 0.0);
        assert_eq!(
            [values(&params[0].1.grad()), values(&params[1].1.grad())].concat(),
            got
        );
    }

    #[test]
    fn schedule_key_steps() {
        let cosine = LrSchedule {
            base_lr: 1.0,
            warmup_steps: 10,
            total_steps: 110,
            min_lr_ratio: 0.1,
            kind: ScheduleKind::Cosine,
        };
        cosine.validate().unwrap();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert_eq!(cosine.lr_at(0), 0.0);
        assert!(close(cosine.lr_at(5), 0.5));
        assert!(close(cosine.lr_at(10), 1.0));
        // Half-way through the decay: 0.1 + 0.9 * 0.5.
        assert!(close(cosine.lr_at(60), 0.55));
        assert!(close(cosine.lr_at(110), 0.1));
        assert!(close(cosine.lr_at(1000), 0.1));

        let linear = LrSchedule {
            kind: ScheduleKind::Linear,
            ..cosine
        };
        assert!(close(linear.lr_at(35), 0.1 + 0.9 * 0.75));
        assert!(close(linear.lr_at(60), 0.55));
        assert!(close(linear.lr_at(110), 0.1));

        let constant = LrSchedule {
            kind: ScheduleKind::Constant,
            ..cosine
        };
        assert_eq!(constant.lr_at(0), 0.0);
        assert!(close(constant.lr_at(10), 1.0));
        assert!(close(constant.lr_at(5000), 1.0));

        let no_warmup = LrSchedule {
            warmup_steps: 0,
            ..cosine
        };
        assert_eq!(no_warmup.lr_at(0), 1.0);

        let bad = LrSchedule {
            warmup_steps: 200,
            ..cosine
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("warmup_steps"));
    }

    fn check_exact_resume(make: fn() -> Box<dyn Optimizer>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("optimizer.safetensors");

        let straight = fresh_params();
        let mut opt = make();
        run_steps(opt.as_mut(), &straight, 0..3);
        run_steps(opt.as_mut(), &straight, 1..3);

        let first = fresh_params();
        let mut opt = make();
        run_steps(opt.as_mut(), &first, 0..3);
        opt.save(&path).unwrap();
        drop(opt);

        // A new process would rebuild the parameters from the checkpoint.
        let resumed: Vec<(String, Tensor)> = first
            .iter()
            .map(|(n, p)| (n.clone(), p.detach().copy().set_requires_grad(true)))
            .collect();
        let mut opt = make();
        opt.load(&path, &resumed).unwrap();
        assert_eq!(opt.steps(), 3);
        run_steps(opt.as_mut(), &resumed, 1..3);
        assert_eq!(opt.steps(), 5);
        for ((name, a), (_, b)) in straight.iter().zip(&resumed) {
            assert!(a.equal(b), "parameter {name} differs after resume");
        }
    }

    #[test]
    fn adamw_resume_is_bit_exact() {
        check_exact_resume(|| Box::new(adamw()));
    }

    #[test]
    fn sgd_resume_is_bit_exact() {
        check_exact_resume(|| Box::new(sgd()));
    }

    #[test]
    fn load_rejects_mismatched_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("optimizer.safetensors");
        let params = fresh_params();
        let mut opt = adamw();
        run_steps(&mut opt, &params, 0..2);
        opt.save(&path).unwrap();

        let reshaped = vec![
            ("a".to_owned(), leaf(&A0, &[3, 2])),
            ("b".to_owned(), leaf(&B0, &[4])),
        ];
        let mut fresh = adamw();
        let err = fresh.load(&path, &reshaped).unwrap_err().to_string();
        assert!(
            err.contains("`exp_avg.a`") && err.contains("[2, 3]"),
            "{err}"
        );
        assert!(err.contains("optimizer.safetensors"), "{err}");
        assert_eq!(fresh.steps(), 0);

        let err = adamw().load(&path, &params[..1]).unwrap_err().to_string();
        assert!(
            err.contains("`exp_avg.b`") && err.contains("no parameter `b`"),
            "{err}"
        );

        let err = sgd().load(&path, &params).unwrap_err().to_string();
        assert!(err.contains("`adamw` state"), "{err}");

        let other = AdamW::new(AdamWConfig {
            betas: (0.9, 0.95),
            ..*opt.config()
        })
        .unwrap()
        .load(&path, &params)
        .unwrap_err()
        .to_string();
        assert!(other.contains("betas[1]"), "{other}");
    }

    #[test]
    fn fast_weights_keep_graph_for_second_order_maml() {
        // L_inner(p) = sum(c * p^2) / 2, so g = c * p and the fast weight is
        // w = (1 - lr c) p. With L_outer(w) = sum(w^2) / 2:
        //   second order: dL/dp = (1 - lr c)^2 p   (g built with create_graph)
        //   first order:  dL/dp = (1 - lr c) p     (g detached)
        let (p0, c, lr) = ([1.0f32, -2.0, 0.5], [0.5f32, 2.0, 4.0], 0.1);
        let expected = |power: i32| -> Vec<f32> {
            p0.iter()
                .zip(&c)
                .map(|(p, c)| (1.0 - lr as f32 * c).powi(power) * p)
                .collect()
        };
        for (create_graph, power) in [(true, 2), (false, 1)] {
            let params = vec![("p".to_owned(), leaf(&p0, &[3]))];
            let p = &params[0].1;
            let inner = (p * p * Tensor::from_slice(&c)).sum(Kind::Float) * 0.5;
            let grads = Tensor::run_backward(&[inner], &[p], create_graph, create_graph);
            let grads: Vec<Tensor> = if create_graph {
                grads
            } else {
                grads.iter().map(Tensor::detach).collect()
            };
            let fast = sgd_fast_weights(&params, &grads, lr).unwrap();
            assert!(fast[0].1.requires_grad());
            assert_eq!(fast[0].0, "p");
            let outer = (&fast[0].1 * &fast[0].1).sum(Kind::Float) * 0.5;
            outer.backward();
            let got = values(&p.grad());
            assert!(
                max_abs_diff(&got, &expected(power)) <= 1e-6,
                "create_graph={create_graph}: {got:?}"
            );
            // The parameter itself is untouched.
            assert_eq!(values(p), p0.to_vec());
        }
    }

    #[test]
    fn fast_weights_reject_mismatched_grads() {
        let params = fresh_params();
        let err = sgd_fast_weights(
            &params,
            &[Tensor::zeros([2, 3], (Kind::Float, tch::Device::Cpu))],
            0.1,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("2 parameters but 1 gradients"),
            "{err}"
        );
        let wrong = [
            Tensor::zeros([2, 3], (Kind::Float, tch::Device::Cpu)),
            Tensor::zeros([5], (Kind::Float, tch::Device::Cpu)),
        ];
        let err = sgd_fast_weights(&params, &wrong, 0.1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("parameter `b`"), "{err}");
    }

    #[test]
    fn invalid_settings_are_rejected() {
        assert!(AdamW::new(AdamWConfig {
            betas: (1.0, 0.999),
            ..AdamWConfig::default()
        })
        .is_err());
        assert!(Sgd::new(SgdConfig {
            momentum: -0.1,
            weight_decay: 0.0
        })
        .is_err());
        let params = fresh_params();
        let err = adamw().step(&params, f64::NAN).unwrap_err().to_string();
        assert!(err.contains("learning rate"), "{err}");
    }
}
