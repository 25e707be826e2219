//! SandboxFusion's HTTP API as data: the request and response of
//! `/run_code` and `/submit` (the fields its official client, `sandbox-fusion`
//! 0.3.7, sends and reads), and the pure mappings between them and our
//! [`Script`]s and per-test results. The service and the remote backend both
//! use these, so a falcon service and a SandboxFusion server are
//! interchangeable behind the same URL list.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::outcome::{ErrorKind, TestResult, TestStatus};
use super::script::{Script, ScriptError, ScriptRun, ScriptStatus};
use crate::task::Task;

/// The languages `/run_code` runs here (SandboxFusion knows many more; we
/// answer 400 for those rather than pretend).
pub const LANGUAGES: [&str; 2] = ["python", "python3"];

/// `POST /run_code`'s body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunCodeRequest {
    pub code: String,
    pub language: String,
    #[serde(default = "default_timeout")]
    pub compile_timeout: f64,
    #[serde(default = "default_timeout")]
    pub run_timeout: f64,
    #[serde(default)]
    pub stdin: Option<String>,
    /// Path → base64 content (`null` content = an empty file).
    #[serde(default)]
    pub files: BTreeMap<String, Option<String>>,
    #[serde(default)]
    pub fetch_files: Vec<String>,
    /// SandboxFusion's server-side memory limit (not in the 0.3.7 client's model).
    #[serde(
        default,
        rename = "memory_limit_MB",
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_limit_mb: Option<u64>,
}

fn default_timeout() -> f64 {
    10.0
}

impl RunCodeRequest {
    /// A Python program with no stdin and no files, its run limited to
    /// `run_timeout` seconds.
    pub fn python(code: String, run_timeout: f64) -> RunCodeRequest {
        RunCodeRequest {
            code,
            language: "python".into(),
            compile_timeout: default_timeout(),
            run_timeout,
            stdin: None,
            files: BTreeMap::new(),
            fetch_files: vec![],
            memory_limit_mb: None,
        }
    }
}

/// One command's result (`compile_result` / `run_result`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandRunResult {
    /// `Finished`, `Error` or `TimeLimitExceeded`.
    pub status: String,
    #[serde(default)]
    pub execution_time: Option<f64>,
    #[serde(default)]
    pub cpu_time: Option<f64>,
    #[serde(default)]
    pub return_code: Option<i32>,
    #[serde(default)]
    pub stdout: Option<String>,
    #[serde(default)]
    pub stderr: Option<String>,
}

/// `POST /run_code`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunCodeResponse {
    /// `Success` (exit status 0), `Failed` or `SandboxError`.
    pub status: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub compile_result: Option<CommandRunResult>,
    #[serde(default)]
    pub run_result: Option<CommandRunResult>,
    #[serde(default)]
    pub executor_pod_name: Option<String>,
    #[serde(default)]
    pub files: BTreeMap<String, String>,
}

/// The script a `/run_code` request asks for, or why it cannot run here.
/// `run_timeout` is wall-clock seconds, as SandboxFusion measures it.
pub fn script_from_request(req: RunCodeRequest, max_timeout_s: f64) -> Result<Script, String> {
    if !LANGUAGES.contains(&req.language.as_str()) {
        return Err(format!(
            "language {:?} is not served here; this server runs {}",
            req.language,
            LANGUAGES.join(", ")
        ));
    }
    if !(req.run_timeout > 0.0 && req.run_timeout <= max_timeout_s) {
        return Err(format!(
            "run_timeout = {} must be in (0, {max_timeout_s}] seconds",
            req.run_timeout
        ));
    }
    Ok(Script {
        code: req.code,
        stdin: req.stdin.unwrap_or_default(),
        files: req
            .files
            .into_iter()
            .map(|(k, v)| (k, v.unwrap_or_default()))
            .collect(),
        fetch_files: req.fetch_files,
        timeout_s: Some(req.run_timeout),
        clock: Some(crate::config::ExecClock::Wall),
        memory_mb: req.memory_limit_mb.filter(|&m| m > 0),
    })
}

