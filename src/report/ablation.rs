//! The summary of an ablation grid (`falcon ablate`): each finished
//! variant's [`SummaryRow`] read from its run directory and kept in its
//! marker, and the table (markdown, CSV) and plots of all of them.
//!
//! The grid, its variants and their markers are `train::ablate`'s; this
//! reads what they trained.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::{load_run, save, BarChart, ReportError};
use crate::config::RunConfig;
use crate::fsutil::{io_err, write_atomic, IoError};
use crate::train::ablate::{mark_finished, Grid, SummaryRow};

/// Problems summarising a grid's variants.
#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    /// A file operation failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// A finished variant's run directory lacks what the summary needs.
    #[error("variant `{variant}`: {message}")]
    Incomplete { variant: String, message: String },
    /// A run directory could not be read, or a plot not drawn.
    #[error(transparent)]
    Report(#[from] ReportError),
}

/// Summarise a variant that has trained and been evaluated, and write its
/// marker ([`mark_finished`]: atomically, so a crash before this leaves the
/// variant to resume).
pub fn finish_variant(cfg: &RunConfig) -> Result<SummaryRow, SummaryError> {
    let dir = cfg.run.run_dir();
    let row = summarize_run(&cfg.run.name, &dir)?;
    mark_finished(cfg, &row)?;
    Ok(row)
}

/// Read a variant's row from its run directory: `metrics.jsonl` and the
/// newest `eval/step-N.json`.
pub fn summarize_run(variant: &str, dir: &Path) -> Result<SummaryRow, SummaryError> {
    let incomplete = |message: String| SummaryError::Incomplete {
        variant: variant.to_owned(),
        message,
    };
    let data = load_run(dir)?;
    let last = data
        .evals
        .iter()
        .filter_map(|e| Some((e.step?, e)))
        .max_by_key(|(s, _)| *s)
        .ok_or_else(|| incomplete(format!("{}: no eval/step-N.json", dir.display())))?;
    let steps = data.metrics.last().map(|m| m.step + 1).unwrap_or(0);
    let mut sums: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    for m in &data.metrics {
        for (k, v) in &m.reward {
            if let Some(v) = v.filter(|v| v.is_finite()) {
                let e = sums.entry(k.clone()).or_default();
                e.0 += v;
                e.1 += 1;
            }
        }
    }
    let step_secs: f64 = data
        .metrics
        .iter()
        .flat_map(|m| m.seconds.values().flatten())
        .sum();
    let eval_secs: f64 = data
        .evals
        .iter()
        .filter(|e| e.step.is_some())
        .map(|e| e.result.seconds)
        .sum();
    Ok(SummaryRow {
        variant: variant.to_owned(),
        steps,
        eval_step: last.0,
        pass_at: last.1.result.pass_at.clone(),
        exec_at: last.1.result.exec_at.clone(),
        reward: sums
            .into_iter()
            .map(|(k, (s, n))| (k, s / n as f64))
            .collect(),
        seconds: step_secs + eval_secs,
    })
}

/// The figures of the summary table, fixed by the issue: pass@1, pass@5
/// and exec@1 (blank where `[eval] k` lacks them).
const FIGURES: [(&str, &str); 3] = [("pass", "1"), ("pass", "5"), ("exec", "1")];

fn figure(r: &SummaryRow, what: &str, k: &str) -> Option<f64> {
    match what {
        "pass" => r.pass_at.get(k).copied(),
        _ => r.exec_at.get(k).copied(),
    }
}

/// Reward terms over all rows, `total` last.
fn reward_terms(rows: &[SummaryRow]) -> Vec<String> {
    let set: BTreeSet<&String> = rows.iter().flat_map(|r| r.reward.keys()).collect();
    let mut v: Vec<String> = set
        .into_iter()
        .filter(|k| *k != "total" && !k.contains('/'))
        .cloned()
        .collect();
    if rows.iter().any(|r| r.reward.contains_key("total")) {
        v.push("total".into());
    }
    v
}

/// The summary as a markdown table.
pub fn summary_markdown(grid: &Grid, rows: &[SummaryRow]) -> String {
    let terms = reward_terms(rows);
    let mut s = format!(
        "# Ablation `{}`\n\nBase config `{}`; every variant with the same seeds. pass@k and \
         exec@k: the final held-out evaluation; rewards: each term's mean over the steps \
         (blank: the term is off); seconds: generation, execution, reward, update and \
         evaluation.\n\n",
        grid.name,
        grid.base.display()
    );
    let mut head = vec!["variant".to_string(), "steps".into()];
    head.extend(FIGURES.iter().map(|(w, k)| format!("{w}@{k}")));
    head.extend(terms.iter().map(|t| format!("reward {t}")));
    head.push("seconds".into());
    let _ = writeln!(s, "| {} |", head.join(" | "));
    let _ = writeln!(
        s,
        "|{}",
        head.iter()
            .enumerate()
            .map(|(i, _)| if i == 0 { " --- |" } else { " ---: |" })
            .collect::<String>()
    );
    for r in rows {
        let mut cells = vec![format!("`{}`", r.variant), r.steps.to_string()];
        cells.extend(FIGURES.iter().map(|(w, k)| {
            figure(r, w, k)
                .map(|v| format!("{:.1}%", 100.0 * v))
                .unwrap_or_default()
        }));
        cells.extend(terms.iter().map(|t| {
            r.reward
                .get(t)
                .map(|v| format!("{v:.3}"))
                .unwrap_or_default()
        }));
        cells.push(format!("{:.1}", r.seconds));
        let _ = writeln!(s, "| {} |", cells.join(" | "));
    }
    s
}

