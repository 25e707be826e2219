//! The RL loop end to end on a tiny random Llama that carries the embedded
//! model's tokenizer and chat template: a smoke run (finite losses, trainable
//! weights change, frozen ones do not), exact resume (6 steps == 3 + resume
//! + 3), and `falcon train` from a config file.

use std::path::Path;

use falcon_rl::config::{Job, RunConfig};
use falcon_rl::dist::Group;
use falcon_rl::exec::Sandbox;
use falcon_rl::model::{Dtype, Policy};
use falcon_rl::task::{LoadOptions, TaskFormat, TaskSet};
use falcon_rl::train::{prepare_policy, trainable, Silent, Start, StepRecord, TrainState};
use tch::{Device, Tensor};

use crate::common::tmpdir;

pub use falcon_rl::model::testing::tiny_chat_model;

const TASKS: &str = r#"{"id": "add", "prompt": "Write a function add(a, b) that returns a + b.", "entry_point": "add", "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"], "canonical_solution": "def add(a, b):\n    return a + b\n", "tags": ["train"]}
{"id": "double", "prompt": "Write a function double(x) that returns 2 * x.", "entry_point": "double", "tests": ["assert double(2) == 4"], "canonical_solution": "def double(x):\n    return 2 * x\n", "tags": ["train"]}
{"id": "first", "prompt": "Write a function first(xs) that returns the first element of a list.", "entry_point": "first", "tests": ["assert first([3, 4]) == 3"], "canonical_solution": "def first(xs):\n    return xs[0]\n", "tags": ["heldout"]}
"#;

