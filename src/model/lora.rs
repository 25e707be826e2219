//! Linear projections with optional LoRA adapters (Hu et al., 2021), in the
//! layout PEFT uses: `y = x Wᵀ + b + (alpha / r) · dropout(x) Aᵀ Bᵀ`, with
//! `lora_A.weight` `[r, in]` and `lora_B.weight` `[out, r]`. B starts at
//! zero, so attaching an adapter does not change the model's output.
//!
//! The base weight is frozen while an adapter is attached; merging folds
//! `scale · B A` into the base weight (for fast inference and export), and
//! unmerging takes it out again. Generation folds fp32 adapters in for
//! its duration only ([`LoraLinear::fold_for_inference`]) and puts the
//! weight back bit for bit. K adapters can run at once, one per batch
//! row ([`LoraLinear::set_stacked`]), and projections of one input can run
//! their base weights as one matmul ([`Fused`]).

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
        self.plus_low_rank(base_linear(x, &self.weight, self.bias.as_ref()), x, train)
    }

    /// `y` (this projection's base output for `x`) plus the adapter's term.
    fn plus_low_rank(&self, y: Tensor, x: &Tensor, train: bool) -> Tensor {
        match self.low_rank_t(x, train) {
            Some(low) => y + low,
            None => y,
        }
    }

    /// The adapter's term of the output (scaled), or `None` when no adapter
    /// is active (none, merged into the weight, or switched off).
    fn low_rank_t(&self, x: &Tensor, train: bool) -> Option<Tensor> {
        let ad = self.adapter.as_ref()?;
        if ad.merged.get() || ad.disabled.get() {
            return None;
        }
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
            return Some(
                crate::kernels::multi_lora::reference(&xin, &stack, &st.rows)
                    .expect("stacked adapters fit the batch they were set for"),
            );
        }
        Some(
            xin.linear(&ad.a, None::<Tensor>)
                .linear(&ad.b, None::<Tensor>)
                * ad.scale,
        )
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

    /// Fold the active adapter into the base weight until the returned
    /// guard drops, which copies the saved weight back: bit for bit, where
    /// unmerging by subtraction would drift a little every round. For
    /// inference only (autograd off): a decode step then runs one matmul per
    /// projection instead of three (measured on the CPU: about 7% of an RL
    /// step's generation, 11% of `falcon eval`'s wall time; docs/results/model.md).
    /// `None` (nothing done) without an adapter, when merged, switched off or
    /// stacked, while autograd records, and for weights narrower than fp32 (or
    /// cast narrower by autocast), where `W + ΔW` would round a young
    /// adapter's small `ΔW` away.
    pub fn fold_for_inference(&self) -> Option<Folded<'_>> {
        let ad = self.adapter.as_ref()?;
        if ad.merged.get()
            || ad.disabled.get()
            || ad.stacked.borrow().is_some()
            || self.weight.kind() != Kind::Float
            || super::autocast::is_enabled(self.weight.device())
            || crate::kernels::grad_enabled()
        {
            return None;
        }
        let base = self.weight.copy();
        let d = self.delta()?;
        // A shallow clone shares the storage, so the sum lands where every
        // view (a fused q/k/v tensor included) reads.
        let _ = self.weight.shallow_clone().g_add_(&d);
        ad.merged.set(true);
        Some(Folded { lin: self, base })
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

/// An adapter folded into its base weight by
/// [`LoraLinear::fold_for_inference`]; dropping it restores the weight.
pub struct Folded<'a> {
    lin: &'a LoraLinear,
    base: Tensor,
}

impl Drop for Folded<'_> {
    fn drop(&mut self) {
        tch::no_grad(|| {
            self.lin.weight.shallow_clone().copy_(&self.base);
        });
        if let Some(ad) = &self.lin.adapter {
            ad.merged.set(false);
        }
    }
}

/// Projections of one input (q/k/v, or gate/up) whose frozen base weights
/// run as one matmul: at batch 1 each matmul is a matrix-vector product
/// whose fixed cost (a parallel region that wakes libtorch's other threads)
/// is a large share of decode time, and three become one.
///
/// The parts' weights (and biases) are made views into one fused tensor
/// (`set_data`), so loading, merging adapters and any in-place update keep
/// writing where the fused matmul reads. Before every use the views are
/// checked to still alias it (pointers, shapes, dtype); anything that
/// replaced a weight (a dtype change, a device move) fails the check, and
/// the parts are fused again. Weights that train (full fine-tuning) run
/// one by one while autograd records, so that each gets its gradient.
#[derive(Default)]
pub struct Fused {
    cell: RefCell<Option<(Tensor, Option<Tensor>)>>,
}