/// The summary as CSV: fractions and seconds as plain numbers, blank where
/// a figure or term is absent.
pub fn summary_csv(rows: &[SummaryRow]) -> String {
    let terms = reward_terms(rows);
    let mut head = vec!["variant".to_string(), "steps".into()];
    head.extend(FIGURES.iter().map(|(w, k)| format!("{w}@{k}")));
    head.extend(terms.iter().map(|t| format!("reward_{t}")));
    head.push("seconds".into());
    let mut s = head.join(",") + "\n";
    let num = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
    for r in rows {
        // Variant names are directory names; quote any comma or quote anyway.
        let name = if r.variant.contains([',', '"']) {
            format!("\"{}\"", r.variant.replace('"', "\"\""))
        } else {
            r.variant.clone()
        };
        let mut cells = vec![name, r.steps.to_string()];
        cells.extend(FIGURES.iter().map(|(w, k)| num(figure(r, w, k))));
        cells.extend(terms.iter().map(|t| num(r.reward.get(t).copied())));
        cells.push(format!("{:.3}", r.seconds));
        s.push_str(&cells.join(","));
        s.push('\n');
    }
    s
}

/// Write `summary.md`, `summary.csv`, and the plots `pass_at_k` (held-out
/// figures per variant) and `reward_terms` (mean reward by term per
/// variant) into `out`. Returns the files written.
pub fn write_summary(
    grid: &Grid,
    out: &Path,
    rows: &[SummaryRow],
) -> Result<Vec<PathBuf>, SummaryError> {
    std::fs::create_dir_all(out).map_err(io_err(out, "create directory"))?;
    let mut files = Vec::new();
    let md = out.join("summary.md");
    write_atomic(&md, summary_markdown(grid, rows).as_bytes())?;
    files.push(md);
    let csv = out.join("summary.csv");
    write_atomic(&csv, summary_csv(rows).as_bytes())?;
    files.push(csv);
    let categories: Vec<String> = rows.iter().map(|r| r.variant.clone()).collect();
    let series: Vec<(String, Vec<Option<f64>>)> = FIGURES
        .iter()
        .map(|(w, k)| {
            (
                format!("{w}@{k}"),
                rows.iter().map(|r| figure(r, w, k)).collect::<Vec<_>>(),
            )
        })
        .filter(|(_, v)| v.iter().any(Option::is_some))
        .collect();
    let bars = BarChart {
        title: format!("Held-out pass@k and exec@k by variant: {}", grid.name),
        categories: categories.clone(),
        series,
        value_label: "share of tasks, final evaluation".into(),
        percent: true,
    };
    files.extend(save(&bars, &out.join("pass_at_k"))?);
    let terms = reward_terms(rows);
    if !terms.is_empty() {
        let rewards = BarChart {
            title: format!("Mean reward by term and variant: {}", grid.name),
            categories,
            series: terms
                .iter()
                .map(|t| {
                    (
                        t.clone(),
                        rows.iter().map(|r| r.reward.get(t).copied()).collect(),
                    )
                })
                .collect(),
            value_label: "mean over steps (a missing bar: the term is off)".into(),
            percent: false,
        };
        files.extend(save(&rewards, &out.join("reward_terms"))?);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::ablate::tests::grid;
    use crate::train::ablate::{prepare_variant, VariantState, CONFIG_FILE, DONE_FILE};

    /// A run directory as training leaves it: metrics and evaluations.
    fn fake_run(dir: &Path, steps: u64, style: bool, pass1: f64) {
        std::fs::create_dir_all(dir.join("eval")).unwrap();
        let lines: Vec<String> = (0..steps)
            .map(|s| {
                let mut reward =
                    serde_json::json!({"coarse": 0.1 * s as f64, "total": 1.0 + s as f64});
                if style {
                    reward["style"] = serde_json::json!(1.5);
                }
                serde_json::json!({"step": s, "pass_rate": 0.5, "samples": 4, "reward": reward,
                    "seconds": {"generate": 2.0, "update": 1.0}})
                .to_string()
            })
            .collect();
        std::fs::write(dir.join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
        for (s, p) in [(0, 0.1), (steps, pass1)] {
            let r = serde_json::json!({"tasks": [], "pass_at": {"1": p, "5": p + 0.2},
                "exec_at": {"1": 0.9}, "outcomes": {}, "samples_per_task": 5,
                "temperature": 0.8, "seconds": 4.0});
            std::fs::write(dir.join(format!("eval/step-{s}.json")), r.to_string()).unwrap();
        }
    }

    #[test]
    fn summary_rows_tables_and_plots_from_run_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let g = grid(
            dir.path(),
            "[[variant]]\nname = \"full\"\n[[variant]]\nname = \"no-style\"\n",
        )
        .unwrap();
        fake_run(&dir.path().join("full"), 2, true, 0.5);
        fake_run(&dir.path().join("no-style"), 2, false, 0.25);
        let rows = vec![
            summarize_run("full", &dir.path().join("full")).unwrap(),
            summarize_run("no-style", &dir.path().join("no-style")).unwrap(),
        ];
        let r = &rows[0];
        assert_eq!((r.steps, r.eval_step), (2, 2));
        assert_eq!(r.pass_at["1"], 0.5);
        assert!((r.reward["coarse"] - 0.05).abs() < 1e-12);
        assert_eq!(r.reward["total"], 1.5);
        assert_eq!(r.reward["style"], 1.5);
        // Two steps of 3 s and two evaluations of 4 s.
        assert_eq!(r.seconds, 14.0);
        assert!(!rows[1].reward.contains_key("style"));
        let md = summary_markdown(&g, &rows);
        assert!(
            md.contains("| variant | steps | pass@1 | pass@5 | exec@1 | reward coarse | reward style | reward total | seconds |"),
            "{md}"
        );
        assert!(
            md.contains("| `full` | 2 | 50.0% | 70.0% | 90.0% | 0.050 | 1.500 | 1.500 | 14.0 |"),
            "{md}"
        );
        assert!(
            md.contains("| `no-style` | 2 | 25.0% | 45.0% | 90.0% | 0.050 |  | 1.500 | 14.0 |"),
            "{md}"
        );
        let csv = summary_csv(&rows);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(
            lines[0],
            "variant,steps,pass@1,pass@5,exec@1,reward_coarse,reward_style,reward_total,seconds"
        );
        assert_eq!(lines[2], "no-style,2,0.25,0.45,0.9,0.05,,1.5,14.000");
        let out = dir.path().join("summary");
        let files = write_summary(&g, &out, &rows).unwrap();
        for f in [
            "summary.md",
            "summary.csv",
            "pass_at_k.png",
            "pass_at_k.svg",
            "reward_terms.png",
        ] {
            assert!(files.contains(&out.join(f)), "{f}");
        }
        let svg = std::fs::read_to_string(out.join("reward_terms.svg")).unwrap();
        assert!(svg.contains("no-style") && svg.contains("style") && svg.contains("coarse"));
        // A run without its final evaluation is not summarised.
        std::fs::remove_dir_all(dir.path().join("full/eval")).unwrap();
        let e = summarize_run("full", &dir.path().join("full"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("variant `full`") && e.contains("no eval/step-N.json"),
            "{e}"
        );
    }

    #[test]
    fn finished_variants_are_skipped_and_changed_configs_refused() {
        let dir = tempfile::tempdir().unwrap();
        let g = grid(dir.path(), "[[variant]]\nname = \"full\"\n").unwrap();
        let cfg = g.resolve(&g.variants[0]).unwrap();
        assert_eq!(prepare_variant(&cfg).unwrap(), VariantState::New);
        let run = cfg.run.run_dir();
        assert!(run.join(CONFIG_FILE).is_file());
        // Failed before its first step (nothing but its config): a changed
        // (corrected) config starts it afresh instead of being refused.
        let mut corrected = cfg.clone();
        corrected.train.lr *= 3.0;
        assert_eq!(prepare_variant(&corrected).unwrap(), VariantState::New);
        assert_eq!(prepare_variant(&cfg).unwrap(), VariantState::New);
        // Interrupted after a step: same config, no marker.
        std::fs::write(run.join("metrics.jsonl"), "{}\n").unwrap();
        assert_eq!(prepare_variant(&cfg).unwrap(), VariantState::Started);
        fake_run(&run, 2, true, 0.5);
        let row = finish_variant(&cfg).unwrap();
        assert_eq!(
            prepare_variant(&cfg).unwrap(),
            VariantState::Finished(row.clone())
        );
        // The marker is the row, whatever happens to the run's files later.
        std::fs::remove_file(run.join("metrics.jsonl")).unwrap();
        assert_eq!(prepare_variant(&cfg).unwrap(), VariantState::Finished(row));
        let mut changed = cfg.clone();
        changed.train.lr *= 2.0;
        let e = prepare_variant(&changed).unwrap_err().to_string();
        assert!(
            e.contains("variant `full`") && e.contains("different config"),
            "{e}"
        );
        std::fs::write(run.join(DONE_FILE), "{").unwrap();
        let e = prepare_variant(&cfg).unwrap_err().to_string();
        assert!(e.contains("ablate-done.json: not a summary row"), "{e}");
    }
}
