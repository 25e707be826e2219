//! The user's own reward terms (`[[reward.custom]]`) against the real
//! thing: reward files written as TRL's, verl's and OpenRLHF's docs write
//! them, run by the project's Python; an OpenRLHF-style `/get_reward`
//! server on loopback; a kept command. And what each does wrong gives no
//! signal with the reason, never a zero and never a crash.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use falcon_rl::config::{CustomKind, CustomTermConfig, RewardSignature};
use falcon_rl::exec::{ExecReport, TestResult, TestStatus};
use falcon_rl::model::{Completion, FinishReason};
use falcon_rl::reward::custom::check;
use falcon_rl::reward::{CustomSample, CustomTerms, CustomValue};
use falcon_rl::task::Task;

use crate::common::{python, root, task_of, text, tmpdir};

fn examples() -> PathBuf {
    root().join("examples/rewards")
}

fn python_term(name: &str, path: &Path, signature: RewardSignature) -> CustomTermConfig {
    CustomTermConfig {
        name: name.into(),
        kind: CustomKind::Python,
        path: Some(path.to_path_buf()),
        signature,
        python: python().display().to_string(),
        timeout_s: 20.0,
        ..CustomTermConfig::default()
    }
}

fn passing() -> ExecReport {
    ExecReport::from_tests(
        vec![TestResult {
            index: 0,
            status: TestStatus::Pass,
            error_lines: vec![],
            seconds: 0.0,
        }],
        String::new(),
        0.0,
    )
}

/// Two tasks, two completions each: a documented function with a return,
/// and a bare one-liner without.
struct Batch {
    tasks: Vec<Task>,
    comps: Vec<Completion>,
    reports: Vec<ExecReport>,
}

impl Batch {
    fn new() -> Batch {
        let good = "```python\ndef add(a, b):\n    \"\"\"Add.\"\"\"\n    return a + b\n```";
        let bare = "add = lambda a, b: a + b";
        Batch {
            tasks: vec![
                task_of("add", &["assert add(1, 2) == 3"]),
                task_of("add2", &["assert add(2, 2) == 4"]),
            ],
            comps: [good, bare, good, bare]
                .iter()
                .map(|t| Completion::text_only(*t, FinishReason::Eos))
                .collect(),
            reports: vec![
                passing(),
                ExecReport::no_signal("sandbox died"),
                passing(),
                passing(),
            ],
        }
    }

    fn samples(&self) -> Vec<CustomSample<'_>> {
        (0..4)
            .map(|i| CustomSample {
                task: &self.tasks[i / 2],
                prompt: &self.tasks[i / 2].prompt,
                completion: &self.comps[i],
                report: &self.reports[i],
            })
            .collect()
    }
}

fn values(terms: &CustomTerms, batch: &Batch, name: &str) -> Vec<CustomValue> {
    terms
        .score(3, &batch.samples())
        .into_iter()
        .map(|mut s| s.remove(name).expect("every sample has every term"))
        .collect()
}

#[test]
fn reward_files_as_trl_verl_and_openrlhf_write_them_run_unchanged() {
    let ex = examples();
    let mut length = python_term(
        "reward_len",
        &ex.join("trl_rewards.py"),
        RewardSignature::Trl,
    );
    length.function = "reward_len".into();
    let mut passes = python_term("passes", &ex.join("trl_rewards.py"), RewardSignature::Trl);
    passes.function = "passes_all_tests".into();
    let cfgs = vec![
        python_term(
            "has_docstring",
            &ex.join("trl_rewards.py"),
            RewardSignature::Trl,
        ),
        length,
        passes,
        python_term(
            "short_code",
            &ex.join("verl_reward.py"),
            RewardSignature::Verl,
        ),
        python_term(
            "returns",
            &ex.join("openrlhf_reward_func.py"),
            RewardSignature::Openrlhf,
        ),
    ];
    for c in &cfgs {
        check(c).unwrap_or_else(|e| panic!("{e}"));
    }
    let terms = CustomTerms::new(&cfgs).unwrap();
    let batch = Batch::new();
    let v = |name| values(&terms, &batch, name);
    use CustomValue::{NotApplicable, Value};
    assert_eq!(
        v("has_docstring"),
        [Value(1.0), Value(0.0), Value(1.0), Value(0.0)]
    );
    let lens: Vec<f64> = batch
        .comps
        .iter()
        .map(|c| -(200.0 - c.text.chars().count() as f64).abs() / 200.0)
        .collect();
    assert_eq!(
        v("reward_len"),
        lens.into_iter().map(Value).collect::<Vec<_>>()
    );
    // The execution report arrives as a column; None is "does not apply".
    assert_eq!(
        v("passes"),
        [Value(1.0), NotApplicable, Value(1.0), Value(1.0)]
    );
    // verl: one call per sample, a dict with a score.
    assert_eq!(v("short_code"), vec![Value(1.0); 4]);
    // OpenRLHF: queries are prompt + completion, a dict of torch tensors back.
    assert_eq!(
        v("returns"),
        [Value(1.0), Value(0.0), Value(1.0), Value(0.0)]
    );
}

