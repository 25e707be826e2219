//! Tasks: the `Task` record every later stage consumes, and `TaskSet::load`,
//! which reads our own JSONL plus the public benchmark formats (HumanEval,
//! MBPP full and sanitized, PriCoder's NumbaEval/NdonnxEval) into it.
//!
//! Loading is strict by default: a malformed record is an error naming the
//! file, the 1-based line (the array index for JSON-array files) and the
//! reason. With `skip_invalid` such records are skipped and listed in
//! `TaskSet::skipped`, never dropped silently. The per-format mapping lives in
//! `formats`; `docs/tasks.md` documents it for users.

mod formats;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use crate::config::TaskFormat;

/// Errors from loading a task file.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// The file could not be read.
    #[error("cannot read task file {}: {source}", path.display())]
    Io {
        /// The file that was being read.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// One record is malformed. `line` is 1-based for line-based files; for a
    /// file holding one JSON array it is the 0-based array index (the reason
    /// then starts with `array index N`).
    #[error("{}:{line}: {reason}", path.display())]
    Invalid {
        /// The task file.
        path: PathBuf,
        /// 1-based line number, or the array index for JSON-array files.
        line: usize,
        /// What is wrong with the record.
        reason: String,
    },
    /// The format could not be detected, or the file is not in the format asked for.
    #[error("cannot read tasks from {}: {reason}", path.display())]
    UnknownFormat {
        /// The task file.
        path: PathBuf,
        /// Why the format is unknown, and what to do.
        reason: String,
    },
    /// A selection (`tags`, `max_tasks`) left no task.
    #[error("{what}: no task of {} ({total} in all) carries any of the tags {tags:?}", path.display())]
    NoneSelected {
        /// The config section that asked (`[tasks]`, `[eval]`).
        what: String,
        path: PathBuf,
        total: usize,
        tags: Vec<String>,
    },
    /// Writing a task file failed.
    #[error(transparent)]
    Write(#[from] crate::fsutil::WriteError),
}

/// Which tasks of a file a command uses: those carrying any of `tags` (all
/// when empty), at most `max_tasks` of them in file order (0 = all).
#[derive(Debug, Clone, Default)]
pub struct Selection<'a> {
    pub format: TaskFormat,
    pub skip_invalid: bool,
    pub tags: &'a [String],
    pub max_tasks: usize,
    /// Who asked (`[tasks]`, `[eval]`), for the error when nothing is left.
    pub what: &'a str,
}

/// How a task's solution is run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    /// Plain CPython.
    #[default]
    Python,
    /// Python that launches CUDA kernels through `numba.cuda` (needs a GPU or
    /// the CUDA simulator).
    NumbaCuda,
}

impl TaskKind {
    /// The name task files use (`python`, `numba_cuda`).
    pub fn name(self) -> &'static str {
        match self {
            TaskKind::Python => "python",
            TaskKind::NumbaCuda => "numba_cuda",
        }
    }
}

/// One programming task with its unit tests.
///
/// The program that checks one test is: `prelude` (if any), the candidate
/// solution, then `test_setup` (if any), then that one entry of `tests`. Each test snippet is
/// independent of the others, so per-test pass counts are meaningful.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// Unique within a task set, e.g. `mbpp/11`, `HumanEval/0`.
    pub id: String,
    /// What the model is given: a problem statement (MBPP) or a function
    /// signature with docstring (HumanEval, PriCoder).
    pub prompt: String,
    /// Name of the function under test.
    pub entry_point: String,
    /// Independent test snippets, each runnable after the solution and `test_setup`.
    pub tests: Vec<String>,
    /// How the solution is run.
    #[serde(default)]
    pub kind: TaskKind,
    /// A reference solution as a complete program (for HumanEval and PriCoder,
    /// whose sources store only the body, this is `prompt` + body).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canonical_solution: Option<String>,
    /// Library documentation for private-library tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub docs: Option<String>,
    /// Free-form labels (source, split, APIs used).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Code run after the solution and before each test (imports, fixtures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_setup: Option<String>,
    /// Code run before the solution, in the candidate's own process: the
    /// imports its prompt gave it (HumanEval's harness runs the prompt first,
    /// PriCoder's an import preamble), so an answer that rewrites the
    /// prompt's `def f(xs: List[int])` is not a NameError for `List`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prelude: Option<String>,
    /// The record's other fields (an `extra` object in our own format; the
    /// keys a public format has beyond those mapped above), kept for the
    /// user's reward terms, which get them as dataset columns.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// Names an `extra` key may not take: the task's own fields and what a
