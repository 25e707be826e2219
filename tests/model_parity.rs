//! The decoder against transformers' own outputs on the tiny fixtures
//! (scripts/fixtures/make-fixtures.py): logits, greedy tokens, ragged batches, the KV
//! cache, LoRA algebra, and the CPU fallback of the CUDA probe.

use falcon_rl::model::decoder::LogitsFor;
use falcon_rl::model::device::{cuda_status, parse_device};
use falcon_rl::model::sampling::Sampler;
use falcon_rl::model::{Dtype, GenerationParams, KvCache, LoraConfig, Policy};
use tch::{Device, Kind, Tensor};

use crate::common::*;

const FIXTURES: [&str; 5] = [
    "tiny-qwen2",
    "tiny-llama",
    "tiny-qwen3",
    "tiny-llama-linear",
    "tiny-qwen2-yarn",
];

fn load(name: &str, dtype: Dtype) -> Policy {
    Policy::load(&fixture(name), dtype, Device::Cpu).expect("fixture loads")
}

fn ids_tensor(ids: &[Vec<i64>]) -> Tensor {
    let flat: Vec<i64> = ids.iter().flatten().copied().collect();
    Tensor::from_slice(&flat).view([ids.len() as i64, ids[0].len() as i64])
}

fn full_logits(p: &Policy, ids: &[Vec<i64>]) -> Tensor {
    tch::no_grad(|| {
        p.model
            .forward(&ids_tensor(ids), None, None, LogitsFor::All, false)
            .unwrap()
    })
}

fn greedy_params(n: usize) -> GenerationParams {
    GenerationParams {
        max_new_tokens: n,
        ..GenerationParams::default()
    }
}

#[test]
fn fp32_logits_match_transformers_within_1e_4() {
    for name in FIXTURES {
        let r = reference(name);
        let p = load(name, Dtype::Fp32);
        let ours = full_logits(&p, &ids_from_json(&r["input_ids"]));
        let want = tensor_from_json(&r["logits_fp32"]);
        let d = max_abs_diff(&ours, &want);
        eprintln!("{name}: fp32 max |Δlogit| = {d:.2e}");
        assert!(d <= 1e-4, "{name}: fp32 logits differ by {d}");
    }
}

#[test]
fn logits_from_a_position_are_the_tail_of_all_logits() {
    for name in FIXTURES {
        let r = reference(name);
        let p = load(name, Dtype::Fp32);
        let ids = ids_from_json(&r["input_ids"]);
        let all = full_logits(&p, &ids);
        let t = all.size()[1];
        for start in [0, 2, t - 1] {
            let tail = tch::no_grad(|| {
                p.model
                    .forward(&ids_tensor(&ids), None, None, LogitsFor::From(start), false)
                    .unwrap()
            });
            let d = max_abs_diff(&tail, &all.narrow(1, start, t - start));
            assert!(d <= 1e-5, "{name} from {start}: {d}");
        }
    }
}

#[test]
fn bf16_logits_match_transformers_bf16_within_bf16_tolerance() {
    for name in FIXTURES {
        let r = reference(name);
        let p = load(name, Dtype::Bf16);
        let ours = full_logits(&p, &ids_from_json(&r["input_ids"]));
        assert_eq!(ours.kind(), Kind::BFloat16);
        let want = tensor_from_json(&r["logits_bf16"]);
        let fp32 = tensor_from_json(&r["logits_fp32"]);
        let d = max_abs_diff(&ours, &want);
        // Both sides round differently inside fused kernels; bound our error by
        // a small multiple of transformers' own bf16-vs-fp32 error.
        let theirs = max_abs_diff(&want, &fp32);
        eprintln!("{name}: bf16 max |Δlogit| vs transformers bf16 = {d:.3e} (their bf16 vs fp32: {theirs:.3e})");
        assert!(
            d <= 0.05_f64.max(2.0 * theirs),
            "{name}: bf16 logits differ by {d}"
        );
    }
}

#[test]
fn greedy_tokens_equal_transformers_generate() {
    for name in FIXTURES {
        let r = reference(name);
        let p = load(name, Dtype::Fp32);
        for key in ["greedy", "greedy_ragged"] {
            let prompts = ids_from_json(&r[key]["prompts"]);
            let want = ids_from_json(&r[key]["tokens"]);
            let got = p
                .generate_ids(&prompts, &greedy_params(want[0].len()))
                .unwrap();
            let got: Vec<Vec<i64>> = got.into_iter().map(|c| c.token_ids).collect();
            assert_eq!(got, want, "{name} {key}");
        }
    }
}

