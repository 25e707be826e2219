//! What a report is made from: a run directory's `metrics.jsonl` and
//! `eval/step-N.json`, or a directory of evaluation results, read into
//! [`RunData`] with errors that name the file and line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::ReportError;
use crate::eval::EvalResult;
use crate::fsutil::io_err;

/// One line of `metrics.jsonl`, read leniently: the reward and loss keys
/// depend on the config, and NaN was written as `null`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct StepMetrics {
    pub step: u64,
    #[serde(default)]
    pub pass_rate: Option<f64>,
    /// Samples scored this step (0 for SFT, whose pass rate means nothing).
    #[serde(default)]
    pub samples: Option<u64>,
    #[serde(default)]
    pub reward: BTreeMap<String, Option<f64>>,
    #[serde(default)]
    pub loss: BTreeMap<String, Option<f64>>,
    #[serde(default)]
    pub error_kinds: BTreeMap<String, u64>,
    #[serde(default)]
    pub seconds: BTreeMap<String, Option<f64>>,
    #[serde(default)]
    pub grad_norm: Option<f64>,
    #[serde(default)]
    pub lr: Option<f64>,
    /// The vLLM engine's log-probs against the update's (`abs_mean`,
    /// `abs_max`, `kl`); empty for the native engine.
    #[serde(default)]
    pub mismatch: BTreeMap<String, Option<f64>>,
}

impl StepMetrics {
    /// The training pass rate, when samples were scored.
    pub(super) fn train_pass_rate(&self) -> Option<f64> {
        match self.samples {
            Some(0) => None,
            _ => self.pass_rate,
        }
    }
}

/// An evaluation result with the name it is shown under.
#[derive(Debug, Clone)]
pub struct LabeledEval {
    /// `step N` for a run's `eval/step-N.json`, else the file stem.
    pub label: String,
    /// The training step, for `eval/step-N.json`.
    pub step: Option<u64>,
    pub path: PathBuf,
    pub result: EvalResult,
}

/// Everything a report is made from.
#[derive(Debug, Clone, Default)]
pub struct RunData {
    pub dir: PathBuf,
    /// Sorted by step; a step logged twice keeps its last line.
    pub metrics: Vec<StepMetrics>,
    /// The run's own `eval/step-N.json` by step, then other result files by name.
    pub evals: Vec<LabeledEval>,
    /// Files that were passed over, and why.
    pub notes: Vec<String>,
}

/// Read `metrics.jsonl`: blank lines are skipped, anything else must be a
/// step record.
pub fn read_metrics(path: &Path) -> Result<Vec<StepMetrics>, ReportError> {
    let text = std::fs::read_to_string(path).map_err(io_err(path, "read"))?;
    let mut by_step = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let m: StepMetrics = serde_json::from_str(line).map_err(|e| ReportError::BadLine {
            path: path.to_path_buf(),
            line: i + 1,
            detail: format!("not a step record: {e}"),
        })?;
        by_step.insert(m.step, m);
    }
    Ok(by_step.into_values().collect())
}

fn json_files(dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io_err(dir, "list"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "json"))
        .collect();
    v.sort();
    Ok(v)
}

fn parse_eval(path: &Path) -> Result<EvalResult, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Gather a run directory: `metrics.jsonl` (optional), `eval/*.json` (each
/// must be a result) and `*.json` beside them (those that are results; the
/// others are noted and passed over).
pub fn load_run(dir: &Path) -> Result<RunData, ReportError> {
    if !dir.is_dir() {
        return Err(ReportError::NoDir(dir.to_path_buf()));
    }
    let mut data = RunData {
        dir: dir.to_path_buf(),
        ..RunData::default()
    };
    let layout = crate::run_dir::RunDir::new(dir);
    let metrics = layout.metrics();
    if metrics.is_file() {
        data.metrics = read_metrics(&metrics)?;
    }
    let eval_dir = layout.eval_dir();
    if eval_dir.is_dir() {
        let mut steps = Vec::new();
        for path in json_files(&eval_dir)? {
            let result = parse_eval(&path).map_err(|detail| ReportError::BadEval {
                path: path.clone(),
                detail,
            })?;
            let name = stem(&path);
            let step = name.strip_prefix("step-").and_then(|s| s.parse().ok());
            let label = match step {
                Some(s) => format!("step {s}"),
                None => name,
            };
            steps.push(LabeledEval {
                label,
                step,
                path,
                result,
            });
        }
        // step-12 after step-8, not before it.
        steps.sort_by_key(|e| (e.step.is_none(), e.step, e.label.clone()));
        data.evals.extend(steps);
    }
    for path in json_files(dir)? {
        match parse_eval(&path) {
            Ok(result) => data.evals.push(LabeledEval {
                label: stem(&path),
                step: None,
                path,
                result,
            }),
            Err(e) => data.notes.push(format!(
                "{}: skipped, not an evaluation result ({e})",
                path.display()
            )),
        }
    }
    if data.metrics.is_empty() && data.evals.is_empty() {
        let notes = data.notes.iter().map(|n| format!("\n  {n}")).collect();
        return Err(ReportError::Nothing {
            dir: dir.to_path_buf(),
            notes,
        });
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::step_line;

    #[test]
    fn malformed_metrics_line_names_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let good = step_line(0, 0.5);
        std::fs::write(
            dir.path().join("metrics.jsonl"),
            format!("{good}\n\n{{\"step\": 1, \"reward\": \n"),
        )
        .unwrap();
        let e = load_run(dir.path()).unwrap_err().to_string();
        assert!(e.contains("metrics.jsonl:3: not a step record"), "{e}");
        std::fs::write(
            dir.path().join("metrics.jsonl"),
            format!("{good}\n{{\"pass_rate\": 0.5}}\n"),
        )
        .unwrap();
        let e = load_run(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("metrics.jsonl:2:") && e.contains("missing field `step`"),
            "{e}"
        );
    }

    #[test]
    fn missing_or_empty_directories_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let e = load_run(&dir.path().join("nope")).unwrap_err().to_string();
        assert!(e.ends_with("nope: no such directory"), "{e}");
        std::fs::write(dir.path().join("notes.json"), "[1, 2]").unwrap();
        let e = load_run(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("nothing to report") && e.contains("notes.json"),
            "{e}"
        );
        std::fs::create_dir(dir.path().join("eval")).unwrap();
        std::fs::write(dir.path().join("eval/step-3.json"), "{").unwrap();
        let e = load_run(dir.path()).unwrap_err().to_string();
        assert!(e.contains("step-3.json: not an evaluation result"), "{e}");
    }

    #[test]
    fn repeated_steps_keep_the_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("metrics.jsonl");
        let lines = [step_line(0, 0.1), step_line(1, 0.2), step_line(1, 0.9)];
        std::fs::write(&p, lines.join("\n")).unwrap();
        let m = read_metrics(&p).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[1].pass_rate, Some(0.9));
    }
}
