//! LoRA with a different adapter on each row of a batch: a gather-matmul
//! over per-row adapter indices (Punica's SGMV/BGMV, which vLLM and S-LoRA
//! serve many adapters with). FALCON's meta-step has K fast adapters, one
//! per task; with this the K tasks' forward passes are one batch.
//!
//! [`reference`] is libtorch (`index_select` + batched matmul), on any
//! device and differentiable to any order, so it is what training uses.
//! [`kernel`] is the CUDA kernel (`kernels/lora_bgmv.cu`) for forward
//! passes without gradients, checked against the reference.

use tch::{Kind, Tensor};

use super::device::{ordinal, ptr, Arg, Gpu};
use super::KernelError;

/// Stacked adapters: `a` `[K, r, in]`, `b` `[K, out, r]`, and `scale`.
pub struct Stack<'a> {
    pub a: &'a Tensor,
    pub b: &'a Tensor,
    pub scale: f64,
}

fn check(x: &Tensor, s: &Stack<'_>, idx: &Tensor) -> Result<(), KernelError> {
    let (a, b) = (s.a.size(), s.b.size());
    let xin = *x.size().last().unwrap_or(&0);
    let ok = a.len() == 3
        && b.len() == 3
        && a[0] == b[0]
        && a[1] == b[2]
        && a[2] == xin
        && (x.dim() == 2 || x.dim() == 3)
        && idx.size() == [x.size()[0]];
    if ok {
        Ok(())
    } else {
        Err(KernelError::Invalid(format!(
            "multi-adapter LoRA: x {:?}, A {a:?}, B {b:?}, indices {:?}",
            x.size(),
            idx.size()
        )))
    }
}

/// `scale · B[idx] · A[idx] · x` for `x` `[R, in]` or `[R, T, in]` and one
/// adapter index per row `idx` `[R]`: `[R, out]` or `[R, T, out]`.
pub fn reference(x: &Tensor, s: &Stack<'_>, idx: &Tensor) -> Result<Tensor, KernelError> {
    check(x, s, idx)?;
    let a = s.a.index_select(0, idx); // [R, r, in]
    let b = s.b.index_select(0, idx); // [R, out, r]
    let x3 = if x.dim() == 2 {
        x.unsqueeze(1)
    } else {
        x.shallow_clone()
    };
    let y = x3.matmul(&a.transpose(1, 2)).matmul(&b.transpose(1, 2)) * s.scale;
    Ok(if x.dim() == 2 { y.squeeze_dim(1) } else { y })
}

