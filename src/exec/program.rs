//! Program tasks (`kind = "stdio"`): the candidate is a whole program, run
//! once per test with that test's stdin, and its stdout is judged here, on
//! the trusted side, against the task's expected output. The expected
//! outputs never enter the sandbox, so no program can read or forge them.
//! The local pool runs a sample's tests in one job, in turn in one candidate
//! process (as LiveCodeBench's and verl's runners do; a fresh process after
//! a test that ends it); a remote backend (`falcon sandbox serve`,
//! SandboxFusion's `run_code`) runs one [`Script`] per test, as verl calls
//! SandboxFusion. The verdicts are the same.
//!
//! The comparison is APPS's and LiveCodeBench's ([`Checker`]); a wrong
//! answer's report says where the output first differs.

use super::fusion::{last_exception, traceback_lines};
use super::outcome::{ErrorKind, ExecReport, TestResult, TestStatus};
use super::script::{Script, ScriptError, ScriptRun, ScriptStatus};
use super::Sandbox;
use crate::task::{Checker, Task};

/// How far a program's output may be from the expected one when both are
/// numbers: numpy's `allclose` defaults, as APPS compares them.
const RTOL: f64 = 1e-5;
const ATOL: f64 = 1e-8;

/// Characters of each side a wrong answer's report shows.
const SHOWN: usize = 80;

/// Runs `code` on every test of the program task `task`.
pub(crate) fn run(sandbox: &Sandbox, task: &Task, code: &str) -> ExecReport {
    let cfg = sandbox.config();
    let timeout_s = task
        .time_limit_ms
        .map_or(cfg.timeout_s, |ms| ms as f64 / 1000.0);
    let memory_mb = task.memory_limit_mb.map(|m| m.min(cfg.memory_mb));
    let mut tests = Vec::with_capacity(task.tests.len());
    let mut notes = String::new();
    let cap = cfg.output_bytes.max(super::SCRIPT_OUTPUT_BYTES);
    let mut push = |i: usize, mut run: ScriptRun, tests: &mut Vec<TestResult>| {
        if run.stdout.len() >= cap && run.return_code == Some(0) {
            // Only the tail of a flood comes back; it must never be judged.
            run.stdout = format!("<more than {cap} bytes of output>");
        }
        let (result, note) = judge(i, &run, &task.outputs[i], task.checker, timeout_s);
        if let Some(note) = note.filter(|_| notes.len() < 2048) {
            notes.push_str(&note);
            notes.push('\n');
        }
        tests.push(result);
    };
    // The local pool runs every test in one job; a remote service, one
    // script per test.
    match sandbox.run_programs(code, &task.tests, timeout_s, memory_mb) {
        Some(Ok(runs)) => {
            for (i, run) in runs.into_iter().enumerate() {
                push(i, run, &mut tests);
            }
        }
        Some(Err(e)) => return ExecReport::no_signal(e.to_string()),
        None => {
            for (i, stdin) in task.tests.iter().enumerate() {
                // A program that does not compile fails every test alike.
                if let Some(first) = tests.first().filter(|_| i > 0).and_then(compile_error) {
                    tests.push(TestResult { index: i, ..first });
                    continue;
                }
                let script = Script {
                    code: code.to_owned(),
                    stdin: stdin.clone(),
                    timeout_s: Some(timeout_s),
                    memory_mb,
                    ..Script::default()
                };
                match sandbox.run_script(&script) {
                    Ok(run) => push(i, run, &mut tests),
                    Err(ScriptError::BadRequest(e) | ScriptError::Sandbox(e)) => {
                        return ExecReport::no_signal(format!("test {i}: {e}"));
                    }
                }
            }
        }
    }
    ExecReport::from_tests(tests, notes, 0.0)
}

/// A copy of a result that every later test shares: a compile error.
fn compile_error(first: &TestResult) -> Option<TestResult> {
    match &first.status {
        TestStatus::Error {
            kind: ErrorKind::SyntaxError | ErrorKind::IndentationError,
            ..
        } => Some(TestResult {
            seconds: 0.0,
            ..first.clone()
        }),
        _ => None,
    }
}