pub fn config(dir: &Path, steps: u64, uid_base: u32) -> RunConfig {
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

pub fn setup(dir: &Path) {
    tiny_chat_model(&dir.join("model"));
    std::fs::write(dir.join("tasks.jsonl"), TASKS).unwrap();
}

fn run(dir: &Path, steps: u64, resume: bool, run_name: &str) -> Vec<StepRecord> {
    run_with(dir, steps, resume, run_name, Job::Train, |_| {}).0
}

/// A run of `mode` with `tweak` applied to the config, evaluating on all
/// tasks where the config asks for it; also returns the trainable weights at
/// the end.
fn run_with(
    dir: &Path,
    steps: u64,
    resume: bool,
    run_name: &str,
    mode: Job,
    tweak: impl FnOnce(&mut RunConfig),
) -> (Vec<StepRecord>, Vec<(String, Tensor)>) {
    let mut cfg = config(dir, steps, 62410);
    cfg.run.name = run_name.into();
    tweak(&mut cfg);
    let mut policy = Policy::load(&dir.join("model"), Dtype::Fp32, Device::Cpu).unwrap();
    prepare_policy(&cfg, &mut policy).unwrap();
    let tasks = TaskSet::load(
        &dir.join("tasks.jsonl"),
        TaskFormat::Auto,
        LoadOptions::default(),
    )
    .unwrap();
    let sandbox = Sandbox::new(&cfg.exec).unwrap();
    let records = {
        let mut t = TrainState::new(
            cfg,
            mode,
            &mut policy,
            &tasks,
            &sandbox,
            Box::leak(Box::new(Group::single())),
            if resume { Start::Resume } else { Start::New },
            &mut Silent,
        )
        .unwrap()
        .with_eval_tasks(&tasks);
        falcon_rl::train::run(&mut t, &mut Silent).unwrap()
    };
    let weights = trainable(&policy)
        .into_iter()
        .map(|(n, t)| (n, t.detach().copy()))
        .collect();
    (records, weights)
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
        let mut t = TrainState::new(
            cfg.clone(),
            Job::Train,
            &mut policy,
            &tasks,
            &sandbox,
            Box::leak(Box::new(Group::single())),
            Start::New,
            &mut Silent,
        )
        .unwrap();
        falcon_rl::train::run(&mut t, &mut Silent).unwrap()
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

/// A 4-step run with a checkpoint every 2 steps that evaluates on all tasks
/// every `eval_every` steps (0 = never).
fn run_evaluating(dir: &Path, name: &str, eval_every: u64, resume: bool) -> Vec<StepRecord> {
    run_with(dir, 4, resume, name, Job::Train, |cfg| {
        cfg.exec.uid_base = 62430;
        cfg.train.checkpoint_every = 2;
        cfg.train.eval_every = eval_every;
    })
    .0
}

#[test]
fn periodic_evaluation_writes_curves_and_leaves_training_unchanged() {
    let dir = tmpdir();
    setup(dir.path());
    let plain = run_evaluating(dir.path(), "plain", 0, false);
    let evaluated = run_evaluating(dir.path(), "evaluated", 2, false);
    // Evaluating (generation without dropout, its own seed) between steps
    // must not move the training trajectory.
    assert_eq!(plain.len(), 4);
    assert_eq!(evaluated.len(), 4);
    for (a, b) in plain.iter().zip(&evaluated) {
        assert_eq!(a.loss, b.loss, "step {}", a.step);
        assert_eq!(a.reward, b.reward, "step {}", a.step);
        assert_eq!(a.grad_norm, b.grad_norm, "step {}", a.step);
    }
    let eval_dir = |run: &str| dir.path().join("runs").join(run).join("eval");
    let mut written: Vec<String> = std::fs::read_dir(eval_dir("evaluated"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    assert_eq!(written, ["step-2.json", "step-4.json"]);
    assert!(!eval_dir("plain").exists());
    // A session killed after the step-4 checkpoint, before its evaluation:
    // the resume evaluates the restored weights and gets the same result.
    let path = eval_dir("evaluated").join("step-4.json");
    let read = |p: &Path| -> falcon_rl::eval::EvalResult {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    let first = read(&path);
    assert_eq!(first.tasks.len(), 3);
    std::fs::remove_file(&path).unwrap();
    assert!(run_evaluating(dir.path(), "evaluated", 2, true).is_empty());
    let again = read(&path);
    assert_eq!(again.pass_at, first.pass_at);
    assert_eq!(again.outcomes, first.outcomes);
    assert_eq!(
        serde_json::to_value(&again.tasks).unwrap(),
        serde_json::to_value(&first.tasks).unwrap()
    );
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
        cfg.tasks.tags = vec!["train".into()];
        cfg.eval.tags = vec!["heldout".into()];
        cfg.train.eval_before = true;
        cfg.train.eval_after = true;
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
    // Held-out evaluation before and after, on the "heldout" task only.
    assert!(
        err.contains("held-out pass@1") && err.contains("1 tasks"),
        "{err}"
    );
    let ev: falcon_rl::eval::EvalResult = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("runs/cli/eval/step-0.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(ev.tasks.len(), 1);
    assert_eq!(ev.tasks[0].id, "first");
    assert!(dir.path().join("runs/cli/eval/step-1.json").is_file());
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
    assert!(dir.path().join("runs/cli/eval/step-2.json").is_file());
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

fn close(a: f64, b: f64, rel: f64) -> bool {
    // Summation order differs between the splits: relative, with a floor.
    (a - b).abs() <= rel * a.abs().max(b.abs()) + 1e-6
}

#[test]
fn micro_batches_accumulate_to_the_whole_batch() {
    let dir = tmpdir();
    setup(dir.path());
    // sl > 0, kl > 0 and sequence-mean normalisation too, so every
    // normaliser and the reference pass are used. Micro-batches of several
    // samples of a group run their prompt once (shared prefix); of one
    // sample, or with shared_prefix off, every sequence runs whole.
    let tweak = |micro: usize, shared: bool| {
        move |c: &mut RunConfig| {
            c.train.micro_batch = micro;
            c.train.shared_prefix = shared;
            // Dropout masks depend on the micro-batch shapes.
            c.model.lora.dropout = 0.0;
            c.train.loss.sl = 0.5;
            c.train.loss.kl = 0.05;
            c.train.advantage = falcon_rl::train::advantage::AdvantageKind::GroupMean;
        }
    };
    let (whole, w_whole) = run_with(dir.path(), 2, false, "whole", Job::Train, tweak(0, true));
    let (micro, w_micro) = run_with(dir.path(), 2, false, "micro", Job::Train, tweak(4, true));
    let (ones, _) = run_with(dir.path(), 2, false, "ones", Job::Train, tweak(1, true));
    let (plain, w_plain) = run_with(dir.path(), 2, false, "plain", Job::Train, tweak(0, false));
    assert!(whole[1].loss["kl"] > 0.0);
    for (a, b) in whole
        .iter()
        .zip(&micro)
        .chain(whole.iter().zip(&ones))
        .chain(whole.iter().zip(&plain))
    {
        assert_eq!(
            a.loss.keys().collect::<Vec<_>>(),
            b.loss.keys().collect::<Vec<_>>()
        );
        for (k, v) in &a.loss {
            assert!(
                close(*v, b.loss[k], 1e-4),
                "step {} {k}: {v} vs {}",
                a.step,
                b.loss[k]
            );
        }
        assert!(
            close(a.grad_norm, b.grad_norm, 1e-4),
            "{} vs {}",
            a.grad_norm,
            b.grad_norm
        );
        assert_eq!(a.reward, b.reward);
    }
    for ((n, a), (_, b)) in w_whole
        .iter()
        .zip(&w_micro)
        .chain(w_whole.iter().zip(&w_plain))
    {
        // AdamW divides by the gradient's own scale, so rounding in a
        // near-zero gradient entry moves its weight by ~1e-6 after 2 steps
        // (the weights are ~1e-2; a wrong gradient moves them by ~lr).
        assert!(
            a.allclose(b, 1e-5, 1e-5, false),
            "{n} differs after 2 steps by {} (max |w| {})",
            (a - b).abs().max().double_value(&[]),
            a.abs().max().double_value(&[])
        );
    }
}

#[test]
fn ppo_epochs_log_the_on_policy_step_and_take_more_updates() {
    let dir = tmpdir();
    setup(dir.path());
    let (one, w_one) = run_with(dir.path(), 1, false, "one", Job::Train, |_| {});
    let (two, w_two) = run_with(dir.path(), 1, false, "two", Job::Train, |c| {
        c.train.ppo_epochs = 2
    });
    // The first epoch is on-policy (ratio 1): clipping cannot change it.
    assert_eq!(one[0].loss, two[0].loss);
    assert_eq!(one[0].grad_norm, two[0].grad_norm);
    let moved = w_one.iter().zip(&w_two).any(|((_, a), (_, b))| !a.equal(b));
    assert!(moved, "a second epoch took a second optimizer step");
}

#[test]
fn kl_to_the_base_model_starts_at_zero_and_grows() {
    let dir = tmpdir();
    setup(dir.path());
    let (rec, _) = run_with(dir.path(), 3, false, "kl", Job::Train, |c| {
        c.train.loss.kl = 0.1
    });
    // LoRA's B starts at zero, so the policy is the reference at step 0.
    assert!(rec[0].loss["kl"].abs() < 1e-6, "{:?}", rec[0].loss);
    assert!(rec[2].loss["kl"] > 1e-6, "{:?}", rec[2].loss);
    let (plain, _) = run_with(dir.path(), 1, false, "plain", Job::Train, |_| {});
    assert!(
        !plain[0].loss.contains_key("kl"),
        "no reference forward when kl = 0"
    );
}

#[test]
fn sft_fits_reference_solutions_and_warm_starts_rl() {
    let dir = tmpdir();
    setup(dir.path());
    let train_only = |c: &mut RunConfig| {
        c.tasks.path = Some(dir.path().join("train-tasks.jsonl"));
        c.train.tasks_per_step = 2;
        c.train.lr = 0.05;
    };
    let all = TaskSet::load(
        &dir.path().join("tasks.jsonl"),
        TaskFormat::Auto,
        LoadOptions::default(),
    )
    .unwrap();
    all.with_any_tag(&["train".to_string()])
        .write_jsonl(&dir.path().join("train-tasks.jsonl"))
        .unwrap();
    let (rec, w_sft) = run_with(dir.path(), 6, false, "sft", Job::Sft, train_only);
    assert!(rec
        .iter()
        .all(|r| r.samples == 0 && r.loss["sl"].is_finite()));
    // Both tasks each step: the same two examples, so without learning the
    // loss would repeat exactly.
    assert!(
        rec[5].loss["sl"] < 0.97 * rec[0].loss["sl"],
        "{} -> {}",
        rec[0].loss["sl"],
        rec[5].loss["sl"]
    );
    // An RL run that starts from the SFT checkpoint has its weights before step 0.
    let ckpt = dir.path().join("runs/sft/step-6");
    let (_, w_rl) = run_with(dir.path(), 1, false, "rl", Job::Train, |c| {
        c.train.init_from = Some(ckpt.clone());
        c.train.lr = 1e-12;
    });
    for ((n, a), (_, b)) in w_sft.iter().zip(&w_rl) {
        assert!(
            a.allclose(b, 1e-6, 1e-6, false),
            "{n} not loaded from the SFT checkpoint"
        );
    }
    // An SFT checkpoint does not resume as RL.
    let mut cfg = config(dir.path(), 7, 62410);
    cfg.run.name = "sft".into();
    let mut policy = Policy::load(&dir.path().join("model"), Dtype::Fp32, Device::Cpu).unwrap();
    prepare_policy(&cfg, &mut policy).unwrap();
    let sandbox = Sandbox::new(&cfg.exec).unwrap();
    let err = TrainState::new(
        cfg,
        Job::Train,
        &mut policy,
        &all,
        &sandbox,
        Box::leak(Box::new(Group::single())),
        Start::Resume,
        &mut Silent,
    )
    .err()
    .expect("mode mismatch refused")
    .to_string();
    assert!(err.contains("cannot resume"), "{err}");
}

#[test]
fn sft_examples_end_with_the_end_of_turn_token() {
    let dir = tmpdir();
    tiny_chat_model(&dir.path().join("model"));
    let policy = Policy::load(&dir.path().join("model"), Dtype::Fp32, Device::Cpu).unwrap();
    let (p, a) = falcon_rl::train::sft_example(&policy, "Say hi.", "hi").unwrap();
    let params = falcon_rl::model::GenerationParams {
        chat: true,
        ..Default::default()
    };
    assert_eq!(
        p,
        policy.encode_prompts(&["Say hi.".into()], &params).unwrap()[0]
    );
    let tok = policy.tokenizer().unwrap();
    assert_eq!(tok.decode(&a, false).unwrap(), "hi<|im_end|>");
    assert!(tok.eos_ids().contains(a.last().unwrap()));
}

#[test]
fn finished_rows_leave_the_batch_without_changing_the_others() {
    let dir = tmpdir();
    tiny_chat_model(&dir.path().join("model"));
    let policy = Policy::load(&dir.path().join("model"), Dtype::Fp32, Device::Cpu).unwrap();
    let params = |stop: Vec<String>| falcon_rl::model::GenerationParams {
        max_new_tokens: 20,
        stop,
        chat: true,
        ignore_eos: true,
        ..Default::default()
    };
    use falcon_rl::model::Generator;
    let candidates = [
        "Write add.",
        "Write a sort function in Python.",
        "What is 2 + 2?",
        "Reverse a string.",
        "Name three colours.",
    ];
    let alone: Vec<_> = candidates
        .iter()
        .map(|p| {
            policy
                .generate(&[p.to_string()], &params(vec![]))
                .unwrap()
                .remove(0)
        })
        .collect();
    // Two prompts and a stop string: the shortest prefix of the first one's
    // text that the second one's text never contains, so the first row stops
    // early and the second runs on alone in a compacted batch.
    let mut found = None;
    'search: for i in 0..candidates.len() {
        for j in 0..candidates.len() {
            let (a, b) = (&alone[i].text, &alone[j].text);
            if i == j || a.is_empty() {
                continue;
            }
            let ends: Vec<usize> = a.char_indices().map(|(k, c)| k + c.len_utf8()).collect();
            for &end in ends.iter().take(a.chars().count() / 2) {
                let stop = &a[..end];
                if !stop.trim().is_empty() && !b.contains(stop) {
                    found = Some((i, j, stop.to_string()));
                    break 'search;
                }
            }
        }
    }
    let (i, j, stop) = found.expect("two distinct greedy texts");
    let prompts = vec![candidates[i].to_string(), candidates[j].to_string()];
    let batch = policy.generate(&prompts, &params(vec![stop])).unwrap();
    assert!(matches!(
        batch[0].finish,
        falcon_rl::model::FinishReason::Stop(_)
    ));
    assert!(batch[0].token_ids.len() < alone[i].token_ids.len());
    assert_eq!(batch[1].token_ids, alone[j].token_ids);
    for (a, b) in batch[1].logprobs.iter().zip(&alone[j].logprobs) {
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }
}

fn meta_tweak(algorithm: &str) -> impl FnOnce(&mut RunConfig) + '_ {
    move |c: &mut RunConfig| {
        c.meta.algorithm = serde_json::from_value(serde_json::json!(algorithm)).unwrap();
        c.meta.inner_steps = 1;
        c.meta.inner_lr = 0.05;
        c.meta.short_term_samples = 2;
        c.memory.short_term_capacity = 64;
        c.memory.short_term_max_len = 256;
        c.train.checkpoint_every = 2;
    }
}

fn long_term_rows(run_dir: &Path) -> u64 {
    falcon_rl::memory::MemoryStore::open(run_dir)
        .unwrap()
        .count_long_term()
        .unwrap()
}

#[test]
fn meta_algorithms_train_and_fill_both_memories() {
    let dir = tmpdir();
    setup(dir.path());
    let start: Vec<(String, Tensor)> = {
        let cfg = config(dir.path(), 1, 62410);
        let mut p = Policy::load(&dir.path().join("model"), Dtype::Fp32, Device::Cpu).unwrap();
        prepare_policy(&cfg, &mut p).unwrap();
        trainable(&p)
            .into_iter()
            .map(|(n, t)| (n, t.detach().copy()))
            .collect()
    };
    for algo in ["maml", "fomaml", "reptile"] {
        let (records, end) = run_with(dir.path(), 2, false, algo, Job::Train, meta_tweak(algo));
        assert_eq!(records.len(), 2, "{algo}");
        for r in &records {
            // 2 tasks × (3 samples with θ + 3 with θ_i).
            assert_eq!(r.samples, 12, "{algo}");
            assert!(r.loss.values().all(|v| v.is_finite()), "{algo}: {r:?}");
            assert!(r.loss.contains_key("inner"), "{algo}: {r:?}");
            assert!(r.reward["total"].is_finite(), "{algo}: {r:?}");
        }
        let moved = start
            .iter()
            .zip(&end)
            .filter(|((_, a), (_, b))| !a.equal(b))
            .count();
        assert!(moved > 0, "{algo}: θ did not move");
        let run_dir = dir.path().join("runs").join(algo);
        // 3 reference solutions (line 4) + 2 steps × 2 tasks × 3 evaluations.
        assert_eq!(long_term_rows(&run_dir), 3 + 12, "{algo}");
        let st = falcon_rl::memory::ShortTerm::load(
            &run_dir.join("step-2").join("short_term.safetensors"),
            Device::Cpu,
        )
        .unwrap();
        // 3 demonstrations + 2 steps × 12 samples.
        assert_eq!(st.pushed(), 3 + 24, "{algo}");
        let samples = std::fs::read_to_string(run_dir.join("samples.jsonl")).unwrap();
        assert_eq!(samples.lines().count(), 24);
    }
    // inner_steps = 0: no adaptation and no second generation, but the same
    // memories; θ's samples are the evaluated ones that long-term memory keeps.
    let (records, _) = run_with(dir.path(), 2, false, "no-meta-loop", Job::Train, |c| {
        meta_tweak("fomaml")(c);
        c.meta.inner_steps = 0;
    });
    for r in &records {
        assert_eq!(r.samples, 6, "{r:?}");
        assert!(!r.loss.contains_key("inner") && r.loss["total"].is_finite());
    }
    assert_eq!(
        long_term_rows(&dir.path().join("runs/no-meta-loop")),
        3 + 2 * 6
    );
    // FALCON's prompt from that memory: neighbours, never the task's own entries.
    use falcon_rl::memory::{Embedder, ExactIndex, HashEmbedder, LongTerm, MemoryStore};
    let run_dir = dir.path().join("runs/fomaml");
    let emb = HashEmbedder::new(384).unwrap();
    let index = Box::new(ExactIndex::new(emb.dim(), Device::Cpu));
    let mut lt = LongTerm::with_store(MemoryStore::open(&run_dir).unwrap(), &emb, index).unwrap();
    let tasks = TaskSet::load(
        &dir.path().join("tasks.jsonl"),
        TaskFormat::Auto,
        LoadOptions::default(),
    )
    .unwrap();
    let add = tasks.iter().find(|t| t.id == "add").unwrap();
    let hits = lt.retrieve(&emb, &[add.prompt.as_str()], 15).unwrap();
    let own = hits[0].iter().filter(|h| h.record.task_id == "add").count();
    assert!(own > 0 && own < hits[0].len(), "{own} of {}", hits[0].len());
    let p = falcon_rl::rollout::falcon_prompt(add, &hits[0], &Default::default());
    assert_eq!(
        p.matches("- Historical Task:").count(),
        hits[0].len() - own,
        "{p}"
    );
    assert!(p.contains(&add.prompt));
}

/// `[meta] prompt = "zero-shot"` keeps long-term memory (recorded, there
/// for demonstrations) but prompts as a run without it does: θ's samples of
/// the first step are those of the memoryless run, not the Table 7 run's.
#[test]
fn zero_shot_meta_prompts_keep_long_term_memory() {
    use falcon_rl::config::MetaPrompt;
    let dir = tmpdir();
    setup(dir.path());
    let run = |name: &str, long_term: bool, prompt: MetaPrompt| {
        run_with(dir.path(), 1, false, name, Job::Train, |c| {
            meta_tweak("fomaml")(c);
            c.meta.long_term = long_term;
            c.meta.prompt = prompt;
        });
        let samples =
            std::fs::read_to_string(dir.path().join("runs").join(name).join("samples.jsonl"))
                .unwrap();
        // θ's samples come first: 2 tasks × 3.
        samples
            .lines()
            .take(6)
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                v["completion"].as_str().unwrap().to_owned()
            })
            .collect::<Vec<_>>()
    };
    let without = run("no-ltm", false, MetaPrompt::Table7);
    let zero_shot = run("ltm-zero-shot", true, MetaPrompt::ZeroShot);
    let table7 = run("ltm-table7", true, MetaPrompt::Table7);
    assert_eq!(zero_shot, without);
    assert_ne!(table7, without);
    // 3 reference solutions + 2 tasks × 3 evaluated samples.
    assert_eq!(
        long_term_rows(&dir.path().join("runs/ltm-zero-shot")),
        3 + 6
    );
}

#[test]
fn meta_resume_after_a_lost_checkpoint_reproduces_the_run_with_its_memories() {
    let dir = tmpdir();
    setup(dir.path());
    let (full, _) = run_with(
        dir.path(),
        4,
        false,
        "full",
        Job::Train,
        meta_tweak("fomaml"),
    );
    let (split_a, _) = run_with(
        dir.path(),
        4,
        false,
        "split",
        Job::Train,
        meta_tweak("fomaml"),
    );
    assert_eq!(full, {
        let mut a = split_a.clone();
        for (x, y) in a.iter_mut().zip(&full) {
            x.seconds = y.seconds.clone();
        }
        a
    });
    // Steps 3 and 4 are lost with their checkpoint; their long-term rows and
    // short-term pushes stay behind in the run directory and must not count.
    let run_dir = dir.path().join("runs/split");
    std::fs::remove_dir_all(run_dir.join("step-4")).unwrap();
    assert_eq!(long_term_rows(&run_dir), 3 + 4 * 6);
    let (rest, _) = run_with(
        dir.path(),
        4,
        true,
        "split",
        Job::Train,
        meta_tweak("fomaml"),
    );
    assert_eq!(rest.len(), 2, "resumed at step 2");
    for (a, b) in full[2..].iter().zip(&rest) {
        assert_eq!(a.step, b.step);
        assert_eq!(a.loss, b.loss, "step {}", a.step);
        assert_eq!(a.reward, b.reward, "step {}", a.step);
        assert_eq!(a.grad_norm, b.grad_norm, "step {}", a.step);
    }
    assert_eq!(long_term_rows(&run_dir), 3 + 4 * 6);
    assert_ne!(full[0].loss["total"], full[3].loss["total"]);
}

#[test]
fn a_time_budget_stops_with_a_checkpoint() {
    let dir = tmpdir();
    setup(dir.path());
    // A budget that is spent after the first step.
    let (records, _) = run_with(dir.path(), 5, false, "budget", Job::Train, |c| {
        c.train.max_minutes = 1e-9;
    });
    assert_eq!(records.len(), 1);
    assert!(dir
        .path()
        .join("runs/budget/step-1/manifest.json")
        .is_file());
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("runs/budget/step-1/trainer_state.json")).unwrap(),
    )
    .unwrap();
    assert!(state["train_seconds"].as_f64().unwrap() > 0.0, "{state}");
    // The budget is the run's, not the session's: resuming a spent run
    // trains nothing more.
    let (again, _) = run_with(dir.path(), 5, true, "budget", Job::Train, |c| {
        c.train.max_minutes = 1e-9;
    });
    assert!(again.is_empty(), "{} steps after the budget", again.len());
    assert!(!dir.path().join("runs/budget/step-2").exists());
    // Lifting the budget trains the rest.
    let (rest, _) = run_with(dir.path(), 5, true, "budget", Job::Train, |c| {
        c.train.max_minutes = 0.0;
    });
    assert_eq!(rest.len(), 4, "steps 2..=5");
    assert!(dir.path().join("runs/budget/step-5").is_dir());
}

/// Two RL steps straight as run `{name}-full`, and one step then a resume
/// for the second as `{name}-split`: each step's losses and rewards must be
/// the same in both, and finite. Returns the straight run's records.
fn two_steps_equal_one_plus_resume(
    dir: &Path,
    name: &str,
    tweak: impl FnOnce(&mut RunConfig) + Copy,
) -> Vec<StepRecord> {
    let (full_name, split_name) = (format!("{name}-full"), format!("{name}-split"));
    let (full, _) = run_with(dir, 2, false, &full_name, Job::Train, tweak);
    let (first, _) = run_with(dir, 1, false, &split_name, Job::Train, tweak);
    let (rest, _) = run_with(dir, 2, true, &split_name, Job::Train, tweak);
    assert_eq!((first.len(), rest.len()), (1, 1));
    for (a, b) in full.iter().zip(first.iter().chain(&rest)) {
        assert_eq!(a.loss, b.loss, "{name} step {}", a.step);
        assert_eq!(a.reward, b.reward, "{name} step {}", a.step);
        assert!(a.loss["total"].is_finite());
    }
    full
}

/// `[train] strategy = "memocoder"`: the policy learns from the repair
/// loop's final answers under the prompts that produced them; samples carry
/// their attempt chains; what the strategy learned is checkpointed, and
/// 1 step + resume + 1 equals 2 straight.
#[test]
fn repairing_rollouts_train_and_resume_exactly() {
    use falcon_rl::config::StrategyKind;
    let dir = tmpdir();
    setup(dir.path());
    let tweak = |c: &mut RunConfig| {
        c.exec.uid_base = 62580;
        c.train.strategy = StrategyKind::Memocoder;
        c.train.checkpoint_every = 1;
        c.strategy.max_attempts = 2;
        c.strategy.plans = 2;
    };
    two_steps_equal_one_plus_resume(dir.path(), "mc", tweak);
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("runs/mc-split/step-1/rollout_state.json"))
            .unwrap(),
    )
    .unwrap();
    // 2 tasks x 3 samples per step, each with one or two attempts.
    let attempts = state["stats"]["attempts"].as_u64().unwrap();
    assert!((6..=12).contains(&attempts), "{state}");
    let samples = std::fs::read_to_string(dir.path().join("runs/mc-full/samples.jsonl")).unwrap();
    let chains: Vec<usize> = samples
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["attempts"].as_array().unwrap().len()
        })
        .collect();
    assert_eq!(chains.len(), 2 * 6);
    assert!(chains.iter().all(|&n| (1..=2).contains(&n)), "{chains:?}");
    // A random model fails its guiding test: most samples were repaired once.
    assert!(chains.iter().filter(|&&n| n == 2).count() > 6, "{chains:?}");
}