/// The `/run_code` answer for a script's result.
pub fn response_from_run(run: Result<ScriptRun, ScriptError>) -> RunCodeResponse {
    match run {
        Ok(r) => RunCodeResponse {
            status: if r.succeeded() { "Success" } else { "Failed" }.into(),
            message: String::new(),
            compile_result: None,
            run_result: Some(CommandRunResult {
                status: match r.status {
                    ScriptStatus::Finished => "Finished",
                    ScriptStatus::Timeout => "TimeLimitExceeded",
                }
                .into(),
                execution_time: Some(r.seconds),
                cpu_time: Some(r.cpu_seconds),
                return_code: r.return_code,
                stdout: Some(r.stdout),
                stderr: Some(r.stderr),
            }),
            executor_pod_name: None,
            files: r.files,
        },
        Err(e) => RunCodeResponse {
            status: "SandboxError".into(),
            message: e.to_string(),
            compile_result: None,
            run_result: None,
            executor_pod_name: None,
            files: BTreeMap::new(),
        },
    }
}

/// The script's result a `/run_code` answer carries (the inverse of
/// [`response_from_run`]); `Err` with the server's words when it ran
/// nothing.
pub fn run_from_response(resp: RunCodeResponse) -> Result<ScriptRun, String> {
    let Some(run) = resp.run_result else {
        return Err(format!("{} {}", resp.status, resp.message));
    };
    Ok(ScriptRun {
        status: if run.status == "TimeLimitExceeded" {
            ScriptStatus::Timeout
        } else {
            ScriptStatus::Finished
        },
        return_code: run.return_code,
        stdout: run.stdout.unwrap_or_default(),
        stderr: run.stderr.unwrap_or_default(),
        seconds: run.execution_time.unwrap_or(0.0),
        cpu_seconds: run.cpu_time.unwrap_or(0.0),
        files: resp.files,
    })
}

