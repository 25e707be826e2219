//! Every CUDA kernel under `kernels/` compiles with NVRTC and assembles for
//! the H100/H200 (`sm_90`) on this machine, which has no GPU: the binary
//! loads NVRTC from the torch wheel at run time, and `ptxas` comes from the
//! same wheel. A kernel that stops compiling fails here, not on a GPU.

use crate::common::{falcon, root, text};

#[test]
fn every_kernel_compiles_and_assembles_for_sm_90() {
    let out = falcon(&["kernels", "check", "--arch", "sm_90"]);
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    let mut sources: Vec<String> = std::fs::read_dir(root().join("kernels"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cu"))
        .collect();
    sources.sort();
    assert!(sources.len() >= 2, "{sources:?}");
    for s in &sources {
        let line = log
            .lines()
            .find(|l| l.starts_with(&format!("kernels/{s}:")))
            .unwrap_or_else(|| {
                panic!("kernels/{s} was not compiled (is it in kernels::SOURCES?):\n{log}")
            });
        assert!(line.contains("of sm_90 code"), "{line}");
    }
}

#[test]
fn a_bad_architecture_is_a_usage_error() {
    let out = falcon(&["kernels", "check", "--arch", "hopper"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("expected sm_NN"));
}

#[test]
fn bench_without_a_gpu_says_so() {
    let out = falcon(&["kernels", "bench", "--case", "fused"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("needs a CUDA device"), "{}", text(&out));
}
