//! Readers for the formats code-RL data ships in: APPS and TACO,
//! CodeContests, LiveCodeBench, KodCode and verl-style rows. Standard-input
//! problems become program tasks (`kind = "stdio"`); call-based ones
//! (`fn_name`, LiveCodeBench's `functional` tests, KodCode's pytest files)
//! become function tasks whose asserts compare as the source's own checker
//! does. `docs/tasks.md` documents each mapping.

use serde_json::{Map, Value};

use super::{Task, TaskKind};

/// What a record of one of these formats maps to, before the keys it used
/// are subtracted for `extra`.
pub(super) type Mapped = (Task, &'static [&'static str]);

/// `input_output` of APPS / TACO (and verl's `ground_truth` built from them).
struct IoSpec {
    inputs: Vec<Value>,
    outputs: Vec<Value>,
    fn_name: Option<String>,
}

fn field<'a>(map: &'a Map<String, Value>, key: &str) -> Result<&'a Value, String> {
    map.get(key).ok_or_else(|| format!("missing field `{key}`"))
}

fn string(map: &Map<String, Value>, key: &str) -> Result<String, String> {
    match field(map, key)? {
        Value::String(s) => Ok(lf(s)),
        other => Err(format!("`{key}` is {}, not a string", kind_of(other))),
    }
}

fn opt_string(map: &Map<String, Value>, key: &str) -> Option<String> {
    map.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.trim().is_empty())
        .map(lf)
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn lf(s: &str) -> String {
    s.replace("\r\n", "\n")
}

/// A value that sources store either as JSON or as a string holding JSON
/// (APPS's `input_output` and `solutions`, LiveCodeBench's test lists).
fn json_or_string(v: &Value, what: &str) -> Result<Value, String> {
    match v {
        Value::String(s) if s.trim().is_empty() => Ok(Value::Null),
        Value::String(s) => {
            serde_json::from_str(s).map_err(|e| format!("`{what}` is not valid JSON: {e}"))
        }
        other => Ok(other.clone()),
    }
}

impl IoSpec {
    fn from_value(v: &Value, what: &str) -> Result<IoSpec, String> {
        let v = json_or_string(v, what)?;
        let map = v
            .as_object()
            .ok_or_else(|| format!("`{what}` is {}, not an object", kind_of(&v)))?;
        let list = |k: &str| -> Result<Vec<Value>, String> {
            match map.get(k) {
                Some(Value::Array(a)) => Ok(a.clone()),
                Some(other) => Err(format!("`{what}.{k}` is {}, not an array", kind_of(other))),
                None => Err(format!("`{what}` has no `{k}`")),
            }
        };
        let (inputs, outputs) = (list("inputs")?, list("outputs")?);
        if inputs.len() != outputs.len() {
            return Err(format!(
                "`{what}` has {} inputs but {} outputs",
                inputs.len(),
                outputs.len()
            ));
        }
        if inputs.is_empty() {
            return Err(format!("`{what}` has no tests"));
        }
        let fn_name = map
            .get("fn_name")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        Ok(IoSpec {
            inputs,
            outputs,
            fn_name,
        })
    }
}

/// A stdin or stdout as the program sees it: APPS stores some as lists of
/// lines.
fn io_text(v: &Value, what: &str) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(lf(s)),
        Value::Array(lines) => lines
            .iter()
            .map(|l| l.as_str().map(lf))
            .collect::<Option<Vec<String>>>()
            .map(|l| l.join("\n"))
            .ok_or_else(|| format!("{what} is a list holding something other than strings")),
        other => Err(format!("{what} is {}, not text", kind_of(other))),
    }
}

/// The name and call target of a call-based task: LeetCode-style starter
/// code wraps the function in `class Solution`, which the tests instantiate.
fn call_target(fn_name: &str, starter: Option<&str>) -> Result<(String, String), String> {
    if !super::is_python_identifier(fn_name) {
        return Err(format!("`fn_name` {fn_name:?} is not a Python identifier"));
    }
    if starter.is_some_and(|s| s.contains("class Solution")) {
        Ok(("Solution".to_owned(), format!("Solution().{fn_name}")))
    } else {
        Ok((fn_name.to_owned(), fn_name.to_owned()))
    }
}

