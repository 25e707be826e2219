//! Reading each on-disk task format into [`Task`]s: the container (JSON lines
//! or one JSON array), format detection, and one mapping per format.
//!
//! Container and record format are independent: any format may come as JSON
//! lines or as one JSON array (HF exports use both), so `mbpp-sanitized.json`
//! and a `.jsonl` re-export of it read the same.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::entry::mbpp_entry_point;
use super::{contest, Task, TaskError, TaskFormat, TaskKind};
use crate::text::python;

/// Where a record sits in its file.
#[derive(Debug, Clone, Copy)]
pub(super) struct Loc {
    /// 1-based line, or 0-based array index or row.
    pub number: usize,
    pub unit: Unit,
}

/// What [`Loc::number`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unit {
    /// A line of a JSON-lines file (1-based).
    Line,
    /// An element of a file holding one JSON array (0-based).
    Index,
    /// A row of a parquet or Arrow file (0-based, over all its files).
    Row,
}

impl Loc {
    /// `line 7`, `array index 7` or `row 7`, for messages that point at another record.
    pub fn label(&self) -> String {
        match self.unit {
            Unit::Line => format!("line {}", self.number),
            Unit::Index => format!("array index {}", self.number),
            Unit::Row => format!("row {}", self.number),
        }
    }

    /// Prefixes array-element and row reasons with the index, because the
    /// `line` field alone would read as a line number.
    pub fn describe(&self, reason: String) -> String {
        match self.unit {
            Unit::Line => reason,
            _ => format!("{}: {reason}", self.label()),
        }
    }
}

/// One record in raw form, before it is decoded by a format.
pub(super) enum Raw<'a> {
    Line(&'a str),
    Element(Value),
}

impl Raw<'_> {
    fn decode<T: DeserializeOwned>(&self) -> Result<T, String> {
        match self {
            Raw::Line(text) => serde_json::from_str(text).map_err(|e| json_reason(&e)),
            Raw::Element(value) => T::deserialize(value).map_err(|e| e.to_string()),
        }
    }

    fn as_object(&self) -> Option<Map<String, Value>> {
        match self {
            Raw::Line(text) => match serde_json::from_str(text) {
                Ok(Value::Object(map)) => Some(map),
                _ => None,
            },
            Raw::Element(Value::Object(map)) => Some(map.clone()),
            Raw::Element(_) => None,
        }
    }

    fn into_object(self) -> Option<Map<String, Value>> {
        match self {
            Raw::Element(Value::Object(map)) => Some(map),
            Raw::Element(_) => None,
            line => line.as_object(),
        }
    }
}

// serde_json ends messages with "at line 1 column N"; within one JSONL line the
// line part is always 1 and would contradict the file line we report.
fn json_reason(e: &serde_json::Error) -> String {
    let mut msg = e.to_string();
    if let Some(at) = msg.rfind(" at line ") {
        msg.truncate(at);
    }
    let prefix = match e.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => "invalid JSON: ",
        _ => "",
    };
    format!("{prefix}{msg} (column {})", e.column())
}

/// One record's location and either its task or why it is invalid.
pub(super) type Decoded = (Loc, Result<Task, String>);

/// Splits `text` into records and decodes each with `format` (detected first
/// when `Auto`), after renaming `columns` (expected key → the file's key).
/// Whole-file problems are errors; per-record problems are returned next to
/// their location for the caller to fail on or skip.
pub(super) fn parse(
    text: &str,
    path: &Path,
    format: TaskFormat,
    columns: &BTreeMap<String, String>,
) -> Result<Vec<Decoded>, TaskError> {
    let raws = rename(split_records(text, path)?, columns);
    let format = resolve(format, &raws, path)?;
    Ok(decode_all(format, raws, 0))
}

