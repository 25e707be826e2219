//! The outcome of running one sample: the error taxonomy of FALCON's Table 11
//! plus wrong answer, MemoryError and Other, its grouping into FALCON's
//! reward classes (Eq. 9) and MemoCoder's four error classes, per-test
//! results, and the report the reward and memory modules read.
//!
//! Sandbox-internal failures are not an [`ErrorKind`]: a sample whose run
//! broke for reasons of ours yields [`ExecReport::no_signal`], never a
//! runtime error of the sample (STYLE.md §6).

use serde::{Deserialize, Serialize};

/// What went wrong in a test (FALCON Table 11 and three more).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ErrorKind {
    SyntaxError,
    IndentationError,
    IndexError,
    TypeError,
    ValueError,
    EOFError,
    Timeout,
    NameError,
    KeyError,
    ImportError,
    ZeroDivisionError,
    RecursionError,
    /// The code ran but an assertion on its result failed.
    WrongAnswer,
    MemoryError,
    /// Any other exception (AttributeError, AssertionError raised by the
    /// candidate itself, a crash by signal, ...).
    Other,
}

/// FALCON's feedback classes (Eq. 9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardClass {
    Pass,
    Failure,
    RuntimeError,
    SyntaxError,
}

/// MemoCoder's four error classes (§2.2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoCoderClass {
    CompileError,
    Exception,
    AssertionFailure,
    Timeout,
}

impl MemoCoderClass {
    /// The name configs and messages use (`compile_error`).
    pub fn name(self) -> &'static str {
        match self {
            MemoCoderClass::CompileError => "compile_error",
            MemoCoderClass::Exception => "exception",
            MemoCoderClass::AssertionFailure => "assertion_failure",
            MemoCoderClass::Timeout => "timeout",
        }
    }
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 15] = [
        ErrorKind::SyntaxError,
        ErrorKind::IndentationError,
        ErrorKind::IndexError,
        ErrorKind::TypeError,
        ErrorKind::ValueError,
        ErrorKind::EOFError,
        ErrorKind::Timeout,
        ErrorKind::NameError,
        ErrorKind::KeyError,
        ErrorKind::ImportError,
        ErrorKind::ZeroDivisionError,
        ErrorKind::RecursionError,
        ErrorKind::WrongAnswer,
        ErrorKind::MemoryError,
        ErrorKind::Other,
    ];

    /// The name results, metrics and messages use: the Python exception's
    /// (`SyntaxError`), or `WrongAnswer`, `Timeout`, `Other`.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::SyntaxError => "SyntaxError",
            ErrorKind::IndentationError => "IndentationError",
            ErrorKind::IndexError => "IndexError",
            ErrorKind::TypeError => "TypeError",
            ErrorKind::ValueError => "ValueError",
            ErrorKind::EOFError => "EOFError",
            ErrorKind::Timeout => "Timeout",
            ErrorKind::NameError => "NameError",
            ErrorKind::KeyError => "KeyError",
            ErrorKind::ImportError => "ImportError",
            ErrorKind::ZeroDivisionError => "ZeroDivisionError",
            ErrorKind::RecursionError => "RecursionError",
            ErrorKind::WrongAnswer => "WrongAnswer",
            ErrorKind::MemoryError => "MemoryError",
            ErrorKind::Other => "Other",
        }
    }

    /// Map a Python exception class name to a kind. Subclasses Python itself
    /// defines map to their base's kind (TabError is an IndentationError,
    /// ModuleNotFoundError an ImportError).
    pub fn from_python_exception(name: &str) -> ErrorKind {
        match name {
            "SyntaxError" => ErrorKind::SyntaxError,
            "IndentationError" | "TabError" => ErrorKind::IndentationError,
            "IndexError" => ErrorKind::IndexError,
            "TypeError" => ErrorKind::TypeError,
            "ValueError" | "UnicodeDecodeError" | "UnicodeEncodeError" => ErrorKind::ValueError,
            "EOFError" => ErrorKind::EOFError,
            "TimeoutError" => ErrorKind::Timeout,
            "NameError" | "UnboundLocalError" => ErrorKind::NameError,
            "KeyError" => ErrorKind::KeyError,
            "ImportError" | "ModuleNotFoundError" => ErrorKind::ImportError,
            "ZeroDivisionError" => ErrorKind::ZeroDivisionError,
            "RecursionError" => ErrorKind::RecursionError,
            "MemoryError" => ErrorKind::MemoryError,
            _ => ErrorKind::Other,
        }
    }

    /// FALCON's class for this kind (Table 11's "Category"; a wrong answer is a failure).
    pub fn reward_class(self) -> RewardClass {
        match self {
            ErrorKind::SyntaxError | ErrorKind::IndentationError => RewardClass::SyntaxError,
            ErrorKind::WrongAnswer => RewardClass::Failure,
            _ => RewardClass::RuntimeError,
        }
    }

    /// MemoCoder's class for this kind.
    pub fn memocoder_class(self) -> MemoCoderClass {
        match self {
            ErrorKind::SyntaxError | ErrorKind::IndentationError => MemoCoderClass::CompileError,
            ErrorKind::WrongAnswer => MemoCoderClass::AssertionFailure,
            ErrorKind::Timeout => MemoCoderClass::Timeout,
            _ => MemoCoderClass::Exception,
        }
    }
}

