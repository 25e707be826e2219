//! Export round trips through the reference Python stack: what we write must
//! load unchanged in transformers (HF directory) and peft (adapter directory)
//! and give the same logits as our model.

use falcon_rl::model::decoder::LogitsFor;
use falcon_rl::model::export::{export_hf, export_peft, load_peft};
use falcon_rl::model::{Dtype, LoraConfig, Policy};
use falcon_rl::train::trainable;
use tch::{Device, Kind, Tensor};

use crate::common::*;

const IDS: &str = "[[5, 17, 99, 3, 64, 21, 8], [120, 7, 7, 45, 90, 33, 12]]";

fn our_logits(p: &Policy) -> Tensor {
    let ids: Vec<Vec<i64>> = serde_json::from_str(IDS).unwrap();
    let flat: Vec<i64> = ids.iter().flatten().copied().collect();
    let t = Tensor::from_slice(&flat).view([2, 7]);
    tch::no_grad(|| {
        p.model
            .forward(&t, None, None, LogitsFor::All, false)
            .unwrap()
    })
}

fn python_logits(model_dir: &std::path::Path, adapter: Option<&std::path::Path>) -> Tensor {
    let md = model_dir.to_string_lossy().into_owned();
    let mut args = vec![md.as_str(), IDS];
    let ad;
    if let Some(a) = adapter {
        ad = a.to_string_lossy().into_owned();
        args.push("--adapter");
        args.push(&ad);
    }
    let out = run_python("fixtures/ref-logits.py", &args);
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("ref-logits prints JSON");
    tensor_from_json(&v["logits"])
}

fn randomise_lora_b(p: &Policy) {
    tch::manual_seed(3);
    tch::no_grad(|| {
        // In name order (HashMap order would change which draw lands where).
        for (k, v) in trainable(p) {
            if k.contains("lora_B") {
                v.shallow_clone()
                    .copy_(&(Tensor::randn(v.size(), (Kind::Float, Device::Cpu)) * 0.2));
            }
        }
    });
}

#[test]
fn export_then_transformers_reload_gives_the_same_logits() {
    for name in ["tiny-qwen2", "tiny-llama", "tiny-qwen3"] {
        let p = Policy::load(&fixture(name), Dtype::Fp32, Device::Cpu).unwrap();
        let dir = tmpdir();
        let out = dir.path().join("export");
        export_hf(&p, &out, Dtype::Fp32, false).unwrap();
        for f in ["model.safetensors", "config.json", "generation_config.json"] {
            assert!(out.join(f).is_file(), "{name}: {f} written");
        }
        let d = max_abs_diff(&python_logits(&out, None), &our_logits(&p));
        eprintln!("{name}: export → transformers max |Δlogit| = {d:.2e}");
        assert!(d <= 1e-4, "{name}: {d}");
        // And our own loader reads the export back.
        let back = Policy::load(&out, Dtype::Fp32, Device::Cpu).unwrap();
        assert!(max_abs_diff(&our_logits(&back), &our_logits(&p)) < 1e-6);
        // Refuses to clobber without overwrite.
        assert!(export_hf(&p, &out, Dtype::Fp32, false).is_err());
    }
}

