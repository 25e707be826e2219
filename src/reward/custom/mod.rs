//! The user's own reward terms (`[[reward.custom]]`): a Python function in
//! TRL's, verl's or OpenRLHF's calling convention, run in a pool of Python
//! processes of its own; any command that answers JSON lines; or a server
//! speaking OpenRLHF's remote reward model protocol. Each term gives one
//! [`CustomValue`] per sample, and nothing a term does wrong stops a run: an
//! exception, a hang, the wrong number of values, NaN, a non-number, a dead
//! process or a failing server is *no signal* for the samples concerned,
//! with the reason, never a zero.
//!
//! The composite ([`super::composite`]) weighs the values like FALCON's own
//! terms; docs/rewards.md ("Your own reward") has the protocols.

mod http;
mod kept;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::{CustomKind, CustomTermConfig, RewardSignature};
use crate::exec::ExecReport;
use crate::model::Completion;
use crate::task::Task;
use kept::Kept;

/// The Python side of a python term.
const WORKER_PY: &str = include_str!("worker.py");

/// Extra time a Python worker has to import the user's file before its
/// first answer, beyond the term's `timeout_s`.
const START_GRACE: Duration = Duration::from_secs(60);

/// One term's value for one sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CustomValue {
    /// A finite number.
    Value(f64),
    /// The term does not apply to this sample (`None` from a TRL function,
    /// `null` from a command or server): left out, as TRL leaves it out.
    NotApplicable,
    /// The term could not give a value; why.
    NoSignal(String),
}

/// Each custom term's value for one sample, by term name; beside them,
/// under `NAME/KEY`, the numbers a term asked to log (verl's extra dict
/// keys, OpenRLHF's `extra_logs`, TRL's `log_metric` and `log_extra`),
/// which are logged and never weighed.
pub type CustomScores = BTreeMap<String, CustomValue>;

/// One term's answer for a slice of the batch: a value per sample and, per
/// key it logs, a number per sample (`None` where it gave none).
#[derive(Debug, Default)]
struct Answer {
    values: Vec<CustomValue>,
    extras: BTreeMap<String, Vec<Option<f64>>>,
}

impl Answer {
    /// `values` with the numbers `extras` (`{key: [per sample]}`) logs
    /// beside them; none when every value is no signal.
    fn logged(values: Vec<CustomValue>, extras: &serde_json::Value) -> Answer {
        let extras = if values.iter().all(|v| matches!(v, CustomValue::NoSignal(_))) {
            BTreeMap::new()
        } else {
            extras_of(extras, values.len())
        };
        Answer { values, extras }
    }

    fn values(values: Vec<CustomValue>) -> Answer {
        Answer {
            values,
            extras: BTreeMap::new(),
        }
    }

    fn no_signal(why: String, n: usize) -> Answer {
        Answer::values(vec![CustomValue::NoSignal(why); n])
    }

    /// `self` followed by `next`, the extras padded to stay per sample.
    fn append(&mut self, next: Answer) {
        let (before, added) = (self.values.len(), next.values.len());
        for (k, v) in next.extras {
            self.extras
                .entry(k)
                .or_insert_with(|| vec![None; before])
                .extend(v);
        }
        self.values.extend(next.values);
        for v in self.extras.values_mut() {
            v.resize(before + added, None);
        }
    }
}

/// `{key: [number per sample]}` as a term answered it; keys whose list has
/// another length than `n`, and values that are not numbers, are left out.
fn extras_of(v: &serde_json::Value, n: usize) -> BTreeMap<String, Vec<Option<f64>>> {
    let Some(map) = v.as_object() else {
        return BTreeMap::new();
    };
    map.iter()
        .filter(|(k, _)| k.as_str() != "no_signal" && !k.is_empty())
        .filter_map(|(k, v)| {
            let list = v.as_array().filter(|l| l.len() == n)?;
            let nums: Vec<Option<f64>> = list
                .iter()
                .map(|x| x.as_f64().filter(|f| f.is_finite()))
                .collect();
            nums.iter().any(Option::is_some).then(|| (k.clone(), nums))
        })
        .collect()
}

