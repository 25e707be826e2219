//! Mixed precision by autocast: inside [`with_autocast`], libtorch runs the
//! matmul-like ops of the chosen device (linear, mm, bmm, attention) in a
//! lower precision and keeps precision-sensitive ones (softmax, norms,
//! losses) in fp32, while the weights and their gradients stay fp32.
//!
//! tch exposes only CUDA autocast in fp16, with no dtype setting, so this
//! calls libtorch's own `at::autocast` functions, which libtorch_cpu exports
//! (build.rs links it by name). Their signatures take the `c10::DeviceType`
//! and `c10::ScalarType` enums, both `int8_t`-backed, so they are plain C
//! calls under the Itanium C++ ABI. Autocast state is per thread, as in
//! PyTorch.

use tch::{Device, Kind};

use super::ModelError;

mod ffi {
    extern "C" {
        #[link_name = "_ZN2at8autocast20set_autocast_enabledEN3c1010DeviceTypeEb"]
        pub fn set_autocast_enabled(device: i8, enabled: bool);
        #[link_name = "_ZN2at8autocast19is_autocast_enabledEN3c1010DeviceTypeE"]
        pub fn is_autocast_enabled(device: i8) -> bool;
        #[link_name = "_ZN2at8autocast18set_autocast_dtypeEN3c1010DeviceTypeENS1_10ScalarTypeE"]
        pub fn set_autocast_dtype(device: i8, dtype: i8);
        #[link_name = "_ZN2at8autocast18get_autocast_dtypeEN3c1010DeviceTypeE"]
        pub fn get_autocast_dtype(device: i8) -> i8;
        #[link_name = "_ZN2at8autocast17increment_nestingEv"]
        pub fn increment_nesting() -> i32;
        #[link_name = "_ZN2at8autocast17decrement_nestingEv"]
        pub fn decrement_nesting() -> i32;
        #[link_name = "_ZN2at8autocast11clear_cacheEv"]
        pub fn clear_cache();
    }
}

/// `c10::DeviceType` values (c10/core/DeviceType.h).
fn device_type(device: Device) -> i8 {
    match device {
        Device::Cpu => 0,
        Device::Cuda(_) => 1,
        Device::Mps => 13,
        Device::Vulkan => 10,
    }
}

/// `c10::ScalarType` values of the dtypes autocast accepts.
fn scalar_type(kind: Kind) -> Result<i8, ModelError> {
    match kind {
        Kind::Half => Ok(5),
        Kind::BFloat16 => Ok(15),
        other => Err(ModelError::Invalid(format!(
            "autocast runs in bf16 or fp16, not {other:?}"
        ))),
    }
}

/// The element type of `[train] autocast`, `None` when off.
pub fn kind_of(a: crate::config::Autocast) -> Option<Kind> {
    use crate::config::Autocast;
    match a {
        Autocast::Off => None,
        Autocast::Bf16 => Some(Kind::BFloat16),
        Autocast::Fp16 => Some(Kind::Half),
    }
}

/// Restores the autocast state it found when dropped (also on panic).
struct Guard {
    device: i8,
    enabled: bool,
    dtype: i8,
}

impl Drop for Guard {
    fn drop(&mut self) {
        // SAFETY: plain setters on libtorch's thread-local autocast state.
        unsafe {
            // Casted weights are cached for the outermost region only.
            if ffi::decrement_nesting() == 0 {
                ffi::clear_cache();
            }
            ffi::set_autocast_enabled(self.device, self.enabled);
            ffi::set_autocast_dtype(self.device, self.dtype);
        }
    }
}

/// Run `f` with autocast to `kind` (bf16 or fp16) on `device`'s type, or
/// plainly when `kind` is `None`.
pub fn with_autocast<T>(
    device: Device,
    kind: Option<Kind>,
    f: impl FnOnce() -> T,
) -> Result<T, ModelError> {
    let Some(kind) = kind else {
        return Ok(f());
    };
    let dtype = scalar_type(kind)?;
    let device = device_type(device);
    // SAFETY: as in `Guard::drop`; the guard undoes these on every exit.
    let _guard = unsafe {
        let guard = Guard {
            device,
            enabled: ffi::is_autocast_enabled(device),
            dtype: ffi::get_autocast_dtype(device),
        };
        ffi::set_autocast_enabled(device, true);
        ffi::set_autocast_dtype(device, dtype);
        ffi::increment_nesting();
        guard
    };
    Ok(f())
}

/// Whether autocast is on for `device`'s type on this thread.
pub fn is_enabled(device: Device) -> bool {
    // SAFETY: a getter of thread-local state.
    unsafe { ffi::is_autocast_enabled(device_type(device)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Tensor;

    #[test]
    fn cpu_bf16_autocast_runs_matmuls_in_bf16_and_restores_state() {
        let a = Tensor::randn([4, 8], (Kind::Float, Device::Cpu));
        let b = Tensor::randn([8, 3], (Kind::Float, Device::Cpu));
        assert!(!is_enabled(Device::Cpu));
        let (kind, inner) = with_autocast(Device::Cpu, Some(Kind::BFloat16), || {
            let nested =
                with_autocast(Device::Cpu, Some(Kind::BFloat16), || a.mm(&b).kind()).unwrap();
            assert!(is_enabled(Device::Cpu), "the inner region kept it on");
            (a.mm(&b).kind(), nested)
        })
        .unwrap();
        assert_eq!((kind, inner), (Kind::BFloat16, Kind::BFloat16));
        assert!(!is_enabled(Device::Cpu));
        assert_eq!(a.mm(&b).kind(), Kind::Float);
        // The result is the fp32 product to bf16 precision.
        let low = with_autocast(Device::Cpu, Some(Kind::BFloat16), || a.mm(&b))
            .unwrap()
            .to_kind(Kind::Float);
        let rel = ((&low - a.mm(&b)).abs().max() / a.mm(&b).abs().max()).double_value(&[]);
        assert!(rel < 2e-2, "bf16 matmul off by {rel}");
        // None runs plainly; fp32 is not an autocast dtype.
        let plain = with_autocast(Device::Cpu, None, || a.mm(&b).kind()).unwrap();
        assert_eq!(plain, Kind::Float);
        assert!(with_autocast(Device::Cpu, Some(Kind::Float), || ()).is_err());
    }

    #[test]
    fn gradients_reach_fp32_leaves_through_autocast() {
        let w = Tensor::randn([8, 3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let x = Tensor::randn([4, 8], (Kind::Float, Device::Cpu));
        let loss = with_autocast(Device::Cpu, Some(Kind::BFloat16), || {
            x.mm(&w)
                .to_kind(Kind::Float)
                .pow_tensor_scalar(2)
                .sum(Kind::Float)
        })
        .unwrap();
        loss.backward();
        let g = w.grad();
        assert_eq!(g.kind(), Kind::Float);
        let exact = x.transpose(0, 1).mm(&(x.mm(&w) * 2.0));
        let rel = ((&g - &exact).abs().max() / exact.abs().max()).double_value(&[]);
        assert!(rel < 5e-2, "gradient off by {rel}");
    }
}
