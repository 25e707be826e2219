//! Tasks: the `Task` record every later stage consumes, and `TaskSet::load`,
//! which reads our own JSONL plus the public benchmark formats (HumanEval,
//! MBPP full and sanitized, PriCoder's NumbaEval/NdonnxEval) and the
//! code-RL data formats (APPS/TACO, CodeContests, LiveCodeBench, KodCode,
//! verl rows; `contest`) into it.
//!
//! Loading is strict by default: a malformed record is an error naming the
//! file, the 1-based line (the array index for JSON-array files) and the
//! reason. With `skip_invalid` such records are skipped and listed in
//! `TaskSet::skipped`, never dropped silently. The per-format mapping lives in
//! `formats`; `docs/tasks.md` documents it for users.

mod columnar;
mod contest;
mod entry;
mod formats;

pub use contest::py_literal;

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
    pub load: LoadOptions,
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
    /// A whole program that reads stdin and writes stdout (competitive
    /// programming): each test is its stdin, with the expected stdout in
    /// [`Task::outputs`].
    Stdio,
}

impl TaskKind {
    /// The name task files use (`python`, `numba_cuda`, `stdio`).
    pub fn name(self) -> &'static str {
        match self {
            TaskKind::Python => "python",
            TaskKind::NumbaCuda => "numba_cuda",
            TaskKind::Stdio => "stdio",
        }
    }
}

/// How a program task's output is compared with the expected output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Checker {
    /// APPS / LiveCodeBench: the outputs, stripped, line by line (each
    /// line stripped); lines that differ as text match when their
    /// whitespace-separated tokens do, a token matching when the two are
    /// equal or both are numbers within `1e-8 + 1e-5·|expected|`.
    #[default]
    Tokens,
    /// Line by line after stripping, as text only.
    Lines,
    /// Byte for byte.
    Exact,
}

impl Checker {
    /// The name task files use.
    pub fn name(self) -> &'static str {
        match self {
            Checker::Tokens => "tokens",
            Checker::Lines => "lines",
            Checker::Exact => "exact",
        }
    }

    fn is_default(&self) -> bool {
        *self == Checker::Tokens
    }
}

