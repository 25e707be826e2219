//! Unit tests for task loading: MBPP as shipped in `data/`, PriCoder's
//! benchmarks where `FALCON_BENCH_DATA` holds them, inline samples of each
//! format, and the error/skip paths.

use std::path::{Path, PathBuf};

use super::entry::{called_names, mbpp_entry_point};
use super::*;

/// A benchmark file the repository ships (`data/NAME`).
fn shipped(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(name)
}

/// A benchmark file we may not redistribute (PriCoder's carry no
/// license), from `$FALCON_BENCH_DATA`; the tests that read one are
/// `#[ignore]`d, and scripts/test runs them when the variable is set.
fn bench_data(name: &str) -> PathBuf {
    let dir = std::env::var_os("FALCON_BENCH_DATA")
        .expect("set FALCON_BENCH_DATA to the directory holding PriCoder's benchmark files");
    let p = PathBuf::from(dir).join(name);
    assert!(p.is_file(), "{} not found", p.display());
    p
}

fn load_str(text: &str, format: TaskFormat, skip_invalid: bool) -> Result<TaskSet, TaskError> {
    TaskSet::parse(
        text,
        Path::new("inline.jsonl"),
        format,
        LoadOptions::skipping(skip_invalid),
    )
}

fn invalid(err: TaskError) -> (PathBuf, usize, String) {
    match err {
        TaskError::Invalid { path, line, reason } => (path, line, reason),
        other => panic!("expected Invalid, got {other}"),
    }
}