/// TRL reward function is already passed under that name.
pub const RESERVED_EXTRA_KEYS: &[&str] = &[
    "id",
    "prompt",
    "entry_point",
    "tests",
    "kind",
    "canonical_solution",
    "docs",
    "tags",
    "test_setup",
    "prelude",
    "extra",
    "prompts",
    "completion",
    "completions",
    "completion_ids",
    "exec_report",
    "trainer_state",
    "log_extra",
    "log_metric",
];

impl Task {
    /// Checks the invariants every loader guarantees; returns the first broken one.
    pub fn validate(&self) -> Result<(), String> {
        if self.id.trim().is_empty() {
            return Err("`id` is empty".to_owned());
        }
        if !is_python_identifier(&self.entry_point) {
            return Err(format!(
                "`entry_point` {:?} is not a Python identifier",
                self.entry_point
            ));
        }
        if self.tests.is_empty() {
            return Err("`tests` is empty; a task needs at least one test".to_owned());
        }
        if let Some(i) = self.tests.iter().position(|t| t.trim().is_empty()) {
            return Err(format!("`tests[{i}]` is empty"));
        }
        if let Some(k) = self
            .extra
            .keys()
            .find(|k| RESERVED_EXTRA_KEYS.contains(&k.as_str()))
        {
            return Err(format!(
                "`extra.{k}` would hide the task's own `{k}` from reward functions; rename it"
            ));
        }
        Ok(())
    }
}

/// Whether `s` is an ASCII Python identifier (non-ASCII names are legal
/// Python but absent from every benchmark we read, so we reject them as typos).
pub fn is_python_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Options for [`TaskSet::load`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Skip malformed records (recording them in [`TaskSet::skipped`]) instead of failing.
    pub skip_invalid: bool,
}

/// A record that was skipped under `skip_invalid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedRecord {
    /// 1-based line, or the array index for JSON-array files (as in [`TaskError::Invalid`]).
    pub line: usize,
    /// Why it was skipped.
    pub reason: String,
}

/// The tasks read from one file, in file order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskSet {
    /// The valid tasks, ids unique.
    pub tasks: Vec<Task>,
    /// Records dropped under `skip_invalid`; always empty otherwise.
    pub skipped: Vec<SkippedRecord>,
}