/// `format`, or the one the first object record's keys say when `Auto`.
pub(super) fn resolve(
    format: TaskFormat,
    raws: &[(Loc, Raw<'_>)],
    path: &Path,
) -> Result<TaskFormat, TaskError> {
    match format {
        TaskFormat::Auto => detect(raws, path),
        explicit => Ok(explicit),
    }
}

/// Decodes records whose first has ordinal `first` among all of the file's.
pub(super) fn decode_all(
    format: TaskFormat,
    raws: Vec<(Loc, Raw<'_>)>,
    first: usize,
) -> Vec<Decoded> {
    raws.into_iter()
        .enumerate()
        .map(|(i, (loc, raw))| (loc, decode_record(format, raw, first + i)))
        .collect()
}

/// Records with the keys of `columns` renamed (`{expected: found}`): the
/// file's `found` column is read as `expected`.
pub(super) fn rename<'a>(
    raws: Vec<(Loc, Raw<'a>)>,
    columns: &BTreeMap<String, String>,
) -> Vec<(Loc, Raw<'a>)> {
    if columns.is_empty() {
        return raws;
    }
    raws.into_iter()
        .map(|(loc, raw)| match raw.as_object() {
            Some(mut map) => {
                for (want, found) in columns {
                    if let Some(v) = map.remove(found) {
                        map.insert(want.clone(), v);
                    }
                }
                (loc, Raw::Element(Value::Object(map)))
            }
            None => (loc, raw),
        })
        .collect()
}

/// The keys a record of `format` must have (what a column mapping must
/// provide), for the error when a columnar file's schema lacks them.
pub(super) fn required_keys(format: TaskFormat) -> &'static [&'static str] {
    match format {
        TaskFormat::Auto => &[],
        TaskFormat::Jsonl => &["id", "prompt", "tests"],
        TaskFormat::Humaneval => &["task_id", "prompt", "test", "entry_point"],
        TaskFormat::Mbpp => &["task_id", "test_list"],
        TaskFormat::Pricoder => &["id", "prompt", "test"],
        TaskFormat::Apps => &["question", "input_output"],
        TaskFormat::Codecontests => &["name", "description"],
        TaskFormat::Livecodebench => &["question_id", "question_content", "public_test_cases"],
        TaskFormat::Kodcode => &["question_id", "question", "test"],
        TaskFormat::Verl => &["prompt", "reward_model"],
    }
}

fn split_records<'a>(text: &'a str, path: &Path) -> Result<Vec<(Loc, Raw<'a>)>, TaskError> {
    if text.trim_start().starts_with('[') {
        // One JSON array: a syntax error here breaks the whole file, so it
        // cannot be skipped record by record.
        let values: Vec<Value> = serde_json::from_str(text).map_err(|e| TaskError::Invalid {
            path: PathBuf::from(path),
            line: e.line(),
            reason: format!(
                "the file starts with '[' but is not a JSON array: {}",
                json_reason(&e)
            ),
        })?;
        return Ok(values
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                let loc = Loc {
                    number: i,
                    unit: Unit::Index,
                };
                (loc, Raw::Element(v))
            })
            .collect());
    }
    Ok(text
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            let loc = Loc {
                number: i + 1,
                unit: Unit::Line,
            };
            (loc, Raw::Line(line))
        })
        .collect())
}