/// A unique scratch file under the system temp dir, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, contents: &[u8]) -> Self {
        let path =
            std::env::temp_dir().join(format!("falcon-rl-task-test-{}-{name}", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        Self(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn assert_entry_points_defined(set: &TaskSet) {
    let mut unresolved = Vec::new();
    for task in set {
        let code = task.canonical_solution.as_deref().unwrap_or("");
        let def = format!("def {}(", task.entry_point);
        let def_spaced = format!("def {} (", task.entry_point);
        if !code.contains(&def) && !code.contains(&def_spaced) {
            unresolved.push((task.id.clone(), task.entry_point.clone()));
        }
        assert!(
            task.tests
                .iter()
                .all(|t| called_names(t).contains(&task.entry_point.as_str())),
            "{}: a test does not call {}",
            task.id,
            task.entry_point
        );
    }
    assert!(
        unresolved.is_empty(),
        "entry points not defined by the reference code: {unresolved:?}"
    );
}

#[test]
fn mbpp_full_loads_all_974_with_entry_points() {
    let set = TaskSet::load(
        &shipped("mbpp.jsonl"),
        TaskFormat::Auto,
        LoadOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(set.len(), 974);
    assert!(set.skipped.is_empty());
    assert_entry_points_defined(&set);

    let t = set.get("mbpp/1").unwrap();
    assert_eq!(t.entry_point, "min_cost");
    assert_eq!(t.tests.len(), 3);
    assert_eq!(t.tags, ["mbpp", "split:prompt"]);
    assert!(!t.canonical_solution.as_ref().unwrap().contains('\r'));
    assert!(set
        .iter()
        .all(|t| t.tests.len() == 3 && t.kind == TaskKind::Python));
    let count = |tag: &str| {
        set.iter()
            .filter(|t| t.tags.iter().any(|x| x == tag))
            .count()
    };
    assert_eq!(
        [
            count("split:prompt"),
            count("split:test"),
            count("split:validation"),
            count("split:train")
        ],
        [10, 500, 90, 374]
    );
    // The wrapped first asserts: `(Diff(...))`, `int(lobb_num(...))`, `(max_height(root))`.
    assert_eq!(set.get("mbpp/769").unwrap().entry_point, "Diff");
    assert_eq!(set.get("mbpp/912").unwrap().entry_point, "lobb_num");
    let t927 = set.get("mbpp/927").unwrap();
    assert_eq!(t927.entry_point, "max_height");
    // Its fixture builds trees with the `Node` class that the solution defines.
    assert!(t927
        .test_setup
        .as_ref()
        .unwrap()
        .starts_with("root = Node(1)"));
    assert_eq!(set.iter().filter(|t| t.test_setup.is_some()).count(), 2);
}

#[test]
fn mbpp_sanitized_loads_all_427_with_entry_points() {
    let path = shipped("mbpp-sanitized.json");
    let set = TaskSet::load(&path, TaskFormat::Auto, LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(set.len(), 427);
    assert_entry_points_defined(&set);
    assert_eq!(
        set.get("mbpp-sanitized/2").unwrap().entry_point,
        "similar_elements"
    );
    assert_eq!(
        set.get("mbpp-sanitized/82").unwrap().entry_point,
        "volume_sphere"
    );
    assert_eq!(
        set.get("mbpp-sanitized/787").unwrap().entry_point,
        "text_match_three"
    );
    assert_eq!(
        set.get("mbpp-sanitized/82").unwrap().test_setup.as_deref(),
        Some("import math")
    );
    assert_eq!(set.iter().filter(|t| t.test_setup.is_some()).count(), 13);
    let eval = set
        .iter()
        .filter(|t| t.tags.iter().any(|x| x == "split:test"))
        .count();
    assert_eq!(eval, 257);
    // Explicit format reads the same.
    let explicit = TaskSet::load(&path, TaskFormat::Mbpp, LoadOptions::default()).unwrap();
    assert_eq!(explicit, set);
}

#[test]
#[ignore = "needs FALCON_BENCH_DATA: PriCoder's files carry no license, so data/ does not ship them"]
fn pricoder_benchmarks_load() {
    let (numba, ndonnx) = (
        bench_data("numbaeval.jsonl"),
        bench_data("ndonnxeval.jsonl"),
    );
    let numba = TaskSet::load(&numba, TaskFormat::Auto, LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(numba.len(), 187);
    assert!(numba
        .iter()
        .all(|t| t.kind == TaskKind::NumbaCuda && t.tests.len() == 1));
    let t = numba.get("numbaeval/subset_0_000").unwrap();
    assert_eq!(t.entry_point, "gpu_add");
    assert_eq!(
        t.test_setup.as_deref(),
        Some("import numba.cuda as cuda\nimport numpy as np")
    );
    assert!(t.tags.contains(&"numbaeval".to_owned()));
    assert!(t.tags.iter().any(|x| x.starts_with("api:numba.cuda.")));
    assert!(t
        .canonical_solution
        .as_ref()
        .unwrap()
        .starts_with(&t.prompt));

    let ndonnx = TaskSet::load(&ndonnx, TaskFormat::Pricoder, LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ndonnx.len(), 169);
    assert!(ndonnx
        .iter()
        .all(|t| t.kind == TaskKind::Python && t.id.starts_with("ndonnxeval/")));
    assert!(ndonnx.iter().all(|t| t
        .test_setup
        .as_deref()
        .unwrap_or("")
        .contains("import ndonnx as ndx")));
    assert!(ndonnx.iter().all(|t| t.prelude == t.test_setup));
    assert_eq!(
        ndonnx
            .get("ndonnxeval/subset_1_002")
            .map(|t| t.entry_point.as_str()),
        Some("apply_gain")
    );
}

const HUMANEVAL_SAMPLE: &str = r#"{"task_id": "HumanEval/0", "prompt": "from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n    \"\"\" Check if any two numbers are closer than threshold. \"\"\"\n", "canonical_solution": "    for i, a in enumerate(numbers):\n        for j, b in enumerate(numbers):\n            if i != j and abs(a - b) < threshold:\n                return True\n    return False\n", "test": "\n\nMETADATA = {\n    'author': 'jt',\n    'dataset': 'test'\n}\n\n\ndef check(candidate):\n    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True\n    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) == True\n\n", "entry_point": "has_close_elements"}
{"task_id": "HumanEval/2", "prompt": "\n\ndef truncate_number(number: float) -> float:\n    \"\"\" Return the decimal part of number. \"\"\"\n", "canonical_solution": "    return number % 1.0\n", "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate(3.5) == 0.5\n", "entry_point": "truncate_number"}
"#;

#[test]
fn humaneval_sample_loads_with_check_call_appended() {
    let set = load_str(HUMANEVAL_SAMPLE, TaskFormat::Auto, false).unwrap();
    assert_eq!(set.len(), 2);
    let t = &set.tasks[0];
    assert_eq!(t.id, "HumanEval/0");
    assert_eq!(t.entry_point, "has_close_elements");
    assert_eq!(t.tests.len(), 1);
    assert!(t.tests[0].contains("def check(candidate):"));
    assert!(
        t.tests[0].ends_with("\n\ncheck(has_close_elements)\n"),
        "{:?}",
        t.tests[0]
    );
    let solution = t.canonical_solution.as_ref().unwrap();
    assert!(solution.starts_with(&t.prompt) && solution.ends_with("return False\n"));
    assert_eq!(t.tags, ["humaneval"]);
    // The prompt's imports run before an answer that rewrote its signature.
    assert_eq!(t.prelude.as_deref(), Some("from typing import List"));
    assert_eq!(set.tasks[1].prelude, None);
    assert_eq!(set.tasks[1].entry_point, "truncate_number");
    assert_eq!(
        load_str(HUMANEVAL_SAMPLE, TaskFormat::Humaneval, false).unwrap(),
        set
    );
}

fn sample_task(id: &str) -> Task {
    Task {
        id: id.to_owned(),
        prompt: "Write add(a, b).\n".to_owned(),
        entry_point: "add".to_owned(),
        tests: vec![
            "assert add(1, 2) == 3".to_owned(),
            "assert add(-1, 1) == 0".to_owned(),
        ],
        kind: TaskKind::Python,
        canonical_solution: None,
        docs: None,
        tags: Vec::new(),
        test_setup: None,
        prelude: None,
        extra: Default::default(),
        ..Default::default()
    }
}

#[test]
fn own_jsonl_round_trips() {
    let mut full = sample_task("full");
    full.kind = TaskKind::NumbaCuda;
    full.canonical_solution = Some("def add(a, b):\r\n    return a + b\n".to_owned());
    full.docs = Some("lib.add(a, b) adds.\n\"quoted\" \u{e9}".to_owned());
    full.tags = vec!["private-lib".to_owned(), "api:lib.add".to_owned()];
    full.test_setup = Some("import lib".to_owned());
    let set = TaskSet {
        tasks: vec![sample_task("minimal"), full],
        skipped: Vec::new(),
    };
    let text = set.to_jsonl();
    assert_eq!(text.lines().count(), 2);
    assert!(text.contains(r#""kind":"numba_cuda""#), "{text}");
    // Optional fields that are unset are omitted, not written as null.
    assert!(!text.lines().next().unwrap().contains("null"));
    assert_eq!(load_str(&text, TaskFormat::Auto, false).unwrap(), set);

    let file = TempFile::new("roundtrip.jsonl", b"");
    set.write_jsonl(&file.0).unwrap();
    assert_eq!(
        TaskSet::load(&file.0, TaskFormat::Jsonl, LoadOptions::default()).unwrap(),
        set
    );
}

#[test]
fn own_jsonl_kind_defaults_to_python_and_unknown_keys_fail() {
    let set = load_str(
        r#"{"id":"a","prompt":"p","entry_point":"f","tests":["assert f()"]}"#,
        TaskFormat::Jsonl,
        false,
    )
    .unwrap();
    assert_eq!(set.tasks[0].kind, TaskKind::Python);
    let (_, line, reason) = invalid(
        load_str(
            r#"{"id":"a","prompt":"p","entry_point":"f","tests":["assert f()"],"test":"x"}"#,
            TaskFormat::Jsonl,
            false,
        )
        .unwrap_err(),
    );
    assert_eq!(line, 1);
    assert!(reason.contains("unknown field `test`"), "{reason}");
    assert!(reason.contains("\"extra\""), "{reason}");
}

#[test]
fn extra_fields_are_kept_for_reward_terms() {
    let set = load_str(
        r#"{"id":"a","prompt":"p","entry_point":"f","tests":["assert f()"],"extra":{"answer":3,"meta":{"k":[1]}}}"#,
        TaskFormat::Auto,
        false,
    )
    .unwrap();
    assert_eq!(set.tasks[0].extra["answer"], serde_json::json!(3));
    // They survive our own JSONL.
    assert_eq!(
        load_str(&set.to_jsonl(), TaskFormat::Jsonl, false).unwrap(),
        set
    );
    let (_, _, reason) = invalid(
        load_str(
            r#"{"id":"a","prompt":"p","entry_point":"f","tests":["assert f()"],"extra":{"tests":1}}"#,
            TaskFormat::Jsonl,
            false,
        )
        .unwrap_err(),
    );
    assert!(reason.contains("`extra.tests`"), "{reason}");
    // A public format's unmapped keys become extra fields; a key that
    // would hide a task field is renamed.
    let mbpp = load_str(
        r#"{"task_id":11,"text":"Remove x.","code":"def f():\n    return 1","test_list":["assert f() == 1"],"challenge_test_list":["assert f() == 1"],"tags":["hard"]}"#,
        TaskFormat::Mbpp,
        false,
    )
    .unwrap();
    let extra = &mbpp.tasks[0].extra;
    assert_eq!(
        extra["challenge_test_list"],
        serde_json::json!(["assert f() == 1"])
    );
    assert_eq!(extra["source_tags"], serde_json::json!(["hard"]));
    assert!(
        !extra.contains_key("text") && !extra.contains_key("code"),
        "{extra:?}"
    );
}

/// Line 1 good, then one record for each kind of defect, with blank lines in between.
const MALFORMED: &str = r#"{"id":"ok","prompt":"p","entry_point":"f","tests":["assert f()"]}

{"id":"badjson","prompt":"p",
{"id":"nofield","prompt":"p","tests":["assert f()"]}
{"id":"wrongtype","prompt":"p","entry_point":"f","tests":"assert f()"}
{"id":"notests","prompt":"p","entry_point":"f","tests":[]}
{"id":"ok","prompt":"p","entry_point":"f","tests":["assert f()"]}
{"id":"badkind","prompt":"p","entry_point":"f","tests":["assert f()"],"kind":"rust"}
{"id":"badentry","prompt":"p","entry_point":"f(x)","tests":["assert f()"]}
{"id":"ok2","prompt":"p","entry_point":"f","tests":["assert f()"]}
"#;

#[test]
fn malformed_lines_name_file_line_and_reason() {
    let expected: [(usize, &str); 7] = [
        (3, "invalid JSON"),
        (4, "missing field `entry_point`"),
        (5, "invalid type"),
        (6, "`tests` is empty"),
        (7, "duplicate id \"ok\" (first seen at line 1)"),
        (8, "unknown variant `rust`"),
        (9, "not a Python identifier"),
    ];
    // Each defect alone after the good first line, so every one is the first error.
    let lines: Vec<&str> = MALFORMED.lines().collect();
    for (line, needle) in expected {
        let text = format!("{}\n{}\n", lines[0], lines[line - 1]);
        let err = load_str(&text, TaskFormat::Auto, false).unwrap_err();
        let msg = err.to_string();
        let (path, got_line, reason) = invalid(err);
        assert_eq!(path, Path::new("inline.jsonl"));
        assert_eq!(got_line, 2, "{msg}");
        assert!(reason.contains(needle), "line {line}: {reason}");
        assert!(msg.starts_with("inline.jsonl:2: "), "{msg}");
    }
    // In the whole file, the first defect is reported at its real line.
    let (_, line, reason) = invalid(load_str(MALFORMED, TaskFormat::Auto, false).unwrap_err());
    assert_eq!(line, 3);
    assert!(
        reason.starts_with("invalid JSON: EOF while parsing"),
        "{reason}"
    );
}

#[test]
fn skip_invalid_counts_every_skipped_record() {
    let set = load_str(MALFORMED, TaskFormat::Auto, true).unwrap();
    let ids: Vec<&str> = set.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["ok", "ok2"]);
    let lines: Vec<usize> = set.skipped.iter().map(|s| s.line).collect();
    assert_eq!(lines, [3, 4, 5, 6, 7, 8, 9]);
    assert!(set.skipped.iter().all(|s| !s.reason.is_empty()));
}

#[test]
fn skip_invalid_detects_format_past_a_broken_first_line() {
    let text = format!("not json\n{}", HUMANEVAL_SAMPLE);
    let set = load_str(&text, TaskFormat::Auto, true).unwrap();
    assert_eq!(set.len(), 2);
    assert_eq!(set.skipped.len(), 1);
    assert_eq!(set.skipped[0].line, 1);
}

#[test]
fn json_array_errors_use_the_array_index() {
    let text = r#"[
      {"task_id": 5, "prompt": "Add.", "code": "def add(a,b): return a+b", "test_list": ["assert add(1,2)==3"]},
      {"task_id": 6, "prompt": "Sub.", "code": "def sub(a,b): return a-b", "test_list": []},
      {"task_id": 7, "code": "x", "test_list": ["assert f(1)"]}
    ]"#;
    let (_, line, reason) = invalid(load_str(text, TaskFormat::Mbpp, false).unwrap_err());
    assert_eq!(line, 1);
    assert!(reason.starts_with("array index 1: "), "{reason}");
    let set = load_str(text, TaskFormat::Auto, true).unwrap();
    assert_eq!(set.len(), 1);
    assert_eq!(set.skipped.len(), 2);
    assert_eq!(set.skipped[1].line, 2);
    assert!(
        set.skipped[1]
            .reason
            .contains("`text` (full MBPP) or `prompt`"),
        "{:?}",
        set.skipped
    );

    let (_, line, reason) =
        invalid(load_str("[\n{\"a\": 1},\n{oops}\n]", TaskFormat::Auto, true).unwrap_err());
    assert_eq!(line, 3);
    assert!(reason.contains("not a JSON array"), "{reason}");
}

#[test]
fn unknown_and_gzip_files_are_refused_with_a_reason() {
    let err = load_str(
        r#"{"question": "q", "answer": "a"}"#,
        TaskFormat::Auto,
        false,
    )
    .unwrap_err();
    assert!(
        matches!(&err, TaskError::UnknownFormat { reason, .. } if reason.contains("question")),
        "{err}"
    );
    let err = load_str("\n\n", TaskFormat::Auto, false).unwrap_err();
    assert!(matches!(err, TaskError::UnknownFormat { .. }));

    let gz = TempFile::new("HumanEval.jsonl.gz", &[0x1f, 0x8b, 8, 0, 0, 0]);
    let err = TaskSet::load(&gz.0, TaskFormat::Auto, LoadOptions::default()).unwrap_err();
    assert!(err.to_string().contains("gunzip"), "{err}");

    let err = TaskSet::load(
        Path::new("/nonexistent/tasks.jsonl"),
        TaskFormat::Auto,
        LoadOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, TaskError::Io { .. }));
    assert!(err.to_string().contains("/nonexistent/tasks.jsonl"));

    let bad_utf8 = TempFile::new("latin1.jsonl", b"{\"id\": 1}\n{\"id\": \"caf\xe9\"}\n");
    let (_, line, reason) =
        invalid(TaskSet::load(&bad_utf8.0, TaskFormat::Jsonl, LoadOptions::default()).unwrap_err());
    assert_eq!((line, reason.as_str()), (2, "not valid UTF-8"));
}

#[test]
fn explicit_format_mismatch_is_reported_per_record() {
    let (_, line, reason) =
        invalid(load_str(HUMANEVAL_SAMPLE, TaskFormat::Mbpp, false).unwrap_err());
    assert_eq!(line, 1);
    assert!(reason.contains("missing field `test_list`"), "{reason}");
}

#[test]
fn mbpp_crlf_and_setup_are_normalised() {
    let line = r#"{"text": "Add.\r\n", "code": "def add(a, b):\r\n    return a + b\r\n", "task_id": 600, "test_setup_code": "X = 1\r\n", "test_list": ["assert add(X, 2) == 3"], "challenge_test_list": ["assert add(0, 0) == 0"]}"#;
    let set = load_str(line, TaskFormat::Auto, false).unwrap();
    let t = &set.tasks[0];
    assert_eq!(t.id, "mbpp/600");
    assert_eq!(t.prompt, "Add.");
    assert_eq!(
        t.canonical_solution.as_deref(),
        Some("def add(a, b):\n    return a + b\n")
    );
    assert_eq!(t.test_setup.as_deref(), Some("X = 1\n"));
    // challenge_test_list is not part of MBPP's standard protocol.
    assert_eq!(t.tests.len(), 1);
    assert_eq!(t.tags, ["mbpp", "split:validation"]);
}

#[test]
fn entry_point_rules() {
    let ep = |test: &str, code: Option<&str>| mbpp_entry_point(test, code);
    assert_eq!(ep("assert f(1) == 2", None).unwrap(), "f");
    assert_eq!(
        ep("assert set(f(1)) == set([1])", Some("def f(x): pass")).unwrap(),
        "f"
    );
    assert_eq!(ep("assert set(f(1)) == set([1])", None).unwrap(), "f");
    assert_eq!(
        ep("assert math.isclose(area(2), 4.0)", None).unwrap(),
        "area"
    );
    assert_eq!(ep("assert not is_odd(2)", None).unwrap(), "is_odd");
    assert_eq!(ep("assert (Diff([1], [2])) == [1]", None).unwrap(), "Diff");
    // A name inside a string literal is not a call.
    assert_eq!(ep(r#"assert g("h(x)", 'k(') == 1"#, None).unwrap(), "g");
    // The reference code decides between two user-looking names.
    assert_eq!(
        ep(
            "assert helper(go(1)) == 1",
            Some("def go(n):\n    return n")
        )
        .unwrap(),
        "go"
    );
    assert!(ep("assert len([1]) == 1", None)
        .unwrap_err()
        .contains("cannot derive"));
    assert_eq!(called_names("x.y(1) + z (2) # w(3)"), ["z"]);
}
