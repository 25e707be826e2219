//! FALCON's meta-RL (Algorithm 1) over fast LoRA weights: for each task of
//! a batch, fast weights θ_i start from θ (the trainable adapters), take
//! `inner_steps` SGD steps with rate α on `L_inner` over a mini-batch of the
//! task's own samples, short-term memory rows and long-term memory
//! demonstrations; θ_i is then evaluated on the task (generation with the
//! fast weights, execution, rewards) and the outcomes go to both memories.
//! The meta-update sums `L_inner(θ_i)` over the evaluation samples and
//! steps θ with the outer optimizer (second-order MAML, first-order MAML),
//! or moves θ toward the mean θ_i (Reptile).
//!
//! Fast weights are swapped into the policy's adapters
//! ([`Policy::swap_adapters`]), so K adaptations cost K adapters, never a
//! second model. Second-order MAML carries the query gradient back through
//! the inner steps with Hessian-vector products (double backward, which
//! needs the composite attention kernel,
//! [`crate::model::Decoder::set_math_attention`]), one inner step at a time.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use tch::Tensor;

use super::metrics::JsonlWriter;
use super::optim::{clip_grad_norm, sgd_fast_weights, zero_grad};
use super::rl::{
    mix, seqs_loss, sft_example, trainable, Rollout, StepRecord, TrainError, Trainer, UpdateSeq,
};
use crate::config::{MetaAlgorithm, MetaPrompt, RunConfig};
use crate::exec::RewardClass;
use crate::memory::long_term::{Experience, Retrieved};
use crate::memory::short_term::{Batch, Sample};
use crate::memory::{
    embedder_from_config, index_from_config, Embedder, LongTerm, MemoryError, MemoryStore,
    ShortTerm,
};
use crate::model::Policy;
use crate::reward::{code_in_completion, TokenSpan};
use crate::rollout::{falcon_prompt, task_prompt};
use crate::task::Task;

/// Named tensors: the trainable weights θ or one task's fast weights θ_i.
pub type Weights = Vec<(String, Tensor)>;

/// The inner loop of Algorithm 1 (lines 9–11).
#[derive(Debug, Clone, Copy)]
pub struct InnerLoop {
    pub steps: usize,
    /// α.
    pub lr: f64,
}

/// One task's adaptation: the fast weights θ_i and the points the inner
/// steps started from, all detached (the meta-gradient is formed by
/// [`meta_backward`], which revisits them one at a time).
pub struct Adapted {
    /// θ_i = θ_K, as leaves that require grad.
    pub fast: Weights,
    /// θ_0 = θ, …, θ_{K−1}.
    path: Vec<Weights>,
    /// The inner loss before each step.
    pub losses: Vec<f64>,
}

impl Adapted {
    /// No adaptation: θ_i = θ.
    pub fn identity(theta: &[(String, Tensor)]) -> Self {
        Adapted {
            fast: leaves(theta),
            path: Vec::new(),
            losses: Vec::new(),
        }
    }
}

/// Detached copies of `w` that require grad: the inputs of one
/// differentiation, with no graph behind them.
fn leaves(w: &[(String, Tensor)]) -> Weights {
    w.iter()
        .map(|(n, t)| (n.clone(), t.detach().copy().set_requires_grad(true)))
        .collect()
}

fn grads_of(
    l: &Tensor,
    at: &[(String, Tensor)],
    create_graph: bool,
) -> Result<Vec<Tensor>, TrainError> {
    let inputs: Vec<&Tensor> = at.iter().map(|(_, t)| t).collect();
    Tensor::f_run_backward(&[l], &inputs, create_graph, create_graph)
        .map_err(|e| TrainError::Invalid(format!("meta-gradient: {e}")))
}

/// `acc += add`, where an undefined tensor is zero.
fn accumulate(acc: &mut [Tensor], add: Vec<Tensor>) {
    for (a, g) in acc.iter_mut().zip(add) {
        if g.defined() {
            *a = if a.defined() { &*a + g } else { g };
        }
    }
}

fn undefined(n: usize) -> Vec<Tensor> {
    (0..n).map(|_| Tensor::new()).collect()
}

/// A loss evaluated in pieces (micro-batches): it hands each piece's loss,
/// with its graph, to the sink, and returns the summed term values
/// (`total` included). The pieces add up to the loss, so gradients and
/// Hessian-vector products are sums over pieces, and a pass holds one
/// piece's activations at a time.
pub trait PieceLoss:
    FnMut(
    &mut Policy,
    &mut dyn FnMut(Tensor) -> Result<(), TrainError>,
) -> Result<BTreeMap<String, f64>, TrainError>
{
}

impl<F> PieceLoss for F where
    F: FnMut(
        &mut Policy,
        &mut dyn FnMut(Tensor) -> Result<(), TrainError>,
    ) -> Result<BTreeMap<String, f64>, TrainError>
{
}

/// The gradient of `loss` at `at` (swapped into the policy), summed over
/// its pieces, and its term values.
fn gradient(
    policy: &mut Policy,
    at: &[(String, Tensor)],
    loss: &mut impl PieceLoss,
) -> Result<(Vec<Tensor>, BTreeMap<String, f64>), TrainError> {
    let mut grads = undefined(at.len());
    let parts = policy.with_adapters(at, |p| {
        loss(p, &mut |l: Tensor| {
            if l.requires_grad() {
                accumulate(&mut grads, grads_of(&l, at, false)?);
            }
            Ok(())
        })
    })??;
    Ok((grads, parts))
}