/// Picks the format from the keys of the first record that is a JSON object,
/// so one malformed leading line does not defeat detection under `skip_invalid`.
pub(super) fn detect(raws: &[(Loc, Raw<'_>)], path: &Path) -> Result<TaskFormat, TaskError> {
    let unknown = |reason: String| TaskError::UnknownFormat {
        path: path.to_path_buf(),
        reason,
    };
    let Some((loc, keys)) = raws
        .iter()
        .find_map(|(loc, raw)| raw.as_object().map(|m| (loc, m)))
    else {
        return Err(unknown(if raws.is_empty() {
            "the file holds no records, so its format cannot be detected".to_owned()
        } else {
            "no record is a JSON object, so the format cannot be detected".to_owned()
        }));
    };
    let has = |k: &str| keys.contains_key(k);
    // `tests` (plural) is ours alone, so a record missing other required keys
    // is still read as ours and gets a "missing field" reason, not "unknown format".
    let format = if has("tests") {
        TaskFormat::Jsonl
    } else if has("test_list") {
        // Before HumanEval's keys: MBPP+ records carry `test` and `entry_point` too.
        TaskFormat::Mbpp
    } else if has("task_id") && has("test") && has("entry_point") {
        TaskFormat::Humaneval
    } else if has("api_list") || (has("id") && has("task") && has("test")) {
        TaskFormat::Pricoder
    } else if let Some(f) = super::contest::detect(has) {
        f
    } else {
        let found: Vec<&str> = keys.keys().map(String::as_str).collect();
        return Err(unknown(format!(
            "the record at {} has keys {found:?}, which match no known format \
             (jsonl: tests; humaneval: task_id/test/entry_point; \
             mbpp: test_list; pricoder: id/task/test/api_list; apps: question/input_output; \
             codecontests: description/public_tests; livecodebench: question_content/public_test_cases; \
             kodcode: question_id/solution/test; verl: prompt/reward_model); set the format explicitly \
             or map the columns with [tasks.columns]",
            loc.label()
        )));
    };
    Ok(format)
}

/// A code-RL reader of one row.
type Reader<'a> = dyn Fn(&Map<String, Value>) -> Result<contest::Mapped, String> + 'a;

fn decode_record(format: TaskFormat, raw: Raw<'_>, ordinal: usize) -> Result<Task, String> {
    let object = |raw: Raw<'_>| {
        raw.into_object()
            .ok_or_else(|| "the record is not a JSON object".to_owned())
    };
    // Each record is held once: the code-RL readers borrow the row, which
    // then gives its unmapped columns to `extra` without a copy.
    let contest = |raw: Raw<'_>, read: &Reader| {
        let map = object(raw)?;
        let (task, keys) = read(&map)?;
        Ok::<_, String>((task, keys, Some(map)))
    };
    let (mut task, mapped, map) = match format {
        TaskFormat::Jsonl => return raw.decode::<Task>().map_err(extra_hint),
        TaskFormat::Humaneval => (
            raw.decode::<HumanEvalRecord>()
                .map(HumanEvalRecord::into_task)?,
            HUMANEVAL_KEYS,
            raw.into_object(),
        ),
        TaskFormat::Mbpp => (
            raw.decode::<MbppRecord>()?.into_task()?,
            MBPP_KEYS,
            raw.into_object(),
        ),
        TaskFormat::Pricoder => (
            raw.decode::<PricoderRecord>()?.into_task()?,
            PRICODER_KEYS,
            raw.into_object(),
        ),
        TaskFormat::Apps => contest(raw, &|m| contest::apps(m, ordinal))?,
        TaskFormat::Codecontests => contest(raw, &contest::codecontests)?,
        TaskFormat::Livecodebench => contest(raw, &contest::livecodebench)?,
        TaskFormat::Kodcode => contest(raw, &contest::kodcode)?,
        TaskFormat::Verl => contest(raw, &|m| contest::verl(m, ordinal))?,
        // `parse` resolves Auto before decoding.
        TaskFormat::Auto => unreachable!("format resolved before decoding"),
    };
    // What a public format has beyond the mapped keys (MBPP's
    // `challenge_test_list`, HumanEval+'s `plus_input`, a user's own
    // columns) reaches reward terms as columns, as in a dataset.
    if let Some(map) = map {
        let own = std::mem::take(&mut task.extra);
        task.extra = map
            .into_iter()
            .filter(|(k, _)| !mapped.contains(&k.as_str()))
            .map(|(k, v)| {
                let k = if super::RESERVED_EXTRA_KEYS.contains(&k.as_str()) {
                    format!("source_{k}")
                } else {
                    k
                };
                (k, v)
            })
            .chain(own)
            .collect();
    }
    Ok(task)
}