/// `[train] strategy = "memcoder"`: each step streams its tasks through
/// MEMCoder (docs and guidelines in the prompt, the policy as reflector);
/// the evolved memory is checkpointed, and 1 step + resume + 1 equals 2
/// straight. MEMCoder-Accum resumes the same way.
#[test]
fn memcoder_rollouts_train_and_resume_exactly() {
    use falcon_rl::config::StrategyKind;
    let dir = tmpdir();
    setup(dir.path());
    let docs = dir.path().join("docs.jsonl");
    std::fs::write(
        &docs,
        concat!(
            r#"{"name": "operator.add", "signature": "add(a, b)", "description": "Same as a + b."}"#,
            "\n",
            r#"{"name": "operator.mul", "signature": "mul(a, b)", "description": "Same as a * b."}"#,
            "\n",
            r#"{"name": "operator.getitem", "signature": "getitem(a, b)", "description": "Same as a[b]."}"#,
            "\n",
        ),
    )
    .unwrap();
    for (kind, name) in [
        (StrategyKind::Memcoder, "mem"),
        (StrategyKind::MemcoderAccum, "acc"),
    ] {
        let tweak = |c: &mut RunConfig| {
            c.exec.uid_base = 62590;
            c.train.strategy = kind;
            c.train.checkpoint_every = 1;
            c.memory.api_docs = Some(docs.clone());
            c.memory.k_doc = 2;
            c.generation.max_new_tokens = 12;
        };
        two_steps_equal_one_plus_resume(dir.path(), name, tweak);
        let split_name = format!("{name}-split");
        let state = |step: u64| -> serde_json::Value {
            let p = dir
                .path()
                .join(format!("runs/{split_name}/step-{step}/rollout_state.json"));
            serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
        };
        // Two tasks per step, each evolving the memory once from its first
        // sample (Accum: kept as raw trajectories instead).
        let (s1, s2) = (state(1), state(2));
        match kind {
            StrategyKind::Memcoder => {
                let n = |s: &serde_json::Value| s["memory"]["tasks"].as_array().unwrap().len();
                assert_eq!((n(&s1), n(&s2)), (2, 4), "{s2}");
            }
            _ => {
                let n = |s: &serde_json::Value| s["accum"].as_array().unwrap().len();
                assert_eq!((n(&s1), n(&s2)), (2, 4), "{s2}");
            }
        }
    }
}