#[test]
fn kv_cache_decoding_equals_full_recomputation() {
    for name in FIXTURES {
        let p = load(name, Dtype::Fp32);
        let seq: Vec<i64> = vec![3, 77, 12, 130, 5, 9, 41, 88, 6, 2, 19];
        let full = full_logits(&p, std::slice::from_ref(&seq));
        let mut cache = KvCache::new(&p.model.config, 1, 32, Kind::Float, Device::Cpu);
        let prefix = 4;
        let mut step_logits = Vec::new();
        // The prompt in one go, then one token at a time.
        let chunks = std::iter::once(&seq[..prefix]).chain(seq[prefix..].chunks(1));
        tch::no_grad(|| {
            for chunk in chunks {
                let ids = ids_tensor(&[chunk.to_vec()]);
                let l = p
                    .model
                    .forward(&ids, None, Some(&mut cache), LogitsFor::All, false);
                step_logits.push(l.unwrap());
            }
        });
        let stepped = Tensor::cat(&step_logits, 1);
        let d = max_abs_diff(&stepped, &full);
        assert!(
            d <= 1e-5,
            "{name}: cached decode differs from recomputation by {d}"
        );
        assert_eq!(cache.len(), seq.len() as i64);
    }
}

#[test]
fn ragged_batch_rows_equal_their_single_runs() {
    let p = load("tiny-qwen2", Dtype::Fp32);
    let prompts = vec![vec![5, 6, 7, 8, 9, 10, 11], vec![100], vec![42, 43, 44]];
    let batch = p.generate_ids(&prompts, &greedy_params(10)).unwrap();
    for (i, prompt) in prompts.iter().enumerate() {
        let alone = p
            .generate_ids(std::slice::from_ref(prompt), &greedy_params(10))
            .unwrap();
        assert_eq!(batch[i].token_ids, alone[0].token_ids, "row {i}");
        for (a, b) in batch[i].logprobs.iter().zip(&alone[0].logprobs) {
            assert!((a - b).abs() < 1e-4, "row {i}: logprob {a} vs {b}");
        }
    }
}

/// A prompt repeated in the batch (a GRPO group) is prefilled once and its
/// cache copied: each copy decodes exactly as the prompt does alone.
#[test]
fn repeated_prompts_decode_as_their_single_runs() {
    let p = load("tiny-llama", Dtype::Fp32);
    let a = vec![5, 6, 7, 8, 9];
    let b = vec![42, 43];
    let prompts = vec![a.clone(), b.clone(), a.clone(), a.clone(), b.clone()];
    let batch = p.generate_ids(&prompts, &greedy_params(12)).unwrap();
    for (i, prompt) in prompts.iter().enumerate() {
        let alone = p
            .generate_ids(std::slice::from_ref(prompt), &greedy_params(12))
            .unwrap();
        assert_eq!(batch[i].prompt_ids, *prompt);
        assert_eq!(batch[i].token_ids, alone[0].token_ids, "row {i}");
        for (x, y) in batch[i].logprobs.iter().zip(&alone[0].logprobs) {
            assert!((x - y).abs() < 1e-4, "row {i}: logprob {x} vs {y}");
        }
    }
    // Sampled copies of one prompt still draw their own tokens.
    let params = GenerationParams {
        max_new_tokens: 12,
        sampler: Sampler {
            temperature: 1.5,
            top_k: 0,
            top_p: 1.0,
        },
        seed: Some(3),
        ..GenerationParams::default()
    };
    let group = p.generate_ids(&vec![a.clone(); 4], &params).unwrap();
    let distinct: std::collections::BTreeSet<&Vec<i64>> =
        group.iter().map(|c| &c.token_ids).collect();
    assert!(distinct.len() > 1, "4 samples at T=1.5 were all the same");
}

#[test]
fn sampling_is_reproducible_per_seed_and_logprobs_are_consistent() {
    let p = load("tiny-llama", Dtype::Fp32);
    let mk = |seed| GenerationParams {
        max_new_tokens: 16,
        sampler: Sampler {
            temperature: 1.3,
            top_k: 50,
            top_p: 0.95,
        },
        seed: Some(seed),
        ..GenerationParams::default()
    };
    let prompts = vec![vec![5, 17, 99], vec![1, 2, 3, 4]];
    let a = p.generate_ids(&prompts, &mk(11)).unwrap();
    let b = p.generate_ids(&prompts, &mk(11)).unwrap();
    let c = p.generate_ids(&prompts, &mk(12)).unwrap();
    assert_eq!(a, b, "same seed must give the same completions");
    assert_ne!(
        a.iter().map(|x| &x.token_ids).collect::<Vec<_>>(),
        c.iter().map(|x| &x.token_ids).collect::<Vec<_>>(),
        "a different seed should change 32 sampled tokens"
    );
    // The reported logprob is log_softmax(logits / T) of the chosen token.
    let seq: Vec<i64> = prompts[0].iter().chain(&a[0].token_ids).copied().collect();
    let logits = full_logits(&p, std::slice::from_ref(&seq));
    let lp = (logits / 1.3).log_softmax(-1, Kind::Float);
    for (j, (&tok, &got)) in a[0].token_ids.iter().zip(&a[0].logprobs).enumerate() {
        let pos = (prompts[0].len() + j - 1) as i64;
        let want = lp.double_value(&[0, pos, tok]) as f32;
        assert!(
            (got - want).abs() < 1e-4,
            "token {j}: logprob {got} vs {want}"
        );
    }
}