impl Fused {
    /// Each part's output for `x`, as [`LoraLinear::forward_t`] gives it.
    pub fn forward_t(&self, parts: &[&LoraLinear], x: &Tensor, train: bool) -> Vec<Tensor> {
        // Weights that are trained need their own matmuls for their gradients.
        let trains = |p: &&LoraLinear| {
            p.weight.requires_grad() || p.bias.as_ref().is_some_and(Tensor::requires_grad)
        };
        let separate = parts.iter().any(trains) && crate::kernels::grad_enabled();
        let mut cell = self.cell.borrow_mut();
        if !separate
            && !cell
                .as_ref()
                .is_some_and(|(w, b)| aliases(parts, w, b.as_ref()))
        {
            *cell = fuse(parts);
        }
        let base = match (&*cell, separate) {
            (Some((w, b)), false) => {
                let sizes: Vec<i64> = parts.iter().map(|p| p.out_dim()).collect();
                base_linear(x, w, b.as_ref()).split_with_sizes(&sizes, -1)
            }
            _ => return parts.iter().map(|p| p.forward_t(x, train)).collect(),
        };
        drop(cell);
        base.into_iter()
            .zip(parts)
            .map(|(y, p)| p.plus_low_rank(y, x, train))
            .collect()
    }
}

/// `x Wᵀ + b`: a decode step's few rows through the CPU kernel
/// ([`crate::kernels::gemv`]), a batched decode step's rows through weights
/// packed for the generation ([`crate::kernels::packed`]), everything else
/// through libtorch.
pub(crate) fn base_linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Tensor {
    crate::kernels::gemv::linear(x, w, b)
        .or_else(|| crate::kernels::packed::linear(x, w, b))
        .unwrap_or_else(|| x.linear(w, b))
}

/// Do `parts`' weights and biases still lie, in order, inside `w` and `b`?
fn aliases(parts: &[&LoraLinear], w: &Tensor, b: Option<&Tensor>) -> bool {
    let es = w.kind().elt_size_in_bytes();
    let in_dim = w.size()[1];
    let (w0, b0) = (w.data_ptr() as usize, b.map(|b| b.data_ptr() as usize));
    let mut row = 0usize;
    for p in parts {
        let out = p.out_dim() as usize;
        let ok_w = p.weight.kind() == w.kind()
            && p.weight.size() == [out as i64, in_dim]
            && p.weight.data_ptr() as usize == w0 + row * in_dim as usize * es;
        let ok_b = match (&p.bias, b0) {
            (None, None) => true,
            (Some(pb), Some(b0)) => {
                pb.kind() == w.kind() && pb.data_ptr() as usize == b0 + row * es
            }
            _ => false,
        };
        if !(ok_w && ok_b) {
            return false;
        }
        row += out;
    }
    w.size()[0] == row as i64
}