/// `[train] strategy` inside the meta-loop: θ's samples and each θ_i's
/// query samples are whole MemoCoder repair runs with their attempt
/// chains, long-term memory records the query samples, what the strategy
/// learned is checkpointed with both memories, and 1 step + resume + 1
/// equals 2 straight.
#[test]
fn repairing_rollouts_run_inside_the_meta_loop() {
    use falcon_rl::config::{MetaPrompt, StrategyKind};
    let dir = tmpdir();
    setup(dir.path());
    let tweak = |c: &mut RunConfig| {
        meta_tweak("fomaml")(c);
        c.meta.prompt = MetaPrompt::ZeroShot;
        c.exec.uid_base = 62600;
        c.generation.max_new_tokens = 12;
        c.train.strategy = StrategyKind::Memocoder;
        c.train.checkpoint_every = 1;
        c.strategy.max_attempts = 2;
        c.strategy.plans = 2;
    };
    let full = two_steps_equal_one_plus_resume(dir.path(), "meta-mc", tweak);
    assert!(full.iter().all(|r| r.loss["inner"].is_finite()));
    let run_dir = dir.path().join("runs/meta-mc-split");
    assert!(run_dir.join("step-1/rollout_state.json").is_file());
    assert!(run_dir.join("step-1/short_term.safetensors").is_file());
    // 3 reference solutions + 2 steps x 2 tasks x 3 query samples.
    assert_eq!(long_term_rows(&run_dir), 3 + 2 * 6);
    let samples =
        std::fs::read_to_string(dir.path().join("runs/meta-mc-full/samples.jsonl")).unwrap();
    let chains: Vec<usize> = samples
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["attempts"].as_array().unwrap().len()
        })
        .collect();
    // Per step: θ's 2 x 3 samples, then θ_i's 3 query samples per task.
    assert_eq!(chains.len(), 2 * 12);
    assert!(chains.iter().all(|&n| (1..=2).contains(&n)), "{chains:?}");
    // A random model fails its guiding test: queries were repaired too.
    assert!(chains[6..12].contains(&2), "{chains:?}");
}