/// Test `index`'s verdict from its run, and a line for the report when it
/// did not pass (the first difference, or the error).
fn judge(
    index: usize,
    run: &ScriptRun,
    expected: &str,
    checker: Checker,
    timeout_s: f64,
) -> (TestResult, Option<String>) {
    let result = |status, error_lines| TestResult {
        index,
        status,
        error_lines,
        seconds: run.seconds,
    };
    if run.status == ScriptStatus::Timeout {
        let message = format!("time limit of {timeout_s} s exceeded");
        let note = format!("test {index}: {message}");
        let status = TestStatus::Error {
            kind: ErrorKind::Timeout,
            message,
        };
        return (result(status, Vec::new()), Some(note));
    }
    if run.return_code != Some(0) {
        let (name, message) = last_exception(&run.stderr);
        let kind = if name.is_empty() {
            ErrorKind::Other
        } else {
            ErrorKind::from_python_exception(&name)
        };
        let message = match (name.is_empty(), run.return_code) {
            (false, _) => format!("{name}: {message}"),
            (true, Some(rc)) if rc < 0 => format!("killed by signal {}", -rc),
            (true, rc) => format!("exit status {}", rc.unwrap_or(-1)),
        };
        let mut lines: Vec<u32> = traceback_lines(&run.stderr)
            .into_iter()
            .filter_map(|l| u32::try_from(l).ok())
            .collect();
        lines.sort_unstable();
        lines.dedup();
        let note = format!("test {index}: {message}");
        return (
            result(TestStatus::Error { kind, message }, lines),
            Some(note),
        );
    }
    match compare(expected, &run.stdout, checker) {
        Ok(()) => (result(TestStatus::Pass, Vec::new()), None),
        Err(diff) => (
            result(TestStatus::Fail, Vec::new()),
            Some(format!("test {index}: wrong output: {diff}")),
        ),
    }
}

/// Whether `got` is `expected` under `checker`; `Err` says where it first
/// differs.
pub fn compare(expected: &str, got: &str, checker: Checker) -> Result<(), String> {
    if checker == Checker::Exact {
        if expected == got {
            return Ok(());
        }
        let at = expected
            .bytes()
            .zip(got.bytes())
            .position(|(a, b)| a != b)
            .unwrap_or(expected.len().min(got.len()));
        let at = floor_boundary(expected, at).min(floor_boundary(got, at));
        return Err(format!(
            "byte {at}: expected {}, got {}",
            shown(&expected[at..]),
            shown(&got[at..])
        ));
    }
    let want = stripped_lines(expected);
    let have = stripped_lines(got);
    for (n, (w, h)) in want.iter().zip(&have).enumerate() {
        let same = w == h || (checker == Checker::Tokens && same_tokens(w, h));
        if !same {
            return Err(format!(
                "line {}: expected {}, got {}",
                n + 1,
                shown(w),
                shown(h)
            ));
        }
    }
    if want.len() != have.len() {
        return Err(format!(
            "{} lines expected, {} printed{}",
            want.len(),
            have.len(),
            match have.get(want.len()) {
                Some(extra) => format!(" (line {} is {})", want.len() + 1, shown(extra)),
                None => String::new(),
            }
        ));
    }
    Ok(())
}

/// The output stripped as a whole, split at line breaks, each line stripped
/// (LiveCodeBench's `get_stripped_lines`; `\r\n` reads as `\n`).
fn stripped_lines(s: &str) -> Vec<&str> {
    s.trim().split('\n').map(str::trim).collect()
}

fn same_tokens(want: &str, have: &str) -> bool {
    let w: Vec<&str> = want.split_whitespace().collect();
    let h: Vec<&str> = have.split_whitespace().collect();
    w.len() == h.len()
        && w.iter().zip(&h).all(|(a, b)| {
            a == b
                || match (number(a), number(b)) {
                    (Some(x), Some(y)) => (x - y).abs() <= ATOL + RTOL * x.abs(),
                    _ => false,
                }
        })
}

