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
}

impl fmt::Display for TaskFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Jsonl => "jsonl",
            Self::Humaneval => "humaneval",
            Self::Mbpp => "mbpp",
            Self::Pricoder => "pricoder",
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
    }
}