/// `[train] autocast = "bf16"` on CPU: the update's forward passes run their
/// matmuls in bf16, weights and gradients stay fp32. SFT on the same
/// examples gives a first loss within bf16 precision of the fp32 run's, and
/// an RL run trains with finite losses.
#[test]
fn bf16_autocast_trains_within_bf16_precision_of_fp32() {
    use falcon_rl::config::Autocast;
    let dir = tmpdir();
    setup(dir.path());
    let tweak = |ac: Autocast| {
        move |c: &mut RunConfig| {
            c.train.autocast = ac;
            c.model.lora.dropout = 0.0;
        }
    };
    let (fp32, _) = run_with(dir.path(), 2, false, "fp32", Job::Sft, tweak(Autocast::Off));
    let (bf16, w16) = run_with(
        dir.path(),
        2,
        false,
        "bf16",
        Job::Sft,
        tweak(Autocast::Bf16),
    );
    let (a, b) = (fp32[0].loss["total"], bf16[0].loss["total"]);
    assert!(a > 1.0 && (a - b).abs() <= 3e-2 * a, "SFT loss {a} vs {b}");
    assert_ne!(a, b, "bf16 matmuls should round differently");
    for (n, w) in &w16 {
        assert_eq!(w.kind(), tch::Kind::Float, "{n} stays fp32");
        assert_eq!(i64::try_from(w.isfinite().all()).unwrap(), 1, "{n}");
    }
    let (rl, _) = run_with(
        dir.path(),
        2,
        false,
        "rl-bf16",
        Job::Train,
        tweak(Autocast::Bf16),
    );
    assert!(rl
        .iter()
        .all(|r| r.loss["total"].is_finite() && r.grad_norm.is_finite()));
}

