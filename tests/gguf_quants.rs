//! Every GGUF tensor type falcon-rl dequantises, bit for bit against the
//! `gguf` package's `gguf.quants.dequantize` on random blocks (every bit
//! pattern is a valid block, so NaN and infinite scales are covered too),
//! read through a real GGUF file that the package wrote.

use falcon_rl::model::gguf::GgufFile;

use crate::common::*;

const TYPES: [&str; 12] = [
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL",
    "IQ4_XS",
];

#[test]
fn every_dequantiser_matches_the_gguf_package_bit_for_bit() {
    let work = tmpdir();
    let out = work.path().to_str().unwrap();
    run_python("fixtures/gguf-quants-reference.py", &[out, "64"]);
    let g = GgufFile::open(&work.path().join("quants.gguf")).expect("the package's file opens");
    for name in TYPES {
        let t = g.tensor(name).unwrap_or_else(|| panic!("tensor {name}"));
        assert_eq!(t.type_name, name);
        let ours = g.dequantize(t).unwrap_or_else(|e| panic!("{name}: {e}"));
        let bytes = std::fs::read(work.path().join(format!("{name}.f32"))).unwrap();
        let want: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(ours.len(), want.len(), "{name}: element count");
        let mut nan = 0;
        for (i, (o, w)) in ours.iter().zip(&want).enumerate() {
            let w_f = f32::from_bits(*w);
            if w_f.is_nan() {
                // NaN from a NaN scale: numpy and Rust may carry different payloads.
                assert!(o.is_nan(), "{name}[{i}]: {o} where the package has NaN");
                nan += 1;
                continue;
            }
            assert_eq!(o.to_bits(), *w, "{name}[{i}]: {o} vs {w_f}");
        }
        let finite = ours.iter().filter(|x| x.is_finite()).count();
        eprintln!(
            "{name}: {} values equal ({finite} finite, {nan} NaN)",
            ours.len()
        );
        assert!(
            finite > ours.len() / 2,
            "{name}: the blocks are mostly ordinary"
        );
    }
}

/// A whole tiny model whose matrices are k-quants, IQ4 and 5-bit blocks
/// (built by the committed fixture script) converts to an HF directory
/// whose fp32 logits are transformers' on the same GGUF file: for the qwen2,
/// qwen3 (its metadata and q/k norms) and llama architectures.
#[test]
fn a_kquant_model_converts_to_the_logits_transformers_gets() {
    use falcon_rl::model::decoder::LogitsFor;
    use falcon_rl::model::gguf::{convert_to_hf, OutDtype};
    use falcon_rl::model::weights::read_all;
    use falcon_rl::model::{Dtype, Policy};
    use tch::{Device, Tensor};

    let work = tmpdir();
    let gguf = work.path().join("kquants.gguf");
    for arch in ["qwen2", "qwen3", "llama"] {
        run_python(
            "fixtures/make-gguf-fixture.py",
            &[
                gguf.to_str().unwrap(),
                "--arch",
                arch,
                "--kquants",
                "--tied",
            ],
        );
        let texts = work.path().join("texts.json");
        std::fs::write(
            &texts,
            r#"["def quicksort(arr):", "The capital of France is"]"#,
        )
        .unwrap();
        let refdir = work.path().join(format!("ref-{arch}"));
        run_python(
            "fixtures/gguf-reference.py",
            &[
                gguf.to_str().unwrap(),
                texts.to_str().unwrap(),
                refdir.to_str().unwrap(),
            ],
        );
        let reference: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(refdir.join("ids.json")).unwrap())
                .unwrap();
        let ids = ids_from_json(&reference["ids"]);
        let logits = read_all(&refdir.join("logits.safetensors")).unwrap();
        let out = work.path().join(format!("hf-{arch}"));
        let summary = convert_to_hf(&gguf, &out, OutDtype::F32).expect("converts");
        eprintln!("{arch}: {summary:?}");
        let p = Policy::load(&out, Dtype::Fp32, Device::Cpu).unwrap();
        for (i, row) in ids.iter().enumerate() {
            let input = Tensor::from_slice(row).view([1, -1]);
            let ours = tch::no_grad(|| {
                p.model
                    .forward(&input, None, None, LogitsFor::All, false)
                    .unwrap()
            })
            .squeeze_dim(0);
            let want = &logits[&format!("fp32.{i}")];
            let d = max_abs_diff(&ours, want);
            eprintln!("{arch} text {i}: max |Δlogit| = {d:.3e}");
            assert!(d <= 1e-3, "{arch} text {i}: {d}");
            assert_eq!(
                ours.argmax(-1, false),
                want.argmax(-1, false).to_kind(tch::Kind::Int64),
                "{arch} text {i}: top-1 tokens"
            );
        }
    }
}