/// APPS's call-based checker (`eval/testing_util.py`): the result, a tuple
/// read as a list, equals the expected value, or the expected value's first
/// element when that is a non-empty list (APPS wraps most expected results
/// in one), a list of tuples compared as lists.
const APPS_EQUAL: &str = "def _apps_equal(got, want):\n    if isinstance(got, tuple):\n        got = list(got)\n    if got == want:\n        return True\n    if not (isinstance(want, list) and want):\n        return False\n    if got == want[0]:\n        return True\n    try:\n        return isinstance(got[0], tuple) and [list(x) for x in got] == want[0]\n    except Exception:\n        return False\n";

/// Call-based tests: one assert per (args, expected) pair. APPS stores the
/// arguments as a list and the expected value as JSON; verl's rows (as its
/// `prime_code` and `sandbox_fusion` scorers read them) store both as text,
/// the arguments one JSON value per line.
fn call_tests(target: &str, spec: &IoSpec, text: bool) -> Result<Vec<String>, String> {
    spec.inputs
        .iter()
        .zip(&spec.outputs)
        .enumerate()
        .map(|(i, (args, want))| {
            let args = match args {
                Value::Array(a) => a.iter().map(py_literal).collect::<Vec<_>>().join(", "),
                Value::String(s) if text => json_lines(s)
                    .map_err(|e| format!("call-based input {i}: {e}"))?
                    .join(", "),
                other => {
                    return Err(format!(
                        "call-based input {i} is {}, not a list of arguments",
                        kind_of(other)
                    ))
                }
            };
            let want = match want {
                Value::String(s) if text => serde_json::from_str(s)
                    .map_err(|e| format!("call-based output {i} is not JSON ({e})"))?,
                other => other.clone(),
            };
            Ok(format!(
                "assert _apps_equal({target}({args}), {})",
                py_literal(&want)
            ))
        })
        .collect()
}

/// One JSON value per non-empty line, each as a Python literal.
fn json_lines(s: &str) -> Result<Vec<String>, String> {
    s.split('\n')
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str::<Value>(l)
                .map(|v| py_literal(&v))
                .map_err(|e| format!("an argument line is not JSON ({e}): {l:?}"))
        })
        .collect()
}