/// Fast weights θ_i from θ by `inner.steps` SGD steps on `loss`, which is
/// evaluated with the current fast weights swapped into the policy. No
/// graph is kept: each piece's is freed once its gradient is taken.
pub fn adapt(
    policy: &mut Policy,
    theta: &[(String, Tensor)],
    inner: &InnerLoop,
    mut loss: impl PieceLoss,
) -> Result<Adapted, TrainError> {
    let mut at = leaves(theta);
    let mut path = Vec::with_capacity(inner.steps);
    let mut losses = Vec::with_capacity(inner.steps);
    for _ in 0..inner.steps {
        let (grads, parts) = gradient(policy, &at, &mut loss)?;
        losses.push(parts.get("total").copied().unwrap_or(0.0));
        let next = tch::no_grad(|| sgd_fast_weights(&at, &grads, inner.lr))?;
        path.push(std::mem::replace(&mut at, leaves(&next)));
    }
    Ok(Adapted {
        fast: at,
        path,
        losses,
    })
}

/// Accumulate one task's meta-gradient into θ's `.grad` and return the
/// query loss's terms.
///
/// `v = ∇L_q(θ_K)` at the fast weights. First order (`second_order` off)
/// applies v to θ. Second order carries it back through the inner steps,
/// `v ← v − α·H_s(θ_k)·v` for k = K−1 … 0 (the Jacobian of an SGD step is
/// `I − α·H`), with each Hessian-vector product taken by differentiating
/// `⟨∇L_s(θ_k), v⟩` again, piece by piece. This is exactly MAML's gradient
/// through the inner steps, but only one piece's double-backward graph is
/// alive at a time (the forward pass is recomputed), never the whole
/// unrolled loop plus the query pass. Double backward needs the composite
/// attention kernel.
pub fn meta_backward(
    policy: &mut Policy,
    theta: &[(String, Tensor)],
    adapted: &Adapted,
    inner: &InnerLoop,
    second_order: bool,
    mut inner_loss: impl PieceLoss,
    mut query_loss: impl PieceLoss,
) -> Result<BTreeMap<String, f64>, TrainError> {
    let (mut v, parts) = gradient(policy, &adapted.fast, &mut query_loss)?;
    if v.iter().all(|t| !t.defined()) {
        return Ok(parts);
    }
    if second_order {
        policy.model.set_math_attention(true);
        let back = (|| -> Result<(), TrainError> {
            for at in adapted.path.iter().rev() {
                let at = leaves(at);
                let mut hv = undefined(at.len());
                policy.with_adapters(&at, |p| {
                    inner_loss(p, &mut |l: Tensor| {
                        if !l.requires_grad() {
                            return Ok(());
                        }
                        let g = grads_of(&l, &at, true)?;
                        let mut dot: Option<Tensor> = None;
                        for (gj, vj) in g.iter().zip(&v) {
                            if gj.defined() && vj.defined() {
                                let t = (gj * vj).sum(gj.kind());
                                dot = Some(match dot {
                                    Some(d) => d + t,
                                    None => t,
                                });
                            }
                        }
                        if let Some(dot) = dot.filter(|d| d.requires_grad()) {
                            accumulate(&mut hv, grads_of(&dot, &at, false)?);
                        }
                        Ok(())
                    })
                })??;
                for (vj, h) in v.iter_mut().zip(&hv) {
                    if vj.defined() && h.defined() {
                        *vj = &*vj - h * inner.lr;
                    }
                }
            }
            Ok(())
        })();
        policy.model.set_math_attention(false);
        back?;
    }
    // θ.grad += v, through autograd's own accumulation.
    let mut surrogate: Option<Tensor> = None;
    for ((_, p), vj) in theta.iter().zip(&v) {
        if vj.defined() {
            let t = (p * vj.detach()).sum(p.kind());
            surrogate = Some(match surrogate {
                Some(s) => s + t,
                None => t,
            });
        }
    }
    if let Some(s) = surrogate {
        s.backward();
    }
    Ok(parts)
}

/// Reptile's outer step: θ ← θ + ε · mean_i(θ_i − θ), in place.
pub fn reptile_update(
    theta: &[(String, Tensor)],
    adapted: &[Vec<(String, Tensor)>],
    eps: f64,
) -> Result<(), TrainError> {
    if adapted.is_empty() {
        return Ok(());
    }
    tch::no_grad(|| {
        for (j, (name, p)) in theta.iter().enumerate() {
            let mut sum = p.zeros_like();
            for a in adapted {
                let (n, t) = a
                    .get(j)
                    .ok_or_else(|| TrainError::Invalid(format!("adapted weights lack `{name}`")))?;
                if n != name {
                    return Err(TrainError::Invalid(format!(
                        "adapted weight `{n}` where `{name}` was expected"
                    )));
                }
                sum += t.detach() - p;
            }
            let step = sum * (eps / adapted.len() as f64);
            let _ = p.shallow_clone().g_add_(&step);
        }
        Ok(())
    })
}

// ---------------------------------------------------------------- the loop

/// The memories of a meta-RL run: the short-term ring buffer (inner
/// mini-batches) and, when `[meta] long_term`, the long-term store and
/// index with their embedder (Table 7 prompts, demonstrations).
pub(super) struct MetaMemory {
    pub short_term: ShortTerm,
    pub long_term: Option<(LongTerm, Box<dyn Embedder>)>,
}

