//! `[tasks]`: the task file a run trains on and how to read it.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{Problems, Section};

/// On-disk layout of a task file; see `docs/tasks.md`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskFormat {
    /// Detect from the file's first record (and reject gzip with a hint).
    #[default]
    Auto,
    /// falcon-rl's own JSONL, one `Task` per line.
    Jsonl,
    /// OpenAI HumanEval JSONL (`task_id`, `prompt`, `test`, `entry_point`, ...).
    Humaneval,
    /// MBPP: full `mbpp.jsonl` or sanitized `mbpp-sanitized.json`.
    Mbpp,
    /// PriCoder benchmarks (NumbaEval, NdonnxEval) JSONL.
    Pricoder,
    /// APPS and TACO (`question`, `input_output`, `solutions`, `starter_code`).
    Apps,
    /// DeepMind CodeContests (`description`, `public_tests`, `private_tests`, ...).
    Codecontests,
    /// LiveCodeBench `code_generation_lite` (`question_content`, `public_test_cases`, ...).
    Livecodebench,
    /// KodCode (`question`, `solution`, `test` as a pytest file, `test_info`).
    Kodcode,
    /// verl-style RL rows (`prompt` as chat messages, `reward_model.ground_truth`, `extra_info`).
    Verl,
}

impl fmt::Display for TaskFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Jsonl => "jsonl",
            Self::Humaneval => "humaneval",
            Self::Mbpp => "mbpp",
            Self::Pricoder => "pricoder",
            Self::Apps => "apps",
            Self::Codecontests => "codecontests",
            Self::Livecodebench => "livecodebench",
            Self::Kodcode => "kodcode",
            Self::Verl => "verl",
        })
    }
}

/// `[tasks]`: the task set a run trains or evaluates on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TasksConfig {
    /// Task file; `None` means the command must be given one (or uses its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// How to read `path`.
    pub format: TaskFormat,
    /// Skip (and count) malformed records instead of failing the load.
    pub skip_invalid: bool,
    /// Keep only tasks carrying at least one of these tags; empty keeps all.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Column renames for datasets whose names differ from their format's:
    /// `{ question = "problem" }` reads the file's `problem` as `question`.
    /// Applies to every task file the run reads.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub columns: std::collections::BTreeMap<String, String>,
    /// When `path` is a directory: read only this split's data files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split: Option<String>,
}

impl Section for TasksConfig {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        if let Some(p) = &self.path {
            if p.as_os_str().is_empty() {
                problems.push(
                    &format!("{path}.path"),
                    p,
                    "must not be empty; remove the key to leave it unset",
                );
            }
        }
        for (want, found) in &self.columns {
            if want.is_empty() || found.is_empty() {
                problems.push(
                    &format!("{path}.columns.{want}"),
                    found,
                    "a column name must not be empty",
                );
            }
        }
        if self.split.as_deref().is_some_and(|s| s.trim().is_empty()) {
            problems.push(
                &format!("{path}.split"),
                "",
                "must not be empty; remove the key to read every split",
            );
        }
    }
}