/// `POST /submit`'s body, for datasets the server does not hold: the test
/// comes in `config.provided_data` as SandboxFusion's AutoEval datasets
/// carry it (`{"test": {"code": ...}}`, appended after the answer's code).
#[derive(Debug, Clone, Deserialize)]
pub struct SubmitRequest {
    #[serde(default)]
    pub dataset: String,
    pub id: serde_json::Value,
    pub completion: String,
    pub config: SubmitConfig,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SubmitConfig {
    #[serde(default)]
    pub language: Option<String>,
    #[serde(default)]
    pub run_timeout: Option<f64>,
    #[serde(default)]
    pub provided_data: Option<serde_json::Value>,
}

/// The test code of a submission, or why there is none.
pub fn submit_test_code(req: &SubmitRequest) -> Result<String, String> {
    if let Some(l) = &req.config.language {
        if !LANGUAGES.contains(&l.as_str()) {
            return Err(format!("language {l:?} is not served here"));
        }
    }
    let data = req.config.provided_data.as_ref().ok_or_else(|| {
        format!(
            "dataset {:?} is not held by this server: give the test in config.provided_data.test.code",
            req.dataset
        )
    })?;
    let data = match data {
        serde_json::Value::Array(rows) => rows
            .iter()
            .find(|r| r.get("id") == Some(&req.id))
            .ok_or_else(|| format!("config.provided_data has no row with id {}", req.id))?,
        other => other,
    };
    data.pointer("/test/code")
        .and_then(|v| v.as_str())
        .map(str::to_owned)
        .ok_or_else(|| "config.provided_data.test.code is missing or not a string".to_owned())
}

/// The code inside the completion's last fenced block (python or bare), or
/// the whole completion when it has none.
pub fn extract_code(completion: &str) -> String {
    let mut blocks = Vec::new();
    let mut rest = completion;
    while let Some(start) = rest.find("```") {
        let after = &rest[start + 3..];
        let Some(nl) = after.find('\n') else { break };
        let lang = after[..nl].trim();
        let body = &after[nl + 1..];
        let Some(end) = body.find("```") else {
            break;
        };
        if lang.is_empty() || lang.starts_with("py") {
            blocks.push(body[..end].to_owned());
        }
        rest = &body[end + 3..];
    }
    blocks.pop().unwrap_or_else(|| completion.to_owned())
}

/// One test of `task` as a standalone program for a server that only runs
/// scripts (`/run_code`), and the line of that program where `code` starts.
pub fn test_program(task: &Task, code: &str, test: usize) -> (String, usize) {
    let mut out = String::new();
    if let Some(p) = task.prelude.as_deref().filter(|p| !p.trim().is_empty()) {
        out.push_str(p);
        if !p.ends_with('\n') {
            out.push('\n');
        }
    }
    let first = out.lines().count() + 1;
    out.push_str(code);
    if !code.ends_with('\n') {
        out.push('\n');
    }
    if let Some(s) = task.test_setup.as_deref().filter(|s| !s.trim().is_empty()) {
        out.push_str(s);
        out.push('\n');
    }
    out.push_str(&task.tests[test]);
    out.push('\n');
    (out, first)
}

/// A test's result from the `/run_code` answer to its [`test_program`]:
/// status 0 passes, an `AssertionError` fails, a time limit is a timeout,
/// any other exception an error of that kind on the candidate's lines.
/// `None` when the server could not run it (no signal).
pub fn test_result_from_response(
    resp: &RunCodeResponse,
    index: usize,
    code_first_line: usize,
    code_lines: usize,
) -> Option<TestResult> {
    let run = resp.run_result.as_ref()?;
    if resp.status == "SandboxError" {
        return None;
    }
    let seconds = run.execution_time.unwrap_or(0.0);
    let status = match (run.status.as_str(), run.return_code) {
        ("TimeLimitExceeded", _) => TestStatus::Error {
            kind: ErrorKind::Timeout,
            message: "time limit exceeded".into(),
        },
        ("Finished", Some(0)) => TestStatus::Pass,
        ("Finished", _) => {
            let stderr = run.stderr.as_deref().unwrap_or("");
            let (name, message) = last_exception(stderr);
            if name == "AssertionError" {
                TestStatus::Fail
            } else {
                TestStatus::Error {
                    kind: if name.is_empty() {
                        ErrorKind::Other
                    } else {
                        ErrorKind::from_python_exception(&name)
                    },
                    message,
                }
            }
        }
        _ => return None,
    };
    let stderr = run.stderr.as_deref().unwrap_or("");
    let mut error_lines: Vec<u32> = if status == TestStatus::Pass {
        Vec::new()
    } else {
        traceback_lines(stderr)
            .into_iter()
            .filter(|&l| l >= code_first_line && l < code_first_line + code_lines)
            .map(|l| (l + 1 - code_first_line) as u32)
            .collect()
    };
    error_lines.sort_unstable();
    error_lines.dedup();
    Some(TestResult {
        index,
        status,
        error_lines,
        seconds,
    })
}

/// The exception a traceback ends with: (type name without module, message).
pub(crate) fn last_exception(stderr: &str) -> (String, String) {
    for line in stderr.lines().rev() {
        if line.starts_with(char::is_whitespace) || line.trim().is_empty() {
            continue;
        }
        let (head, msg) = line.split_once(':').unwrap_or((line, ""));
        let head = head.trim();
        if !head.is_empty()
            && head
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
        {
            let name = head.rsplit('.').next().unwrap_or(head);
            return (name.to_owned(), msg.trim().chars().take(500).collect());
        }
        break;
    }
    (String::new(), String::new())
}

/// Line numbers of the program's own frames (`File "main.py"` or the
/// temporary file a SandboxFusion server writes), innermost last.
pub(crate) fn traceback_lines(stderr: &str) -> Vec<usize> {
    stderr
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let rest = l.strip_prefix("File \"")?;
            let (file, rest) = rest.split_once('"')?;
            let own = file == "main.py"
                || (!file.contains("site-packages")
                    && !file.contains("/lib/python")
                    && !file.starts_with('<'));
            if !own {
                return None;
            }
            let n = rest
                .trim_start_matches(", line ")
                .split(|c: char| !c.is_ascii_digit())
                .next()?;
            n.parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::TaskKind;

    fn task() -> Task {
        Task {
            id: "t".into(),
            prompt: String::new(),
            entry_point: "f".into(),
            tests: vec!["assert f(1) == 2".into(), "assert f(2) == 3".into()],
            kind: TaskKind::Python,
            canonical_solution: None,
            docs: None,
            tags: vec![],
            test_setup: Some("import math".into()),
            prelude: Some("from typing import List\n".into()),
            extra: Default::default(),
            ..Default::default()
        }
    }

    fn finished(rc: i32, stderr: &str) -> RunCodeResponse {
        response_from_run(Ok(ScriptRun {
            status: ScriptStatus::Finished,
            return_code: Some(rc),
            stdout: String::new(),
            stderr: stderr.into(),
            seconds: 0.1,
            cpu_seconds: 0.1,
            files: BTreeMap::new(),
        }))
    }

    #[test]
    fn a_test_program_puts_prelude_code_setup_and_test_in_order() {
        let (p, first) = test_program(&task(), "def f(x):\n    return x + 1", 1);
        assert_eq!(
            p,
            "from typing import List\ndef f(x):\n    return x + 1\nimport math\nassert f(2) == 3\n"
        );
        assert_eq!(first, 2);
    }

    #[test]
    fn exit_status_and_traceback_become_a_test_result() {
        let pass = test_result_from_response(&finished(0, ""), 0, 2, 2).unwrap();
        assert_eq!(pass.status, TestStatus::Pass);
        let tb = "Traceback (most recent call last):\n  File \"main.py\", line 5, in <module>\n  File \"main.py\", line 3, in f\nZeroDivisionError: division by zero\n";
        let err = test_result_from_response(&finished(1, tb), 1, 2, 2).unwrap();
        assert_eq!(
            err.status,
            TestStatus::Error {
                kind: ErrorKind::from_python_exception("ZeroDivisionError"),
                message: "division by zero".into()
            }
        );
        // Line 3 of the program is line 2 of the candidate's code; line 5 is the test.
        assert_eq!(err.error_lines, vec![2]);
        let fail = test_result_from_response(
            &finished(
                1,
                "Traceback...\n  File \"main.py\", line 5\nAssertionError\n",
            ),
            0,
            2,
            2,
        )
        .unwrap();
        assert_eq!(fail.status, TestStatus::Fail);
        let mut tle = finished(0, "");
        tle.run_result.as_mut().unwrap().status = "TimeLimitExceeded".into();
        assert!(matches!(
            test_result_from_response(&tle, 0, 1, 1).unwrap().status,
            TestStatus::Error {
                kind: ErrorKind::Timeout,
                ..
            }
        ));
        let broken = response_from_run(Err(ScriptError::Sandbox("pool".into())));
        assert_eq!(broken.status, "SandboxError");
        assert!(test_result_from_response(&broken, 0, 1, 1).is_none());
    }

    #[test]
    fn a_run_survives_the_trip_through_a_response() {
        let run = ScriptRun {
            status: ScriptStatus::Timeout,
            return_code: None,
            stdout: "a".into(),
            stderr: "b".into(),
            seconds: 1.5,
            cpu_seconds: 1.0,
            files: [("o".to_owned(), "aGk=".to_owned())].into(),
        };
        assert_eq!(
            run_from_response(response_from_run(Ok(run.clone()))),
            Ok(run)
        );
        let err = run_from_response(response_from_run(Err(ScriptError::Sandbox("x".into()))));
        assert_eq!(err, Err("SandboxError x".to_owned()));
    }

    #[test]
    fn requests_for_other_languages_or_timeouts_are_refused() {
        let req = |language: &str, run_timeout| RunCodeRequest {
            language: language.into(),
            ..RunCodeRequest::python("print(1)".into(), run_timeout)
        };
        assert!(script_from_request(req("cpp", 1.0), 60.0)
            .unwrap_err()
            .contains("\"cpp\""));
        assert!(script_from_request(req("python", 0.0), 60.0).is_err());
        assert!(script_from_request(req("python", 61.0), 60.0).is_err());
        let s = script_from_request(req("python", 2.0), 60.0).unwrap();
        assert_eq!(s.timeout_s, Some(2.0));
    }

    #[test]
    fn code_comes_from_the_last_python_fence() {
        assert_eq!(extract_code("x = 1"), "x = 1");
        assert_eq!(
            extract_code("a\n```python\nx = 1\n```\nb\n```\ny = 2\n```\n```bash\nls\n```"),
            "y = 2\n"
        );
    }

    #[test]
    fn a_submission_finds_its_test_in_provided_data() {
        let req: SubmitRequest = serde_json::from_value(serde_json::json!({
            "dataset": "mine", "id": 3, "completion": "x",
            "config": {"provided_data": [{"id": 3, "test": {"code": "assert x"}}]}
        }))
        .unwrap();
        assert_eq!(submit_test_code(&req).unwrap(), "assert x");
        let req: SubmitRequest = serde_json::from_value(serde_json::json!({
            "dataset": "humaneval_python", "id": 0, "completion": "x", "config": {}
        }))
        .unwrap();
        assert!(submit_test_code(&req)
            .unwrap_err()
            .contains("humaneval_python"));
    }
}