/// One programming task with its unit tests.
///
/// For function tasks (`python`, `numba_cuda`) the program that checks one
/// test is: `prelude` (if any), the candidate solution, then `test_setup` (if
/// any), then that one entry of `tests`. Each test snippet is independent of
/// the others, so per-test pass counts are meaningful. For program tasks
/// (`stdio`) each entry of `tests` is one run's stdin and the same entry of
/// `outputs` what it must print.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// Unique within a task set, e.g. `mbpp/11`, `HumanEval/0`.
    pub id: String,
    /// What the model is given: a problem statement (MBPP) or a function
    /// signature with docstring (HumanEval, PriCoder).
    pub prompt: String,
    /// Name of the function under test (empty for program tasks).
    #[serde(default)]
    pub entry_point: String,
    /// Independent test snippets, each runnable after the solution and
    /// `test_setup`; for program tasks, each test's stdin.
    pub tests: Vec<String>,
    /// For program tasks: the expected stdout of each test, in the order of
    /// `tests`. Never sent into the sandbox: the comparison is the trusted side's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<String>,
    /// For program tasks: how `outputs` are compared.
    #[serde(default, skip_serializing_if = "Checker::is_default")]
    pub checker: Checker,
    /// The time limit of one test in milliseconds, measured on `[exec]
    /// clock` (default: `[exec] timeout_s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_ms: Option<u64>,
    /// The memory (address-space) limit of one test in MiB (default:
    /// `[exec] memory_mb`; a task can only lower it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_mb: Option<u64>,
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
    "outputs",
    "checker",
    "time_limit_ms",
    "memory_limit_mb",
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
        if self.kind == TaskKind::Stdio {
            return self.validate_program();
        }
        if !self.outputs.is_empty() {
            return Err(format!(
                "`outputs` is only for program tasks, and this one has kind {:?}; \
                 set \"kind\": \"stdio\" if its tests are stdin inputs",
                self.kind.name()
            ));
        }
        if self.memory_limit_mb.is_some() {
            return Err(
                "`memory_limit_mb` is only for program tasks (kind \"stdio\"); function tasks run under [exec] memory_mb".to_owned(),
            );
        }
        if self.entry_point.is_empty() {
            return Err(
                "missing field `entry_point`: a function task names the function its tests call"
                    .to_owned(),
            );
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
        self.validate_common()
    }

    fn validate_program(&self) -> Result<(), String> {
        if self.tests.is_empty() {
            return Err(
                "`tests` is empty; a program task needs at least one (stdin, output) pair"
                    .to_owned(),
            );
        }
        if self.tests.len() != self.outputs.len() {
            return Err(format!(
                "{} test inputs but {} `outputs`; a program task needs one expected output per input",
                self.tests.len(),
                self.outputs.len()
            ));
        }
        if !self.entry_point.is_empty() && !is_python_identifier(&self.entry_point) {
            return Err(format!(
                "`entry_point` {:?} is not a Python identifier",
                self.entry_point
            ));
        }
        self.validate_common()
    }

    fn validate_common(&self) -> Result<(), String> {
        if self.time_limit_ms == Some(0) {
            return Err("`time_limit_ms` is 0".to_owned());
        }
        if self.memory_limit_mb == Some(0) {
            return Err("`memory_limit_mb` is 0".to_owned());
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

    /// Test `i` as a model is shown it: the assert for a function task;
    /// stdin and the expected stdout for a program task.
    pub fn shown_test(&self, i: usize) -> String {
        let input = self.tests.get(i).map_or("", String::as_str);
        match self.outputs.get(i) {
            Some(out) if self.kind == TaskKind::Stdio => format!(
                "# input\n{}\n# expected output\n{}",
                input.trim_end(),
                out.trim_end()
            ),
            _ => input.trim_end().to_owned(),
        }
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Skip malformed records (recording them in [`TaskSet::skipped`]) instead of failing.
    pub skip_invalid: bool,
    /// Column renames, `{expected key: the file's key}` (`[tasks.columns]`).
    pub columns: BTreeMap<String, String>,
    /// In a directory, read only the data files of this split (`train`,
    /// `test`, ...: a file named `SPLIT.*`, `SPLIT-*`, `*-SPLIT.*`,
    /// `*-SPLIT-*`, or one under a directory `SPLIT`).
    pub split: Option<String>,
}

impl LoadOptions {
    /// How a run reads its task files: `[tasks]`'s `skip_invalid`,
    /// `columns` and `split`.
    pub fn of(cfg: &crate::config::TasksConfig) -> Self {
        LoadOptions {
            skip_invalid: cfg.skip_invalid,
            columns: cfg.columns.clone(),
            split: cfg.split.clone(),
        }
    }

    /// Strict or skipping, with no renames and every split.
    pub fn skipping(skip_invalid: bool) -> Self {
        LoadOptions {
            skip_invalid,
            ..LoadOptions::default()
        }
    }
}

/// A record that was skipped under `skip_invalid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedRecord {
    /// 1-based line, or the array index for JSON-array files (as in [`TaskError::Invalid`]).
    pub line: usize,
    /// Why it was skipped.
    pub reason: String,
}

impl SkippedRecord {
    /// The kind of reason, for counting: the reason without its location,
    /// quoted values and parenthesised detail, numbers as `N`.
    pub fn category(&self) -> String {
        let mut r = self.reason.as_str();
        for unit in ["array index ", "row "] {
            if let Some(rest) = r.strip_prefix(unit) {
                r = rest.split_once(": ").map_or(rest, |(_, after)| after);
            }
        }
        let cut = r.find(['"', '(']).unwrap_or(r.len());
        let mut out = String::new();
        let mut in_digits = false;
        for c in r[..cut].chars() {
            if c.is_ascii_digit() {
                if !in_digits {
                    out.push('N');
                }
                in_digits = true;
            } else {
                in_digits = false;
                out.push(c);
            }
        }
        out.trim_end_matches([' ', ':', ';', ',']).to_owned()
    }
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
    /// Reads a task file: JSON lines or a JSON array, a `.parquet` or `.arrow`
    /// file, or a directory of them (a parquet export, an HF `datasets`
    /// cache). `TaskFormat::Auto` detects the format from the first record's
    /// keys (see `docs/tasks.md`); gzip files are refused with a hint.
    pub fn load(path: &Path, format: TaskFormat, opts: LoadOptions) -> Result<Self, TaskError> {
        if columnar::is_columnar(path) {
            return columnar::load(path, format, &opts);
        }
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
        let records = formats::parse(text, path, format, &opts.columns)?;
        let mut b = Builder::new(path, &opts);
        for (loc, record) in records {
            b.push(loc, record)?;
        }
        Ok(b.set)
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
        let all = TaskSet::load(path, sel.format, sel.load.clone())?;
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

/// Collects decoded records into a set: checks each task, refuses duplicate
/// ids, and fails on or skips the invalid ones.
struct Builder<'a> {
    set: TaskSet,
    first_seen: HashMap<String, formats::Loc>,
    path: &'a Path,
    skip_invalid: bool,
}

impl<'a> Builder<'a> {
    fn new(path: &'a Path, opts: &LoadOptions) -> Self {
        Builder {
            set: TaskSet::default(),
            first_seen: HashMap::new(),
            path,
            skip_invalid: opts.skip_invalid,
        }
    }

    fn push(&mut self, loc: formats::Loc, record: Result<Task, String>) -> Result<(), TaskError> {
        let result = record.and_then(|task| {
            task.validate()?;
            if let Some(first) = self.first_seen.get(&task.id) {
                return Err(format!(
                    "duplicate id {:?} (first seen at {})",
                    task.id,
                    first.label()
                ));
            }
            Ok(task)
        });
        match result {
            Ok(mut task) => {
                self.first_seen.insert(task.id.clone(), loc);
                // A set of many tasks is held for the whole run: vectors
                // grown while reading keep no spare room.
                for v in [&mut task.tests, &mut task.outputs, &mut task.tags] {
                    v.shrink_to_fit();
                }
                self.set.tasks.push(task);
            }
            Err(reason) => {
                let reason = loc.describe(reason);
                if !self.skip_invalid {
                    return Err(TaskError::Invalid {
                        path: self.path.to_path_buf(),
                        line: loc.number,
                        reason,
                    });
                }
                self.set.skipped.push(SkippedRecord {
                    line: loc.number,
                    reason,
                });
            }
        }
        Ok(())
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