/// A token as a finite number (`1`, `-2.50`, `1e-3`), as Python's `float`
/// reads the ones programs print.
fn number(s: &str) -> Option<f64> {
    let ok = s
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+' | b'e' | b'E'));
    s.parse::<f64>().ok().filter(|x| ok && x.is_finite())
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// `s` quoted, cut to [`SHOWN`] characters.
fn shown(s: &str) -> String {
    let cut: String = s.chars().take(SHOWN).collect();
    if cut.len() < s.len() {
        format!("{cut:?}…")
    } else {
        format!("{cut:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_compare_line_by_line_token_by_token_and_as_numbers() {
        let t = |e: &str, g: &str| compare(e, g, Checker::Tokens);
        assert!(t("3\n", "3").is_ok());
        assert!(t("1 2\n3\n", "  1   2  \r\n3\n\n\n").is_ok());
        assert!(t("0.333333333", "0.33333333").is_ok());
        assert!(t("1000", "1e3").is_ok());
        assert!(t("YES", "YES\n").is_ok());
        assert_eq!(
            t("1 2\n3", "1 2\n4").unwrap_err(),
            r#"line 2: expected "3", got "4""#
        );
        assert!(t("0.5", "0.51").is_err());
        assert!(t("yes", "YES").is_err());
        // A blank line inside the output is a line, as in LiveCodeBench.
        assert!(t("1\n\n2", "1\n2").is_err());
        assert_eq!(
            t("1", "1\n2").unwrap_err(),
            r#"1 lines expected, 2 printed (line 2 is "2")"#
        );
        assert_eq!(t("1\n2", "1").unwrap_err(), "2 lines expected, 1 printed");
        // Words are never numbers, and `nan` never matches a number.
        assert!(t("inf", "infinity").is_err());
        assert!(t("nan", "nan").is_ok());
        assert!(t("1", "nan").is_err());
    }

    #[test]
    fn the_lines_and_exact_checkers_are_stricter() {
        assert!(compare("1.0", "1.00", Checker::Lines).is_err());
        assert!(compare(" a \n", "a", Checker::Lines).is_ok());
        assert!(compare("a\n", "a\n", Checker::Exact).is_ok());
        assert_eq!(
            compare("a\n", "a", Checker::Exact).unwrap_err(),
            r#"byte 1: expected "\n", got """#
        );
        assert!(compare("é1", "é2", Checker::Exact)
            .unwrap_err()
            .starts_with("byte 2"));
    }

    fn run(rc: Option<i32>, stdout: &str, stderr: &str) -> ScriptRun {
        ScriptRun {
            status: if rc.is_some() {
                ScriptStatus::Finished
            } else {
                ScriptStatus::Timeout
            },
            return_code: rc,
            stdout: stdout.into(),
            stderr: stderr.into(),
            seconds: 0.1,
            cpu_seconds: 0.1,
            files: Default::default(),
        }
    }

    #[test]
    fn a_run_becomes_pass_wrong_answer_error_or_timeout() {
        let j = |r: &ScriptRun| judge(0, r, "3\n", Checker::Tokens, 2.0);
        assert_eq!(j(&run(Some(0), "3\n", "")).0.status, TestStatus::Pass);
        let (wrong, note) = j(&run(Some(0), "4\n", ""));
        assert_eq!(wrong.status, TestStatus::Fail);
        assert!(note.unwrap().contains(r#"expected "3", got "4""#));
        let tb = "Traceback (most recent call last):\n  File \"main.py\", line 2, in <module>\n    print(1 // 0)\nZeroDivisionError: integer division or modulo by zero\n";
        let (err, _) = j(&run(Some(1), "", tb));
        assert_eq!(err.error_lines, [2]);
        assert!(matches!(
            err.status,
            TestStatus::Error {
                kind: ErrorKind::ZeroDivisionError,
                ..
            }
        ));
        let (t, note) = j(&run(None, "", ""));
        assert!(matches!(
            t.status,
            TestStatus::Error {
                kind: ErrorKind::Timeout,
                ..
            }
        ));
        assert!(note.unwrap().contains("2 s"));
        let (k, _) = j(&run(Some(-9), "", ""));
        assert!(
            matches!(k.status, TestStatus::Error { kind: ErrorKind::Other, ref message } if message == "killed by signal 9")
        );
        // A program that printed the right answer and then crashed fails.
        let (c, _) = j(&run(Some(1), "3\n", "MemoryError\n"));
        assert!(matches!(
            c.status,
            TestStatus::Error {
                kind: ErrorKind::MemoryError,
                ..
            }
        ));
    }
}