/// The result of one test of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum TestStatus {
    Pass,
    /// The code ran; the test's check on its result failed.
    Fail,
    /// The code raised, timed out, or was killed.
    Error {
        kind: ErrorKind,
        message: String,
    },
}

/// One test's outcome, with where in the candidate's code it went wrong.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestResult {
    /// Index into the task's `tests`.
    pub index: usize,
    #[serde(flatten)]
    pub status: TestStatus,
    /// 1-based line numbers in the candidate's code.
    pub error_lines: Vec<u32>,
    pub seconds: f64,
}

/// Everything the reward and memory modules need to know about one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecReport {
    /// `None` when the sandbox itself failed: no signal about the sample.
    pub outcome: Option<RewardClass>,
    /// The dominant error kind (the first failing test's), `None` on pass.
    pub error_kind: Option<ErrorKind>,
    /// Union of the failing tests' error lines, sorted.
    pub error_lines: Vec<u32>,
    pub tests: Vec<TestResult>,
    /// Why there is no signal, when `outcome` is `None`.
    pub no_signal: Option<String>,
    /// Tail of captured stdout/stderr (capped).
    pub output_tail: String,
    pub seconds: f64,
}

impl ExecReport {
    /// A report that carries no information about the sample.
    pub fn no_signal(reason: impl Into<String>) -> Self {
        ExecReport {
            outcome: None,
            error_kind: None,
            error_lines: Vec::new(),
            tests: Vec::new(),
            no_signal: Some(reason.into()),
            output_tail: String::new(),
            seconds: 0.0,
        }
    }

    /// Build the report from per-test results: pass when every test passes;
    /// otherwise the class of the first failing test (a syntax error fails
    /// every test alike).
    pub fn from_tests(tests: Vec<TestResult>, output_tail: String, seconds: f64) -> Self {
        if tests.is_empty() {
            return ExecReport::no_signal("the task has no tests");
        }
        let first_bad = tests.iter().find(|t| t.status != TestStatus::Pass);
        let error_kind = first_bad.map(|t| match &t.status {
            TestStatus::Fail => ErrorKind::WrongAnswer,
            TestStatus::Error { kind, .. } => *kind,
            TestStatus::Pass => unreachable!("filtered above"),
        });
        let mut error_lines: Vec<u32> = tests
            .iter()
            .filter(|t| t.status != TestStatus::Pass)
            .flat_map(|t| t.error_lines.iter().copied())
            .collect();
        error_lines.sort_unstable();
        error_lines.dedup();
        ExecReport {
            outcome: Some(error_kind.map_or(RewardClass::Pass, ErrorKind::reward_class)),
            error_kind,
            error_lines,
            tests,
            no_signal: None,
            output_tail,
            seconds,
        }
    }

    /// One word for the outcome, as metrics and evaluation results count
    /// them: `pass`, the dominant error kind (`WrongAnswer`, `NameError`,
    /// ...), or `no_signal`.
    pub fn outcome_label(&self) -> String {
        match (self.outcome, self.error_kind) {
            (None, _) => "no_signal".to_owned(),
            (Some(_), None) => "pass".to_owned(),
            (Some(_), Some(k)) => k.name().to_owned(),
        }
    }