/// A JSON value as the Python literal that `json.loads` would give.
pub fn py_literal(v: &Value) -> String {
    match v {
        Value::Null => "None".to_owned(),
        Value::Bool(true) => "True".to_owned(),
        Value::Bool(false) => "False".to_owned(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.is_infinite() => if f > 0.0 {
                "float('inf')"
            } else {
                "float('-inf')"
            }
            .to_owned(),
            _ => n.to_string(),
        },
        Value::String(s) => py_string(s),
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(py_literal).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, v)| format!("{}: {}", py_string(k), py_literal(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn py_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The Python 3 solutions of a `solutions` field: a JSON list of strings
/// (APPS, TACO), or CodeContests' `{language: [...], solution: [...]}`
/// keeping language 3 (`PYTHON3`).
fn python_solutions(v: Option<&Value>) -> Result<Vec<String>, String> {
    let Some(v) = v else {
        return Ok(Vec::new());
    };
    let v = json_or_string(v, "solutions")?;
    match &v {
        Value::Null => Ok(Vec::new()),
        Value::Array(a) => Ok(a.iter().filter_map(Value::as_str).map(lf).collect()),
        Value::Object(m) => {
            let langs = m.get("language").and_then(Value::as_array);
            let sols = m.get("solution").and_then(Value::as_array);
            match (langs, sols) {
                (Some(l), Some(s)) => Ok(l
                    .iter()
                    .zip(s)
                    .filter(|(l, _)| l.as_i64() == Some(CODECONTESTS_PYTHON3))
                    .filter_map(|(_, s)| s.as_str().map(lf))
                    .collect()),
                _ => Err("`solutions` has no `language` and `solution` lists".to_owned()),
            }
        }
        other => Err(format!("`solutions` is {}", kind_of(other))),
    }
}

/// CodeContests' `Language` enum value for Python 3.
const CODECONTESTS_PYTHON3: i64 = 3;

/// `"2 seconds"`, `"1.5 seconds"`, `"1000 ms"` as milliseconds (TACO).
fn time_limit_ms(s: &str) -> Option<u64> {
    let s = s.trim().to_ascii_lowercase();
    let (num, unit) = split_number(&s)?;
    let ms = match unit {
        "" | "s" | "sec" | "secs" | "second" | "seconds" => num * 1000.0,
        "ms" | "millisecond" | "milliseconds" => num,
        _ => return None,
    };
    (ms > 0.0).then(|| ms.round() as u64)
}

/// `"256 megabytes"`, `"256 MB"`, `"1024 KB"` as MiB (TACO).
fn memory_limit_mb(s: &str) -> Option<u64> {
    let s = s.trim().to_ascii_lowercase();
    let (num, unit) = split_number(&s)?;
    let mb = match unit {
        "" | "mb" | "mib" | "megabyte" | "megabytes" => num,
        "kb" | "kib" | "kilobyte" | "kilobytes" => num / 1024.0,
        "gb" | "gib" | "gigabyte" | "gigabytes" => num * 1024.0,
        _ => return None,
    };
    (mb >= 1.0).then(|| mb.round() as u64)
}

fn split_number(s: &str) -> Option<(f64, &str)> {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let num: f64 = s[..end].parse().ok()?;
    Some((num, s[end..].trim()))
}

fn opt_str<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    map.get(key).and_then(Value::as_str)
}

/// A task from APPS-style tests: stdin programs, or call-based when
/// `fn_name` is set.
fn from_io_spec(
    id: String,
    prompt: String,
    spec: &IoSpec,
    starter: Option<String>,
    canonical: Option<String>,
    tags: Vec<String>,
    text: bool,
) -> Result<Task, String> {
    let mut task = Task {
        id,
        tags,
        canonical_solution: canonical,
        ..Task::default()
    };
    match &spec.fn_name {
        Some(name) => {
            let (entry, target) = call_target(name, starter.as_deref())?;
            task.kind = TaskKind::Python;
            task.entry_point = entry;
            task.tests = call_tests(&target, spec, text)?;
            task.test_setup = Some(APPS_EQUAL.to_owned());
            task.prompt = with_starter(&prompt, starter.as_deref());
        }
        None => {
            task.kind = TaskKind::Stdio;
            task.prompt = prompt;
            for (i, (inp, out)) in spec.inputs.iter().zip(&spec.outputs).enumerate() {
                task.tests.push(io_text(inp, &format!("input {i}"))?);
                task.outputs.push(io_text(out, &format!("output {i}"))?);
            }
        }
    }
    Ok(task)
}

/// The statement followed by the starter code the answer must complete.
fn with_starter(prompt: &str, starter: Option<&str>) -> String {
    match starter.filter(|s| !s.trim().is_empty()) {
        Some(s) => format!(
            "{}\n\nComplete this starter code:\n```python\n{}\n```",
            prompt.trim_end(),
            s.trim_end()
        ),
        None => prompt.to_owned(),
    }
}

pub(super) const APPS_KEYS: &[&str] = &[
    "problem_id",
    "question",
    "solutions",
    "input_output",
    "starter_code",
    "time_limit",
    "memory_limit",
];

/// APPS (`problem_id`) or TACO (no id: the row's ordinal names it).
pub(super) fn apps(map: &Map<String, Value>, ordinal: usize) -> Result<Mapped, String> {
    let (source, id) = match map.get("problem_id") {
        Some(Value::Number(n)) => ("apps", format!("apps/{n}")),
        Some(Value::String(s)) => ("apps", format!("apps/{s}")),
        _ => ("taco", format!("taco/{ordinal}")),
    };
    let spec = IoSpec::from_value(field(map, "input_output")?, "input_output")?;
    let starter = opt_string(map, "starter_code");
    let canonical = python_solutions(map.get("solutions"))?.into_iter().next();
    let mut tags = vec![source.to_owned()];
    if let Some(d) = opt_str(map, "difficulty") {
        tags.push(format!("difficulty:{}", d.to_ascii_lowercase()));
    }
    let mut task = from_io_spec(
        id,
        string(map, "question")?,
        &spec,
        starter,
        canonical,
        tags,
        false,
    )?;
    if task.kind == TaskKind::Stdio {
        task.time_limit_ms = opt_str(map, "time_limit").and_then(time_limit_ms);
        task.memory_limit_mb = opt_str(map, "memory_limit").and_then(memory_limit_mb);
    }
    Ok((task, APPS_KEYS))
}

pub(super) const CODECONTESTS_KEYS: &[&str] = &[
    "name",
    "description",
    "public_tests",
    "private_tests",
    "generated_tests",
    "solutions",
    "time_limit",
    "memory_limit_bytes",
];

/// DeepMind CodeContests: public, private and generated tests, in that
/// order (so the first test is one the statement shows); Python 3
/// solutions; the problem's time and memory limits.
pub(super) fn codecontests(map: &Map<String, Value>) -> Result<Mapped, String> {
    let name = string(map, "name")?;
    let mut task = Task {
        id: format!("codecontests/{name}"),
        prompt: string(map, "description")?,
        kind: TaskKind::Stdio,
        tags: vec!["codecontests".to_owned()],
        ..Task::default()
    };
    for key in ["public_tests", "private_tests", "generated_tests"] {
        let Some(t) = map.get(key).filter(|v| !v.is_null()) else {
            continue;
        };
        let inputs = t.get("input").and_then(Value::as_array);
        let outputs = t.get("output").and_then(Value::as_array);
        let (Some(inputs), Some(outputs)) = (inputs, outputs) else {
            return Err(format!("`{key}` has no `input` and `output` lists"));
        };
        if inputs.len() != outputs.len() {
            return Err(format!(
                "`{key}` has {} inputs but {} outputs",
                inputs.len(),
                outputs.len()
            ));
        }
        for (i, (inp, out)) in inputs.iter().zip(outputs).enumerate() {
            task.tests.push(io_text(inp, &format!("{key}.input[{i}]"))?);
            task.outputs
                .push(io_text(out, &format!("{key}.output[{i}]"))?);
        }
    }
    task.canonical_solution = python_solutions(map.get("solutions"))?.into_iter().next();
    if let Some(t) = map.get("time_limit").and_then(Value::as_object) {
        let s = t.get("seconds").and_then(Value::as_u64).unwrap_or(0);
        let ns = t.get("nanos").and_then(Value::as_u64).unwrap_or(0);
        let ms = s * 1000 + ns / 1_000_000;
        task.time_limit_ms = (ms > 0).then_some(ms);
    }
    task.memory_limit_mb = map
        .get("memory_limit_bytes")
        .and_then(Value::as_u64)
        .map(|b| b >> 20)
        .filter(|&m| m > 0);
    if let Some(d) = map.get("difficulty").and_then(Value::as_i64) {
        task.tags.push(format!("difficulty:{d}"));
    }
    let wrong = python_solutions(map.get("incorrect_solutions"))?;
    if !wrong.is_empty() {
        task.extra
            .insert("incorrect_python_solutions".to_owned(), Value::from(wrong));
    }
    Ok((task, CODECONTESTS_KEYS))
}

pub(super) const LIVECODEBENCH_KEYS: &[&str] = &[
    "question_id",
    "question_title",
    "question_content",
    "public_test_cases",
    "private_test_cases",
    "starter_code",
    "metadata",
];

/// LiveCodeBench `code_generation_lite`: public tests as JSON, private
/// tests as JSON or as base64 of zlib of a pickled JSON string, which is
/// decoded without running any pickle code ([`pickled_string`]).
pub(super) fn livecodebench(map: &Map<String, Value>) -> Result<Mapped, String> {
    let id = match field(map, "question_id")? {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => return Err(format!("`question_id` is {}", kind_of(other))),
    };
    let mut cases = lcb_cases(field(map, "public_test_cases")?, "public_test_cases")?;
    if let Some(private) = map.get("private_test_cases").filter(|v| !v.is_null()) {
        let value = match private {
            Value::String(s) if !s.trim_start().starts_with('[') && !s.trim().is_empty() => {
                let text =
                    decode_compressed(s).map_err(|e| format!("`private_test_cases`: {e}"))?;
                Value::String(text)
            }
            other => other.clone(),
        };
        cases.extend(lcb_cases(&value, "private_test_cases")?);
    }
    if cases.is_empty() {
        return Err("no test cases (public or private)".to_owned());
    }
    let metadata = map
        .get("metadata")
        .map(|m| json_or_string(m, "metadata"))
        .transpose()?
        .unwrap_or(Value::Null);
    let func_name = metadata.get("func_name").and_then(Value::as_str);
    let functional = cases.iter().any(|c| c.2 == "functional");
    let stdin = cases.iter().any(|c| c.2 == "stdin");
    if functional && stdin {
        return Err("mixes `stdin` and `functional` test cases".to_owned());
    }
    let mut tags = vec!["livecodebench".to_owned()];
    for (k, prefix) in [("platform", "platform"), ("difficulty", "difficulty")] {
        if let Some(v) = opt_str(map, k) {
            tags.push(format!("{prefix}:{v}"));
        }
    }
    let statement = string(map, "question_content")?;
    let starter = opt_string(map, "starter_code");
    let mut task = Task {
        id: format!("livecodebench/{id}"),
        tags,
        ..Task::default()
    };
    if functional {
        let name = func_name.ok_or("functional tests but no `metadata.func_name`")?;
        let (entry, target) = call_target(name, starter.as_deref())?;
        task.entry_point = entry;
        task.prompt = with_starter(&statement, starter.as_deref());
        task.test_setup = Some(LCB_EQUAL.to_owned());
        for (i, (input, output, _)) in cases.iter().enumerate() {
            let args = json_lines(input).map_err(|e| format!("test {i}: {e}"))?;
            let want: Value = serde_json::from_str(output)
                .map_err(|e| format!("test {i}: the expected output is not JSON ({e})"))?;
            task.tests.push(format!(
                "assert _lcb_equal({target}({}), {})",
                args.join(", "),
                py_literal(&want)
            ));
        }
    } else {
        task.kind = TaskKind::Stdio;
        task.prompt = statement;
        for (input, output, _) in cases {
            task.tests.push(input);
            task.outputs.push(output);
        }
    }
    Ok((task, LIVECODEBENCH_KEYS))
}

/// LiveCodeBench's functional check: a tuple result reads as a list.
const LCB_EQUAL: &str = "def _lcb_equal(got, want):\n    if isinstance(got, tuple):\n        got = list(got)\n    return got == want\n";

/// `[{"input", "output", "testtype"}]`, as JSON or a string of it.
fn lcb_cases(v: &Value, what: &str) -> Result<Vec<(String, String, String)>, String> {
    let v = json_or_string(v, what)?;
    let list = match &v {
        Value::Null => return Ok(Vec::new()),
        Value::Array(a) => a,
        other => return Err(format!("`{what}` is {}, not a list", kind_of(other))),
    };
    list.iter()
        .enumerate()
        .map(|(i, c)| {
            let get = |k: &str| {
                c.get(k)
                    .and_then(Value::as_str)
                    .map(lf)
                    .ok_or_else(|| format!("`{what}[{i}]` has no string `{k}`"))
            };
            let kind = get("testtype")?;
            if kind != "stdin" && kind != "functional" {
                return Err(format!(
                    "`{what}[{i}].testtype` is {kind:?}, not \"stdin\" or \"functional\""
                ));
            }
            Ok((get("input")?, get("output")?, kind))
        })
        .collect()
}

/// base64 → zlib → a pickle whose only value is a string, returned as is.
pub(super) fn decode_compressed(s: &str) -> Result<String, String> {
    use base64::Engine as _;
    use std::io::Read as _;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .map_err(|e| format!("not base64 ({e})"))?;
    let mut bytes = Vec::new();
    flate2::read::ZlibDecoder::new(&raw[..])
        .take(1 << 30)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("not zlib data ({e})"))?;
    pickled_string(&bytes)
}

/// The string a pickle holds, read opcode by opcode; any opcode that is not
/// framing, memo or a string is refused, so no pickle code ever runs.
pub(super) fn pickled_string(b: &[u8]) -> Result<String, String> {
    let mut i = 0;
    let mut value: Option<String> = None;
    let take = |i: &mut usize, n: usize| -> Result<&[u8], String> {
        let s = b
            .get(*i..*i + n)
            .ok_or("the pickle ends in the middle of an opcode")?;
        *i += n;
        Ok(s)
    };
    let len = |s: &[u8]| s.iter().rev().fold(0usize, |a, &x| (a << 8) | x as usize);
    loop {
        let op = *take(&mut i, 1)?.first().unwrap_or(&0);
        match op {
            0x80 => drop(take(&mut i, 1)?), // PROTO
            0x95 => drop(take(&mut i, 8)?), // FRAME
            0x94 => {}                      // MEMOIZE
            b'q' => drop(take(&mut i, 1)?), // BINPUT
            b'r' => drop(take(&mut i, 4)?), // LONG_BINPUT
            0x8c | b'X' | 0x8d if value.is_none() => {
                let width = match op {
                    0x8c => 1,
                    b'X' => 4,
                    _ => 8,
                };
                let n = len(take(&mut i, width)?);
                let text = take(&mut i, n)?;
                value = Some(
                    String::from_utf8(text.to_vec())
                        .map_err(|_| "the pickled string is not valid UTF-8")?,
                );
            }
            b'.' => {
                return value.ok_or_else(|| "the pickle holds no string".to_owned());
            }
            other => {
                return Err(format!(
                "the pickle holds more than one plain string (opcode 0x{other:02x} at byte {}); \
                     refusing to unpickle it",
                i - 1
            ))
            }
        }
    }
}

pub(super) const KODCODE_KEYS: &[&str] =
    &["question_id", "question", "solution", "test", "test_info"];

/// KodCode: the `test` field is a pytest file that imports the solution
/// (`from solution import f`). Each `test_*` function without parameters is
/// one test; the rest of the file is the tests' set-up, with the solution's
/// names taken from the candidate's code instead of a module.
pub(super) fn kodcode(map: &Map<String, Value>) -> Result<Mapped, String> {
    let id = string(map, "question_id")?;
    let file = string(map, "test")?;
    let mut setup = Vec::new();
    let mut tests = Vec::new();
    let mut imported: Vec<String> = Vec::new();
    for line in file.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("from solution import ") {
            if line.starts_with(char::is_whitespace) {
                return Err("imports from `solution` inside a function; only top-level `from solution import NAME` is supported".to_owned());
            }
            let names = rest.trim_matches(|c| c == '(' || c == ')');
            imported.extend(
                names
                    .split(',')
                    .map(|n| n.split_whitespace().next().unwrap_or("").to_owned())
                    .filter(|n| !n.is_empty() && n != "*"),
            );
            continue;
        }
        if t == "import solution" || t.starts_with("import solution ") {
            return Err("imports the module `solution` as a whole; only `from solution import NAME` is supported".to_owned());
        }
        if let Some(rest) = line.strip_prefix("def test") {
            let name_end = rest.find('(').unwrap_or(rest.len());
            let name = format!("test{}", &rest[..name_end]);
            let params = rest[name_end..].trim_start_matches('(');
            if !params.trim_start().starts_with(')') {
                return Err(format!(
                    "`{name}` takes parameters (a pytest fixture or parametrize); such tests are not supported"
                ));
            }
            tests.push(format!("{name}()"));
        }
        setup.push(line);
    }
    if tests.is_empty() {
        return Err("`test` defines no `def test_*()` function".to_owned());
    }
    let entry = map
        .get("test_info")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(|t| t.get("function_name"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| imported.first().cloned())
        .ok_or("cannot derive `entry_point`: no `test_info[0].function_name` and no `from solution import`")?;
    let mut tags = vec!["kodcode".to_owned()];
    if let Some(s) = opt_str(map, "subset") {
        tags.push(format!("subset:{s}"));
    }
    if let Some(s) = opt_str(map, "gpt_difficulty") {
        tags.push(format!("difficulty:{s}"));
    }
    let task = Task {
        id: format!("kodcode/{id}"),
        prompt: string(map, "question")?,
        entry_point: entry,
        tests,
        canonical_solution: opt_string(map, "solution"),
        test_setup: Some(setup.join("\n")),
        tags,
        ..Task::default()
    };
    Ok((task, KODCODE_KEYS))
}

pub(super) const VERL_KEYS: &[&str] = &["prompt", "reward_model"];

/// A verl RL row: `prompt` as chat messages (the last user message is the
/// statement), `reward_model.ground_truth` holding APPS-style tests (a JSON
/// string or object with `inputs`, `outputs`, `fn_name`), `data_source`
/// and `extra_info` kept for reward terms.
pub(super) fn verl(map: &Map<String, Value>, ordinal: usize) -> Result<Mapped, String> {
    let prompt = match field(map, "prompt")? {
        Value::String(s) => lf(s),
        Value::Array(msgs) => msgs
            .iter()
            .rev()
            .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
            .and_then(|m| m.get("content"))
            .and_then(Value::as_str)
            .map(lf)
            .ok_or("`prompt` has no message with role \"user\" and string content")?,
        other => return Err(format!("`prompt` is {}", kind_of(other))),
    };
    let truth = field(map, "reward_model")?
        .get("ground_truth")
        .ok_or("`reward_model` has no `ground_truth`")?;
    let source = opt_str(map, "data_source").unwrap_or("verl").to_owned();
    let index = map
        .get("extra_info")
        .and_then(|e| e.get("index"))
        .map(|i| match i {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .unwrap_or_else(|| ordinal.to_string());
    let id = format!("{source}/{index}");
    let truth = json_or_string(truth, "reward_model.ground_truth")?;
    // verl's sandbox_fusion scorer also takes assert snippets appended to the code.
    if let Some(asserts) = truth.get("assert_case").and_then(Value::as_array) {
        let tests: Vec<String> = asserts.iter().filter_map(Value::as_str).map(lf).collect();
        let first = tests.first().ok_or("`ground_truth.assert_case` is empty")?;
        let entry_point = super::entry::mbpp_entry_point(first, None)?;
        let task = Task {
            id,
            prompt,
            entry_point,
            tests,
            tags: vec![source],
            ..Task::default()
        };
        return Ok((task, VERL_KEYS));
    }
    let spec = IoSpec::from_value(&truth, "reward_model.ground_truth")?;
    let task = from_io_spec(id, prompt, &spec, None, None, vec![source], true)?;
    Ok((task, VERL_KEYS))
}

/// Which of these formats a record's keys say it is.
pub(super) fn detect(has: impl Fn(&str) -> bool) -> Option<crate::config::TaskFormat> {
    use crate::config::TaskFormat as F;
    if has("input_output") && has("question") {
        Some(F::Apps)
    } else if has("public_tests") && has("description") {
        Some(F::Codecontests)
    } else if has("question_content") && has("public_test_cases") {
        Some(F::Livecodebench)
    } else if has("question_id") && has("test") && has("solution") {
        Some(F::Kodcode)
    } else if has("reward_model") && has("prompt") {
        Some(F::Verl)
    } else {
        None
    }
}

/// A check of the helpers that needs no records: literals, limits, pickles.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_values_become_the_python_literals_json_loads_gives() {
        let v: Value =
            serde_json::from_str(r#"[1, -2.5, "a\"b\\c\nd", null, true, {"k": [false]}]"#).unwrap();
        assert_eq!(
            py_literal(&v),
            r#"[1, -2.5, "a\"b\\c\nd", None, True, {"k": [False]}]"#
        );
        assert_eq!(py_literal(&Value::from("\u{1}é")), r#""\x01é""#);
    }

    #[test]
    fn limits_read_as_taco_writes_them() {
        assert_eq!(time_limit_ms("1 seconds"), Some(1000));
        assert_eq!(time_limit_ms("2.5 second"), Some(2500));
        assert_eq!(time_limit_ms("500 ms"), Some(500));
        assert_eq!(time_limit_ms("None"), None);
        assert_eq!(memory_limit_mb("256 megabytes"), Some(256));
        assert_eq!(memory_limit_mb("65536 KB"), Some(64));
        assert_eq!(memory_limit_mb("lots"), None);
    }

    /// `pickle.dumps("[{}]")` at protocols 3 and 4 (LiveCodeBench's files
    /// use 4), as CPython writes them; the bytes are in the test so it
    /// needs no Python.
    #[test]
    fn a_pickled_string_is_read_and_anything_else_refused() {
        // protocol 4 and 5: PROTO, FRAME, SHORT_BINUNICODE, MEMOIZE, STOP
        let p4 = b"\x80\x04\x95\x08\x00\x00\x00\x00\x00\x00\x00\x8c\x04[{}]\x94.";
        assert_eq!(pickled_string(p4).unwrap(), "[{}]");
        // protocol 3: PROTO, BINUNICODE, BINPUT, STOP
        let p3 = b"\x80\x03X\x04\x00\x00\x00[{}]q\x00.";
        assert_eq!(pickled_string(p3).unwrap(), "[{}]");
        // `os.system('x')` by REDUCE: refused at GLOBAL, before anything runs.
        let evil = b"\x80\x04\x95\x1c\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94\x8c\x01x\x94\x85\x94R\x94.";
        let e = pickled_string(evil).unwrap_err();
        assert!(e.contains("refusing"), "{e}");
        // a list of strings is not a plain string either
        let list = b"\x80\x04]\x94\x8c\x01a\x94a.";
        assert!(pickled_string(list).is_err());
        assert!(pickled_string(b"\x80\x04\x8c\x05ab").is_err());
    }
}