impl TaskSet {
    /// Reads a task file. `TaskFormat::Auto` detects the format from the first
    /// record's keys (see `docs/tasks.md`); gzip files are refused with a hint.
    pub fn load(path: &Path, format: TaskFormat, opts: LoadOptions) -> Result<Self, TaskError> {
        let bytes = std::fs::read(path).map_err(|source| TaskError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(&bytes, path, format, opts)
    }

    /// Parses task-file contents already in memory; `path` is used only in errors.
    pub fn from_bytes(
        bytes: &[u8],
        path: &Path,
        format: TaskFormat,
        opts: LoadOptions,
    ) -> Result<Self, TaskError> {
        if bytes.starts_with(&[0x1f, 0x8b]) {
            return Err(TaskError::UnknownFormat {
                path: path.to_path_buf(),
                reason: "the file is gzip-compressed; decompress it first (gunzip -k FILE)"
                    .to_owned(),
            });
        }
        let text = std::str::from_utf8(bytes).map_err(|e| {
            let line = 1 + bytes[..e.valid_up_to()]
                .iter()
                .filter(|&&b| b == b'\n')
                .count();
            TaskError::Invalid {
                path: path.to_path_buf(),
                line,
                reason: "not valid UTF-8".to_owned(),
            }
        })?;
        Self::parse(text, path, format, opts)
    }

    /// Parses task-file text; `path` is used only in errors.
    pub fn parse(
        text: &str,
        path: &Path,
        format: TaskFormat,
        opts: LoadOptions,
    ) -> Result<Self, TaskError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let records = formats::parse(text, path, format)?;
        let mut set = TaskSet::default();
        let mut first_seen: HashMap<String, String> = HashMap::new();
        for (line, record) in records {
            let result = record.and_then(|task| {
                task.validate()?;
                if let Some(first) = first_seen.get(&task.id) {
                    return Err(format!(
                        "duplicate id {:?} (first seen at {first})",
                        task.id
                    ));
                }
                Ok(task)
            });
            match result {
                Ok(task) => {
                    first_seen.insert(task.id.clone(), line.label());
                    set.tasks.push(task);
                }
                Err(reason) => {
                    let reason = line.describe(reason);
                    if opts.skip_invalid {
                        set.skipped.push(SkippedRecord {
                            line: line.number,
                            reason,
                        });
                    } else {
                        return Err(TaskError::Invalid {
                            path: path.to_path_buf(),
                            line: line.number,
                            reason,
                        });
                    }
                }
            }
        }
        Ok(set)
    }

    /// The tasks as our own JSONL (one object per line), loadable with
    /// `TaskFormat::Jsonl`.
    pub fn to_jsonl(&self) -> String {
        let mut out = String::new();
        for task in &self.tasks {
            // A struct of strings, vectors and enums always serializes.
            out.push_str(&serde_json::to_string(task).expect("Task serializes to JSON"));
            out.push('\n');
        }
        out
    }

    /// Writes [`TaskSet::to_jsonl`] to `path`.
    pub fn write_jsonl(&self, path: &Path) -> Result<(), TaskError> {
        Ok(crate::fsutil::write_atomic(
            path,
            self.to_jsonl().as_bytes(),
        )?)
    }

    /// Number of tasks loaded.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether no task was loaded.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// The task with this id, if any.
    pub fn get(&self, id: &str) -> Option<&Task> {
        self.tasks.iter().find(|t| t.id == id)
    }

    /// The tasks that carry at least one of `tags` (all tasks when `tags`
    /// is empty), in file order.
    pub fn with_any_tag(&self, tags: &[String]) -> TaskSet {
        if tags.is_empty() {
            return self.clone();
        }
        TaskSet {
            tasks: self
                .tasks
                .iter()
                .filter(|t| t.tags.iter().any(|x| tags.contains(x)))
                .cloned()
                .collect(),
            skipped: self.skipped.clone(),
        }
    }

    /// The tasks of `path` that `sel` selects; an error when none is left.
    pub fn load_selected(path: &Path, sel: &Selection) -> Result<TaskSet, TaskError> {
        let all = TaskSet::load(
            path,
            sel.format,
            LoadOptions {
                skip_invalid: sel.skip_invalid,
            },
        )?;
        let mut set = all.with_any_tag(sel.tags);
        if sel.max_tasks > 0 {
            set.tasks.truncate(sel.max_tasks);
        }
        if set.is_empty() {
            return Err(TaskError::NoneSelected {
                what: sel.what.to_owned(),
                path: path.to_path_buf(),
                total: all.len(),
                tags: sel.tags.to_vec(),
            });
        }
        Ok(set)
    }

    /// Iterates over the tasks in file order.
    pub fn iter(&self) -> std::slice::Iter<'_, Task> {
        self.tasks.iter()
    }
}

impl<'a> IntoIterator for &'a TaskSet {
    type Item = &'a Task;
    type IntoIter = std::slice::Iter<'a, Task>;

    fn into_iter(self) -> Self::IntoIter {
        self.tasks.iter()
    }
}

#[cfg(test)]
mod tests;
