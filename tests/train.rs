//! The RL loop end to end on a tiny random Llama that carries the embedded
//! model's tokenizer and chat template: a smoke run (finite losses, trainable
//! weights change, frozen ones do not), exact resume (6 steps == 3 + resume
//! + 3), and `falcon train` from a config file.

use std::path::Path;

use falcon_rl::config::RunConfig;
use falcon_rl::exec::Sandbox;
use falcon_rl::model::{hub, Decoder, Dtype, Policy};
use falcon_rl::task::{LoadOptions, TaskFormat, TaskSet};
use falcon_rl::train::rl::{prepare_policy, trainable, Silent, StepRecord, Trainer};
use tch::{nn::VarStore, Device, Kind, Tensor};

use crate::common::tmpdir;

/// A 2-layer, 32-wide Llama with random weights (seeded) and SmolLM2's
/// tokenizer files, written to `dir`.
pub fn tiny_chat_model(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let src = hub::resolve("embedded").expect("the embedded model (scripts/setup)");
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
    ] {
        if src.join(f).is_file() {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
    }
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "vocab_size": 49152, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": true, "hidden_act": "silu",
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "attention_bias": false,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let (_, cfg, _) = falcon_rl::model::generate::read_config(dir).unwrap();
    let vs = VarStore::new(Device::Cpu);
    let _model = Decoder::new(&vs.root(), cfg).unwrap();
    tch::manual_seed(1234);
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    let named: Vec<(String, Tensor)> = named
        .into_iter()
        .map(|(n, t)| {
            let v = if n.ends_with("norm.weight") {
                Tensor::ones(t.size(), (Kind::Float, Device::Cpu))
            } else {
                Tensor::randn(t.size(), (Kind::Float, Device::Cpu)) * 0.08
            };
            (n, v)
        })
        .collect();
    falcon_rl::model::weights::save_safetensors(&dir.join("model.safetensors"), &named, None)
        .unwrap();
}

const TASKS: &str = r#"{"id": "add", "prompt": "Write a function add(a, b) that returns a + b.", "entry_point": "add", "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}
{"id": "double", "prompt": "Write a function double(x) that returns 2 * x.", "entry_point": "double", "tests": ["assert double(2) == 4"]}
{"id": "first", "prompt": "Write a function first(xs) that returns the first element of a list.", "entry_point": "first", "tests": ["assert first([3, 4]) == 3"]}
"#;

fn config(dir: &Path, steps: u64, uid_base: u32) -> RunConfig {
    let text = format!(
        r#"
[run]
name = "tiny"
seed = 7
output_dir = {out:?}
[model]
path = {model:?}
device = "cpu"
[model.lora]
enabled = true
rank = 4
alpha = 8.0
dropout = 0.1
[generation]
max_new_tokens = 24
temperature = 1.0
[tasks]
path = {tasks:?}
[exec]
workers = 2
uid_base = {uid_base}
timeout_s = 2.0
[reward]
judge = "static"
[memory]
embedder = "hash"
[train]
steps = {steps}
tasks_per_step = 2
group_size = 3
lr = 0.01
checkpoint_every = 3
keep_last = 2
advantage = "none"
"#,
        out = dir.join("runs"),
        model = dir.join("model"),
        tasks = dir.join("tasks.jsonl"),
    );
    let cfg = RunConfig::from_toml_str(&text, "test.toml").unwrap();
    cfg.validate().unwrap();
    cfg
}

fn setup(dir: &Path) {
    tiny_chat_model(&dir.join("model"));
    std::fs::write(dir.join("tasks.jsonl"), TASKS).unwrap();
}

fn run(dir: &Path, steps: u64, resume: bool, run_name: &str) -> Vec<StepRecord> {
    let mut cfg = config(dir, steps, 62410);
    cfg.run.name = run_name.into();
    let mut policy = Policy::load(&dir.join("model"), Dtype::Fp32, Device::Cpu).unwrap();
    prepare_policy(&cfg, &mut policy).unwrap();
    let tasks = TaskSet::load(
        &dir.join("tasks.jsonl"),
        TaskFormat::Auto,
        LoadOptions::default(),
    )
    .unwrap();
    let sandbox = Sandbox::new(&cfg.exec).unwrap();
    let run_dir = cfg.run.output_dir.join(run_name);
    let mut t = Trainer::new(
        cfg,
        &run_dir,
        &mut policy,
        &tasks,
        &sandbox,
        resume,
        &mut Silent,
    )
    .unwrap();
    t.run(&mut Silent).unwrap()
}