/// The same with the CUDA kernel, without gradients (CUDA tensors, f32 or
/// bf16, `x`, `a` and `b` of one dtype).
pub fn kernel(x: &Tensor, s: &Stack<'_>, idx: &Tensor) -> Result<Tensor, KernelError> {
    check(x, s, idx)?;
    let dev = ordinal(x)
        .ok_or_else(|| KernelError::Invalid("the LoRA kernel needs CUDA tensors".into()))?;
    let kind = x.kind();
    let suffix = match kind {
        Kind::Float => "f32",
        Kind::BFloat16 => "bf16",
        k => {
            return Err(KernelError::Invalid(format!(
                "the LoRA kernel takes f32 or bf16, not {k:?}"
            )))
        }
    };
    if s.a.kind() != kind || s.b.kind() != kind {
        return Err(KernelError::Invalid(
            "the LoRA kernel needs x and the adapters in one dtype".into(),
        ));
    }
    let gpu = Gpu::get(dev)?;
    let shape = x.size();
    let (rank, din, dout) = (s.a.size()[1], s.a.size()[2], s.b.size()[1]);
    let t = if x.dim() == 3 { shape[1] } else { 1 };
    let rows = shape[0] * t;
    tch::no_grad(|| {
        let x2 = x.reshape([rows, din]).contiguous();
        let idx = idx.to_kind(Kind::Int64);
        let idx = if t > 1 {
            idx.repeat_interleave_self_int(t, 0, None)
        } else {
            idx
        }
        .contiguous();
        let (a, b) = (s.a.contiguous(), s.b.contiguous());
        let v = Tensor::zeros([rows, rank], (Kind::Float, x.device()));
        let y = Tensor::zeros([rows, dout], (kind, x.device()));
        if rows > 0 {
            gpu.launch(
                &format!("shrink_{suffix}"),
                (rows as u32, rank as u32),
                256,
                &[
                    ptr(&x2),
                    ptr(&a),
                    ptr(&idx),
                    ptr(&v),
                    Arg::I32(din as i32),
                    Arg::I32(rank as i32),
                ],
            )?;
            gpu.launch(
                &format!("expand_{suffix}"),
                (rows as u32, dout.div_euclid(256) as u32 + 1),
                256,
                &[
                    ptr(&v),
                    ptr(&b),
                    ptr(&idx),
                    ptr(&y),
                    Arg::I32(dout as i32),
                    Arg::I32(rank as i32),
                    Arg::F32(s.scale as f32),
                ],
            )?;
        }
        let mut out = shape.clone();
        *out.last_mut().expect("x has a last dimension") = dout;
        Ok(y.reshape(out))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    #[test]
    fn each_row_gets_its_own_adapter_with_gradients() {
        tch::manual_seed(5);
        let opts = (Kind::Double, Device::Cpu);
        let (k, r, din, dout) = (3, 4, 8, 6);
        let a = Tensor::randn([k, r, din], opts).set_requires_grad(true);
        let b = Tensor::randn([k, dout, r], opts).set_requires_grad(true);
        let x = Tensor::randn([5, 7, din], opts);
        let idx = Tensor::from_slice(&[2i64, 0, 2, 1, 0]);
        let s = Stack {
            a: &a,
            b: &b,
            scale: 0.5,
        };
        let y = reference(&x, &s, &idx).unwrap();
        assert_eq!(y.size(), [5, 7, dout]);
        // Row by row with its own adapter, as K separate LoRA layers would.
        let mut rows = Vec::new();
        for (i, &j) in [2i64, 0, 2, 1, 0].iter().enumerate() {
            let xi = x.get(i as i64);
            rows.push(xi.matmul(&a.get(j).tr()).matmul(&b.get(j).tr()) * 0.5);
        }
        let want = Tensor::stack(&rows, 0);
        assert!((&y - &want).abs().max().double_value(&[]) < 1e-12);
        let w = Tensor::randn([5, 7, dout], opts);
        let g1 = Tensor::run_backward(&[(&y * &w).sum(Kind::Double)], &[&a, &b], false, false);
        let g2 = Tensor::run_backward(&[(&want * &w).sum(Kind::Double)], &[&a, &b], false, false);
        for (p, q) in g1.iter().zip(&g2) {
            assert!((p - q).abs().max().double_value(&[]) < 1e-12);
        }
        // Two-dimensional rows too.
        let y2 = reference(&x.select(1, 0), &s, &idx).unwrap();
        assert!((&y2 - y.select(1, 0)).abs().max().double_value(&[]) < 1e-12);
    }

    #[test]
    fn shapes_that_do_not_fit_are_refused() {
        let a = Tensor::zeros([2, 4, 8], (Kind::Float, Device::Cpu));
        let b = Tensor::zeros([2, 6, 4], (Kind::Float, Device::Cpu));
        let s = Stack {
            a: &a,
            b: &b,
            scale: 1.0,
        };
        let x = Tensor::zeros([3, 9], (Kind::Float, Device::Cpu));
        assert!(reference(&x, &s, &Tensor::from_slice(&[0i64, 1, 0])).is_err());
        let x = Tensor::zeros([3, 8], (Kind::Float, Device::Cpu));
        assert!(reference(&x, &s, &Tensor::from_slice(&[0i64, 1])).is_err());
        assert!(kernel(&x, &s, &Tensor::from_slice(&[0i64, 1, 0])).is_err());
    }
}