/// A task file's extra fields reach a reward function as the dataset's
/// columns would (TRL keyword arguments; verl's `data_source`,
/// `reward_model.ground_truth` and `extra_info`; OpenRLHF's labels), and what
/// a function asks to log comes back as `NAME/KEY` beside its value.
#[test]
fn task_extra_fields_are_columns_and_logged_numbers_come_back() {
    let dir = tmpdir();
    let file = dir.path().join("cols.py");
    std::fs::write(
        &file,
        r#"
def trl_answer(completions, answer, difficulty=None, log_metric=None, log_extra=None, **kwargs):
    log_metric("batch", float(len(completions)))
    log_extra("chars", [len(c) for c in completions])
    log_extra("text", list(completions))
    return [1.0 if str(a) in c else 0.0 for a, c in zip(answer, completions)]

def verl_truth(data_source, solution_str, ground_truth, extra_info=None):
    assert data_source == "my_set", data_source
    assert extra_info["split"] == "train", extra_info
    return {"score": 1.0 if ground_truth in solution_str else -1.0, "len": len(solution_str)}

def openrlhf_labels(queries, prompts, labels):
    return [float(l) for l in labels]
"#,
    )
    .unwrap();
    let tasks: Vec<Task> = [("a", 3, "add"), ("b", 4, "zzz")]
        .iter()
        .map(|(id, answer, truth)| {
            let mut t = task_of(id, &["assert True"]);
            t.extra = serde_json::json!({
                "answer": answer,
                "data_source": "my_set",
                "reward_model": {"ground_truth": truth},
                "extra_info": {"split": "train"},
            })
            .as_object()
            .unwrap()
            .clone()
            .into_iter()
            .collect();
            t
        })
        .collect();
    let comps: Vec<Completion> = ["def add(): return 3", "x = 5"]
        .iter()
        .map(|t| Completion::text_only(*t, FinishReason::Eos))
        .collect();
    let reports = [passing(), passing()];
    let samples: Vec<CustomSample> = (0..2)
        .map(|i| CustomSample {
            task: &tasks[i],
            prompt: "",
            completion: &comps[i],
            report: &reports[i],
        })
        .collect();
    let mut trl = python_term("answer", &file, RewardSignature::Trl);
    trl.function = "trl_answer".into();
    let mut verl = python_term("truth", &file, RewardSignature::Verl);
    verl.function = "verl_truth".into();
    let mut orl = python_term("label", &file, RewardSignature::Openrlhf);
    orl.function = "openrlhf_labels".into();
    orl.label_key = "answer".into();
    let terms = CustomTerms::new(&[trl, verl, orl]).unwrap();
    let got = terms.score(0, &samples);
    use CustomValue::Value;
    assert_eq!(got[0]["answer"], Value(1.0), "{got:?}");
    assert_eq!(got[1]["answer"], Value(0.0), "{got:?}");
    assert_eq!(got[0]["answer/batch"], Value(2.0));
    assert_eq!(got[1]["answer/chars"], Value(5.0));
    // Text logged with log_extra is not a number to log here.
    assert!(!got[0].contains_key("answer/text"), "{got:?}");
    assert_eq!(got[0]["truth"], Value(1.0), "{got:?}");
    assert_eq!(got[1]["truth"], Value(-1.0), "{got:?}");
    assert_eq!(got[1]["truth/len"], Value(5.0));
    assert_eq!(got[0]["label"], Value(3.0));
    assert_eq!(got[1]["label"], Value(4.0));
}

