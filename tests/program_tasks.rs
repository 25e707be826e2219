//! Program tasks (`kind = "stdio"`) and the code-RL data formats: every
//! format's fixture reads (tests/fixtures/formats, written by
//! scripts/fixtures/data-formats.py) and its reference solutions pass in the
//! sandbox while its known-wrong ones fail; the verdicts cover the error
//! taxonomy; a program cannot reach the expected outputs; the local pool,
//! `falcon sandbox serve` and the SandboxFusion protocol judge alike; a
//! hostile LiveCodeBench pickle is refused without running. Each test has
//! its own candidate uids (see exec_adversarial.rs).

use std::path::PathBuf;

use falcon_rl::config::{ExecBackend, ExecConfig, RemoteApi, RemoteConfig, TaskFormat};
use falcon_rl::exec::service::{ServeOptions, Service};
use falcon_rl::exec::{ErrorKind, ExecReport, RewardClass, Sandbox, TestStatus};
use falcon_rl::task::{Checker, LoadOptions, Task, TaskKind, TaskSet};

use crate::common::{python, root};

fn fixture(name: &str) -> PathBuf {
    root().join("tests/fixtures/formats").join(name)
}

fn cfg(uid_base: u32) -> ExecConfig {
    ExecConfig {
        uid_base,
        workers: 2,
        timeout_s: 10.0,
        python: python().display().to_string(),
        ..ExecConfig::default()
    }
}