fn read_metrics(path: &Path) -> Vec<StepRecord> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn smoke_train_changes_only_trainable_weights() {
    let dir = tmpdir();
    setup(dir.path());
    let cfg = config(dir.path(), 2, 62400);
    let mut policy = Policy::load(&dir.path().join("model"), Dtype::Fp32, Device::Cpu).unwrap();
    prepare_policy(&cfg, &mut policy).unwrap();
    let before: Vec<(String, Tensor)> = policy
        .vs
        .variables()
        .into_iter()
        .map(|(n, t)| (n, t.detach().copy()))
        .collect();
    let tasks = TaskSet::load(
        &dir.path().join("tasks.jsonl"),
        TaskFormat::Auto,
        LoadOptions::default(),
    )
    .unwrap();
    let sandbox = Sandbox::new(&cfg.exec).unwrap();
    let run_dir = cfg.run.output_dir.join("tiny");
    let records = {
        let mut t = Trainer::new(
            cfg.clone(),
            &run_dir,
            &mut policy,
            &tasks,
            &sandbox,
            false,
            &mut Silent,
        )
        .unwrap();
        t.run(&mut Silent).unwrap()
    };
    assert_eq!(records.len(), 2);
    for r in &records {
        assert_eq!(r.samples, 6);
        assert!(r.loss.values().all(|v| v.is_finite()), "{r:?}");
        assert!(r.reward["total"].is_finite(), "{r:?}");
        assert!(r.grad_norm.is_finite() && r.grad_norm > 0.0, "{r:?}");
    }
    let trained: std::collections::HashSet<String> =
        trainable(&policy).into_iter().map(|(n, _)| n).collect();
    assert!(
        !trained.is_empty() && trained.iter().all(|n| n.contains("lora_")),
        "{trained:?}"
    );
    let now = policy.vs.variables();
    let mut changed = 0;
    for (name, old) in &before {
        let same = now[name].equal(old);
        if trained.contains(name) {
            changed += usize::from(!same);
        } else {
            assert!(same, "frozen weight {name} changed");
        }
    }
    assert!(changed > 0, "no trainable weight changed");
    // Metrics, samples and the final checkpoint are on disk.
    assert_eq!(read_metrics(&run_dir.join("metrics.jsonl")), records);
    let samples = std::fs::read_to_string(run_dir.join("samples.jsonl")).unwrap();
    assert_eq!(samples.lines().count(), 12);
    assert!(run_dir.join("step-2").join("manifest.json").is_file());
    // The same scalars went to a TensorBoard event file.
    let tb: Vec<_> = std::fs::read_dir(run_dir.join("tb"))
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(tb.len(), 1);
    let ev = falcon_rl::train::metrics::read_events(&tb[0].path()).unwrap();
    assert!(ev.truncated_at.is_none());
    let steps: Vec<&falcon_rl::train::metrics::Event> =
        ev.events.iter().filter(|e| !e.scalars.is_empty()).collect();
    assert_eq!(steps.len(), 2);
    for (e, r) in steps.iter().zip(&records) {
        assert_eq!(e.step, r.step as i64);
        assert_eq!(e.scalar("loss/total"), Some(r.loss["total"] as f32));
        assert_eq!(e.scalar("reward/total"), Some(r.reward["total"] as f32));
    }
}

#[test]
fn resume_reproduces_an_uninterrupted_run_exactly() {
    let dir = tmpdir();
    setup(dir.path());
    let full = run(dir.path(), 6, false, "full");
    let first = run(dir.path(), 3, false, "split");
    let rest = run(dir.path(), 6, true, "split");
    assert_eq!(first.len(), 3);
    assert_eq!(rest.len(), 3, "resumed at step 3");
    let split: Vec<StepRecord> = first.into_iter().chain(rest).collect();
    for (a, b) in full.iter().zip(&split) {
        assert_eq!(a.step, b.step);
        assert_eq!(a.loss, b.loss, "step {}", a.step);
        assert_eq!(a.reward, b.reward, "step {}", a.step);
        assert_eq!(a.error_kinds, b.error_kinds, "step {}", a.step);
        assert_eq!(a.grad_norm, b.grad_norm, "step {}", a.step);
    }
    // Training moves the numbers (a resume that lost the weights would not
    // match, and neither would a run that never changed them).
    assert_ne!(full[0].loss["total"], full[5].loss["total"]);
    // The split run's metrics file holds each step once.
    let m = read_metrics(&dir.path().join("runs/split/metrics.jsonl"));
    assert_eq!(
        m.iter().map(|r| r.step).collect::<Vec<_>>(),
        (0..6).collect::<Vec<_>>()
    );
    // keep_last = 2: steps 3 and 6 remain.
    let mut left: Vec<String> = std::fs::read_dir(dir.path().join("runs/split"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    left.sort();
    assert_eq!(left, ["step-3", "step-6"]);
}

#[test]
fn falcon_train_runs_and_resumes_from_a_config_file() {
    let dir = tmpdir();
    setup(dir.path());
    let cfg_path = dir.path().join("run.toml");
    let write = |steps: u64| {
        let mut cfg = config(dir.path(), steps, 62420);
        cfg.run.name = "cli".into();
        cfg.train.checkpoint_every = 1;
        std::fs::write(&cfg_path, toml::to_string(&cfg).unwrap()).unwrap();
    };
    let falcon = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_falcon"))
            .args(["train", "--config", cfg_path.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap()
    };
    write(1);
    let o = falcon(&[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("1 steps") && err.contains("metrics.jsonl"),
        "{err}"
    );
    write(2);
    let o = falcon(&["--resume"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("resumed from") && err.contains("step 1"),
        "{err}"
    );
    let m = read_metrics(&dir.path().join("runs/cli/metrics.jsonl"));
    assert_eq!(m.iter().map(|r| r.step).collect::<Vec<_>>(), [0, 1]);
    // Any checkpoint exports as a merged HF directory and a PEFT adapter.
    let out = dir.path().join("exported");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_falcon"))
        .args(["export", "--checkpoint"])
        .arg(dir.path().join("runs/cli/step-2"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.join("config.json").is_file() && out.join("model.safetensors").is_file());
    assert!(dir
        .path()
        .join("exported-adapter/adapter_config.json")
        .is_file());
    let merged = falcon_rl::model::weights::read_all(&out.join("model.safetensors")).unwrap();
    let base =
        falcon_rl::model::weights::read_all(&dir.path().join("model/model.safetensors")).unwrap();
    let q = "model.layers.0.self_attn.q_proj.weight";
    assert!(
        !merged[q].equal(&base[q]),
        "the trained adapter is merged in"
    );
    // A config without a task file is a usage error naming the key.
    let mut cfg = config(dir.path(), 1, 62420);
    cfg.tasks.path = None;
    std::fs::write(&cfg_path, toml::to_string(&cfg).unwrap()).unwrap();
    let o = falcon(&[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("[tasks] path"));
}