/// What a term sees of one sample.
#[derive(Debug, Clone, Copy)]
pub struct CustomSample<'a> {
    pub task: &'a Task,
    /// What the policy was asked: the task's prompt, as a dataset's
    /// `prompt` column.
    pub prompt: &'a str,
    pub completion: &'a Completion,
    pub report: &'a ExecReport,
}

impl<'a> CustomSample<'a> {
    /// The samples of a sandbox batch: `jobs[i]` (task, completion) ran as
    /// `reports[i]`; each prompt is its task's.
    pub fn batch(
        jobs: &[(&'a Task, &'a Completion)],
        reports: &'a [ExecReport],
    ) -> Vec<CustomSample<'a>> {
        jobs.iter()
            .zip(reports)
            .map(|(&(task, completion), report)| CustomSample {
                task,
                prompt: &task.prompt,
                completion,
                report,
            })
            .collect()
    }
}

/// Why a term cannot be used at all (`falcon config check` and start-up).
#[derive(Debug, thiserror::Error)]
#[error("[[reward.custom]] {name}: {reason}")]
pub struct CustomError {
    pub name: String,
    pub reason: String,
}

/// The configured terms, ready to score.
pub struct CustomTerms {
    terms: Vec<Term>,
    /// (term, reason) pairs already shown on stderr.
    warned: Mutex<std::collections::BTreeSet<(String, String)>>,
}

struct Term {
    cfg: CustomTermConfig,
    backend: Backend,
}

enum Backend {
    /// Python workers (or a command), one slot per process.
    Processes {
        program: PathBuf,
        args: Vec<String>,
        slots: Vec<Mutex<Option<Kept>>>,
        python: bool,
    },
    Http(http::HttpTerm),
}

impl CustomTerms {
    /// The terms of `cfgs` that are not `off`, each [checked](check) first,
    /// with their processes not yet started (each starts on first use).
    pub fn new(cfgs: &[CustomTermConfig]) -> Result<CustomTerms, CustomError> {
        let mut terms = Vec::new();
        for cfg in cfgs.iter().filter(|c| c.mode.computed()) {
            check(cfg)?;
            let backend = backend(cfg)?;
            terms.push(Term {
                cfg: cfg.clone(),
                backend,
            });
        }
        Ok(CustomTerms {
            terms,
            warned: Mutex::new(Default::default()),
        })
    }

