//! Linear projections with optional LoRA adapters (Hu et al., 2021), in the
//! layout PEFT uses: `y = x Wᵀ + b + (alpha / r) · dropout(x) Aᵀ Bᵀ`, with
//! `lora_A.weight` `[r, in]` and `lora_B.weight` `[out, r]`. B starts at
//! zero, so attaching an adapter does not change the model's output.
//!
//! The base weight is frozen while an adapter is attached; merging folds
//! `scale · B A` into the base weight (for fast inference and export), and
//! unmerging takes it out again.

use std::cell::{Cell, RefCell};

use tch::nn::Path;
use tch::{Kind, Tensor};

use super::ModelError;
use crate::config::{LoraConfig, Problems, Section};

/// `alpha / r`, the factor on the adapter's output.
pub fn scale(cfg: &LoraConfig) -> f64 {
    cfg.alpha / cfg.rank as f64
}

/// Check an adapter configuration with the config module's own rules.
pub fn check(cfg: &LoraConfig) -> Result<(), ModelError> {
    let mut problems = Problems::default();
    cfg.validate_into("lora", &mut problems);
    if problems.as_slice().is_empty() {
        Ok(())
    } else {
        Err(ModelError::Invalid(problems.as_slice().join("; ")))
    }
}

/// Does the projection with full HF name `name` (…`.q_proj`) get an adapter?
pub fn targets_module(cfg: &LoraConfig, name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    cfg.targets.iter().any(|t| t == last)
}

/// One adapter: the two low-rank factors and its settings.
pub struct LoraAdapter {
    /// `[r, in]`
    pub a: Tensor,
    /// `[out, r]`
    pub b: Tensor,
    pub scale: f64,
    pub dropout: f64,
    merged: Cell<bool>,
    /// Switched off: the layer computes the base projection only (the
    /// frozen reference policy of a KL penalty, without a second model).
    disabled: Cell<bool>,
    /// Several adapters at once, one per batch row (see
    /// [`LoraLinear::set_stacked`]); when set, they replace `a` and `b`.
    stacked: RefCell<Option<Stacked>>,
}

/// K adapters' factors stacked, `a` `[K, r, in]` and `b` `[K, out, r]`, and
/// the adapter of each batch row, `rows` `[B]`.
pub struct Stacked {
    pub a: Tensor,
    pub b: Tensor,
    pub rows: Tensor,
}

/// A linear projection (HF `nn.Linear` layout: weight `[out, in]`) that may
/// carry a LoRA adapter.
pub struct LoraLinear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub adapter: Option<LoraAdapter>,
}

impl LoraLinear {
    pub(crate) fn new(p: Path<'_>, in_dim: i64, out_dim: i64, bias: bool) -> Self {
        let weight = p.zeros("weight", &[out_dim, in_dim]);
        let bias = bias.then(|| p.zeros("bias", &[out_dim]));
        LoraLinear {
            weight,
            bias,
            adapter: None,
        }
    }

    /// Attach a fresh adapter whose factors live under `p` (`p/lora_A/weight`,
    /// `p/lora_B/weight`, PEFT's names). A gets PEFT's default init
    /// (kaiming-uniform with a = √5, i.e. U(±1/√in)), B zeros.
    pub(crate) fn attach(&mut self, p: &Path<'_>, cfg: &LoraConfig) {
        let (out_dim, in_dim) = (self.out_dim(), self.in_dim());
        let rank = cfg.rank as i64;
        let bound = 1.0 / (in_dim as f64).sqrt();
        let a = (p / "lora_A").var(
            "weight",
            &[rank, in_dim],
            tch::nn::Init::Uniform {
                lo: -bound,
                up: bound,
            },
        );
        let b = (p / "lora_B").zeros("weight", &[out_dim, rank]);
        tch::no_grad(|| {
            let _ = self.weight.set_requires_grad(false);
            if let Some(b) = &self.bias {
                let _ = b.set_requires_grad(false);
            }
        });
        self.adapter = Some(LoraAdapter {
            a,
            b,
            scale: scale(cfg),
            dropout: cfg.dropout,
            merged: Cell::new(false),
            disabled: Cell::new(false),
            stacked: RefCell::new(None),
        });
    }

    pub fn in_dim(&self) -> i64 {
        self.weight.size()[1]
    }

    pub fn out_dim(&self) -> i64 {
        self.weight.size()[0]
    }

    pub fn forward_t(&self, x: &Tensor, train: bool) -> Tensor {
        let y = x.linear(&self.weight, self.bias.as_ref());
        match &self.adapter {
            Some(ad) if !ad.merged.get() && !ad.disabled.get() => {
                let xin = if train && ad.dropout > 0.0 {
                    x.dropout(ad.dropout, true)
                } else {
                    x.shallow_clone()
                };
                if let Some(st) = &*ad.stacked.borrow() {
                    let stack = crate::kernels::multi_lora::Stack {
                        a: &st.a,
                        b: &st.b,
                        scale: ad.scale,
                    };
                    let low = crate::kernels::multi_lora::reference(&xin, &stack, &st.rows)
                        .expect("stacked adapters fit the batch they were set for");
                    return y + low;
                }
                let low = xin
                    .linear(&ad.a, None::<Tensor>)
                    .linear(&ad.b, None::<Tensor>);
                y + low * ad.scale
            }
            _ => y,
        }
    }

    /// `scale · B A` in the base weight's dtype, `[out, in]`.
    pub fn delta(&self) -> Option<Tensor> {
        self.adapter.as_ref().map(|ad| {
            (ad.b.to_kind(Kind::Float).matmul(&ad.a.to_kind(Kind::Float)) * ad.scale)
                .to_kind(self.weight.kind())
        })
    }

    /// Run K adapters at once, row `i` of the batch through adapter
    /// `rows[i]` ([`crate::kernels::multi_lora`]); `None` goes back to the
    /// layer's own adapter. Gradients reach every stacked factor.
    pub fn set_stacked(&self, stacked: Option<Stacked>) {
        if let Some(ad) = &self.adapter {
            *ad.stacked.borrow_mut() = stacked;
        }
    }

    pub fn is_merged(&self) -> bool {
        self.adapter.as_ref().is_some_and(|a| a.merged.get())
    }

    /// Switch the adapter on or off; a merged adapter is taken back out of the
    /// base weight first, so "off" always means the base projection.
    pub fn set_adapter_enabled(&mut self, on: bool) {
        if !on {
            self.unmerge();
        }
        if let Some(ad) = &self.adapter {
            ad.disabled.set(!on);
        }
    }

    /// Fold the adapter into the base weight. No-op without an adapter or when merged.
    pub fn merge(&mut self) {
        self.fold(true);
    }

    /// Take a merged adapter back out of the base weight.
    pub fn unmerge(&mut self) {
        self.fold(false);
    }

    fn fold(&mut self, merge: bool) {
        // Folding a switched-off adapter in would switch it back on.
        let off = self.adapter.as_ref().is_some_and(|a| a.disabled.get());
        if self.adapter.is_none() || self.is_merged() == merge || (merge && off) {
            return;
        }
        let d = self.delta().expect("adapter present");
        tch::no_grad(|| {
            let _ = if merge {
                self.weight.g_add_(&d)
            } else {
                self.weight.g_sub_(&d)
            };
        });
        if let Some(a) = &self.adapter {
            a.merged.set(merge);
        }
    }
}