/// `sandbox = true`: a reward that runs the completion itself does so
/// without network and without write access to the files around it; the
/// same function outside the sandbox can do both.
#[test]
fn a_sandboxed_term_has_no_network_and_cannot_write() {
    if falcon_rl::exec::isolation::which("bwrap").is_none() {
        eprintln!("SKIP: bubblewrap is not installed (scripts/setup installs it)");
        return;
    }
    let dir = tmpdir();
    let file = dir.path().join("escape.py");
    std::fs::write(
        &file,
        r#"
import os, socket
def escape(completions, port=0, **kwargs):
    out = []
    for c in completions:
        got = 0.0
        try:
            with open(os.path.join(os.path.dirname(__file__), "written"), "w") as f:
                f.write(c)
            got += 1.0
        except OSError:
            pass
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            got += 2.0  # reached the trainer's host
        except OSError:
            pass
        out.append(got)
    return out
"#,
    )
    .unwrap();
    let batch = Batch::new();
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = host.local_addr().unwrap().port();
    let mut free = python_term("free", &file, RewardSignature::Trl);
    free.function = "escape".into();
    free.kwargs.insert("port".into(), i64::from(port).into());
    let mut boxed = free.clone();
    boxed.name = "boxed".into();
    boxed.sandbox = true;
    check(&boxed).unwrap_or_else(|e| panic!("{e}"));
    let terms = CustomTerms::new(&[boxed]).unwrap();
    assert_eq!(
        values(&terms, &batch, "boxed"),
        vec![CustomValue::Value(0.0); 4]
    );
    assert!(!dir.path().join("written").exists());
    let terms = CustomTerms::new(&[free]).unwrap();
    assert_eq!(
        values(&terms, &batch, "free"),
        vec![CustomValue::Value(3.0); 4]
    );
    assert!(dir.path().join("written").exists());
}

#[test]
fn what_a_function_does_wrong_is_no_signal_with_the_reason() {
    let dir = tmpdir();
    let file = dir.path().join("bad.py");
    std::fs::write(
        &file,
        r#"
import math, os, sys, time

def raises(completions, **kwargs):
    raise ValueError("no idea")

def hangs(completions, **kwargs):
    time.sleep(60)

def too_few(completions, **kwargs):
    return [1.0]

def nan_and_text(completions, **kwargs):
    return [math.nan, "0.5", math.inf, 2]

def chatty(completions, **kwargs):
    print("debugging output on stdout")
    os.write(1, b"and straight to fd 1\n")
    return [0.5 for _ in completions]

def dies(completions, **kwargs):
    os._exit(3)
"#,
    )
    .unwrap();
    let term = |f: &str, timeout_s: f64| CustomTermConfig {
        function: f.into(),
        timeout_s,
        ..python_term(f, &file, RewardSignature::Trl)
    };
    let cfgs = vec![
        term("raises", 20.0),
        term("hangs", 1.0),
        term("too_few", 20.0),
        term("nan_and_text", 20.0),
        term("chatty", 20.0),
        term("dies", 20.0),
    ];
    let terms = CustomTerms::new(&cfgs).unwrap();
    let batch = Batch::new();
    let reason = |v: &CustomValue| match v {
        CustomValue::NoSignal(why) => why.clone(),
        other => panic!("expected no signal, got {other:?}"),
    };
    for _round in 0..2 {
        // A second round: each process that failed is started afresh.
        let scores = terms.score(0, &batch.samples());
        assert_eq!(scores.len(), 4);
        let col = |name: &str| scores.iter().map(|s| s[name].clone()).collect::<Vec<_>>();
        assert!(col("raises")
            .iter()
            .all(|v| reason(v).contains("ValueError: no idea")));
        assert!(col("hangs").iter().all(|v| reason(v).contains("deadline")));
        assert!(col("too_few")
            .iter()
            .all(|v| reason(v).contains("1 values for 4 samples")));
        let odd = col("nan_and_text");
        assert!(reason(&odd[0]).contains("nan"), "{odd:?}");
        assert!(reason(&odd[1]).contains("str"), "{odd:?}");
        assert!(reason(&odd[2]).contains("inf"), "{odd:?}");
        assert_eq!(odd[3], CustomValue::Value(2.0));
        assert_eq!(col("chatty"), vec![CustomValue::Value(0.5); 4]);
        assert!(col("dies").iter().all(|v| reason(v).contains("exit")));
    }
}