const HUMANEVAL_KEYS: &[&str] = &[
    "task_id",
    "prompt",
    "canonical_solution",
    "test",
    "entry_point",
];
const MBPP_KEYS: &[&str] = &[
    "task_id",
    "text",
    "prompt",
    "code",
    "test_list",
    "test_setup_code",
    "test_imports",
    "entry_point",
];
const PRICODER_KEYS: &[&str] = &["id", "prompt", "canonical_solution", "test", "api_list"];

/// Our own format refuses unknown fields (a typo must not vanish); say
/// where a user's extra columns go.
fn extra_hint(reason: String) -> String {
    if reason.starts_with("unknown field") {
        format!("{reason}; put a task's own extra columns under \"extra\": {{...}}")
    } else {
        reason
    }
}

/// Public benchmark files mix `\r\n` and `\n` (972 of 974 MBPP solutions use
/// `\r\n`); test programs are assembled by concatenation, so use one style.
fn lf(s: &str) -> String {
    s.replace("\r\n", "\n")
}

/// HumanEval and PriCoder store only the function body; we keep solutions
/// as whole programs so that every format's reference can run as-is.
fn complete_program(prompt: &str, body: Option<&str>) -> Option<String> {
    non_empty(body).map(|body| format!("{}{body}", lf(prompt)))
}

fn non_empty(s: Option<&str>) -> Option<String> {
    s.filter(|s| !s.trim().is_empty()).map(lf)
}

/// A record of OpenAI's HumanEval (`HumanEval.jsonl`). Extra keys (as in
/// HumanEval+ exports) are ignored.
#[derive(Deserialize)]
struct HumanEvalRecord {
    task_id: String,
    prompt: String,
    #[serde(default)]
    canonical_solution: Option<String>,
    test: String,
    entry_point: String,
}

impl HumanEvalRecord {
    /// `test` defines `check(candidate)` and never calls it; the harness appends
    /// `check(entry_point)`. Its asserts share helpers, loops and METADATA, so
    /// they are not split: the whole program is one test.
    fn into_task(self) -> Task {
        let test = format!(
            "{}\n\ncheck({})\n",
            lf(&self.test).trim_end(),
            self.entry_point
        );
        Task {
            id: self.task_id,
            prompt: lf(&self.prompt),
            entry_point: self.entry_point,
            tests: vec![test],
            kind: TaskKind::Python,
            canonical_solution: complete_program(&self.prompt, self.canonical_solution.as_deref()),
            docs: None,
            tags: vec!["humaneval".to_owned()],
            test_setup: None,
            prelude: leading_imports(&lf(&self.prompt)),
            extra: Default::default(),
            ..Default::default()
        }
    }
}

/// The `import` / `from` lines before a prompt's first `def` or decorator.
fn leading_imports(prompt: &str) -> Option<String> {
    let imports: Vec<&str> = prompt
        .lines()
        .take_while(|l| !l.starts_with("def ") && !l.starts_with('@'))
        .filter(|l| l.starts_with("import ") || l.starts_with("from "))
        .collect();
    (!imports.is_empty()).then(|| imports.join("\n"))
}

/// `task_id` is an integer in Google's files and a string (`"Mbpp/2"`) in some
/// re-exports.
#[derive(Deserialize)]
#[serde(untagged)]
enum MbppId {
    Number(u64),
    Text(String),
}

/// A record of either MBPP file: full (`text`, `test_setup_code`,
/// `challenge_test_list`) or sanitized (`prompt`, `test_imports`, `source_file`).
#[derive(Deserialize)]
struct MbppRecord {
    task_id: MbppId,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    code: Option<String>,
    test_list: Vec<String>,
    #[serde(default)]
    test_setup_code: Option<String>,
    #[serde(default)]
    test_imports: Vec<String>,
    /// MBPP+ (EvalPlus) names it; Google's files do not.
    #[serde(default)]
    entry_point: Option<String>,
}

/// MBPP's published split by task id (mbpp/README.md; the HF dataset uses the same ranges).
fn mbpp_split(task_id: u64) -> Option<&'static str> {
    match task_id {
        1..=10 => Some("split:prompt"),
        11..=510 => Some("split:test"),
        511..=600 => Some("split:validation"),
        601..=974 => Some("split:train"),
        _ => None,
    }
}