/// Make `parts`' weights views into one fresh tensor (and their biases into
/// another), when they are alike (dtype, device, input size, biases) and
/// contiguous.
fn fuse(parts: &[&LoraLinear]) -> Option<(Tensor, Option<Tensor>)> {
    let first = &parts.first()?.weight;
    let alike = parts.iter().all(|p| {
        p.weight.kind() == first.kind()
            && p.weight.device() == first.device()
            && p.weight.size()[1] == first.size()[1]
            && p.weight.is_contiguous()
            && p.bias.is_some() == parts[0].bias.is_some()
    });
    if !alike || parts.len() < 2 {
        return None;
    }
    tch::no_grad(|| {
        let w = Tensor::cat(&parts.iter().map(|p| &p.weight).collect::<Vec<_>>(), 0);
        let b = parts[0].bias.as_ref().map(|_| {
            Tensor::cat(
                &parts
                    .iter()
                    .map(|p| p.bias.as_ref().expect("all have biases"))
                    .collect::<Vec<_>>(),
                0,
            )
        });
        let mut row = 0;
        for p in parts {
            let out = p.out_dim();
            p.weight.shallow_clone().set_data(&w.narrow(0, row, out));
            if let (Some(pb), Some(b)) = (&p.bias, &b) {
                pb.shallow_clone().set_data(&b.narrow(0, row, out));
            }
            row += out;
        }
        Some((w, b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn::VarStore;
    use tch::Device;

    fn parts(vs: &VarStore, bias: bool) -> Vec<LoraLinear> {
        let root = vs.root();
        let mut ps = vec![
            LoraLinear::new(&root / "q", 8, 6, bias),
            LoraLinear::new(&root / "k", 8, 4, bias),
            LoraLinear::new(&root / "v", 8, 4, bias),
        ];
        tch::no_grad(|| {
            for p in &ps {
                p.weight.shallow_clone().copy_(&p.weight.randn_like());
                if let Some(b) = &p.bias {
                    b.shallow_clone().copy_(&b.randn_like());
                }
            }
        });
        let cfg = LoraConfig {
            enabled: true,
            rank: 2,
            alpha: 4.0,
            dropout: 0.0,
            targets: vec![],
        };
        for (i, p) in ps.iter_mut().enumerate() {
            p.attach(&(&root / format!("lora{i}")), &cfg);
            let b = &p.adapter.as_ref().unwrap().b;
            tch::no_grad(|| b.shallow_clone().copy_(&b.randn_like()));
        }
        ps
    }

    fn separate(ps: &[LoraLinear], x: &Tensor) -> Vec<Tensor> {
        ps.iter().map(|p| p.forward_t(x, false)).collect()
    }

    fn close(a: &[Tensor], b: &[Tensor], tol: f64) {
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x.size(), y.size());
            let d = (x - y).abs().max().double_value(&[]);
            assert!(d < tol, "{d}");
        }
    }

    /// One matmul for the three bases gives what the three layers give, and
    /// keeps doing so after a merge (written through the views), a dtype
    /// change (which replaces the weights: fused again) and an adapter
    /// switched off.
    #[test]
    fn fused_projections_follow_every_change_of_their_weights() {
        tch::manual_seed(1);
        let mut vs = VarStore::new(Device::Cpu);
        let mut ps = parts(&vs, true);
        let fused = Fused::default();
        let x = Tensor::randn([2, 3, 8], (Kind::Float, Device::Cpu));
        let run = |ps: &[LoraLinear], x: &Tensor| {
            let refs: Vec<&LoraLinear> = ps.iter().collect();
            fused.forward_t(&refs, x, false)
        };
        close(&run(&ps, &x), &separate(&ps, &x), 1e-5);
        // The weights are now views into one tensor.
        let w0 = ps[0].weight.data_ptr() as usize;
        assert_eq!(ps[1].weight.data_ptr() as usize, w0 + 6 * 8 * 4);
        let want = separate(&ps, &x);
        ps[1].merge();
        close(&run(&ps, &x), &want, 1e-5);
        close(&run(&ps, &x), &separate(&ps, &x), 1e-5);
        ps[1].unmerge();
        ps[2].set_adapter_enabled(false);
        close(&run(&ps, &x), &separate(&ps, &x), 1e-5);
        vs.set_kind(Kind::Double);
        let xd = x.to_kind(Kind::Double);
        let got = run(&ps, &xd);
        assert_eq!(got[0].kind(), Kind::Double);
        close(&got, &separate(&ps, &xd), 1e-10);
    }

    /// Weights that train keep their own matmuls while autograd records, so
    /// each gets its gradient; under `no_grad` they are fused.
    #[test]
    fn trained_weights_get_their_gradients() {
        tch::manual_seed(2);
        let vs = VarStore::new(Device::Cpu);
        let root = vs.root();
        let ps = [
            LoraLinear::new(&root / "g", 8, 5, false),
            LoraLinear::new(&root / "u", 8, 5, false),
        ];
        tch::no_grad(|| {
            for p in &ps {
                p.weight.shallow_clone().copy_(&p.weight.randn_like());
            }
        });
        assert!(ps[0].weight.requires_grad());
        let fused = Fused::default();
        let refs: Vec<&LoraLinear> = ps.iter().collect();
        let x = Tensor::randn([4, 8], (Kind::Float, Device::Cpu));
        let out = fused.forward_t(&refs, &x, true);
        let loss = out[0].sum(Kind::Float) + out[1].square().sum(Kind::Float);
        let g = Tensor::run_backward(&[loss], &[&ps[0].weight, &ps[1].weight], false, false);
        assert!(g
            .iter()
            .all(|t| t.defined() && t.abs().sum(Kind::Float).double_value(&[]) > 0.0));
        let inference = tch::no_grad(|| fused.forward_t(&refs, &x, false));
        close(&inference, &[out[0].detach(), out[1].detach()], 1e-5);
        assert_eq!(
            ps[1].weight.data_ptr() as usize,
            ps[0].weight.data_ptr() as usize + 5 * 8 * 4
        );
    }

    /// Folded for inference, the fused projections give what the adapters
    /// give; dropped, every weight is back bit for bit (and the fused
    /// tensor, which the weights are views of, with them). Nothing is folded
    /// while autograd records, nor for a switched-off adapter.
    #[test]
    fn folding_for_inference_restores_every_weight_exactly() {
        tch::manual_seed(3);
        let vs = VarStore::new(Device::Cpu);
        let ps = parts(&vs, true);
        ps[2].adapter.as_ref().unwrap().disabled.set(true);
        let fused = Fused::default();
        let refs: Vec<&LoraLinear> = ps.iter().collect();
        let x = Tensor::randn([2, 3, 8], (Kind::Float, Device::Cpu));
        let want = tch::no_grad(|| fused.forward_t(&refs, &x, false));
        let before: Vec<Tensor> = ps.iter().map(|p| p.weight.copy()).collect();
        assert!(ps[0].fold_for_inference().is_none(), "autograd is on");
        tch::no_grad(|| {
            let folded: Vec<Folded> = ps.iter().filter_map(|p| p.fold_for_inference()).collect();
            assert_eq!(folded.len(), 2, "the switched-off adapter stays out");
            assert!(ps[0].is_merged() && !ps[2].is_merged());
            assert!(
                ps[0]
                    .weight
                    .not_equal_tensor(&before[0])
                    .any()
                    .int64_value(&[])
                    == 1
            );
            close(&fused.forward_t(&refs, &x, false), &want, 1e-5);
        });
        for (p, w) in ps.iter().zip(&before) {
            assert!(!p.is_merged());
            assert!(p.weight.equal(w), "restored bit for bit");
        }
        close(
            &tch::no_grad(|| fused.forward_t(&refs, &x, false)),
            &want,
            1e-12,
        );
    }
}