/// One LoRA training step: the loss and every adapter gradient are
/// transformers + PEFT's on the same model, adapter and tokens.
#[test]
fn lora_gradients_match_transformers_and_peft() {
    for name in ["tiny-qwen2", "tiny-llama", "tiny-qwen3"] {
        let mut p = Policy::load(&fixture(name), Dtype::Fp32, Device::Cpu).unwrap();
        p.attach_lora(&LoraConfig {
            enabled: true,
            rank: 4,
            alpha: 8.0,
            dropout: 0.0,
            targets: [
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ]
            .map(String::from)
            .to_vec(),
        })
        .unwrap();
        // B = 0 would leave A without a gradient.
        randomise_lora_b(&p);
        let dir = tmpdir();
        let adapter = dir.path().join("adapter");
        export_peft(&p, &adapter, false).unwrap();
        let out = dir.path().join("grads.safetensors");
        run_python(
            "fixtures/lora-grads.py",
            &[
                fixture(name).to_str().unwrap(),
                adapter.to_str().unwrap(),
                IDS,
                out.to_str().unwrap(),
            ],
        );
        let want = falcon_rl::model::weights::read_all(&out).unwrap();

        let ids: Vec<Vec<i64>> = serde_json::from_str(IDS).unwrap();
        let flat: Vec<i64> = ids.iter().flatten().copied().collect();
        let t = Tensor::from_slice(&flat).view([2, 7]);
        let logits = p
            .model
            .forward(&t, None, None, LogitsFor::All, true)
            .unwrap();
        let vocab = logits.size()[2];
        let loss = logits
            .narrow(1, 0, 6)
            .reshape([-1, vocab])
            .cross_entropy_for_logits(&t.narrow(1, 1, 6).reshape([-1]));
        loss.backward();
        let dl = (loss.double_value(&[]) - want["loss"].double_value(&[0])).abs();
        assert!(dl < 1e-5, "{name}: loss differs by {dl}");
        let params = trainable(&p);
        assert_eq!(
            params.len(),
            want.len() - 1,
            "{name}: the same LoRA parameters"
        );
        let mut worst = 0f64;
        for (k, v) in &params {
            let w = want
                .get(k)
                .unwrap_or_else(|| panic!("{name}: PEFT has no gradient for {k}"));
            let g = v.grad();
            let scale = w.abs().max().double_value(&[]).max(1e-6);
            assert!(scale > 1e-6, "{name}: {k} has a gradient");
            let rel = max_abs_diff(&g, w) / scale;
            worst = worst.max(rel);
            assert!(rel < 1e-4, "{name}: {k}: relative gradient error {rel:.2e}");
        }
        eprintln!(
            "{name}: loss Δ {dl:.1e}, {} LoRA gradients, worst relative Δ {worst:.2e}",
            params.len()
        );
    }
}

#[test]
fn lora_export_merged_and_peft_adapter_match_our_lora_model() {
    let mut p = Policy::load(&fixture("tiny-llama"), Dtype::Fp32, Device::Cpu).unwrap();
    p.attach_lora(&LoraConfig {
        enabled: true,
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        targets: vec![
            "q_proj".into(),
            "k_proj".into(),
            "v_proj".into(),
            "o_proj".into(),
            "up_proj".into(),
        ],
    })
    .unwrap();
    randomise_lora_b(&p);
    let ours = our_logits(&p);
    let base = Policy::load(&fixture("tiny-llama"), Dtype::Fp32, Device::Cpu).unwrap();
    assert!(
        max_abs_diff(&ours, &our_logits(&base)) > 1e-3,
        "adapter is not a no-op"
    );

    let dir = tmpdir();
    let merged = dir.path().join("merged");
    let adapter = dir.path().join("adapter");
    export_hf(&p, &merged, Dtype::Fp32, false).unwrap();
    export_peft(&p, &adapter, false).unwrap();

    let d_merged = max_abs_diff(&python_logits(&merged, None), &ours);
    let d_peft = max_abs_diff(
        &python_logits(&fixture("tiny-llama"), Some(&adapter)),
        &ours,
    );
    eprintln!("LoRA: merged export Δ = {d_merged:.2e}, peft adapter Δ = {d_peft:.2e}");
    assert!(d_merged <= 1e-4, "merged export: {d_merged}");
    assert!(d_peft <= 1e-4, "peft adapter: {d_peft}");

    // Our loader takes the adapter back too.
    let mut again = Policy::load(&fixture("tiny-llama"), Dtype::Fp32, Device::Cpu).unwrap();
    load_peft(&mut again, &adapter).unwrap();
    assert!(max_abs_diff(&our_logits(&again), &ours) < 1e-6);
}