impl MbppRecord {
    fn into_task(self) -> Result<Task, String> {
        let sanitized = self.prompt.is_some();
        let statement = self
            .text
            .or(self.prompt)
            .ok_or("missing field `text` (full MBPP) or `prompt` (sanitized MBPP)")?;
        let source = if sanitized { "mbpp-sanitized" } else { "mbpp" };
        let mut tags = vec![source.to_owned()];
        let id = match self.task_id {
            MbppId::Number(n) => {
                tags.extend(mbpp_split(n).map(str::to_owned));
                format!("{source}/{n}")
            }
            MbppId::Text(s) => s,
        };
        let tests: Vec<String> = self.test_list.iter().map(|t| lf(t)).collect();
        let code = non_empty(self.code.as_deref());
        let first = tests.first().ok_or("`test_list` is empty")?;
        let entry_point = match self.entry_point.filter(|e| !e.is_empty()) {
            Some(e) => e,
            None => mbpp_entry_point(first, code.as_deref())?,
        };
        let mut setup: Vec<String> = self.test_imports.iter().map(|s| lf(s)).collect();
        setup.extend(non_empty(self.test_setup_code.as_deref()));
        Ok(Task {
            id,
            prompt: lf(statement.trim()),
            entry_point,
            tests,
            kind: TaskKind::Python,
            canonical_solution: code,
            docs: None,
            tags,
            test_setup: (!setup.is_empty()).then(|| setup.join("\n")),
            // MBPP's prompt is prose; its tests' imports are `test_setup`.
            prelude: None,
            extra: Default::default(),
            ..Default::default()
        })
    }
}

/// A record of PriCoder's NumbaEval / NdonnxEval (`id`, `task`, `prompt`,
/// `canonical_solution`, `test`, `api_list`, `seed_apis`).
#[derive(Deserialize)]
struct PricoderRecord {
    id: String,
    prompt: String,
    #[serde(default)]
    canonical_solution: Option<String>,
    test: String,
    #[serde(default)]
    api_list: Vec<String>,
}

impl PricoderRecord {
    fn into_task(self) -> Result<Task, String> {
        let prompt = lf(&self.prompt);
        let numba =
            prompt.contains("import numba") || self.api_list.iter().any(|a| a.starts_with("numba"));
        let ndonnx = prompt.contains("import ndonnx")
            || self.api_list.iter().any(|a| a.starts_with("ndonnx"));
        let (bench, kind) = match (numba, ndonnx) {
            (true, _) => ("numbaeval", TaskKind::NumbaCuda),
            (false, true) => ("ndonnxeval", TaskKind::Python),
            (false, false) => ("pricoder", TaskKind::Python),
        };
        // The prompt is imports plus one function signature with docstring;
        // the function to test is the last top-level `def`.
        let entry_point = prompt
            .lines()
            .filter(|l| l.starts_with("def ") || l.starts_with("async def "))
            .filter_map(|l| python::defs(l).first().copied())
            .next_back()
            .ok_or("cannot derive `entry_point`: `prompt` has no top-level `def`")?
            .to_owned();
        // PriCoder's harness prepends an import preamble to the whole
        // program; 40 NdonnxEval tests use `ndx` without importing it, so the
        // prompt's imports are both the prelude and the tests' setup.
        let test_setup = leading_imports(&prompt);
        let mut tags = vec![bench.to_owned()];
        tags.extend(self.api_list.iter().map(|a| format!("api:{a}")));
        Ok(Task {
            id: format!("{bench}/{}", self.id),
            prompt,
            entry_point,
            tests: vec![lf(&self.test)],
            kind,
            canonical_solution: complete_program(&self.prompt, self.canonical_solution.as_deref()),
            docs: None,
            tags,
            prelude: test_setup.clone(),
            test_setup,
            extra: Default::default(),
            ..Default::default()
        })
    }
}