    /// Whether there is a term to compute.
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// Every term's value for every sample, at training step `step`; the
    /// terms run one after another, each over the whole batch.
    pub fn score(&self, step: u64, samples: &[CustomSample<'_>]) -> Vec<CustomScores> {
        let mut out = vec![CustomScores::new(); samples.len()];
        if samples.is_empty() {
            return out;
        }
        for term in &self.terms {
            let Answer { values, extras } = term.score(step, samples);
            debug_assert_eq!(values.len(), samples.len());
            let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
            for v in &values {
                if let CustomValue::NoSignal(why) = v {
                    if warned.insert((term.cfg.name.clone(), why.clone())) {
                        eprintln!(
                            "warning: [[reward.custom]] {}: {why}; those samples get no signal from it \
                             (each reason is shown once)",
                            term.cfg.name
                        );
                    }
                }
            }
            drop(warned);
            for (row, v) in out.iter_mut().zip(values) {
                row.insert(term.cfg.name.clone(), v);
            }
            for (key, nums) in extras {
                let name = format!("{}/{key}", term.cfg.name);
                for (row, x) in out.iter_mut().zip(nums) {
                    if let Some(x) = x {
                        row.insert(name.clone(), CustomValue::Value(x));
                    }
                }
            }
        }
        out
    }
}

/// Every problem of the terms of `cfgs` that are not `off`, as `falcon
/// config check` reports them.
pub fn check_all(cfgs: &[CustomTermConfig]) -> Vec<CustomError> {
    cfgs.iter()
        .filter(|c| c.mode.computed())
        .filter_map(|c| check(c).err())
        .collect()
}

/// Checks one term as `falcon config check` does: a Python term's file
/// imports and defines the function with a usable signature (in a
/// subprocess of the configured Python), a command is executable, URLs
/// were checked by the config itself.
pub fn check(cfg: &CustomTermConfig) -> Result<(), CustomError> {
    let fail = |reason: String| CustomError {
        name: cfg.name.clone(),
        reason,
    };
    match backend(cfg)? {
        Backend::Processes {
            program,
            mut args,
            python: true,
            ..
        } => {
            // The flag follows the worker script, under bwrap or not.
            let worker = worker_file().map_err(fail)?.display().to_string();
            let at = args.iter().rposition(|a| *a == worker).map_or(1, |i| i + 1);
            args.insert(at, "--check".into());
            let mut p = Kept::spawn(&program, &args, None, "the reward worker")
                .map_err(|e| fail(e.to_string()))?;
            let line = p
                .recv(Instant::now() + START_GRACE)
                .map_err(|e| fail(e.to_string()))?;
            ready(&line).map_err(fail)
        }
        _ => Ok(()),
    }
}

fn backend(cfg: &CustomTermConfig) -> Result<Backend, CustomError> {
    let fail = |reason: String| CustomError {
        name: cfg.name.clone(),
        reason,
    };
    match cfg.kind {
        CustomKind::Python => {
            let python = crate::config::locate_tool(&cfg.python, "python3").map_err(|tried| {
                fail(format!(
                    "python {:?} not found (looked for {}); set python to an interpreter",
                    cfg.python,
                    crate::config::tried_list(&tried)
                ))
            })?;
            let path = cfg
                .path
                .clone()
                .ok_or_else(|| fail("python terms need a path".into()))?;
            if !path.is_file() {
                return Err(fail(format!("{}: no such file", path.display())));
            }
            let worker = worker_file().map_err(fail)?;
            let signature = match cfg.signature {
                RewardSignature::Trl => "trl",
                RewardSignature::Verl => "verl",
                RewardSignature::Openrlhf => "openrlhf",
            };
            let args = vec![
                worker.display().to_string(),
                path.display().to_string(),
                cfg.function_name().to_owned(),
                signature.to_owned(),
            ];
            let (program, args) = if cfg.sandbox {
                let dir = path.parent().map(std::path::Path::to_path_buf);
                let binds = [Some(worker.clone()), dir, cfg.cwd.clone()];
                sandboxed(&python, args, &binds).map_err(fail)?
            } else {
                (python, args)
            };
            Ok(Backend::Processes {
                program,
                args,
                slots: (0..cfg.workers.max(1)).map(|_| Mutex::new(None)).collect(),
                python: true,
            })
        }
        CustomKind::Command => {
            let (first, rest) = cfg
                .command
                .split_first()
                .ok_or_else(|| fail("command is empty".into()))?;
            let program = match crate::config::locate_tool(first, first) {
                Ok(p) => p,
                Err(_) => {
                    // A relative path names a file in the config's directory.
                    let p = cfg.cwd.clone().unwrap_or_default().join(first);
                    if first.contains('/') && is_executable(&p) {
                        p
                    } else {
                        return Err(fail(format!(
                            "command {first:?} is not an executable on PATH or in {}",
                            cfg.cwd.clone().unwrap_or_default().display()
                        )));
                    }
                }
            };
            let (program, args) = if cfg.sandbox {
                sandboxed(&program, rest.to_vec(), std::slice::from_ref(&cfg.cwd)).map_err(fail)?
            } else {
                (program, rest.to_vec())
            };
            Ok(Backend::Processes {
                program,
                args,
                slots: vec![Mutex::new(None)],
                python: false,
            })
        }
        CustomKind::Http => Ok(Backend::Http(http::HttpTerm::new(cfg))),
    }
}

/// `program args` under bubblewrap (`sandbox = true`): no network, own
/// pid, ipc and uts namespaces, the filesystem read-only, a private
/// `/tmp` with `binds` (the worker, the term's directory) bound back
/// read-only, and the process dies with the trainer.
fn sandboxed(
    program: &std::path::Path,
    args: Vec<String>,
    binds: &[Option<PathBuf>],
) -> Result<(PathBuf, Vec<String>), String> {
    let bwrap = crate::exec::isolation::which("bwrap").ok_or_else(|| {
        "sandbox = true needs bubblewrap (bwrap), which is not installed; scripts/setup installs it"
            .to_owned()
    })?;
    // Run it by its real directory, keeping the file name (a venv's
    // `bin/python` finds its `pyvenv.cfg` by it): a project `.venv` link
    // under /tmp would vanish behind the private /tmp, so an interpreter
    // that lives there has its prefix bound back.
    let program = match (program.parent(), program.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir)
            .map(|d| d.join(name))
            .unwrap_or_else(|_| program.to_path_buf()),
        _ => program.to_path_buf(),
    };
    let prefix = program
        .parent()
        .and_then(std::path::Path::parent)
        .filter(|p| p.starts_with("/tmp") && *p != std::path::Path::new("/tmp"))
        .map(std::path::Path::to_path_buf);
    let mut argv: Vec<String> = crate::exec::isolation::NAMESPACES
        .iter()
        .chain(&["--tmpfs", "/tmp"])
        .map(|a| (*a).to_owned())
        .collect();
    for b in binds.iter().flatten().chain(&prefix) {
        // Canonical, so a path through a symlink is bound where it lives.
        let b = std::fs::canonicalize(b).unwrap_or_else(|_| b.clone());
        argv.extend([
            "--ro-bind".to_owned(),
            b.display().to_string(),
            b.display().to_string(),
        ]);
    }
    argv.push("--".to_owned());
    argv.push(program.display().to_string());
    argv.extend(args);
    Ok((bwrap, argv))
}