#[test]
fn lora_attach_is_identity_generation_and_merge_match_unmerged_and_unmerge_restores() {
    let mut p = load("tiny-qwen2", Dtype::Fp32);
    let ids = vec![vec![5i64, 17, 99, 3, 64]];
    let base = full_logits(&p, &ids);
    let w_before = p.vs.variables()["model.layers.0.self_attn.q_proj.weight"].copy();
    let cfg = LoraConfig {
        enabled: true,
        rank: 4,
        alpha: 8.0,
        dropout: 0.1,
        targets: vec!["q_proj".into(), "v_proj".into(), "down_proj".into()],
    };
    p.attach_lora(&cfg).unwrap();
    assert!(
        max_abs_diff(&full_logits(&p, &ids), &base) < 1e-6,
        "B = 0: no change"
    );
    let vars = p.vs.variables();
    let n_lora = vars.keys().filter(|k| k.contains(".lora_")).count();
    assert_eq!(n_lora, 2 * 3 * 2, "A and B for 3 targets in 2 layers");
    assert!(
        !vars["model.layers.0.self_attn.q_proj.weight"].requires_grad(),
        "base frozen"
    );
    assert!(vars["model.layers.0.self_attn.q_proj.lora_A.weight"].requires_grad());
    tch::no_grad(|| {
        for (k, v) in &vars {
            if k.contains("lora_B") {
                v.shallow_clone()
                    .copy_(&(Tensor::randn(v.size(), (Kind::Float, Device::Cpu)) * 0.1));
            }
        }
    });
    let adapted = full_logits(&p, &ids);
    assert!(
        max_abs_diff(&adapted, &base) > 1e-3,
        "a non-zero B must change the output"
    );
    // Generation folds the adapters into the weights for its duration:
    // its greedy tokens and log-probs are the unfolded model's, and every
    // weight is back bit for bit afterwards.
    let w_adapted = p.vs.variables()["model.layers.0.self_attn.q_proj.weight"].copy();
    let gen = p.generate_ids(&ids, &greedy_params(12)).unwrap();
    let seq: Vec<i64> = ids[0].iter().chain(&gen[0].token_ids).copied().collect();
    let lp = full_logits(&p, std::slice::from_ref(&seq)).log_softmax(-1, Kind::Float);
    for (j, (&tok, &got)) in gen[0].token_ids.iter().zip(&gen[0].logprobs).enumerate() {
        let pos = (ids[0].len() + j - 1) as i64;
        assert_eq!(
            tok,
            lp.get(0).get(pos).argmax(-1, false).int64_value(&[]),
            "token {j}"
        );
        let want = lp.double_value(&[0, pos, tok]) as f32;
        assert!((got - want).abs() < 1e-4, "token {j}: {got} vs {want}");
    }
    assert!(p.vs.variables()["model.layers.0.self_attn.q_proj.weight"].equal(&w_adapted));
    assert!(max_abs_diff(&full_logits(&p, &ids), &adapted) == 0.0);
    p.merge_lora();
    assert!(
        max_abs_diff(&full_logits(&p, &ids), &adapted) < 1e-5,
        "merged == unmerged"
    );
    p.unmerge_lora();
    assert!(max_abs_diff(&full_logits(&p, &ids), &adapted) < 1e-5);
    let w_after = &p.vs.variables()["model.layers.0.self_attn.q_proj.weight"];
    assert!(
        max_abs_diff(w_after, &w_before) < 1e-6,
        "unmerge restores the base weight"
    );
}

#[test]
fn cuda_probe_falls_back_to_cpu_cleanly_without_a_gpu() {
    let s = cuda_status();
    if s.available() {
        eprintln!(
            "CUDA present ({} devices): fallback not testable here",
            s.device_count
        );
        assert!(matches!(parse_device("auto").unwrap(), Device::Cuda(0)));
        return;
    }
    assert!(s.reason.is_some(), "an unavailable CUDA says why");
    assert_eq!(parse_device("auto").unwrap(), Device::Cpu);
    let err = parse_device("cuda").unwrap_err().to_string();
    assert!(err.contains("CUDA is unavailable"), "{err}");
    assert!(parse_device("tpu").is_err());
    // And the model still runs on the CPU after the probe.
    let p = load("tiny-llama", Dtype::Fp32);
    assert_eq!(
        p.generate_ids(&[vec![1, 2, 3]], &greedy_params(3)).unwrap()[0]
            .token_ids
            .len(),
        3
    );
}