/// `[[reward.custom]]` in training: a TRL-style Python function weighed into
/// the composite and a command logged only, both by name in the step
/// records and in `samples.jsonl`; a resumed run equals an uninterrupted one.
#[test]
fn custom_reward_terms_train_log_and_resume_exactly() {
    use falcon_rl::config::{CustomKind, CustomTermConfig, TermMode};
    let dir = tmpdir();
    setup(dir.path());
    let file = dir.path().join("rewards.py");
    std::fs::write(
        &file,
        "def short(completions, log_extra=None, **kwargs):\n    log_extra(\"chars\", [len(c) for c in completions])\n    return [1.0 / (1 + len(c)) for c in completions]\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("chars.py"),
        "import json, sys\nfor line in sys.stdin:\n    print(len(json.loads(line)['completion']), flush=True)\n",
    )
    .unwrap();
    let python = crate::common::python().display().to_string();
    let tweak = |cfg: &mut RunConfig| {
        cfg.exec.uid_base = 62660;
        cfg.train.checkpoint_every = 2;
        cfg.reward.custom = vec![
            CustomTermConfig {
                name: "short".into(),
                path: Some(file.clone()),
                python: python.clone(),
                weight: 3.0,
                ..CustomTermConfig::default()
            },
            CustomTermConfig {
                name: "chars".into(),
                kind: CustomKind::Command,
                command: vec![python.clone(), "chars.py".into()],
                cwd: Some(dir.path().to_path_buf()),
                mode: TermMode::LogOnly,
                ..CustomTermConfig::default()
            },
        ];
    };
    let full = run_with(dir.path(), 4, false, "full", Job::Train, tweak).0;
    let first = run_with(dir.path(), 2, false, "split", Job::Train, tweak).0;
    let rest = run_with(dir.path(), 4, true, "split", Job::Train, tweak).0;
    let split: Vec<StepRecord> = first.into_iter().chain(rest).collect();
    assert_eq!(split.len(), 4);
    for (a, b) in full.iter().zip(&split) {
        assert_eq!(a.loss, b.loss, "step {}", a.step);
        assert_eq!(a.reward, b.reward, "step {}", a.step);
    }
    for r in &full {
        assert!(
            r.reward["short"] > 0.0 && r.reward["short"] <= 1.0,
            "{:?}",
            r.reward
        );
        assert!(r.reward["chars"] >= 1.0, "{:?}", r.reward);
        assert_eq!(r.reward["short/no_signal"], 0.0);
        // What the function logged, averaged over the step's samples.
        assert!(r.reward["short/chars"] >= 0.0, "{:?}", r.reward);
        assert_eq!(r.reward["chars/no_signal"], 0.0);
    }
    // Each sample's values, by name, with the weights that made its total.
    let samples = std::fs::read_to_string(dir.path().join("runs/full/samples.jsonl")).unwrap();
    let mut n = 0;
    for line in samples.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let r = &v["rewards"];
        if r.is_null() {
            continue;
        }
        n += 1;
        let text = v["completion"].as_str().unwrap_or_default();
        let short = r["short"].as_f64().unwrap();
        let want = 1.0 / (1.0 + text.chars().count() as f64);
        assert!((short - want).abs() < 1e-12, "{short} vs {want}: {text:?}");
        assert!(r["chars"].as_f64().is_some());
        let logged = v["reward_logs"]["short/chars"].as_f64().unwrap();
        assert_eq!(logged, text.chars().count() as f64);
    }
    assert!(n > 0, "some sample was scored");
}

