//! HumanEval+ and MBPP+ (EvalPlus): a record's `base_input` and
//! `plus_input` become the task's tests, each expected value computed once
//! from the canonical solution in the sandbox (EvalPlus computes them the
//! same way) and cached under falcon's cache directory, so later loads
//! run nothing. The base inputs come first, one test each; the plus inputs
//! follow in tests of [`PLUS_PER_TEST`]; `extra.evalplus_base_tests` says
//! how many are base, so evaluation reports base and plus pass@k side by
//! side as EvalPlus does.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

use crate::exec::{Sandbox, Script};
use crate::task::{py_literal, Task, TaskKind, TaskSet};

/// The `extra` key holding the number of base tests of an expanded task.
pub const BASE_TESTS_KEY: &str = "evalplus_base_tests";

/// Plus inputs per test: EvalPlus judges the plus set as a whole, so a
/// test per input would only multiply processes.
pub const PLUS_PER_TEST: usize = 25;

/// Inputs one canonical run computes (its output must fit what a script returns).
const INPUTS_PER_RUN: usize = 200;

/// EvalPlus's comparison (`evalplus/eval/__init__.py`): equal, or within
/// `atol` (1e-6 for float results when the task sets none) with rtol 1e-7.
const PLUS_EQUAL: &str = r#"def _plus_equal(out, exp, atol):
    if out == exp:
        return True
    def _floats(x):
        if isinstance(x, float):
            return True
        return isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(i, float) for i in x)
    if atol == 0 and _floats(exp):
        atol = 1e-6
    if atol == 0:
        return False
    a = list(out) if isinstance(out, (list, tuple)) else [out]
    b = list(exp) if isinstance(exp, (list, tuple)) else [exp]
    try:
        return len(a) == len(b) and all(abs(x - y) <= atol + 1e-7 * abs(y) for x, y in zip(a, b))
    except TypeError:
        return False
"#;

/// Prints each result as Python source that rebuilds it exactly, or `!`
/// and the exception's name.
const RUNNER: &str = r#"
import json as _json
def _lit(x, depth=0):
    if depth > 50:
        raise ValueError("nested too deeply")
    t = type(x)
    if x is None or t is bool or t is int or t is str or t is bytes:
        return repr(x)
    if t is float:
        if x != x:
            return "float('nan')"
        if x in (float('inf'), float('-inf')):
            return "float('%s')" % ('inf' if x > 0 else '-inf')
        return repr(x)
    if t is list:
        return "[" + ", ".join(_lit(i, depth + 1) for i in x) + "]"
    if t is tuple:
        return "(" + "".join(_lit(i, depth + 1) + ", " for i in x) + ")"
    if t is set or t is frozenset:
        items = sorted((_lit(i, depth + 1) for i in x))
        body = ", ".join(items)
        return ("set()" if not items else "{" + body + "}") if t is set else "frozenset([" + body + "])"
    if t is dict:
        return "{" + ", ".join(_lit(k, depth + 1) + ": " + _lit(v, depth + 1) for k, v in x.items()) + "}"
    raise TypeError("cannot write a %s as a literal" % t.__name__)
for _args in _json.loads(_INPUTS):
    try:
        print(_lit(_ENTRY(*_args)))
    except BaseException as _e:
        print("!" + type(_e).__name__)
"#;

/// Errors from expanding EvalPlus tasks.
#[derive(Debug, thiserror::Error)]
pub enum PlusError {
    /// The canonical solution could not be run on a task's inputs.
    #[error("EvalPlus task {id}: {reason}")]
    Canonical { id: String, reason: String },
}

/// The inputs of an EvalPlus record, if it is one that is not yet expanded.
fn inputs(task: &Task) -> Option<(Vec<Value>, Vec<Value>)> {
    if task.extra.contains_key(BASE_TESTS_KEY) || task.kind != TaskKind::Python {
        return None;
    }
    let list = |k: &str| task.extra.get(k).and_then(Value::as_array).cloned();
    let (base, plus) = (list("base_input"), list("plus_input"));
    if base.is_none() && plus.is_none() {
        return None;
    }
    Some((base.unwrap_or_default(), plus.unwrap_or_default()))
}

/// Whether `set` holds EvalPlus records still to expand.
pub fn needs_expansion(set: &TaskSet) -> bool {
    set.iter().any(|t| inputs(t).is_some())
}

fn cache_path(task: &Task, base: &[Value], plus: &[Value]) -> PathBuf {
    let b = serde_json::to_string(base).unwrap_or_default();
    let p = serde_json::to_string(plus).unwrap_or_default();
    let h = crate::text::fnv1a(&[
        task.id.as_bytes(),
        task.entry_point.as_bytes(),
        task.prelude.as_deref().unwrap_or("").as_bytes(),
        task.canonical_solution.as_deref().unwrap_or("").as_bytes(),
        b.as_bytes(),
        p.as_bytes(),
    ]);
    crate::config::cache_dir()
        .join("evalplus")
        .join(format!("{h:016x}.json"))
}

