//! `falcon report`: plots (PNG and SVG) and an `index.html` with tables for
//! a run directory (`metrics.jsonl`, `eval/step-N.json`) or a directory of
//! evaluation results (`falcon eval --out`), and the summary of an ablation
//! grid (`falcon ablate`, [`ablation`]), drawn with the same figure types.
//!
//! It reads what training and evaluation wrote, so it sits below both in
//! the module order. The parts: `data` (reading a run), `charts` (the
//! figure types and drawing), `figures` (a run's figures), `html` (the
//! page); their public names are re-exported here.

pub mod ablation;
mod charts;
mod data;
mod figures;
mod html;

pub use charts::{save, BarChart, Figure, Heatmap, LineChart, Panel, Series, StackedBars};
pub use data::{load_run, read_metrics, LabeledEval, RunData, StepMetrics};
pub use figures::{
    error_kind_chart, loss_chart, outcome_chart, pass_at_chart, reward_chart, transition_heatmap,
};
pub use html::{html_table, write_report, Written, TABLE_STEPS};

use std::path::PathBuf;

use crate::fsutil::IoError;

/// Problems making a report. Each names the file it is about.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{0}: no such directory")]
    NoDir(PathBuf),
    /// A file operation failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// A line of `metrics.jsonl` (1-based) that is not a step record.
    #[error("{path}:{line}: {detail}")]
    BadLine {
        path: PathBuf,
        line: usize,
        detail: String,
    },
    /// A file under `eval/` that is not an evaluation result.
    #[error("{path}: not an evaluation result: {detail}")]
    BadEval { path: PathBuf, detail: String },
    #[error("{dir}: nothing to report: no steps in metrics.jsonl, no eval/*.json and no evaluation result (*.json){notes}")]
    Nothing { dir: PathBuf, notes: String },
    #[error("{path}: cannot draw: {detail}")]
    Draw { path: PathBuf, detail: String },
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::eval::EvalResult;

    pub(super) fn step_line(step: u64, pass: f64) -> String {
        serde_json::json!({
            "step": step, "pass_rate": pass, "samples": 8,
            "reward": {"coarse": pass - 0.2, "style": 1.5, "total": 1.0 + pass},
            "loss": {"sl": 0.05, "fine": -0.1 * step as f64, "total": null},
            "error_kinds": {"WrongAnswer": 8 - (pass * 8.0) as u64, "pass": (pass * 8.0) as u64},
            "seconds": {"generate": 2.0, "update": 1.0},
            "grad_norm": 0.3, "lr": 1e-4, "tokens_generated": 100
        })
        .to_string()
    }

    /// A result built from JSON with only the fields every version of the
    /// format has, so the test does not follow `EvalResult`'s field list.
    pub(super) fn eval(strategy: &str, p1: f64, transitions: bool) -> EvalResult {
        let sample = |outcome: &str| {
            serde_json::json!({"completion": "", "outcome": outcome,
                               "passed": outcome == "pass", "executed": true})
        };
        let mut v = serde_json::json!({
            "tasks": [{"id": "t", "n": 2, "passed": 1, "executed": 2,
                       "samples": [sample("pass"), sample("WrongAnswer")]}],
            "pass_at": {"1": p1, "2": (p1 + 0.2).min(1.0)},
            "exec_at": {"1": 0.9},
            "outcomes": {"pass": 3, "WrongAnswer": 1},
            "samples_per_task": 2, "temperature": 0.8, "seconds": 1.0,
            "strategy": strategy,
        });
        if transitions {
            v["transitions"] = serde_json::json!({
                "labels": ["pass", "NameError", "WrongAnswer"],
                "counts": [[3, 0, 0], [2, 1, 4], [1, 0, 5]],
            });
        }
        serde_json::from_value(v).unwrap()
    }

    pub(super) fn write_run(dir: &Path) {
        let lines: Vec<String> = (0..5)
            .map(|s| step_line(s, 0.25 + 0.1 * s as f64))
            .collect();
        std::fs::write(dir.join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
        std::fs::create_dir_all(dir.join("eval")).unwrap();
        for (s, p) in [(0, 0.4), (4, 0.6)] {
            let path = dir.join(format!("eval/step-{s}.json"));
            std::fs::write(
                path,
                serde_json::to_string(&eval("zero-shot", p, false)).unwrap(),
            )
            .unwrap();
        }
    }

    pub(super) fn png_size(path: &Path) -> (u32, u32) {
        let bytes = std::fs::read(path).unwrap();
        let dec = png::Decoder::new(std::io::Cursor::new(bytes));
        let mut reader = dec.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        // Not a blank canvas: some pixels are dark (text, lines).
        let dark = buf[..info.buffer_size()]
            .chunks(3)
            .filter(|p| p.iter().all(|&c| c < 100))
            .count();
        assert!(dark > 500, "{}: only {dark} dark pixels", path.display());
        (info.width, info.height)
    }
}