/// `judge = "lm"` in training: a judge model of its own (here a second
/// copy of the tiny model), a budget of answers per step, a cache by code
/// hash that checkpoints keep, so a resumed run equals an uninterrupted one.
#[test]
fn the_lm_judge_trains_within_its_budget_and_resumes_exactly() {
    use falcon_rl::config::{JudgeKind, OnMissingTerm};
    let dir = tmpdir();
    setup(dir.path());
    let judge_model = dir.path().join("model").display().to_string();
    let budget = 3;
    let tweak = |cfg: &mut RunConfig| {
        cfg.exec.uid_base = 62740;
        cfg.train.checkpoint_every = 1;
        cfg.reward.judge = JudgeKind::Lm;
        cfg.reward.on_missing = OnMissingTerm::SkipTerm;
        cfg.reward.lm_judge.model = judge_model.clone();
        cfg.reward.lm_judge.max_new_tokens = 6;
        cfg.reward.lm_judge.max_requests_per_step = budget;
    };
    let full = run_with(dir.path(), 3, false, "full", Job::Train, tweak).0;
    let first = run_with(dir.path(), 1, false, "split", Job::Train, tweak).0;
    let rest = run_with(dir.path(), 3, true, "split", Job::Train, tweak).0;
    let split: Vec<StepRecord> = first.into_iter().chain(rest).collect();
    assert_eq!(split.len(), 3);
    for (a, b) in full.iter().zip(&split) {
        assert_eq!(a.loss, b.loss, "step {}", a.step);
        assert_eq!(a.reward, b.reward, "step {}", a.step);
    }
    // The cache holds what the judge answered: never more than the budget
    // allowed over the steps so far, and something.
    // keep_last = 2: steps 2 and 3 remain.
    for step in 2..=3u64 {
        let path = dir
            .path()
            .join(format!("runs/full/step-{step}"))
            .join(falcon_rl::run_dir::checkpoint::JUDGE_CACHE);
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let n = v["cache"].as_object().unwrap().len();
        assert!(
            n > 0 && n <= budget * step as usize,
            "step {step}: {n} cached answers for a budget of {budget} a step"
        );
    }
}