fn is_executable(p: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The worker script, written once per process into the temp directory
/// (under a name that holds its hash, so versions never mix).
fn worker_file() -> Result<PathBuf, String> {
    let hash = crate::text::fnv1a(&[WORKER_PY.as_bytes()]);
    let path = std::env::temp_dir().join(format!("falcon-reward-worker-{hash:016x}.py"));
    if std::fs::read_to_string(&path).is_ok_and(|t| t == WORKER_PY) {
        return Ok(path);
    }
    crate::fsutil::write_atomic(&path, WORKER_PY.as_bytes())
        .map_err(|e| format!("writing the reward worker: {e}"))?;
    Ok(path)
}

/// A worker's first line: ready, or why not.
fn ready(line: &str) -> Result<(), String> {
    let v: serde_json::Value = serde_json::from_str(line)
        .map_err(|e| format!("the reward worker's first line is not JSON ({e}): {line}"))?;
    if v["ready"] == serde_json::Value::Bool(true) {
        return Ok(());
    }
    let mut why = v["error"].as_str().unwrap_or("it is not ready").to_owned();
    if let Some(tb) = v["traceback"].as_str() {
        why.push('\n');
        why.push_str(tb.trim_end());
    }
    Err(why)
}

impl Term {
    fn score(&self, step: u64, samples: &[CustomSample<'_>]) -> Answer {
        match &self.backend {
            Backend::Http(h) => h.score(samples),
            Backend::Processes {
                program,
                args,
                slots,
                python,
            } => {
                let per = samples.len().div_ceil(slots.len());
                let chunks: Vec<&[CustomSample]> = samples.chunks(per.max(1)).collect();
                let mut out = Answer::default();
                std::thread::scope(|s| {
                    let handles: Vec<_> = chunks
                        .iter()
                        .zip(slots)
                        .map(|(chunk, slot)| {
                            s.spawn(move || {
                                let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
                                self.on_process(&mut slot, program, args, *python, step, chunk)
                            })
                        })
                        .collect();
                    for (chunk, h) in chunks.iter().zip(handles) {
                        out.append(h.join().unwrap_or_else(|_| {
                            Answer::no_signal("the term's thread panicked".into(), chunk.len())
                        }));
                    }
                });
                out
            }
        }
    }

    /// One slice of the batch on one process (started if need be); a
    /// process that failed is dropped so the next call starts a fresh one.
    fn on_process(
        &self,
        slot: &mut Option<Kept>,
        program: &std::path::Path,
        args: &[String],
        python: bool,
        step: u64,
        chunk: &[CustomSample<'_>],
    ) -> Answer {
        let no = |why: String| Answer::no_signal(why, chunk.len());
        let deadline = Instant::now() + Duration::from_secs_f64(self.cfg.timeout_s);
        if slot.is_none() {
            let what = if python {
                format!("the Python worker of {}", self.cfg.name)
            } else {
                format!("the command of {}", self.cfg.name)
            };
            let mut p = match Kept::spawn(program, args, self.cfg.cwd.as_deref(), &what) {
                Ok(p) => p,
                Err(e) => return no(e.to_string()),
            };
            if python {
                let started = p.recv(deadline + START_GRACE).map_err(|e| e.to_string());
                if let Err(why) = started.and_then(|l| ready(&l)) {
                    return no(why);
                }
            }
            *slot = Some(p);
        }
        let p = slot.as_mut().expect("started above");
        let result = if python {
            self.python_call(p, step, chunk, deadline)
        } else {
            self.command_call(p, step, chunk, deadline)
                .map(Answer::values)
        };
        match result {
            Ok(values) => values,
            Err(Broken(why)) => {
                *slot = None;
                no(why)
            }
        }
    }

    fn python_call(
        &self,
        p: &mut Kept,
        step: u64,
        chunk: &[CustomSample<'_>],
        deadline: Instant,
    ) -> Result<Answer, Broken> {
        let samples: Vec<serde_json::Value> = chunk.iter().map(sample_json).collect();
        let completions = match self.cfg.completions {
            crate::config::CompletionFormat::Standard => "standard",
            crate::config::CompletionFormat::Conversational => "conversational",
        };
        let req = serde_json::json!({
            "step": step,
            "samples": samples,
            "completions": completions,
            "label_key": self.cfg.label_key,
            "kwargs": self.cfg.kwargs,
        });
        p.send(&format!("{req}\n"))
            .map_err(|e| Broken(e.to_string()))?;
        let line = p.recv(deadline).map_err(|e| Broken(e.to_string()))?;
        let v: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| Broken(format!("the reward worker's answer is not JSON ({e})")))?;
        if let Some(e) = v["error"].as_str() {
            let why = format!("{}() raised {e}", self.cfg.function_name());
            return Ok(Answer::no_signal(why, chunk.len()));
        }
        let values = v["values"].as_array().cloned().unwrap_or_default();
        let values = values_of(&values, chunk.len(), self.cfg.function_name());
        Ok(Answer::logged(values, &v["extras"]))
    }

    fn command_call(
        &self,
        p: &mut Kept,
        step: u64,
        chunk: &[CustomSample<'_>],
        deadline: Instant,
    ) -> Result<Vec<CustomValue>, Broken> {
        let mut text = String::new();
        for s in chunk {
            let mut v = sample_json(s);
            v["step"] = step.into();
            text.push_str(&v.to_string());
            text.push('\n');
        }
        p.send(&text).map_err(|e| Broken(e.to_string()))?;
        let mut out = Vec::with_capacity(chunk.len());
        for _ in chunk {
            let line = p.recv(deadline).map_err(|e| Broken(e.to_string()))?;
            out.push(match serde_json::from_str::<serde_json::Value>(&line) {
                Ok(v) => value_of(&v, "the command"),
                Err(_) => CustomValue::NoSignal(format!(
                    "the command answered {:?}, not a JSON number, null or {{\"score\": ...}}",
                    crate::text::body_excerpt(&line, 80)
                )),
            });
        }
        Ok(out)
    }
}

/// A process that can no longer be trusted to answer in step.
struct Broken(String);

/// What a term gets to know about one sample, as JSON.
fn sample_json(s: &CustomSample<'_>) -> serde_json::Value {
    serde_json::json!({
        "prompt": s.prompt,
        "completion": s.completion.text,
        "completion_ids": s.completion.token_ids,
        "task": s.task,
        "report": s.report,
    })
}

/// A task's column `key`, as a dataset would have it: its own field, else
/// its extra field of that name, else null.
fn column(task: &Task, key: &str) -> serde_json::Value {
    if key != "extra" {
        if let Some(v) = serde_json::to_value(task)
            .ok()
            .and_then(|t| t.get(key).cloned())
        {
            return v;
        }
    }
    task.extra
        .get(key)
        .cloned()
        .unwrap_or(serde_json::Value::Null)
}

/// `n` values from a list answered for `n` samples; a list of another
/// length gives no signal for all of them.
pub(crate) fn values_of(values: &[serde_json::Value], n: usize, who: &str) -> Vec<CustomValue> {
    if values.len() != n {
        let why = format!("{who} returned {} values for {n} samples", values.len());
        return vec![CustomValue::NoSignal(why); n];
    }
    values.iter().map(|v| value_of(v, who)).collect()
}

/// One value: a finite number, null (does not apply), `{"score": x}`, or
/// `{"invalid": why}` from the Python worker.
fn value_of(v: &serde_json::Value, who: &str) -> CustomValue {
    match v {
        serde_json::Value::Null => CustomValue::NotApplicable,
        serde_json::Value::Number(x) => match x.as_f64() {
            Some(f) if f.is_finite() => CustomValue::Value(f),
            _ => CustomValue::NoSignal(format!("{who} returned {x}, not a finite number")),
        },
        serde_json::Value::Bool(b) => CustomValue::Value(f64::from(u8::from(*b))),
        serde_json::Value::Object(o) => {
            if let Some(why) = o.get("invalid").and_then(|w| w.as_str()) {
                return CustomValue::NoSignal(format!("{who} {why}"));
            }
            match o.get("score").or_else(|| o.get("reward")) {
                Some(inner @ (serde_json::Value::Number(_) | serde_json::Value::Null)) => {
                    value_of(inner, who)
                }
                _ => CustomValue::NoSignal(format!(
                    "{who} returned an object without a numeric \"score\""
                )),
            }
        }
        other => CustomValue::NoSignal(format!(
            "{who} returned {}, not a number",
            crate::text::body_excerpt(&other.to_string(), 60)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_are_numbers_nulls_or_no_signal_with_the_reason() {
        let got = values_of(
            &[
                json!(1.5),
                json!(null),
                json!(true),
                json!({"score": -2}),
                json!({"invalid": "returned nan, not a finite number"}),
                json!("0.5"),
                json!({"other": 1}),
            ],
            7,
            "f()",
        );
        assert_eq!(got[0], CustomValue::Value(1.5));
        assert_eq!(got[1], CustomValue::NotApplicable);
        assert_eq!(got[2], CustomValue::Value(1.0));
        assert_eq!(got[3], CustomValue::Value(-2.0));
        assert_eq!(
            got[4],
            CustomValue::NoSignal("f() returned nan, not a finite number".into())
        );
        assert!(matches!(&got[5], CustomValue::NoSignal(w) if w.contains("not a number")));
        assert!(matches!(&got[6], CustomValue::NoSignal(w) if w.contains("\"score\"")));
    }

    #[test]
    fn the_wrong_number_of_values_is_no_signal_for_all() {
        let got = values_of(&[json!(1.0)], 3, "f()");
        assert_eq!(got.len(), 3);
        assert!(got.iter().all(
            |v| matches!(v, CustomValue::NoSignal(w) if w == "f() returned 1 values for 3 samples")
        ));
    }
}
