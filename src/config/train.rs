//! `[train]`: the training loop's steps, batch, optimizer and schedule,
//! advantages, loss weights, checkpoints and held-out evaluation hooks
//! (docs/train.md).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{Problems, Section, StrategyKind};

/// Which optimizer updates the trainable weights.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    #[default]
    Adamw,
    Sgd,
}

/// Weights of the loss terms (FALCON Algorithm 1 line 10 adds them; a
/// weight of 0 still logs the term).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LossWeights {
    /// Policy gradient on the composite reward's advantages.
    pub pg: f64,
    /// Fine-grained loss on the tokens of failing lines (Eqs. 2, 8).
    pub fine: f64,
    /// Cross-entropy on passing samples (L_sl, Eq. 3).
    pub sl: f64,
    /// KL penalty to the frozen reference policy (the base model under
    /// LoRA); 0 = off, and the reference forward is skipped.
    pub kl: f64,
}

impl Default for LossWeights {
    fn default() -> Self {
        LossWeights {
            pg: 1.0,
            fine: 1.0,
            sl: 0.0,
            kl: 0.0,
        }
    }
}

/// `[train]`: see docs/train.md.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Policy updates in the run.
    pub steps: u64,
    /// Tasks per step.
    pub tasks_per_step: usize,
    /// Samples generated per task (G).
    pub group_size: usize,
    pub optimizer: OptimizerKind,
    /// Peak learning rate.
    pub lr: f64,
    pub weight_decay: f64,
    pub warmup_steps: u64,
    pub schedule: ScheduleKind,
    /// Final learning rate as a fraction of `lr` (cosine / linear).
    pub min_lr_ratio: f64,
    /// Global gradient-norm clip; 0 = off.
    pub grad_clip: f64,
    pub advantage: AdvantageKind,
    /// Divide group-mean advantages by the group's standard deviation (GRPO).
    pub normalize_std: bool,
    pub normalization: Normalization,
    pub loss: LossWeights,
    /// Write `step-N/` every this many steps (and after the last).
    pub checkpoint_every: u64,
    /// Checkpoints kept (the newest); 0 keeps all.
    pub keep_last: usize,
    /// The instruction put before each task in the user message.
    pub instruction: String,
    /// The rollout: `zero-shot`, or a strategy (`self-repair`, `memocoder`,
    /// `doc-rag`, `memcoder`, `memcoder-accum`, with `[strategy]`'s
    /// settings) whose final answers, under the prompts that produced them,
    /// are what the policy learns from. Single-level loop only.
    pub strategy: StrategyKind,
    /// Optimizer steps on each generated batch (PPO-style reuse). Above 1
    /// the policy-gradient term uses the clipped ratio with `clip_eps`.
    pub ppo_epochs: usize,
    pub clip_eps: f64,
    /// Sequences per forward/backward pass; the gradients of a step's
    /// micro-batches are accumulated (exactly: each term keeps the whole
    /// batch's normalisation). 0 = the whole batch at once.
    pub micro_batch: usize,
    /// In the update and the meta-loop's passes, run each prompt once for
    /// the samples of a micro-batch that share it (a GRPO group) instead of
    /// once per sample: the same losses and gradients up to float rounding
    /// (second-order MAML included), less compute.
    pub shared_prefix: bool,
    /// Score sampled tokens from the hidden states in chunks
    /// (`kernels::fused`; the CUDA kernel on a GPU) instead of full fp32
    /// `[tokens × vocabulary]` logits: the same values and first-order
    /// gradients up to rounding, a fraction of the memory. Applies with a
    /// frozen output projection (LoRA); second-order MAML passes use the
    /// plain path.
    pub fused_logprobs: bool,
    /// Mixed precision for the update's forward passes: `"bf16"` or
    /// `"fp16"` autocast (matmuls in the low precision; weights, gradients,
    /// optimizer state and log-softmax in fp32) on the model's device, CPU
    /// included. The meta-loop's passes stay in the model's dtype.
    pub autocast: Autocast,
    /// Start from the trainable weights of this checkpoint directory
    /// (`runs/NAME/step-N`, e.g. of a `falcon sft` run); its LoRA settings
    /// must match `[model.lora]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_from: Option<PathBuf>,
    /// Evaluate on `[eval]`'s tasks before the first step / after the last.
    pub eval_before: bool,
    pub eval_after: bool,
    /// Also evaluate on `[eval]`'s tasks after every this many steps (0 =
    /// off), for held-out curves; that time is not counted in
    /// `max_minutes`.
    pub eval_every: u64,
    /// Stop (with a checkpoint, then `eval_after`) after the step during
    /// which this many minutes of training have passed, counted over all
    /// the sessions of a resumed run; 0 = no limit. For comparisons at
    /// equal wall-clock budgets.
    pub max_minutes: f64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            steps: 20,
            tasks_per_step: 4,
            group_size: 4,
            optimizer: OptimizerKind::Adamw,
            lr: 1e-4,
            weight_decay: 0.0,
            warmup_steps: 0,
            schedule: ScheduleKind::Constant,
            min_lr_ratio: 0.1,
            grad_clip: 1.0,
            advantage: Default::default(),
            normalize_std: false,
            normalization: Default::default(),
            loss: LossWeights::default(),
            checkpoint_every: 5,
            keep_last: 3,
            instruction: "Write a Python function for the task below. Answer with the complete code in one ```python block.".into(),
            strategy: StrategyKind::ZeroShot,
            ppo_epochs: 1,
            clip_eps: 0.2,
            micro_batch: 0,
            shared_prefix: true,
            fused_logprobs: true,
            autocast: Autocast::Off,
            init_from: None,
            eval_before: false,
            eval_after: false,
            eval_every: 0,
            max_minutes: 0.0,
        }
    }
}

