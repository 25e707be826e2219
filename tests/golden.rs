//! The same commands give the same numbers: a few steps of every training
//! algorithm (single-level RL, FOMAML, second-order MAML, Reptile, SFT) on
//! the tiny model with a fixed seed, run through `falcon`, must write the
//! `metrics.jsonl` kept in `tests/fixtures/golden-metrics/` (every field but
//! the timings). It was recorded before the trainer became a recipe, so a
//! refactor that changes what a step computes fails here.
//!
//! Regenerate, only for a change meant to alter the numbers, with
//! `FALCON_BLESS=1 cargo nextest run golden`, and say why in the commit.
//! Libtorch runs on one thread (`--threads 1`), so the sums do not depend on
//! the machine's core count; numbers are compared to 1e-6 relative (plus 1e-9 absolute, for
//! terms that are zero up to rounding, such as the on-policy `pg`), which
//! only forgives the last bits of fp32 sums on another CPU's vector kernels
//! (on one machine they are equal to the bit).

use std::path::Path;
use std::process::Command;

use crate::common::{fixture, tmpdir};

const ALGORITHMS: [&str; 5] = ["rl", "fomaml", "maml", "reptile", "sft"];

fn config(dir: &Path, algo: &str, uid_base: u32) -> String {
    let meta = match algo {
        "rl" | "sft" => String::new(),
        a => format!(
            "[meta]\nalgorithm = \"{a}\"\ninner_steps = 1\ninner_lr = 0.05\nshort_term_samples = 2\nlong_term_demos = 1\n"
        ),
    };
    format!(
        r#"
[run]
name = "{algo}"
seed = 11
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
max_new_tokens = 16
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
# The rendering the numbers were recorded with (the default became
# "brief" later, by measurement: docs/results/eval.md).
render = "full"
short_term_capacity = 64
short_term_max_len = 256
[train]
steps = 3
tasks_per_step = 2
group_size = 3
lr = 0.01
warmup_steps = 1
schedule = "cosine"
advantage = "group_mean"
checkpoint_every = 2
[train.loss]
sl = 0.1
kl = {kl}
{meta}"#,
        out = dir.join("runs"),
        model = dir.join("model"),
        tasks = dir.join("tasks.jsonl"),
        kl = if algo == "rl" { 0.05 } else { 0.0 },
    )
}

/// A metrics line without its timings, which no two runs share.
fn strip(line: &str) -> serde_json::Value {
    let mut v: serde_json::Value = serde_json::from_str(line).expect("metrics line is JSON");
    v.as_object_mut().expect("an object").remove("seconds");
    v
}

/// Numbers agree to 1e-6 relative, or 1e-8 absolute near zero: rl's KL
/// term (about 6e-4 at step 2) is a difference of near-equal fp32
/// log-probs, and its last bits follow the CPU's BLAS path. An AMD EPYC
/// gives 6.3376874e-4 where the Intel Xeon that recorded it gave
/// 6.3376623e-4, with the same code (4e-6 relative, 2.5e-9 absolute).
fn same(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value::*;
    match (a, b) {
        (Number(x), Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x == y || (x - y).abs() <= 1e-6 * x.abs().max(y.abs()) + 1e-8,
            _ => x == y,
        },
        (Array(x), Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y)),
        (Object(x), Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

#[test]
fn golden_metrics_of_every_algorithm_are_unchanged() {
    let dir = tmpdir();
    crate::train::setup(dir.path());
    let bless = std::env::var_os("FALCON_BLESS").is_some();
    let mut failures = Vec::new();
    for (i, algo) in ALGORITHMS.iter().enumerate() {
        let cfg = dir.path().join(format!("{algo}.toml"));
        std::fs::write(&cfg, config(dir.path(), algo, 63000 + 10 * i as u32)).unwrap();
        let cmd = if *algo == "sft" { "sft" } else { "train" };
        let o = Command::new(env!("CARGO_BIN_EXE_falcon"))
            .args(["--threads", "1", cmd, "--config"])
            .arg(&cfg)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{algo}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let got = std::fs::read_to_string(dir.path().join("runs").join(algo).join("metrics.jsonl"))
            .unwrap();
        let got: Vec<serde_json::Value> = got.lines().map(strip).collect();
        assert_eq!(got.len(), 3, "{algo}: three steps");
        let path = fixture("golden-metrics").join(format!("{algo}.jsonl"));
        if bless {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let text: String = got.iter().map(|v| format!("{v}\n")).collect();
            std::fs::write(&path, text).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (FALCON_BLESS=1 records it)", path.display()));
        let want: Vec<serde_json::Value> = want
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if want.len() != got.len() || !want.iter().zip(&got).all(|(w, g)| same(w, g)) {
            failures.push(format!(
                "{algo}:\n  want {}\n  got  {}",
                want.iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join("\n       "),
                got.iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join("\n       ")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