    pub fn n_pass(&self) -> usize {
        self.tests
            .iter()
            .filter(|t| t.status == TestStatus::Pass)
            .count()
    }

    pub fn n_fail(&self) -> usize {
        self.tests.len() - self.n_pass()
    }

    /// `N_error` of FALCON Eq. 11: how many tests ended in each error kind.
    pub fn error_counts(&self) -> std::collections::BTreeMap<ErrorKind, usize> {
        let mut m = std::collections::BTreeMap::new();
        for t in &self.tests {
            let k = match &t.status {
                TestStatus::Pass => continue,
                TestStatus::Fail => ErrorKind::WrongAnswer,
                TestStatus::Error { kind, .. } => *kind,
            };
            *m.entry(k).or_insert(0) += 1;
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_and_class_names_are_their_serialized_names() {
        for k in ErrorKind::ALL {
            assert_eq!(serde_json::to_value(k).unwrap(), k.name());
        }
        for c in [
            MemoCoderClass::CompileError,
            MemoCoderClass::Exception,
            MemoCoderClass::AssertionFailure,
            MemoCoderClass::Timeout,
        ] {
            assert_eq!(serde_json::to_value(c).unwrap(), c.name());
        }
    }

    fn t(index: usize, status: TestStatus, lines: &[u32]) -> TestResult {
        TestResult {
            index,
            status,
            error_lines: lines.to_vec(),
            seconds: 0.0,
        }
    }

    #[test]
    fn outcome_labels() {
        let pass = ExecReport::from_tests(vec![t(0, TestStatus::Pass, &[])], String::new(), 0.0);
        assert_eq!(pass.outcome_label(), "pass");
        let wrong = ExecReport::from_tests(
            vec![t(0, TestStatus::Pass, &[]), t(1, TestStatus::Fail, &[2])],
            String::new(),
            0.0,
        );
        assert_eq!(wrong.outcome_label(), "WrongAnswer");
        assert_eq!(ExecReport::no_signal("x").outcome_label(), "no_signal");
    }

    #[test]
    fn classes_follow_table_11_and_memocoder() {
        assert_eq!(
            ErrorKind::IndentationError.reward_class(),
            RewardClass::SyntaxError
        );
        assert_eq!(ErrorKind::Timeout.reward_class(), RewardClass::RuntimeError);
        assert_eq!(ErrorKind::WrongAnswer.reward_class(), RewardClass::Failure);
        assert_eq!(
            ErrorKind::Timeout.memocoder_class(),
            MemoCoderClass::Timeout
        );
        assert_eq!(
            ErrorKind::KeyError.memocoder_class(),
            MemoCoderClass::Exception
        );
        assert_eq!(
            ErrorKind::from_python_exception("ModuleNotFoundError"),
            ErrorKind::ImportError
        );
        assert_eq!(
            ErrorKind::from_python_exception("AttributeError"),
            ErrorKind::Other
        );
    }

    #[test]
    fn report_counts_and_dominant_kind() {
        let r = ExecReport::from_tests(
            vec![
                t(0, TestStatus::Pass, &[]),
                t(1, TestStatus::Fail, &[7]),
                t(
                    2,
                    TestStatus::Error {
                        kind: ErrorKind::KeyError,
                        message: "k".into(),
                    },
                    &[3, 7],
                ),
            ],
            String::new(),
            0.1,
        );
        assert_eq!((r.n_pass(), r.n_fail()), (1, 2));
        assert_eq!(r.outcome, Some(RewardClass::Failure));
        assert_eq!(r.error_kind, Some(ErrorKind::WrongAnswer));
        assert_eq!(r.error_lines, vec![3, 7]);
        assert_eq!(r.error_counts()[&ErrorKind::KeyError], 1);
        let all = ExecReport::from_tests(vec![t(0, TestStatus::Pass, &[])], String::new(), 0.0);
        assert_eq!(all.outcome, Some(RewardClass::Pass));
        assert!(ExecReport::from_tests(vec![], String::new(), 0.0)
            .outcome
            .is_none());
    }
}