/// `[train] autocast`: mixed precision of the update.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Autocast {
    /// The model's own dtype throughout.
    #[default]
    Off,
    Bf16,
    Fp16,
}

impl Section for TrainConfig {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        if self.strategy == StrategyKind::Falcon {
            problems.push(
                &format!("{path}.strategy"),
                self.strategy.name(),
                "FALCON's prompt comes from [meta]'s long-term memory: use zero-shot with a [meta] algorithm",
            );
        }
        for (key, value) in [
            ("steps", self.steps),
            ("tasks_per_step", self.tasks_per_step as u64),
            ("group_size", self.group_size as u64),
            ("checkpoint_every", self.checkpoint_every),
            ("ppo_epochs", self.ppo_epochs as u64),
        ] {
            if value == 0 {
                problems.push(&format!("{path}.{key}"), value, "must be >= 1");
            }
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            problems.push(&format!("{path}.lr"), self.lr, "must be a positive number");
        }
        for (key, v) in [
            ("weight_decay", self.weight_decay),
            ("grad_clip", self.grad_clip),
            ("loss.pg", self.loss.pg),
            ("loss.fine", self.loss.fine),
            ("loss.sl", self.loss.sl),
            ("loss.kl", self.loss.kl),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                problems.push(&format!("{path}.{key}"), v, "must be a finite number >= 0");
            }
        }
        if !(self.clip_eps.is_finite() && self.clip_eps > 0.0 && self.clip_eps < 1.0) {
            problems.push(
                &format!("{path}.clip_eps"),
                self.clip_eps,
                "must be in (0, 1)",
            );
        }
        if let Some(p) = &self.init_from {
            if p.as_os_str().is_empty() {
                problems.push(
                    &format!("{path}.init_from"),
                    p,
                    "must not be empty; remove the key to leave it unset",
                );
            }
        }
        if !(self.max_minutes.is_finite() && self.max_minutes >= 0.0) {
            problems.push(
                &format!("{path}.max_minutes"),
                self.max_minutes,
                "must be a finite number >= 0 (0 = no limit)",
            );
        }
        if self.schedule != ScheduleKind::Constant && self.warmup_steps > self.steps {
            problems.push(
                &format!("{path}.warmup_steps"),
                self.warmup_steps,
                &format!(
                    "exceeds [train] steps = {}: the {} decay would never start; lower the warm-up or raise steps",
                    self.steps,
                    match self.schedule {
                        ScheduleKind::Cosine => "cosine",
                        _ => "linear",
                    }
                ),
            );
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            problems.push(
                &format!("{path}.min_lr_ratio"),
                self.min_lr_ratio,
                "must be in [0, 1]",
            );
        }
    }
}

/// Shape of the learning-rate curve after warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScheduleKind {
    /// `base_lr` after warm-up.
    Constant,
    /// Half-cosine from `base_lr` to `min_lr_ratio * base_lr`.
    Cosine,
    /// Straight line from `base_lr` to `min_lr_ratio * base_lr`.
    Linear,
}

/// How a sample's reward becomes its advantage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdvantageKind {
    /// The reward itself, as in FALCON's Eq. 2.
    None,
    /// `r − mean(group)`; with `normalize_std`, divided by the group's
    /// standard deviation (GRPO).
    #[default]
    GroupMean,
    /// `r − mean(other samples of the group)` (RLOO); 0 for a sample alone in its group.
    Rloo,
}

/// How the policy-gradient loss averages its per-token terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Normalization {
    /// Mean over every masked token of the batch: each token weighs the same,
    /// so long completions weigh more (DAPO's token-level loss).
    #[default]
    TokenMean,
    /// Mean over each sequence's masked tokens, then over the sequences that
    /// have any: each completion weighs the same (the original GRPO loss).
    SequenceMean,
}