fn load(name: &str) -> TaskSet {
    TaskSet::load(&fixture(name), TaskFormat::Auto, LoadOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn verdict(r: &ExecReport) -> String {
    match (&r.no_signal, r.error_kind) {
        (Some(why), _) => format!("no_signal: {why}"),
        (None, None) => "pass".into(),
        (None, Some(k)) => k.name().into(),
    }
}

#[test]
fn every_format_reads_and_its_references_pass_while_known_wrong_answers_fail() {
    let sb = Sandbox::new(&cfg(65000)).unwrap_or_else(|e| panic!("{e}"));
    let verl_refs: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(fixture("verl-reference.json")).unwrap())
            .unwrap();
    // (file, tasks, kinds in order)
    use TaskKind::{Python as F, Stdio as P};
    let cases: &[(&str, &[TaskKind])] = &[
        ("apps.jsonl", &[P, F, F]),
        ("taco.jsonl", &[P, P]),
        ("codecontests.jsonl", &[P]),
        ("kodcode.jsonl", &[F]),
        ("verl.jsonl", &[P, F, F]),
    ];
    for (name, kinds) in cases {
        let set = load(name);
        let got: Vec<TaskKind> = set.iter().map(|t| t.kind).collect();
        assert_eq!(&got, kinds, "{name}");
        let codes: Vec<String> = if name.starts_with("verl") {
            verl_refs.clone()
        } else {
            set.iter()
                .map(|t| t.canonical_solution.clone().expect("a reference"))
                .collect()
        };
        let jobs: Vec<(&Task, &str)> = set
            .iter()
            .zip(&codes)
            .map(|(t, c)| (t, c.as_str()))
            .collect();
        for ((t, _), r) in jobs.iter().zip(sb.run_batch(&jobs)) {
            assert_eq!(verdict(&r), "pass", "{name} {}: {r:?}", t.id);
        }
    }

    let taco = load("taco.jsonl");
    assert_eq!(taco.tasks[0].id, "taco/0");
    assert_eq!(taco.tasks[0].time_limit_ms, Some(1000));
    assert_eq!(taco.tasks[0].memory_limit_mb, Some(256));
    assert!(taco.tasks[0].tags.contains(&"difficulty:easy".to_owned()));
    // The reference prints 2.3333333333333335 against 2.333333333: within
    // tolerance under the default checker, wrong under `lines`.
    let mut strict = taco.tasks[1].clone();
    strict.checker = Checker::Lines;
    let code = strict.canonical_solution.clone().unwrap();
    let r = sb.run(&strict, &code);
    assert_eq!(verdict(&r), "WrongAnswer");
    assert!(
        r.output_tail.contains("2.3333333333333335"),
        "{}",
        r.output_tail
    );

    let cc = load("codecontests.jsonl");
    let t = &cc.tasks[0];
    assert_eq!(t.id, "codecontests/1000_A. Sum");
    assert_eq!((t.tests.len(), t.outputs.len()), (4, 4));
    assert_eq!(t.tests[0], "1 2\n", "public tests come first");
    assert_eq!(
        (t.time_limit_ms, t.memory_limit_mb),
        (Some(2500), Some(256))
    );
    // Only the Python 3 solutions, right and wrong.
    let wrong = t.extra["incorrect_python_solutions"].as_array().unwrap();
    assert_eq!(wrong.len(), 1);
    let r = sb.run(t, wrong[0].as_str().unwrap());
    assert_eq!(verdict(&r), "WrongAnswer");
    assert_eq!(r.n_pass(), 0, "{r:?}");
    assert!(
        r.output_tail.contains(r#"expected "3", got "-1""#),
        "{}",
        r.output_tail
    );
    // The columns no field took stay with the task, for reward terms.
    assert_eq!(t.extra["cf_rating"], 800);

    let apps = load("apps.jsonl");
    assert_eq!(apps.tasks[2].entry_point, "Solution");
    assert!(apps.tasks[2].prompt.contains("class Solution"));
    let r = sb.run(&apps.tasks[1], "def sum_squares(xs):\n    return sum(xs)\n");
    assert_eq!(verdict(&r), "WrongAnswer");
    let verl = load("verl.jsonl");
    assert_eq!(verl.tasks[1].id, "apps/1");
    assert_eq!(verl.tasks[0].prompt, "Print the sum of two integers.");
    assert_eq!(verl.tasks[0].extra["extra_info"]["split"], "train");
    assert_eq!(verl.tasks[2].entry_point, "double");
    let kod = load("kodcode.jsonl");
    assert_eq!(kod.tasks[0].tests.len(), 3);
    let r = sb.run(
        &kod.tasks[0],
        "def interleave(a, b):\n    return str(a) + str(b)\n",
    );
    // Only the empty case passes; `pytest.raises` sees no TypeError.
    assert_eq!(
        (r.n_pass(), verdict(&r).as_str()),
        (1, "WrongAnswer"),
        "{r:?}"
    );
}

#[test]
fn livecodebench_private_tests_decode_and_a_hostile_pickle_is_refused_unrun() {
    let marker = std::path::Path::new("/tmp/falcon-lcb-pwned");
    let _ = std::fs::remove_file(marker);
    let path = fixture("livecodebench.jsonl");
    let e = TaskSet::load(&path, TaskFormat::Auto, LoadOptions::default()).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(":3:") && msg.contains("refusing to unpickle"),
        "{msg}"
    );
    let set = TaskSet::load(&path, TaskFormat::Auto, LoadOptions::skipping(true))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((set.len(), set.skipped.len()), (2, 1));
    assert!(!marker.exists(), "the pickle ran");
    let stdin = &set.tasks[0];
    assert_eq!(stdin.kind, TaskKind::Stdio);
    assert_eq!(
        stdin.tests,
        ["1 2\n", "4 5\n", "-2 2\n"],
        "public then private"
    );
    let func = &set.tasks[1];
    assert_eq!(
        (func.kind, func.entry_point.as_str()),
        (TaskKind::Python, "Solution")
    );
    assert_eq!(func.tests.len(), 2);
    assert!(func.tags.contains(&"platform:leetcode".to_owned()));
    let sb = Sandbox::new(&cfg(65010)).unwrap_or_else(|e| panic!("{e}"));
    let good = "from typing import List\nclass Solution:\n    def addK(self, nums: List[int], k: int) -> List[int]:\n        return [x + k for x in nums]\n";
    let tuple = "class Solution:\n    def addK(self, nums, k):\n        return tuple(x + k for x in nums)\n";
    let r = sb.run_batch(&[
        (stdin, "a, b = map(int, input().split())\nprint(a + b)\n"),
        (func, good),
        (func, tuple),
    ]);
    assert_eq!(
        r.iter().map(verdict).collect::<Vec<_>>(),
        ["pass", "pass", "pass"],
        "{r:?}"
    );
}

/// A program task built in the test: sum two integers.
fn sum_task() -> Task {
    Task {
        id: "sum".into(),
        prompt: "Print a + b.".into(),
        kind: TaskKind::Stdio,
        tests: vec!["1 2\n".into(), "SECRET-IN 5 6\n".into(), "7 8\n".into()],
        outputs: vec!["3\n".into(), "SECRET-OUT-11\n".into(), "15\n".into()],
        time_limit_ms: Some(1000),
        memory_limit_mb: Some(200),
        ..Task::default()
    }
}

/// The candidates of the taxonomy test and what each must score.
fn taxonomy() -> Vec<(&'static str, String, &'static str)> {
    let sum = "import sys\nfor line in sys.stdin:\n    p = line.split()\n    if p[0] == 'SECRET-IN':\n        print('SECRET-OUT-' + str(int(p[1]) + int(p[2])))\n    else:\n        print(int(p[0]) + int(p[1]))\n";
    // Looks everywhere a test's expected output could be: the writable
    // directories, the environment, every process's environment and arguments.
    let forge = r#"import os, sys
found = []
for top in ('/tmp', os.getcwd(), '/dev/shm', '/run'):
  for root, dirs, files in os.walk(top, onerror=lambda e: None):
    for f in files:
        try:
            with open(os.path.join(root, f), 'rb') as fh:
                if b'SECRET-OUT' in fh.read(1 << 20):
                    found.append(os.path.join(root, f))
        except Exception:
            pass
for pid in os.listdir('/proc'):
    for what in ('environ', 'cmdline'):
        try:
            with open('/proc/%s/%s' % (pid, what), 'rb') as fh:
                if b'SECRET-OUT' in fh.read():
                    found.append(pid)
        except Exception:
            pass
if any('SECRET-OUT' in v for v in os.environ.values()):
    found.append('env')
print(' '.join(found) or 'nothing')
"#;
    vec![
        ("right", sum.into(), "pass"),
        (
            "wrong",
            "a, b = map(int, input().split()[-2:])\nprint(a * b)\n".into(),
            "WrongAnswer",
        ),
        (
            "crash",
            "x = 1\nprint(x // 0)\n".into(),
            "ZeroDivisionError",
        ),
        ("eof", "print(input())\nprint(input())\n".into(), "EOFError"),
        ("slow", "while True:\n    pass\n".into(), "Timeout"),
        (
            "hungry",
            "x = bytearray(1 << 30)\nprint(len(x))\n".into(),
            "MemoryError",
        ),
        ("syntax", "print(1 +)\n".into(), "SyntaxError"),
        ("quiet", "import sys\nsys.exit(0)\n".into(), "WrongAnswer"),
        ("forge", forge.into(), "WrongAnswer"),
    ]
}

fn check_taxonomy(sb: &Sandbox, label: &str) -> Vec<String> {
    let task = sum_task();
    let cands = taxonomy();
    let jobs: Vec<(&Task, &str)> = cands.iter().map(|(_, c, _)| (&task, c.as_str())).collect();
    let reports = sb.run_batch(&jobs);
    let mut out = Vec::new();
    for ((name, _, want), r) in cands.iter().zip(&reports) {
        assert_eq!(&verdict(r), want, "{label} {name}: {r:?}");
        out.push(format!(
            "{name}: {} {:?}",
            verdict(r),
            r.tests.iter().map(|t| t.status.clone()).collect::<Vec<_>>()
        ));
        match *name {
            "crash" => assert_eq!(r.error_lines, [2], "{label}: {r:?}"),
            "syntax" => {
                assert_eq!(r.error_lines, [1], "{label}: {r:?}");
                assert_eq!(r.n_pass(), 0);
            }
            "wrong" => assert!(
                r.output_tail
                    .contains(r#"test 0: wrong output: line 1: expected "3", got "2""#),
                "{label}: {}",
                r.output_tail
            ),
            "forge" => {
                assert_eq!(r.n_pass(), 0, "{label}: {r:?}");
                assert!(
                    r.output_tail.contains("\"nothing\""),
                    "{label}: {}",
                    r.output_tail
                );
            }
            "eof" => assert!(matches!(
                r.tests[0].status,
                TestStatus::Error {
                    kind: ErrorKind::EOFError,
                    ..
                }
            )),
            _ => {}
        }
    }
    out
}

#[test]
fn program_verdicts_cover_the_taxonomy_and_expected_outputs_stay_outside() {
    let sb = Sandbox::new(&cfg(65020)).unwrap_or_else(|e| panic!("{e}"));
    check_taxonomy(&sb, "local");
    // A task's limits bind: 300 ms is too little for 0.6 s of work.
    let mut task = sum_task();
    task.time_limit_ms = Some(300);
    let r = sb.run(
        &task,
        "import time\nwhile time.process_time() < 0.6:\n    pass\nprint(3)\n",
    );
    assert_eq!(verdict(&r), "Timeout", "{r:?}");
    assert!(r.output_tail.contains("0.3 s"), "{}", r.output_tail);
    assert_eq!(r.outcome, Some(RewardClass::RuntimeError));
    // A flood of output ending in the right answer is cut, never judged on its tail.
    let r = sb.run(
        &sum_task(),
        "import sys\nfor i in range(400000):\n    sys.stdout.write('x' * 9 + '\\n')\nprint(3)\n",
    );
    assert!(r.no_signal.is_none() && r.n_pass() == 0, "{r:?}");
    assert!(r.output_tail.len() < 4096, "{}", r.output_tail.len());
}

#[test]
fn program_tasks_judge_alike_locally_through_the_service_and_as_sandbox_fusion() {
    let local = Sandbox::new(&cfg(65030)).unwrap_or_else(|e| panic!("{e}"));
    let here = check_taxonomy(&local, "local");
    let service = Service::start(
        Sandbox::local(&cfg(65040)).unwrap_or_else(|e| panic!("{e}")),
        ServeOptions {
            addr: "127.0.0.1:0".into(),
            max_body_bytes: 1 << 20,
            ..ServeOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    for api in [RemoteApi::Falcon, RemoteApi::SandboxFusion] {
        let remote = ExecConfig {
            backend: ExecBackend::Remote,
            remote: RemoteConfig {
                urls: vec![format!("http://{}", service.addr())],
                api,
                concurrency: 2,
                ..RemoteConfig::default()
            },
            ..cfg(65040)
        };
        let sb = Sandbox::new(&remote).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(check_taxonomy(&sb, &format!("{api:?}")), here, "{api:?}");
    }
}

/// Program tasks (and a call-based one) for the training test, with
/// reference solutions for long-term memory's demonstrations.
const PROGRAM_TASKS: &str = r#"{"id": "sum", "kind": "stdio", "prompt": "Read two integers on one line and print their sum.", "tests": ["1 2\n", "5 -5\n"], "outputs": ["3\n", "0\n"], "time_limit_ms": 2000, "canonical_solution": "a, b = map(int, input().split())\nprint(a + b)\n"}
{"id": "rev", "kind": "stdio", "prompt": "Read a line and print it reversed.", "tests": ["abc\n"], "outputs": ["cba\n"], "canonical_solution": "print(input()[::-1])\n"}
{"id": "add", "prompt": "Write add(a, b).", "entry_point": "add", "tests": ["assert add(1, 2) == 3"], "canonical_solution": "def add(a, b):\n    return a + b\n"}
"#;

#[test]
fn falcon_trains_on_program_tasks_and_p_error_counts_their_verdicts() {
    use falcon_rl::config::Job;
    use falcon_rl::dist::Group;
    use falcon_rl::model::{Dtype, Policy};
    use falcon_rl::train::{prepare_policy, Silent, Start, TrainState};
    use tch::Device;

    let dir = crate::common::tmpdir();
    let d = dir.path();
    crate::train::tiny_chat_model(&d.join("model"));
    std::fs::write(d.join("tasks.jsonl"), PROGRAM_TASKS).unwrap();
    let mut cfg = crate::train::config(d, 2, 65050);
    cfg.run.name = "programs".into();
    cfg.meta.algorithm = falcon_rl::config::MetaAlgorithm::Fomaml;
    cfg.meta.inner_steps = 1;
    cfg.meta.short_term_samples = 1;
    cfg.memory.short_term_capacity = 32;
    cfg.memory.short_term_max_len = 256;
    cfg.train.tasks_per_step = 3;
    cfg.train.checkpoint_every = 1;
    let tasks = TaskSet::load(
        &d.join("tasks.jsonl"),
        TaskFormat::Auto,
        LoadOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut policy = Policy::load(&d.join("model"), Dtype::Fp32, Device::Cpu).unwrap();
    prepare_policy(&cfg, &mut policy).unwrap();
    let sandbox = Sandbox::new(&cfg.exec).unwrap();
    let records = {
        let mut t = TrainState::new(
            cfg,
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
        assert!(r.loss.values().all(|v| v.is_finite()), "{r:?}");
        assert!(r.reward["total"].is_finite(), "{r:?}");
    }
    let run = d.join("runs/programs");
    let samples = std::fs::read_to_string(run.join("samples.jsonl")).unwrap();
    let mut judged = 0;
    for line in samples.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let report: ExecReport = serde_json::from_value(v["report"].clone()).unwrap();
        if v["task_id"] != "add" {
            // Every program sample got a verdict per (input, output) pair.
            assert!(report.no_signal.is_none(), "{line}");
            let n = if v["task_id"] == "sum" { 2 } else { 1 };
            assert_eq!(report.tests.len(), n, "{line}");
            judged += 1;
        }
    }
    assert!(judged >= 2 * 2 * 3, "{judged} program samples");
    // The demonstrations (reference solutions) and every verdict reach P_error.
    let out = crate::common::falcon(&["memory", "stats", run.to_str().unwrap()]);
    let t = crate::common::text(&out);
    assert!(
        out.status.success() && t.contains("P_error over 36 samples"),
        "{t}"
    );
    // The tiny random model writes only syntax errors; P_error (Eq. 11)
    // counts a program's own verdicts, test by test, as the trainer feeds it.
    let mut stats = falcon_rl::memory::stats::ErrorStats::new(Default::default()).unwrap();
    let task = sum_task();
    for code in [
        "print(input())\nprint(input())\n",
        "while True:\n    pass\n",
        "print(0)\n",
    ] {
        assert!(stats.observe(&sandbox.run(&task, code)));
    }
    let p = stats.p_error();
    for k in [
        ErrorKind::EOFError,
        ErrorKind::Timeout,
        ErrorKind::WrongAnswer,
    ] {
        assert!(p.get(&k).is_some_and(|&x| x > 0.0), "{k:?}: {p:?}");
    }
}

#[test]
fn evalplus_tasks_get_base_and_plus_tests_from_their_canonical_solutions() {
    use falcon_rl::eval::plus;
    let cache = crate::common::tmpdir();
    std::env::set_var("FALCON_CACHE", cache.path());
    let sb = Sandbox::new(&cfg(65060)).unwrap_or_else(|e| panic!("{e}"));
    let mut he = load("humanevalplus.jsonl");
    let mut mbpp = load("mbppplus.jsonl");
    assert!(plus::needs_expansion(&he) && plus::needs_expansion(&mbpp));
    assert_eq!(plus::expand(&mut he, &sb).unwrap(), 3);
    assert_eq!(plus::expand(&mut mbpp, &sb).unwrap(), 1);
    assert!(!plus::needs_expansion(&he), "expanded once");
    let base = |t: &Task| t.extra[plus::BASE_TESTS_KEY].as_u64().unwrap();
    // 1 base + 4 plus inputs (one plus test); 2 base + 31 plus (two tests);
    // 1 base + 2 plus, the input the canonical solution raises on left out.
    let shape: Vec<(u64, usize)> = he.iter().map(|t| (base(t), t.tests.len())).collect();
    assert_eq!(shape, [(1, 2), (2, 4), (1, 2)]);
    assert_eq!(he.tasks[2].tests[1].lines().count(), 2);
    assert!(he.tasks[1].tests[2].contains("assert _plus_equal(sort_unique([]), [], 0.0)"));
    assert_eq!((base(&mbpp.tasks[0]), mbpp.tasks[0].tests.len()), (1, 2));
    // Every canonical solution passes everything.
    for t in he.iter().chain(mbpp.iter()) {
        let r = sb.run(t, t.canonical_solution.as_deref().unwrap());
        assert_eq!(verdict(&r), "pass", "{}: {r:?}", t.id);
        assert_eq!(plus::base_passed(t, &r), Some(true));
    }
    // `atol` holds: another way to the decimal part differs in the last bits.
    let r = sb.run(
        &he.tasks[0],
        "def truncate_number(number):\n    return number - int(number)\n",
    );
    assert_eq!(verdict(&r), "pass", "{r:?}");
    // Right on the base inputs, wrong on a plus one: base passes, plus fails.
    let sloppy = "def sort_unique(xs):\n    return [] if 5 in xs else sorted(set(xs))\n";
    let r = sb.run(&he.tasks[1], sloppy);
    assert_eq!(
        (plus::base_passed(&he.tasks[1], &r), r.outcome),
        (Some(true), Some(RewardClass::Failure)),
        "{r:?}"
    );
    // The expected values are cached: a second load runs nothing new and
    // gives the same tests.
    let files = std::fs::read_dir(cache.path().join("evalplus"))
        .unwrap()
        .count();
    assert_eq!(files, 4);
    let mut again = load("humanevalplus.jsonl");
    plus::expand(&mut again, &sb).unwrap();
    assert_eq!(again.tasks, he.tasks);
    // Base and plus pass@1 side by side.
    let results: Vec<falcon_rl::eval::TaskResult> = [(1, Some(1)), (0, Some(1)), (0, Some(0))]
        .into_iter()
        .enumerate()
        .map(|(i, (passed, base_passed))| falcon_rl::eval::TaskResult {
            id: format!("t{i}"),
            n: 1,
            passed,
            executed: 1,
            samples: Vec::new(),
            base_passed,
        })
        .collect();
    let b = plus::base_pass_at(&results, &[1]);
    assert!((b["1"] - 2.0 / 3.0).abs() < 1e-12, "{b:?}");
}

/// The local pool runs a sample's tests in turn in one candidate process;
/// what one test does to that process or its directory stays that test's.
#[test]
fn tests_sharing_a_process_keep_their_own_verdicts() {
    let sb = Sandbox::new(&cfg(65070)).unwrap_or_else(|e| panic!("{e}"));
    let mut task = sum_task();
    task.tests = vec![
        "1 2\n".into(),
        "0 0\n".into(),
        "7 8\n".into(),
        "2 2\n".into(),
    ];
    task.outputs = vec!["3\n".into(), "0\n".into(), "15\n".into(), "4\n".into()];
    let statuses = |code: &str| -> Vec<String> {
        let r = sb.run(&task, code);
        assert!(r.no_signal.is_none(), "{r:?}");
        r.tests
            .iter()
            .map(|t| match &t.status {
                TestStatus::Pass => "pass".to_owned(),
                TestStatus::Fail => "fail".to_owned(),
                TestStatus::Error { kind, .. } => kind.name().to_owned(),
            })
            .collect()
    };
    let sum = "a, b = map(int, input().split())\n";
    // Test 1 hangs; the tests after it run in a fresh process.
    assert_eq!(
        statuses(&format!("{sum}while a == 0:\n    pass\nprint(a + b)\n")),
        ["pass", "Timeout", "pass", "pass"]
    );
    // os._exit after printing: the output counts, the next test still runs.
    assert_eq!(
        statuses(&format!(
            "import os, sys\n{sum}print(a + b)\nsys.stdout.flush()\nos._exit(0)\n"
        )),
        ["pass", "pass", "pass", "pass"]
    );
    // Removing the files of earlier and later tests, or planting links where
    // outputs go, changes nothing for them: a test's output is read before
    // the next one starts, and each test's files are made afresh.
    let vandal = format!(
        "import os\n{sum}mine = (os.fstat(1).st_ino, os.fstat(2).st_ino)\nfor f in os.listdir('.'):\n    if f.startswith(('in', 'out', 'err')) and os.stat(f).st_ino not in mine:\n        os.remove(f)\n        os.symlink('/etc/passwd', f)\nprint(a + b)\n"
    );
    assert_eq!(statuses(&vandal), ["pass", "pass", "pass", "pass"]);
    // Closing its report pipe and running on is still held to the time limit.
    let closer =
        format!("import os\n{sum}print(a + b, flush=True)\nos.close(3)\nwhile a == 0:\n    pass\n");
    assert_eq!(statuses(&closer), ["pass", "Timeout", "pass", "pass"]);
    // State left by one test is the program's own: a module-level counter
    // restarts with each test, as `python main.py` would.
    let counter = format!("import builtins\n{sum}n = getattr(builtins, 'seen', 0)\nbuiltins.seen = n + 1\nprint(a + b + (1 if n > 0 and a == 7 else 0))\n");
    let s = statuses(&counter);
    assert_eq!(s[..2], ["pass", "pass"]);
    assert_eq!(
        s[2], "fail",
        "a process shared by tests leaks builtins: {s:?}"
    );
}