/// File of the short-term buffer inside a checkpoint.
pub const SHORT_TERM_FILE: &str = "short_term.safetensors";

impl MetaMemory {
    /// Open the memories of `run_dir`, forgetting long-term rows of steps
    /// after `step` (an interrupted future that a resume repeats).
    pub fn open(cfg: &RunConfig, run_dir: &Path, step: u64) -> Result<Self, TrainError> {
        let device = crate::model::device::device_of(cfg);
        let mem = |e: MemoryError| TrainError::Invalid(format!("memory: {e}"));
        let short_term = ShortTerm::new(
            cfg.memory.short_term_capacity,
            cfg.memory.short_term_max_len,
            device,
            cfg.run.seed ^ 0x5_7e4d,
        )
        .map_err(mem)?;
        let long_term = if cfg.meta.long_term {
            let embedder = embedder_from_config(&cfg.memory, device).map_err(mem)?;
            let index = index_from_config(&cfg.memory, embedder.dim(), device).map_err(mem)?;
            let mut store = MemoryStore::open(run_dir).map_err(|e| mem(e.into()))?;
            store
                .truncate_long_term_after(step)
                .map_err(|e| mem(e.into()))?;
            let lt = LongTerm::with_store(store, embedder.as_ref(), index).map_err(mem)?;
            Some((lt, embedder))
        } else {
            None
        };
        Ok(MetaMemory {
            short_term,
            long_term,
        })
    }

    /// Push a rollout's samples (prompt + completion tokens, the sample's
    /// advantage on every completion token, `R_fine` on its span tokens).
    pub fn remember_samples(&mut self, ro: &Rollout) -> Result<(), TrainError> {
        let mut rows = Vec::with_capacity(ro.comps.len());
        for (i, c) in ro.comps.iter().enumerate() {
            rows.push(OwnedSeq {
                prompt_ids: c.prompt_ids.clone(),
                completion_ids: c.token_ids.clone(),
                advantage: ro.adv[i],
                passed: ro.passed(i),
                spans: ro.spans[i].clone(),
                logprobs: c.logprobs.clone(),
            });
        }
        self.remember(&rows)
    }

    pub fn remember(&mut self, rows: &[OwnedSeq]) -> Result<(), TrainError> {
        let flat: Vec<[Vec<f32>; 3]> = rows.iter().map(OwnedSeq::per_token).collect();
        let ids: Vec<Vec<i64>> = rows
            .iter()
            .map(|r| [r.prompt_ids.as_slice(), r.completion_ids.as_slice()].concat())
            .collect();
        let samples: Vec<Sample> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| Sample {
                token_ids: &ids[i],
                rewards: &flat[i][0],
                logprobs: &flat[i][1],
                advantages: &flat[i][2],
                prompt_len: r.prompt_ids.len(),
                passed: r.passed,
            })
            .collect();
        self.short_term
            .push(&samples)
            .map_err(|e| TrainError::Invalid(format!("short-term memory: {e}")))
    }

    /// `n` rows drawn from the short-term buffer, back on the host.
    pub fn draw(&mut self, n: usize) -> Vec<OwnedSeq> {
        if n == 0 || self.short_term.is_empty() {
            return Vec::new();
        }
        OwnedSeq::from_batch(&self.short_term.sample(n))
    }
}

/// An update sequence that owns its tokens (rows from memory).
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedSeq {
    pub prompt_ids: Vec<i64>,
    pub completion_ids: Vec<i64>,
    pub advantage: f64,
    pub passed: bool,
    pub spans: Vec<TokenSpan>,
    /// One per completion token (0 where unknown, e.g. demonstrations).
    pub logprobs: Vec<f32>,
}

impl OwnedSeq {
    pub fn as_seq(&self) -> UpdateSeq<'_> {
        UpdateSeq {
            prompt_ids: &self.prompt_ids,
            completion_ids: &self.completion_ids,
            advantage: self.advantage,
            passed: self.passed,
            spans: &self.spans,
        }
    }

    /// Per-token rewards (`R_fine` on span tokens), log-probs and
    /// advantages over prompt + completion; the prompt's are 0.
    fn per_token(&self) -> [Vec<f32>; 3] {
        let (p, n) = (self.prompt_ids.len(), self.completion_ids.len());
        let mut rewards = vec![0f32; p + n];
        for s in &self.spans {
            for t in s.start_token.min(n)..s.end_token.min(n) {
                rewards[p + t] = s.reward as f32;
            }
        }
        let mut logprobs = vec![0f32; p + n];
        for (t, &l) in self.logprobs.iter().take(n).enumerate() {
            logprobs[p + t] = l;
        }
        let mut adv = vec![0f32; p + n];
        adv[p..].fill(self.advantage as f32);
        [rewards, logprobs, adv]
    }

    /// The rows of a short-term batch: prompt and completion split where
    /// `scored` starts, the advantage of the first completion token, and
    /// spans from the runs of equal non-zero per-token rewards.
    pub fn from_batch(b: &Batch) -> Vec<OwnedSeq> {
        let host = |t: &Tensor, k: tch::Kind| t.to_device(tch::Device::Cpu).to_kind(k);
        let ids = host(&b.token_ids, tch::Kind::Int64);
        let mask = host(&b.mask, tch::Kind::Int64);
        let scored = host(&b.scored, tch::Kind::Int64);
        let rewards = host(&b.rewards, tch::Kind::Float);
        let logprobs = host(&b.logprobs, tch::Kind::Float);
        let adv = host(&b.advantages, tch::Kind::Float);
        let passed: Vec<i64> = Vec::try_from(host(&b.passed, tch::Kind::Int64)).unwrap_or_default();
        let row = |t: &Tensor, r: usize| -> Vec<f64> {
            Vec::try_from(t.get(r as i64).to_kind(tch::Kind::Double)).unwrap_or_default()
        };
        (0..b.slots.len())
            .map(|r| {
                let toks: Vec<i64> = Vec::try_from(ids.get(r as i64)).unwrap_or_default();
                let len = row(&mask, r).iter().filter(|&&m| m > 0.0).count();
                let sc = row(&scored, r);
                let p = sc[..len].iter().position(|&s| s > 0.0).unwrap_or(len);
                let rw = row(&rewards, r);
                let mut spans: Vec<TokenSpan> = Vec::new();
                for (t, &v) in rw.iter().enumerate().take(len).skip(p) {
                    if v == 0.0 {
                        continue;
                    }
                    match spans.last_mut() {
                        Some(s) if s.end_token == t - p && s.reward == v => s.end_token += 1,
                        _ => spans.push(TokenSpan {
                            start_token: t - p,
                            end_token: t - p + 1,
                            reward: v,
                        }),
                    }
                }
                OwnedSeq {
                    prompt_ids: toks[..p].to_vec(),
                    completion_ids: toks[p..len].to_vec(),
                    advantage: if p < len { row(&adv, r)[p] } else { 0.0 },
                    passed: passed.get(r).is_some_and(|&x| x != 0),
                    spans,
                    logprobs: row(&logprobs, r)[p..len]
                        .iter()
                        .map(|&x| x as f32)
                        .collect(),
                }
            })
            .collect()
    }
}