#[test]
fn check_names_a_missing_function_a_bad_signature_and_a_broken_import() {
    let dir = tmpdir();
    let file = dir.path().join("r.py");
    std::fs::write(
        &file,
        "def no_kwargs(completions):\n    return [0.0] * len(completions)\n\
         def verl_like(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n",
    )
    .unwrap();
    let broken = dir.path().join("broken.py");
    std::fs::write(&broken, "import not_a_module_anyone_has\n").unwrap();
    let err = |c: CustomTermConfig| check(&c).unwrap_err().to_string();
    let mut c = python_term("missing", &file, RewardSignature::Trl);
    c.function = "nope".into();
    let e = err(c);
    assert!(
        e.contains("no 'nope'") && e.contains("no_kwargs, verl_like"),
        "{e}"
    );
    let mut c = python_term("trl", &file, RewardSignature::Trl);
    c.function = "no_kwargs".into();
    assert!(err(c).contains("**kwargs"));
    let mut c = python_term("verl", &file, RewardSignature::Verl);
    c.function = "verl_like".into();
    check(&c).unwrap();
    c.signature = RewardSignature::Openrlhf;
    c.function = "no_kwargs".into();
    assert!(err(c).contains("queries, prompts, labels"));
    let e = err(python_term("x", &broken, RewardSignature::Trl));
    assert!(
        e.contains("ModuleNotFoundError") && e.contains("not_a_module_anyone_has"),
        "{e}"
    );
    let e = err(python_term(
        "x",
        &dir.path().join("gone.py"),
        RewardSignature::Trl,
    ));
    assert!(e.contains("no such file"), "{e}");
}

/// `python3 SCRIPT --port 0 ARGS…`, and the port it printed.
fn serve(script: &Path, args: &[&str]) -> (Child, u16) {
    let mut child = Command::new(python())
        .arg(script)
        .args(["--port", "0"])
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    (child, port)
}

fn http_term(name: &str, urls: Vec<String>) -> CustomTermConfig {
    CustomTermConfig {
        name: name.into(),
        kind: CustomKind::Http,
        urls,
        retries: 1,
        timeout_s: 10.0,
        ..CustomTermConfig::default()
    }
}

#[test]
fn an_openrlhf_reward_server_scores_and_a_bad_one_is_no_signal() {
    let (mut good, port) = serve(&examples().join("openrlhf_server.py"), &[]);
    let dir = tmpdir();
    let bad_py = dir.path().join("bad_server.py");
    std::fs::write(
        &bad_py,
        r#"
import argparse, json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        n = len(json.loads(self.rfile.read(int(self.headers["Content-Length"])))["query"])
        status, body = {
            "/500": (500, b"boom"),
            "/garbage": (200, b"<html>not json</html>"),
            "/short": (200, json.dumps({"rewards": [1.0] * (n - 1)}).encode()),
            "/nokey": (200, json.dumps({"score": [1.0] * n}).encode()),
        }[self.path]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ap = argparse.ArgumentParser(); ap.add_argument("--port", type=int)
s = ThreadingHTTPServer(("127.0.0.1", ap.parse_args().port), H)
print("serving on http://127.0.0.1:%d" % s.server_address[1], flush=True)
s.serve_forever()
"#,
    )
    .unwrap();
    let (mut bad, bad_port) = serve(&bad_py, &[]);
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let at = |p: u16, path: &str| format!("http://127.0.0.1:{p}{path}");
    let mut batched = http_term("judge_batched", vec![at(port, "/get_reward")]);
    batched.batch_size = 3;
    let cfgs = vec![
        http_term("judge", vec![at(port, "/get_reward")]),
        batched,
        // The first server is down: the request fails over to the second.
        http_term(
            "failover",
            vec![at(dead, "/get_reward"), at(port, "/get_reward")],
        ),
        http_term("e500", vec![at(bad_port, "/500")]),
        http_term("garbage", vec![at(bad_port, "/garbage")]),
        http_term("short", vec![at(bad_port, "/short")]),
        http_term("nokey", vec![at(bad_port, "/nokey")]),
        http_term("dead", vec![at(dead, "/get_reward")]),
    ];
    let terms = CustomTerms::new(&cfgs).unwrap();
    let batch = Batch::new();
    let judge = values(&terms, &batch, "judge");
    // The server rates the share of code lines: the fenced answer scores
    // below 1 (its fence lines are prose), the lambda 0.
    let expect = |c: &str| {
        let lines: Vec<&str> = c.lines().filter(|l| !l.trim().is_empty()).collect();
        let prefixes = [" ", "def ", "return", "import", "from", "class "];
        let code = lines
            .iter()
            .filter(|l| prefixes.iter().any(|p| l.starts_with(p)))
            .count();
        CustomValue::Value(code as f64 / lines.len() as f64)
    };
    let want: Vec<CustomValue> = batch.comps.iter().map(|c| expect(&c.text)).collect();
    assert_eq!(judge, want);
    // serve_rm's extra_logs come back beside the value.
    let logged: Vec<CustomValue> = terms
        .score(3, &batch.samples())
        .into_iter()
        .map(|mut s| s.remove("judge/dummy_scores").expect("extra_logs"))
        .collect();
    assert_eq!(logged, want);
    assert_eq!(values(&terms, &batch, "judge_batched"), want);
    assert_eq!(values(&terms, &batch, "failover"), want);
    let why = |name: &str| match &values(&terms, &batch, name)[0] {
        CustomValue::NoSignal(w) => w.clone(),
        other => panic!("{name}: expected no signal, got {other:?}"),
    };
    assert!(why("e500").contains("HTTP 500"), "{}", why("e500"));
    assert!(why("garbage").contains("not JSON"), "{}", why("garbage"));
    assert!(
        why("short").contains("3 values for 4 samples"),
        "{}",
        why("short")
    );
    assert!(why("nokey").contains("no \"rewards\""), "{}", why("nokey"));
    assert!(
        why("dead").contains("no reward server answered"),
        "{}",
        why("dead")
    );
    let _ = good.kill();
    let _ = bad.kill();
}

