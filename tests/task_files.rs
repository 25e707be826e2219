//! Task files as users keep them: parquet (pyarrow-written, as verl and the
//! HF Hub ship them) and the HF `datasets` cache (written by the real
//! `datasets` package in the test), directories of shards, splits, column
//! renames, schema mismatches, and invalid rows counted by reason through
//! `falcon tasks check` / `convert`.

use std::path::Path;

use falcon_rl::config::TaskFormat;
use falcon_rl::task::{LoadOptions, TaskKind, TaskSet};

use crate::common::{falcon, root, run_python_code, text, tmpdir};

fn fixture(name: &str) -> std::path::PathBuf {
    root().join("tests/fixtures/formats").join(name)
}

fn load(path: &Path, format: TaskFormat, opts: LoadOptions) -> TaskSet {
    TaskSet::load(path, format, opts).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn parquet_files_load_exactly_as_their_jsonl_exports() {
    for name in ["verl", "codecontests"] {
        let a = load(
            &fixture(&format!("{name}.parquet")),
            TaskFormat::Auto,
            LoadOptions::default(),
        );
        let b = load(
            &fixture(&format!("{name}.jsonl")),
            TaskFormat::Auto,
            LoadOptions::default(),
        );
        assert!(!a.is_empty());
        assert_eq!(a.tasks, b.tasks, "{name}");
    }
}

/// APPS-shaped rows under other column names, as a user's own dataset has
/// them, loaded by the real `datasets` into a cache directory and saved
/// with `save_to_disk`.
const MAKE_CACHE: &str = r#"
import json, sys
import datasets
out = sys.argv[1]
def rows(split, n, first):
    return [{"pid": first + i, "problem": "Print %d plus the input." % i,
             "cases": json.dumps({"inputs": ["1\n"], "outputs": ["%d\n" % (i + 1)]})}
            for i in range(n)]
with open(out + "/train.jsonl", "w") as f:
    f.write("\n".join(json.dumps(r) for r in rows("train", 5, 0)))
with open(out + "/test.jsonl", "w") as f:
    f.write("\n".join(json.dumps(r) for r in rows("test", 3, 100)))
d = datasets.load_dataset("json", data_files={"train": out + "/train.jsonl", "test": out + "/test.jsonl"},
                          cache_dir=out + "/cache")
d.save_to_disk(out + "/saved")
print(d["train"].cache_files[0]["filename"])
"#;

#[test]
fn an_hf_datasets_cache_reads_by_split_with_renamed_columns() {
    let dir = tmpdir();
    let d = dir.path().display().to_string();
    let code = format!("import sys; sys.argv = ['x', {d:?}]\n{MAKE_CACHE}");
    let train_file = run_python_code(&code).trim().to_owned();
    assert!(train_file.ends_with("-train.arrow"), "{train_file}");
    let cache = dir.path().join("cache");

    // Undetectable as it is: the error lists the columns it found.
    let e = TaskSet::load(&cache, TaskFormat::Auto, LoadOptions::default()).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("\"problem\"") && msg.contains("[tasks.columns]"),
        "{msg}"
    );
    // Named explicitly, the schema is checked before any row.
    let e = TaskSet::load(&cache, TaskFormat::Apps, LoadOptions::default()).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(r#"needs the columns ["question", "input_output"]"#)
            && msg.contains("\"pid\""),
        "{msg}"
    );

    let renamed = |split: Option<&str>| LoadOptions {
        columns: [
            ("question", "problem"),
            ("input_output", "cases"),
            ("problem_id", "pid"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .collect(),
        split: split.map(str::to_owned),
        ..LoadOptions::default()
    };
    let train = load(&cache, TaskFormat::Auto, renamed(Some("train")));
    assert_eq!(train.len(), 5);
    assert_eq!(train.tasks[4].id, "apps/4");
    assert_eq!(train.tasks[4].kind, TaskKind::Stdio);
    assert_eq!(train.tasks[4].outputs, ["5\n"]);
    let test = load(&cache, TaskFormat::Auto, renamed(Some("test")));
    assert_eq!(test.tasks[0].id, "apps/100");
    assert_eq!(load(&cache, TaskFormat::Auto, renamed(None)).len(), 8);
    // The same rows from one cache file and from `save_to_disk`'s directory.
    let one = load(Path::new(&train_file), TaskFormat::Auto, renamed(None));
    assert_eq!(one.tasks, train.tasks);
    let saved = load(
        &dir.path().join("saved"),
        TaskFormat::Auto,
        renamed(Some("train")),
    );
    assert_eq!(saved.tasks, train.tasks);
    let e = TaskSet::load(&cache, TaskFormat::Auto, renamed(Some("validation"))).unwrap_err();
    assert!(e.to_string().contains("split \"validation\""), "{e}");
}

/// 10,000 APPS rows in two parquet shards, 10 of them bad in three ways.
const MAKE_BIG: &str = r#"
import json, sys
import pyarrow as pa, pyarrow.parquet as pq
out = sys.argv[1]
rows = []
for i in range(10000):
    io = {"inputs": ["%d\n" % i], "outputs": ["%d\n" % (2 * i)]}
    pid = i
    if i % 1000 == 7:
        io = {"inputs": [], "outputs": []}
    if i % 1000 == 9 and i < 3000:
        pid = i - 1
    s = json.dumps(io)
    if i in (4242, 4243):
        s = s[:-3]
    rows.append({"problem_id": pid, "question": "Double the number.", "input_output": s,
                 "solutions": json.dumps(["print(2 * int(input()))"]), "starter_code": ""})
import os
os.makedirs(out + "/data")
pq.write_table(pa.Table.from_pylist(rows[:6000]), out + "/data/train-00000-of-00002.parquet")
pq.write_table(pa.Table.from_pylist(rows[6000:]), out + "/data/train-00001-of-00002.parquet")
"#;

#[test]
fn invalid_rows_of_a_large_parquet_dataset_are_counted_by_reason_and_convert_keeps_the_rest() {
    let dir = tmpdir();
    let d = dir.path().display().to_string();
    run_python_code(&format!("import sys; sys.argv = ['x', {d:?}]\n{MAKE_BIG}"));
    let data = dir.path().join("data");
    let e = TaskSet::load(&data, TaskFormat::Auto, LoadOptions::default()).unwrap_err();
    assert!(
        e.to_string()
            .contains(":7: row 7: `input_output` has no tests"),
        "{e}"
    );
    let set = load(&data, TaskFormat::Auto, LoadOptions::skipping(true));
    assert_eq!((set.len(), set.skipped.len()), (10000 - 15, 15));

    let out = falcon(&["tasks", "check", data.to_str().unwrap(), "--skip-invalid"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("9985 tasks (0 python, 0 numba_cuda, 9985 stdio)"),
        "{t}"
    );
    assert!(t.contains("10 skipped: `input_output` has no tests"), "{t}");
    assert!(t.contains("3 skipped: duplicate id"), "{t}");
    assert!(
        t.contains("2 skipped: `input_output` is not valid JSON"),
        "{t}"
    );

    let jsonl = dir.path().join("apps.jsonl");
    let out = falcon(&[
        "tasks",
        "convert",
        data.to_str().unwrap(),
        jsonl.to_str().unwrap(),
        "--skip-invalid",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let back = load(&jsonl, TaskFormat::Jsonl, LoadOptions::default());
    assert_eq!(back.tasks, set.tasks);

    // Obvious mistakes: a format that does not exist, a malformed mapping.
    let out = falcon(&[
        "tasks",
        "check",
        data.to_str().unwrap(),
        "--format",
        "parquet",
    ]);
    assert!(
        !out.status.success() && text(&out).contains("use auto, jsonl"),
        "{}",
        text(&out)
    );
    let out = falcon(&[
        "tasks",
        "check",
        data.to_str().unwrap(),
        "--column",
        "question",
    ]);
    assert!(
        !out.status.success() && text(&out).contains("EXPECTED=FOUND"),
        "{}",
        text(&out)
    );
}