impl Trainer<'_> {
    /// Algorithm 1 line 4: the reference solutions of the task set, run in
    /// the sandbox, become long-term entries (step 0) and passing
    /// short-term rows. Done once, at the start of a fresh run.
    pub(super) fn populate_memories(&mut self) -> Result<usize, TrainError> {
        let demos: Vec<&Task> = self
            .tasks
            .iter()
            .filter(|t| t.canonical_solution.is_some())
            .collect();
        if demos.is_empty() || self.memory.is_none() {
            return Ok(0);
        }
        let jobs: Vec<(&Task, &str)> = demos
            .iter()
            .map(|t| (*t, t.canonical_solution.as_deref().unwrap_or_default()))
            .collect();
        let reports = self.sandbox.run_batch(&jobs);
        let mut rows = Vec::new();
        let mut experiences = Vec::new();
        for (t, r) in demos.iter().zip(&reports) {
            let passed = r.outcome == Some(RewardClass::Pass);
            let solution = t.canonical_solution.as_deref().unwrap_or_default();
            let answer = format!("```python\n{}\n```", solution.trim_end());
            let (p, c) = sft_example(
                self.policy,
                &task_prompt(&self.cfg.train.instruction, t),
                &answer,
            )?;
            rows.push(OwnedSeq {
                logprobs: vec![0.0; c.len()],
                prompt_ids: p,
                completion_ids: c,
                advantage: 0.0,
                passed,
                spans: Vec::new(),
            });
            experiences.push(Experience {
                step: 0,
                task_id: t.id.clone(),
                task_text: t.prompt.clone(),
                code: solution.to_owned(),
                report: r.clone(),
                rewards: BTreeMap::new(),
            });
        }
        let mem = self.memory.as_mut().expect("checked above");
        mem.remember(&rows)?;
        if let Some((lt, emb)) = mem.long_term.as_mut() {
            if lt.store().count_long_term().unwrap_or(0) == 0 {
                lt.insert(emb.as_ref(), &experiences)
                    .map_err(|e| TrainError::Invalid(format!("long-term memory: {e}")))?;
            }
        }
        Ok(rows.len())
    }

    /// Prompts of the step: FALCON's Table 7 with the retrieved history
    /// when long-term memory is on (unless `[meta] prompt = "zero-shot"`),
    /// else zero-shot; and each task's retrieved neighbours (none without
    /// long-term memory), which also supply the demonstrations.
    fn meta_prompts(
        &mut self,
        tasks: &[&Task],
    ) -> Result<(Vec<String>, Vec<Vec<Retrieved>>), TrainError> {
        let instruction = self.cfg.train.instruction.clone();
        let k = self.cfg.memory.top_k;
        let table7 = self.cfg.meta.prompt == MetaPrompt::Table7;
        let mem = self.memory.as_mut().expect("meta runs have memory");
        match mem.long_term.as_mut() {
            Some((lt, emb)) => {
                let texts: Vec<&str> = tasks.iter().map(|t| t.prompt.as_str()).collect();
                let hits = lt
                    .retrieve(emb.as_ref(), &texts, k)
                    .map_err(|e| TrainError::Invalid(format!("long-term memory: {e}")))?;
                let prompts = tasks
                    .iter()
                    .zip(&hits)
                    .map(|(t, h)| {
                        if table7 {
                            falcon_prompt(t, h)
                        } else {
                            task_prompt(&instruction, t)
                        }
                    })
                    .collect();
                Ok((prompts, hits))
            }
            None => Ok((
                tasks.iter().map(|t| task_prompt(&instruction, t)).collect(),
                vec![Vec::new(); tasks.len()],
            )),
        }
    }

    /// Passing neighbours from long-term memory (other tasks), as
    /// demonstrations for `L_sl`.
    fn demos_from(
        &self,
        hits: &[Retrieved],
        task: &Task,
        n: usize,
    ) -> Result<Vec<OwnedSeq>, TrainError> {
        let mut out = Vec::new();
        for h in hits {
            if out.len() == n {
                break;
            }
            let r = &h.record;
            if r.task_id == task.id || r.report.outcome != Some(RewardClass::Pass) {
                continue;
            }
            let prompt = format!(
                "{}\n\n{}",
                self.cfg.train.instruction,
                r.task_text.trim_end()
            );
            let answer = format!("```python\n{}\n```", r.code.trim_end());
            let (p, c) = sft_example(self.policy, &prompt, &answer)?;
            out.push(OwnedSeq {
                logprobs: vec![0.0; c.len()],
                prompt_ids: p,
                completion_ids: c,
                advantage: 0.0,
                passed: true,
                spans: Vec::new(),
            });
        }
        Ok(out)
    }

    /// One meta-step of Algorithm 1 over the step's task batch.
    pub(super) fn meta_step(
        &mut self,
        samples_log: &mut JsonlWriter,
    ) -> Result<StepRecord, TrainError> {
        let t = self.cfg.train.clone();
        let m = self.cfg.meta.clone();
        let seed = mix(self.cfg.run.seed, self.step);
        tch::manual_seed(seed as i64);
        let tasks = self.step_tasks();
        let (prompts, hits) = self.meta_prompts(&tasks)?;
        let mut seconds = BTreeMap::new();
        let g = t.group_size;
        // Line 8: generate with θ and record in short-term memory (after the
        // inner mini-batches are drawn, so they come from earlier steps).
        let support = self.sample(&tasks, &prompts, g, seed, &mut seconds)?;
        let q = if m.query_size == 0 { g } else { m.query_size };
        let inner = InnerLoop {
            steps: m.inner_steps,
            lr: m.inner_lr,
        };
        let second_order = m.algorithm == MetaAlgorithm::Maml;
        let theta = trainable(self.policy);
        zero_grad(&theta);
        let t_update = Instant::now();
        let mut loss: BTreeMap<String, f64> = BTreeMap::new();
        let mut inner_first = 0.0;
        let mut adapted = Vec::new();
        let mut queries: Vec<Rollout> = Vec::with_capacity(tasks.len());
        let support_seqs = support.seqs();
        let mut outside = 0.0;
        for (i, task) in tasks.iter().enumerate() {
            // Line 9: the task's own samples, short-term rows, and passing
            // neighbours from long-term memory.
            let mut extra = self
                .memory
                .as_mut()
                .expect("meta runs have memory")
                .draw(m.short_term_samples);
            extra.extend(self.demos_from(&hits[i], task, m.long_term_demos)?);
            let mut batch: Vec<UpdateSeq> = support_seqs[i * g..(i + 1) * g].to_vec();
            batch.extend(extra.iter().map(OwnedSeq::as_seq));
            let mb = t.micro_batch;
            let inner_loss =
                |p: &mut Policy, sink: &mut dyn FnMut(Tensor) -> Result<(), TrainError>| {
                    seqs_loss(
                        p,
                        &batch,
                        mb,
                        t.normalization,
                        &t.loss,
                        t.shared_prefix,
                        sink,
                    )
                };
            if m.inner_steps == 0 {
                // No adaptation (θ_i = θ): FALCON's memories and rewards in
                // a single-level update, the "without the meta-loop" arm.
                let parts = meta_backward(
                    self.policy,
                    &theta,
                    &Adapted::identity(&theta),
                    &inner,
                    false,
                    inner_loss,
                    inner_loss,
                )?;
                for (k, v) in parts {
                    *loss.entry(k).or_insert(0.0) += v;
                }
                continue;
            }
            // Lines 10–11.
            let ad = adapt(self.policy, &theta, &inner, inner_loss)?;
            inner_first += ad.losses.first().copied().unwrap_or(0.0) / tasks.len() as f64;
            // Line 12: evaluate θ_i on T_i.
            let before: f64 = seconds.values().sum();
            let mut slot: Weights = ad
                .fast
                .iter()
                .map(|(n, x)| (n.clone(), x.shallow_clone()))
                .collect();
            self.policy.swap_adapters(&mut slot)?;
            let qr = self.sample(
                &[*task],
                &prompts[i..=i],
                q,
                mix(seed, i as u64 + 1),
                &mut seconds,
            );
            self.policy.swap_adapters(&mut slot)?;
            let qr = qr?;
            outside += seconds.values().sum::<f64>() - before;
            // Line 14: L_meta = Σ_i L_inner(θ_i) on the evaluation samples.
            let qs = qr.seqs();
            let query_loss =
                |p: &mut Policy, sink: &mut dyn FnMut(Tensor) -> Result<(), TrainError>| {
                    seqs_loss(p, &qs, mb, t.normalization, &t.loss, t.shared_prefix, sink)
                };
            let parts = match m.algorithm {
                MetaAlgorithm::Reptile => {
                    // Logged only: Reptile's update does not use the query loss.
                    let parts = tch::no_grad(|| {
                        self.policy
                            .with_adapters(&ad.fast, |p| query_loss(p, &mut |_| Ok(())))
                    })??;
                    adapted.push(ad.fast);
                    parts
                }
                _ => meta_backward(
                    self.policy,
                    &theta,
                    &ad,
                    &inner,
                    second_order,
                    inner_loss,
                    query_loss,
                )?,
            };
            drop(qs);
            for (k, v) in parts {
                *loss.entry(k).or_insert(0.0) += v;
            }
            queries.push(qr);
        }
        if m.inner_steps > 0 {
            loss.insert("inner".into(), inner_first);
        }
        let lr = self.schedule.lr_at(self.step);
        let grad_norm = if m.algorithm == MetaAlgorithm::Reptile {
            reptile_update(&theta, &adapted, m.reptile_eps)?;
            0.0
        } else {
            let n = clip_grad_norm(&theta, t.grad_clip);
            if n.is_finite() {
                self.optimizer.step(&theta, lr)?;
            }
            zero_grad(&theta);
            n
        };
        seconds.insert(
            "update".to_owned(),
            (t_update.elapsed().as_secs_f64() - outside).max(0.0),
        );
        // Outcomes go to both memories.
        let mem = self.memory.as_mut().expect("meta runs have memory");
        mem.remember_samples(&support)?;
        for qr in &queries {
            mem.remember_samples(qr)?;
        }
        // Long-term memory records the evaluated samples: θ_i's, or θ's own
        // when there is no adaptation (inner_steps = 0).
        let evaluated: Vec<(&Rollout, &[&Task])> = if queries.is_empty() {
            vec![(&support, &tasks[..])]
        } else {
            queries
                .iter()
                .enumerate()
                .map(|(i, qr)| (qr, &tasks[i..=i]))
                .collect()
        };
        let mut experiences = Vec::new();
        for (ro, ts) in evaluated {
            for (j, c) in ro.comps.iter().enumerate() {
                let task = ts[j / ro.group];
                experiences.push(Experience {
                    step: self.step + 1,
                    task_id: task.id.clone(),
                    task_text: task.prompt.clone(),
                    code: code_in_completion(&c.text).1.to_owned(),
                    report: ro.reports[j].clone(),
                    rewards: ro.breakdowns[j]
                        .as_ref()
                        .map(|b| b.terms.clone())
                        .unwrap_or_default(),
                });
            }
        }
        if let Some((lt, emb)) = mem.long_term.as_mut() {
            lt.insert(emb.as_ref(), &experiences)
                .map_err(|e| TrainError::Invalid(format!("long-term memory: {e}")))?;
        }
        self.log_samples(samples_log, &support, &tasks)?;
        for (i, qr) in queries.iter().enumerate() {
            self.log_samples(samples_log, qr, &tasks[i..=i])?;
        }
        let mut all: Vec<&Rollout> = vec![&support];
        all.extend(queries.iter());
        Ok(self.record(lr, loss, grad_norm, &all, seconds))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LoraConfig, LossWeights};
    use crate::model::{Dtype, LogitsFor};
    use crate::train::losses::Normalization;
    use tch::{Device, Kind};

    /// A 2-layer, 16-wide Llama (vocab 64) with random weights and LoRA
    /// (rank 2 on q/v, B random so that every term has a gradient), in
    /// double precision so that finite differences are accurate.
    fn tiny_policy(dir: &Path) -> Policy {
        let config = serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
            "vocab_size": 64, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "tie_word_embeddings": true, "hidden_act": "silu",
        });
        crate::model::generate::write_random_model(dir, &config, 11, 0.3).unwrap();
        let mut p = Policy::load(dir, Dtype::Fp32, Device::Cpu).unwrap();
        p.attach_lora(&LoraConfig {
            enabled: true,
            rank: 2,
            alpha: 4.0,
            dropout: 0.0,
            targets: vec!["q_proj".into(), "v_proj".into()],
        })
        .unwrap();
        p.vs.set_kind(Kind::Double);
        tch::no_grad(|| {
            for (n, t) in trainable(&p) {
                if n.contains("lora_B") {
                    t.shallow_clone().copy_(&(t.randn_like() * 0.3));
                }
            }
        });
        p
    }

    struct Data {
        ids: Vec<(Vec<i64>, Vec<i64>)>,
        spans: Vec<Vec<TokenSpan>>,
        adv: Vec<f64>,
    }

    impl Data {
        fn new(seed: i64) -> Self {
            let r = |n: i64, k: i64| -> Vec<i64> {
                (0..n)
                    .map(|i| (i * 7 + seed * 13 + k * 5) % 61 + 1)
                    .collect()
            };
            Data {
                // Unequal lengths: padding and the attention mask are
                // exercised; the first and last share a prompt, so whole
                // batches take the shared-prefix path.
                ids: vec![
                    (r(3, 0), r(4, 1)),
                    (r(5, 2), r(2, 3)),
                    (r(2, 4), r(5, 5)),
                    (r(3, 0), r(3, 6)),
                ],
                spans: vec![
                    vec![TokenSpan {
                        start_token: 1,
                        end_token: 3,
                        reward: -0.7,
                    }],
                    vec![],
                    vec![],
                    vec![],
                ],
                adv: vec![1.0, -0.5, 0.3 + seed as f64 * 0.1, -0.4],
            }
        }

        fn seqs(&self) -> Vec<UpdateSeq<'_>> {
            (0..self.ids.len())
                .map(|i| UpdateSeq {
                    prompt_ids: &self.ids[i].0,
                    completion_ids: &self.ids[i].1,
                    advantage: self.adv[i],
                    passed: i != 1,
                    spans: &self.spans[i],
                })
                .collect()
        }
    }

    const W: LossWeights = LossWeights {
        pg: 1.0,
        fine: 1.0,
        sl: 0.5,
        kl: 0.0,
    };

    /// The query loss of the finite-difference check leaves out the
    /// policy-gradient term: on-policy, its value is −mean(A) whatever θ is
    /// (only its gradient is the estimator), so a finite difference of it
    /// would be 0. The inner loss keeps it: its gradient and Hessian are
    /// what the check is about.
    const W_QUERY: LossWeights = LossWeights { pg: 0.0, ..W };

    /// The loss of `d` with weights `w`, in pieces of `size` sequences.
    fn pieces<'d>(d: &'d Data, w: &'d LossWeights, size: usize) -> impl PieceLoss + 'd {
        move |p: &mut Policy, sink: &mut dyn FnMut(Tensor) -> Result<(), TrainError>| {
            seqs_loss(p, &d.seqs(), size, Normalization::TokenMean, w, true, sink)
        }
    }

    /// The loss of `d` as one tensor.
    fn whole(p: &mut Policy, d: &Data, w: &LossWeights) -> Tensor {
        let mut total: Option<Tensor> = None;
        seqs_loss(
            p,
            &d.seqs(),
            0,
            Normalization::TokenMean,
            w,
            true,
            &mut |l| {
                total = Some(match total.take() {
                    Some(t) => t + l,
                    None => l,
                });
                Ok(())
            },
        )
        .unwrap();
        total.unwrap()
    }

    fn flat(ws: &[(String, Tensor)], grad: bool) -> Tensor {
        Tensor::cat(
            &ws.iter()
                .map(|(_, t)| if grad { t.grad() } else { t.detach() }.reshape([-1]))
                .collect::<Vec<_>>(),
            0,
        )
    }

    /// θ.grad after one task's meta-gradient with `inner`, the losses in
    /// pieces of `size` sequences.
    fn meta_grad(
        p: &mut Policy,
        (s, q): (&Data, &Data),
        inner: &InnerLoop,
        second: bool,
        size: usize,
    ) -> Tensor {
        let theta = trainable(p);
        zero_grad(&theta);
        let ad = adapt(p, &theta, inner, pieces(s, &W, size)).unwrap();
        meta_backward(
            p,
            &theta,
            &ad,
            inner,
            second,
            pieces(s, &W, size),
            pieces(q, &W_QUERY, size),
        )
        .unwrap();
        let g = flat(&theta, true);
        zero_grad(&theta);
        g
    }

    /// F(θ) = L_q(θ_i(θ)).
    fn meta_value(p: &mut Policy, s: &Data, q: &Data, inner: &InnerLoop) -> f64 {
        let theta = trainable(p);
        let ad = adapt(p, &theta, inner, pieces(s, &W, 0)).unwrap();
        let v = p
            .with_adapters(&ad.fast, |p| whole(p, q, &W_QUERY))
            .unwrap();
        v.double_value(&[])
    }

    fn shift(theta: &[(String, Tensor)], dir: &[Tensor], h: f64) {
        tch::no_grad(|| {
            for ((_, p), d) in theta.iter().zip(dir) {
                let _ = p.shallow_clone().g_add_(&(d * h));
            }
        });
    }

    #[test]
    fn second_order_meta_gradient_matches_finite_differences() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = tiny_policy(dir.path());
        let (s, q) = (Data::new(1), Data::new(2));
        let inner = InnerLoop { steps: 2, lr: 0.5 };
        let g2 = meta_grad(&mut p, (&s, &q), &inner, true, 0);
        let g1 = meta_grad(&mut p, (&s, &q), &inner, false, 0);
        // In micro-batches of one sequence: the same gradient (the pieces
        // add up, and so do their Hessian-vector products).
        let g2_pieces = meta_grad(&mut p, (&s, &q), &inner, true, 1);
        assert!(g2_pieces.allclose(&g2, 1e-9, 1e-12, false));
        let first = inner;
        let theta = trainable(&p);
        tch::manual_seed(5);
        let dirs: Vec<Tensor> = theta.iter().map(|(_, t)| t.randn_like()).collect();
        let v = Tensor::cat(&dirs.iter().map(|d| d.reshape([-1])).collect::<Vec<_>>(), 0);
        let h = 1e-5;
        shift(&theta, &dirs, h);
        let up = meta_value(&mut p, &s, &q, &first);
        shift(&theta, &dirs, -2.0 * h);
        let down = meta_value(&mut p, &s, &q, &first);
        shift(&theta, &dirs, h);
        let fd = (up - down) / (2.0 * h);
        let d2 = g2.dot(&v).double_value(&[]);
        let d1 = g1.dot(&v).double_value(&[]);
        // Central differences in fp64: truncation error ~h², rounding ~1e-11.
        let tol = 1e-4 * fd.abs().max(1.0);
        assert!(
            (d2 - fd).abs() < tol,
            "second order {d2} vs finite difference {fd}"
        );
        // The check can tell the orders apart: first-order misses the
        // curvature term by far more than the tolerance.
        assert!(
            (d1 - fd).abs() > 100.0 * tol,
            "first order {d1} is as close to {fd} as second order {d2}"
        );
    }

    #[test]
    fn first_order_and_reptile_match_hand_computation() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = tiny_policy(dir.path());
        let (s, q) = (Data::new(3), Data::new(4));
        let alpha = 0.3;
        let theta = trainable(&p);
        let theta0: Vec<Tensor> = theta.iter().map(|(_, t)| t.detach().copy()).collect();
        // By hand: one plain SGD step on L_s, then ∇L_q at the new point.
        let by_hand_step = |p: &mut Policy, d: &Data| {
            let theta = trainable(p);
            zero_grad(&theta);
            whole(p, d, &W).backward();
            tch::no_grad(|| {
                for (_, t) in &theta {
                    let g = t.grad();
                    let _ = t.shallow_clone().g_sub_(&(g * alpha));
                }
            });
            zero_grad(&theta);
        };
        let restore = |theta: &[(String, Tensor)]| {
            tch::no_grad(|| {
                for ((_, t), t0) in theta.iter().zip(&theta0) {
                    t.shallow_clone().copy_(t0);
                }
            })
        };
        by_hand_step(&mut p, &s);
        whole(&mut p, &q, &W_QUERY).backward();
        let want = flat(&theta, true);
        zero_grad(&theta);
        restore(&theta);
        let inner = InnerLoop {
            steps: 1,
            lr: alpha,
        };
        let got = meta_grad(&mut p, (&s, &q), &inner, false, 0);
        assert!(
            got.allclose(&want, 1e-10, 1e-12, false),
            "FOMAML {got:?} vs by hand {want:?}"
        );
        assert!(flat(&theta, false).equal(&Tensor::cat(
            &theta0.iter().map(|t| t.reshape([-1])).collect::<Vec<_>>(),
            0
        )));

        // Reptile over two tasks, two inner steps each.
        let inner = InnerLoop { steps: 2, ..inner };
        let mut ends = Vec::new();
        for d in [&s, &q] {
            by_hand_step(&mut p, d);
            by_hand_step(&mut p, d);
            ends.push(flat(&theta, false));
            restore(&theta);
        }
        let eps = 0.4;
        let start = flat(&theta, false);
        let want = &start + ((&ends[0] - &start) + (&ends[1] - &start)) * (eps / 2.0);
        let adapted: Vec<Weights> = [&s, &q]
            .iter()
            .map(|d| {
                adapt(&mut p, &theta, &inner, pieces(d, &W, 0))
                    .unwrap()
                    .fast
            })
            .collect();
        reptile_update(&theta, &adapted, eps).unwrap();
        let got = flat(&theta, false);
        assert!(got.allclose(&want, 1e-10, 1e-12, false));
        assert!(!got.allclose(&start, 1e-6, 1e-6, false), "θ moved");
    }

    #[test]
    fn fast_weights_swap_in_and_out_without_copying_the_model() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = tiny_policy(dir.path());
        let theta = trainable(&p);
        let ids = Tensor::from_slice(&[5i64, 9, 3, 7]).view([1, 4]);
        let fwd = |p: &Policy| {
            p.model
                .forward(&ids, None, None, LogitsFor::All, false)
                .unwrap()
        };
        let base = fwd(&p);
        let fast: Weights = theta
            .iter()
            .map(|(n, t)| (n.clone(), t.detach() + t.randn_like() * 0.2))
            .collect();
        let swapped = p.with_adapters(&fast, |p| fwd(p)).unwrap();
        assert!(fwd(&p).equal(&base), "the originals are back");
        // The same weights copied into the parameters give the same output.
        tch::no_grad(|| {
            for ((_, t), (_, f)) in theta.iter().zip(&fast) {
                t.shallow_clone().copy_(f);
            }
        });
        assert!(fwd(&p).allclose(&swapped, 1e-12, 1e-12, false));
        assert!(!swapped.allclose(&base, 1e-3, 1e-3, false));
        // Math attention gives the fused kernel's result.
        p.model.set_math_attention(true);
        assert!(fwd(&p).allclose(&swapped, 1e-10, 1e-10, false));
        p.model.set_math_attention(false);

        let mut bad = vec![(
            "model.layers.0.self_attn.k_proj.lora_A.weight".to_owned(),
            Tensor::zeros([2, 16], (Kind::Double, Device::Cpu)),
        )];
        let e = p.swap_adapters(&mut bad).unwrap_err().to_string();
        assert!(e.contains("names no LoRA factor"), "{e}");
        let mut bad = vec![(
            theta[0].0.clone(),
            Tensor::zeros([1], (Kind::Double, Device::Cpu)),
        )];
        let e = p.swap_adapters(&mut bad).unwrap_err().to_string();
        assert!(e.contains("has shape"), "{e}");
    }

    #[test]
    fn short_term_rows_come_back_as_the_sequences_pushed() {
        let mut mem = MetaMemory {
            short_term: ShortTerm::new(8, 16, tch::Device::Cpu, 3).unwrap(),
            long_term: None,
        };
        let row = OwnedSeq {
            prompt_ids: vec![4, 5, 6],
            completion_ids: vec![7, 8, 9, 10, 11],
            advantage: -0.25,
            passed: false,
            spans: vec![
                TokenSpan {
                    start_token: 1,
                    end_token: 3,
                    reward: -0.5,
                },
                TokenSpan {
                    start_token: 3,
                    end_token: 4,
                    reward: -1.0,
                },
            ],
            logprobs: vec![-0.5, -1.0, -1.5, -2.0, -2.5],
        };
        let other = OwnedSeq {
            passed: true,
            spans: vec![],
            advantage: 0.5,
            ..row.clone()
        };
        mem.remember(&[row.clone(), other.clone()]).unwrap();
        let mut back = mem.draw(5);
        back.sort_by_key(|s| s.passed);
        assert_eq!(back, vec![row, other]);
    }
}