#[test]
fn a_command_is_kept_between_steps_and_started_again_when_it_dies() {
    let dir = tmpdir();
    std::fs::write(
        dir.path().join("pid.py"),
        "import json, os, sys\nfor line in sys.stdin:\n    s = json.loads(line)\n    \
         if 'die' in s['completion']:\n        os._exit(1)\n    \
         print(os.getpid() if s['report']['outcome'] else 'null', flush=True)\n",
    )
    .unwrap();
    let cfg = CustomTermConfig {
        name: "pid".into(),
        kind: CustomKind::Command,
        command: vec![python().display().to_string(), "pid.py".into()],
        cwd: Some(dir.path().to_path_buf()),
        timeout_s: 20.0,
        ..CustomTermConfig::default()
    };
    check(&cfg).unwrap();
    let terms = CustomTerms::new(std::slice::from_ref(&cfg)).unwrap();
    let batch = Batch::new();
    let first = values(&terms, &batch, "pid");
    let CustomValue::Value(pid) = first[0] else {
        panic!("{first:?}")
    };
    assert_eq!(first[1], CustomValue::NotApplicable, "no outcome: null");
    assert_eq!(
        values(&terms, &batch, "pid")[0],
        CustomValue::Value(pid),
        "kept"
    );
    let mut dying = Batch::new();
    dying.comps[0] = Completion::text_only("die", FinishReason::Eos);
    let died = values(&terms, &dying, "pid");
    assert!(died
        .iter()
        .all(|v| matches!(v, CustomValue::NoSignal(w) if w.contains("command of pid"))));
    let CustomValue::Value(again) = values(&terms, &batch, "pid")[0] else {
        panic!("a new process answers")
    };
    assert_ne!(again, pid);
    let missing = CustomTermConfig {
        command: vec!["no-such-reward-program".into()],
        ..cfg
    };
    assert!(check(&missing).is_err() || CustomTerms::new(&[missing]).is_err());
}

#[test]
fn falcon_config_check_refuses_unusable_terms_with_where_and_why() {
    let dir = tmpdir();
    std::fs::write(
        dir.path().join("r.py"),
        "def ok(completions, **kwargs):\n    return [1.0 for _ in completions]\n",
    )
    .unwrap();
    let cfg = |custom: &str| {
        let p = dir.path().join("c.toml");
        let tasks = root().join("data/easy_python.jsonl");
        std::fs::write(
            &p,
            format!("[tasks]\npath = {tasks:?}\n[reward]\njudge = \"static\"\n{custom}"),
        )
        .unwrap();
        crate::common::falcon(&["config", "check", p.to_str().unwrap()])
    };
    let good = cfg("[[reward.custom]]\nname = \"ok\"\nkind = \"python\"\npath = \"r.py\"\n");
    assert!(good.status.success(), "{}", text(&good));
    let out = cfg(
        "[[reward.custom]]\nname = \"coarse\"\nkind = \"python\"\npath = \"r.py\"\n\
         [[reward.custom]]\nname = \"j\"\nkind = \"http\"\nurls = [\"localhost:5000\"]\n\
         [[reward.custom]]\nname = \"j\"\nkind = \"command\"\n",
    );
    let t = text(&out);
    assert!(!out.status.success());
    for want in [
        "reward.custom[0].name = \"coarse\"",
        "reward.custom[1].urls[0]",
        "http://",
        "reward.custom[2].name",
        "already the name",
        "reward.custom[2].command",
    ] {
        assert!(t.contains(want), "{want:?} missing in\n{t}");
    }
    let out = cfg("[[reward.custom]]\nname = \"x\"\nkind = \"python\"\npath = \"r.py\"\nfunction = \"nope\"\n");
    let t = text(&out);
    assert!(
        !out.status.success() && t.contains("defines no 'nope'"),
        "{t}"
    );
}