/// Replaces the tests of every EvalPlus record of `set` by its base and
/// plus inputs with expected values; returns how many tasks were expanded.
/// Inputs on which the canonical solution itself raises are left out, as
/// EvalPlus's ground truth has none.
pub fn expand(set: &mut TaskSet, sandbox: &Sandbox) -> Result<usize, PlusError> {
    let mut n = 0;
    for task in &mut set.tasks {
        let Some((base, plus)) = inputs(task) else {
            continue;
        };
        let all: Vec<Value> = base.iter().chain(&plus).cloned().collect();
        if all.is_empty() {
            // No inputs to run: the record's own tests are its base tests.
            let n_base = task.tests.len();
            task.extra
                .insert(BASE_TESTS_KEY.into(), Value::from(n_base));
            n += 1;
            continue;
        }
        let path = cache_path(task, &base, &plus);
        let expected: Vec<Option<String>> = match std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
        {
            Some(e) => e,
            None => {
                let e = compute(task, &all, sandbox)?;
                if let Ok(bytes) = serde_json::to_vec(&e) {
                    if let Some(dir) = path.parent() {
                        let _ = std::fs::create_dir_all(dir);
                    }
                    // A cache: a failed write only costs the next load a rerun.
                    let _ = crate::fsutil::write_atomic(&path, &bytes);
                }
                e
            }
        };
        let atol = task
            .extra
            .get("atol")
            .and_then(Value::as_f64)
            .unwrap_or(0.0);
        let call = |args: &Value, want: &str| {
            let args = match args {
                Value::Array(a) => a.iter().map(py_literal).collect::<Vec<_>>().join(", "),
                other => py_literal(other),
            };
            format!(
                "assert _plus_equal({}({args}), {want}, {atol:?})",
                task.entry_point
            )
        };
        let mut tests = Vec::new();
        for (args, want) in base.iter().zip(&expected) {
            if let Some(w) = want {
                tests.push(call(args, w));
            }
        }
        let n_base = tests.len();
        let plus_asserts: Vec<String> = plus
            .iter()
            .zip(&expected[base.len()..])
            .filter_map(|(args, want)| want.as_ref().map(|w| call(args, w)))
            .collect();
        for chunk in plus_asserts.chunks(PLUS_PER_TEST) {
            tests.push(chunk.join("\n"));
        }
        if tests.is_empty() {
            return Err(PlusError::Canonical {
                id: task.id.clone(),
                reason: "the canonical solution raised on every input".into(),
            });
        }
        task.tests = tests;
        task.test_setup = Some(match task.test_setup.take() {
            Some(s) => format!("{s}\n{PLUS_EQUAL}"),
            None => PLUS_EQUAL.to_owned(),
        });
        task.extra
            .insert(BASE_TESTS_KEY.into(), Value::from(n_base));
        if !task.tags.iter().any(|t| t == "evalplus") {
            task.tags.push("evalplus".into());
        }
        n += 1;
    }
    Ok(n)
}

/// Each input's expected value as Python source, `None` where the
/// canonical solution raised.
fn compute(
    task: &Task,
    all: &[Value],
    sandbox: &Sandbox,
) -> Result<Vec<Option<String>>, PlusError> {
    let fail = |reason: String| PlusError::Canonical {
        id: task.id.clone(),
        reason,
    };
    let canonical = task
        .canonical_solution
        .as_deref()
        .ok_or_else(|| fail("no canonical solution to compute the expected outputs from".into()))?;
    let mut out = Vec::with_capacity(all.len());
    for chunk in all.chunks(INPUTS_PER_RUN) {
        let json = serde_json::to_string(chunk).map_err(|e| fail(e.to_string()))?;
        let code = format!(
            "{}\n{canonical}\n_ENTRY = {}\n_INPUTS = {}\n{RUNNER}",
            task.prelude.as_deref().unwrap_or(""),
            task.entry_point,
            py_literal(&Value::String(json)),
        );
        let run = sandbox
            .run_script(&Script {
                code,
                timeout_s: Some(120.0),
                ..Script::default()
            })
            .map_err(|e| {
                fail(format!(
                    "the sandbox could not run the canonical solution: {e}"
                ))
            })?;
        if !run.succeeded() {
            let tail: Vec<&str> = run.stderr.lines().rev().take(4).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(fail(format!(
                "the canonical solution failed: {}",
                tail.join(" | ")
            )));
        }
        let lines: Vec<&str> = run.stdout.lines().collect();
        if lines.len() != chunk.len() {
            return Err(fail(format!(
                "{} results for {} inputs (output over {} bytes?)",
                lines.len(),
                chunk.len(),
                crate::exec::SCRIPT_OUTPUT_BYTES
            )));
        }
        out.extend(
            lines
                .into_iter()
                .map(|l| (!l.starts_with('!')).then(|| l.to_owned())),
        );
    }
    Ok(out)
}

/// Per-task base pass of a report: every base test passed.
pub fn base_passed(task: &Task, report: &crate::exec::ExecReport) -> Option<bool> {
    let n = task.extra.get(BASE_TESTS_KEY)?.as_u64()? as usize;
    Some(
        report.no_signal.is_none()
            && report.tests.len() >= n
            && report
                .tests
                .iter()
                .filter(|t| t.index < n)
                .all(|t| t.status == crate::exec::TestStatus::Pass),
    )
}

/// Base pass@k by k over the tasks that have base tests.
pub fn base_pass_at(results: &[super::TaskResult], ks: &[usize]) -> BTreeMap<String, f64> {
    let with: Vec<(usize, usize)> = results
        .iter()
        .filter_map(|t| t.base_passed.map(|c| (t.n, c)))
        .collect();
    if with.is_empty() {
        return BTreeMap::new();
    }
    ks.iter()
        .filter(|&&k| with.iter().all(|&(n, _)| k <= n && n > 0))
        .map(|&k| {
            let mean = with
                .iter()
                .map(|&(n, c)| super::pass_at_k(n, c, k))
                .sum::<f64>()
                / with.len() as f64;
            (k.to_string(), mean)
        })
        .collect()
}
