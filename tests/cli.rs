//! The `falcon` binary end to end: exit codes, messages, config commands,
//! model resolution from a local HF cache, and generation on the embedded model.

use std::path::Path;
use std::process::Command;

use crate::common::*;

#[test]
fn config_show_prints_every_shipped_config_and_dry_run_lists_each_grid() {
    // Whether each config is accepted is tests/config_check.rs's: config
    // check agrees with the trainer there.
    for e in std::fs::read_dir(root().join("configs")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("ablate-") {
            // A grid of variants: each resolves (its base may name an SFT
            // checkpoint a fresh clone lacks, which --dry-run reports).
            let o = falcon(&["ablate", "--grid", p.to_str().unwrap(), "--dry-run"]);
            let t = text(&o);
            assert!(
                o.status.success() || t.contains("train.init_from"),
                "{}: {t}",
                p.display()
            );
            continue;
        }
        let o = falcon(&["config", "show", p.to_str().unwrap()]);
        assert!(
            o.status.success() && text(&o).contains("[generation]"),
            "{}",
            text(&o)
        );
    }
}

#[test]
fn bad_config_exits_2_with_key_paths() {
    let d = tmpdir();
    let f = d.path().join("bad.toml");
    std::fs::write(&f, "[generation]\ntop_p = 1.5\ntemperature = -1\n").unwrap();
    let o = falcon(&["config", "check", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("generation.top_p") && t.contains("generation.temperature"),
        "{t}"
    );
    std::fs::write(&f, "[generation]\ntop_q = 0.5\n").unwrap();
    let o = falcon(&["config", "check", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("top_q"), "{}", text(&o));
}

#[test]
fn info_reports_cuda_status() {
    let o = falcon(&["info"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("cuda devices:"), "{}", text(&o));
    // Set-up's torch wheel brings NVRTC, so the custom kernels can compile here.
    assert!(
        text(&o).contains("custom kernels: NVRTC ") && text(&o).contains("libnvrtc.so.13"),
        "{}",
        text(&o)
    );
}

#[test]
fn repo_id_resolves_from_local_hf_cache_and_never_downloads() {
    let cache = tmpdir();
    let snap = cache.path().join("models--acme--tiny/snapshots/0123abcd");
    copy_dir(&fixture("tiny-qwen2"), &snap);
    std::fs::create_dir_all(cache.path().join("models--acme--tiny/refs")).unwrap();
    std::fs::write(
        cache.path().join("models--acme--tiny/refs/main"),
        "0123abcd",
    )
    .unwrap();
    let run = |model: &str| {
        Command::new(env!("CARGO_BIN_EXE_falcon"))
            .args(["export", "--model", model, "--out"])
            .arg(
                cache
                    .path()
                    .join(format!("out-{}", model.replace('/', "_"))),
            )
            .env("HF_HUB_CACHE", cache.path())
            .env("HF_HOME", cache.path())
            .output()
            .unwrap()
    };
    let o = run("acme/tiny");
    assert!(o.status.success(), "{}", text(&o));
    let o = run("acme/missing");
    assert!(!o.status.success());
    let t = text(&o);
    assert!(
        t.contains("not in the local HF cache") && t.contains(cache.path().to_str().unwrap()),
        "{t}"
    );
}

#[test]
fn text_generation_without_tokenizer_is_a_clear_error() {
    let o = falcon(&[
        "generate",
        "--model",
        fixture("tiny-llama").to_str().unwrap(),
        "--prompt",
        "hi",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("no tokenizer.json"), "{}", text(&o));
    let o = falcon(&["generate", "--model", "/nonexistent/dir", "--prompt", "hi"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("/nonexistent/dir"), "{}", text(&o));
    let o = falcon(&["generate", "--prompt", "hi", "--top-p", "0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("--top-p"), "{}", text(&o));
}

#[test]
fn embedded_model_generates_greedy_json_reproducibly() {
    let args = [
        "generate",
        "--chat",
        "--json",
        "--max-new-tokens",
        "12",
        "--prompt",
        "Write a Python function that adds two numbers.",
    ];
    let a = falcon(&args);
    assert!(a.status.success(), "{}", text(&a));
    let out = String::from_utf8_lossy(&a.stdout).into_owned();
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let c = &lines[0]["completion"];
    let n = c["token_ids"].as_array().unwrap().len();
    assert!((1..=12).contains(&n));
    assert_eq!(c["logprobs"].as_array().unwrap().len(), n);
    assert!(c["logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l.as_f64().unwrap() <= 0.0));
    assert!(!c["text"].as_str().unwrap().is_empty());
    assert_eq!(
        lines[1]["summary"]["new_tokens"].as_u64().unwrap() as usize,
        n
    );
    let b = falcon(&args);
    let out_b = String::from_utf8_lossy(&b.stdout).into_owned();
    assert_eq!(
        out.lines().next(),
        out_b.lines().next(),
        "greedy is deterministic"
    );
}

#[test]
fn exec_reports_outcomes_and_rewards_per_sample() {
    let d = tmpdir();
    let tasks = d.path().join("t.jsonl");
    std::fs::write(
        &tasks,
        r#"{"id": "add", "prompt": "def add(a, b):", "entry_point": "add", "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}"#,
    )
    .unwrap();
    let samples = d.path().join("s.jsonl");
    std::fs::write(
        &samples,
        [
            r#"{"task_id": "add", "code": "def add(a, b):\n    return a + b\n"}"#,
            r#"{"task_id": "add", "code": "def add(a, b):\n    return a - b\n"}"#,
            r#"{"task_id": "add", "code": "def add(a, b)\n    return a + b\n"}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    let out = d.path().join("r.jsonl");
    let o = Command::new(env!("CARGO_BIN_EXE_falcon"))
        .args(["exec", "--tasks", tasks.to_str().unwrap(), "--samples"])
        .arg(&samples)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("outcome"), "summary table: {}", text(&o));
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let outcome = |i: usize| rows[i]["report"]["outcome"].as_str().unwrap().to_string();
    assert_eq!(outcome(0), "pass");
    assert_eq!(outcome(1), "failure");
    assert_eq!(outcome(2), "syntax_error");
    assert_eq!(rows[0]["rewards"]["coarse"], 1.0);
    assert_eq!(rows[1]["rewards"]["coarse"], -0.3);
    assert_eq!(rows[2]["rewards"]["coarse"], -1.0);
    assert_eq!(rows[1]["n_fail"], 2, "a - b fails both tests");
    assert_eq!(rows[0]["n_pass"], 2);
    // A sample naming an unknown task is a clear error (exit 2).
    std::fs::write(&samples, r#"{"task_id": "nope", "code": "x = 1"}"#).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_falcon"))
        .args(["exec", "--tasks", tasks.to_str().unwrap(), "--samples"])
        .arg(&samples)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("s.jsonl:1") && text(&o).contains("nope"),
        "{}",
        text(&o)
    );
}

#[test]
fn eval_compare_prints_both_sides_and_mcnemar() {
    let d = tmpdir();
    // Task i is solved by A when i < 6 and by B when 3 <= i < 10: 3 only by
    // A, 4 only by B.
    let result = |solved: &dyn Fn(usize) -> bool| {
        let tasks: Vec<serde_json::Value> = (0..12)
            .map(|i| {
                let ok = solved(i);
                serde_json::json!({"id": format!("t{i}"), "n": 1, "passed": ok as usize,
                    "executed": 1, "samples": [{"completion": "", "outcome": if ok {"pass"} else {"WrongAnswer"},
                    "passed": ok, "executed": true}]})
            })
            .collect();
        let rate = (0..12).filter(|&i| solved(i)).count() as f64 / 12.0;
        serde_json::json!({"tasks": tasks, "pass_at": {"1": rate}, "exec_at": {"1": 1.0},
            "outcomes": {}, "samples_per_task": 1, "temperature": 0.0, "seconds": 1.0})
    };
    let (a, b) = (d.path().join("a.json"), d.path().join("b.json"));
    std::fs::write(&a, result(&|i| i < 6).to_string()).unwrap();
    std::fs::write(&b, result(&|i| (3..10).contains(&i)).to_string()).unwrap();
    let o = falcon(&["eval", "compare", a.to_str().unwrap(), b.to_str().unwrap()]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("pass@1\t0.5000\t0.5833\t+0.0833"), "{t}");
    // Two-sided exact binomial, 3 vs 4 discordant: p = 1.
    assert!(
        t.contains("solved only by A 3, only by B 4, exact p = 1.0000"),
        "{t}"
    );
    // With one sample per task the sign test sees the same pairs.
    assert!(
        t.contains("higher in A 3, higher in B 4, exact p = 1.0000"),
        "{t}"
    );
    std::fs::write(&b, "{\"tasks\": 3}").unwrap();
    let o = falcon(&["eval", "compare", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("not an evaluation result"),
        "{}",
        text(&o)
    );
}

#[test]
fn eval_rescore_scores_saved_answers_again_and_keeps_the_original() {
    let d = tmpdir();
    let tasks = d.path().join("t.jsonl");
    std::fs::write(
        &tasks,
        r#"{"id": "add", "prompt": "def add(a, b):", "entry_point": "add", "tests": ["assert add(1, 2) == 3"]}"#,
    )
    .unwrap();
    let config = d.path().join("eval.toml");
    std::fs::write(&config, format!("[eval]\npath = {:?}\n", tasks)).unwrap();
    // As an older extractor might have left it: a correct fenced answer
    // scored as a syntax error, and a wrong one that stays wrong.
    let sample = |code: &str, outcome: &str| {
        serde_json::json!({"completion": format!("Here:\n```python\n{code}```\nDone."),
            "outcome": outcome, "passed": false, "executed": outcome != "SyntaxError"})
    };
    let result = serde_json::json!({
        "tasks": [{"id": "add", "n": 2, "passed": 0, "executed": 1, "samples": [
            sample("def add(a, b):\n    return a + b\n", "SyntaxError"),
            sample("def add(a, b):\n    return a - b\n", "WrongAnswer"),
        ]}],
        "pass_at": {"1": 0.0}, "exec_at": {"1": 0.5},
        "outcomes": {"SyntaxError": 1, "WrongAnswer": 1},
        "samples_per_task": 2, "temperature": 0.8, "seconds": 12.5, "strategy": "zero-shot"});
    let old = d.path().join("old.json");
    let original = serde_json::to_string_pretty(&result).unwrap();
    std::fs::write(&old, &original).unwrap();
    let new = d.path().join("new.json");
    let rescore = |result: &Path, out: &Path| {
        falcon(&[
            "eval",
            "rescore",
            result.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
    };
    let o = rescore(&old, &new);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("pass@1\t0.0000\t0.5000"), "{t}");
    assert!(t.contains("1 of 2 outcomes changed"), "{t}");
    assert!(t.contains("SyntaxError -> pass: 1"), "{t}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&new).unwrap()).unwrap();
    assert_eq!(r["rescored"], true);
    assert_eq!(r["pass_at"]["1"], 0.5);
    assert_eq!(
        r["outcomes"],
        serde_json::json!({"pass": 1, "WrongAnswer": 1})
    );
    assert_eq!(r["tasks"][0]["passed"], 1);
    assert_eq!(r["tasks"][0]["samples"][0]["passed"], true);
    assert_eq!(r["tasks"][0]["samples"][1]["outcome"], "WrongAnswer");
    // What the run measured is kept.
    assert_eq!(r["seconds"], 12.5);
    assert_eq!(r["strategy"], "zero-shot");
    assert!(d.path().join("new.tasks.jsonl").is_file());
    assert_eq!(std::fs::read_to_string(&old).unwrap(), original);

    // The original is never replaced; a task the config lacks is named.
    let o = rescore(&old, &old);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("would replace"), "{}", text(&o));
    let stray = d.path().join("stray.json");
    let mut s = result.clone();
    s["tasks"][0]["id"] = "sub".into();
    std::fs::write(&stray, s.to_string()).unwrap();
    let o = rescore(&stray, &d.path().join("x.json"));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("task sub of the result is not in the configured task set"),
        "{}",
        text(&o)
    );
    assert!(!d.path().join("x.json").exists());
}

#[test]
fn report_draws_a_run_dir_and_names_a_malformed_metrics_line() {
    let d = tmpdir();
    let run = d.path().join("run");
    std::fs::create_dir_all(run.join("eval")).unwrap();
    let lines: Vec<String> = (0..3)
        .map(|s| {
            serde_json::json!({"step": s, "pass_rate": 0.5, "samples": 4,
                "reward": {"coarse": 0.1 * s as f64, "total": 1.0},
                "loss": {"pg": 0.2, "total": 0.2}, "error_kinds": {"pass": 2, "SyntaxError": 2}})
            .to_string()
        })
        .collect();
    std::fs::write(run.join("metrics.jsonl"), lines.join("\n")).unwrap();
    let result = serde_json::json!({"tasks": [], "pass_at": {"1": 0.25}, "exec_at": {"1": 0.5},
        "outcomes": {"pass": 1, "NameError": 3}, "samples_per_task": 1, "temperature": 0.0,
        "seconds": 1.0});
    std::fs::write(run.join("eval/step-3.json"), result.to_string()).unwrap();
    let o = falcon(&["report", run.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let out = run.join("report");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        out.join("index.html").to_str().unwrap()
    );
    for f in ["reward", "loss", "error_kinds", "pass_at_k", "outcomes"] {
        for ext in ["png", "svg"] {
            assert!(out.join(format!("{f}.{ext}")).is_file(), "{f}.{ext}");
        }
    }
    // --out elsewhere; a broken line is a usage error naming file and line.
    std::fs::write(
        run.join("metrics.jsonl"),
        format!("{}\nnot json\n", lines[0]),
    )
    .unwrap();
    let o = falcon(&["report", run.to_str().unwrap(), "--out", "elsewhere"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("metrics.jsonl:2: not a step record"),
        "{}",
        text(&o)
    );
    let o = falcon(&["report", d.path().join("missing").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("no such directory"), "{}", text(&o));
}

/// configs/lora-smoke.toml runs as shipped (only its output directory moved
/// out of the repository): one LoRA step on the embedded model.
#[test]
fn the_lora_smoke_config_trains_its_step_as_shipped() {
    let d = tmpdir();
    let mut cfg =
        falcon_rl::config::RunConfig::from_file(&root().join("configs/lora-smoke.toml")).unwrap();
    cfg.run.output_dir = d.path().join("runs");
    cfg.exec.uid_base = 63400;
    let c = d.path().join("smoke.toml");
    std::fs::write(&c, cfg.to_toml_string().unwrap()).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_falcon"))
        .current_dir(root())
        .args(["train", "--config", c.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let m = std::fs::read_to_string(d.path().join("runs/lora-smoke/metrics.jsonl")).unwrap();
    assert_eq!(m.lines().count(), 1, "{m}");
    assert!(d
        .path()
        .join("runs/lora-smoke/step-1/manifest.json")
        .is_file());
}