/// `--set` reaches the run (recorded in its config.toml), may extend a
/// resumed run, and may not change what the checkpoint was trained with.
#[test]
fn set_overrides_are_recorded_and_checked_on_resume() {
    let dir = tmpdir();
    setup(dir.path());
    let cfg_path = dir.path().join("run.toml");
    let mut cfg = config(dir.path(), 1, 62421);
    cfg.run.name = "set".into();
    cfg.train.checkpoint_every = 1;
    cfg.train.eval_after = false;
    std::fs::write(&cfg_path, toml::to_string(&cfg).unwrap()).unwrap();
    let falcon = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_falcon"))
            .args(["train", "--config", cfg_path.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap()
    };
    let o = falcon(&["--set", "train.lr=0.00042", "--set", "train.steps=1"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let saved: falcon_rl::config::RunConfig =
        toml::from_str(&std::fs::read_to_string(dir.path().join("runs/set/config.toml")).unwrap())
            .unwrap();
    assert_eq!(saved.train.lr, 0.00042, "the override is what trained");

    // A typo is refused before anything runs, naming the closest key.
    let o = falcon(&["--resume", "--set", "train.stpes=2"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("did you mean `train.steps`"), "{err}");

    // Changing the learning rate of a trained run is refused on resume.
    let o = falcon(&["--resume", "--set", "train.lr=0.001"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("train.lr: trained with") && err.contains("0.001"),
        "{err}"
    );

    // Going on for longer is what resume is for.
    let o = falcon(&[
        "--resume",
        "--set",
        "train.lr=0.00042",
        "--set",
        "train.steps=2",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("resumed from"), "{err}");
    let m = read_metrics(&dir.path().join("runs/set/metrics.jsonl"));
    assert_eq!(m.iter().map(|r| r.step).collect::<Vec<_>>(), [0, 1]);
}
