//! `index.html`: every figure a run supports, drawn into the report
//! directory, with tables of the newest steps, the evaluations and their
//! outcomes ([`write_report`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::charts::{fmt_num, save};
use super::data::{LabeledEval, RunData, StepMetrics};
use super::figures::*;
use super::ReportError;
use crate::fsutil::{io_err, write_atomic};

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn cell(v: Option<f64>, pct: bool) -> String {
    match v {
        Some(v) if v.is_finite() && pct => format!("{:.1}%", 100.0 * v),
        Some(v) if v.is_finite() => fmt_num(v),
        Some(_) => "NaN".into(),
        None => String::new(),
    }
}

/// An HTML table; the first column is left-aligned, the rest are figures.
pub fn html_table(head: &[String], rows: &[Vec<String>]) -> String {
    let mut s = String::from("<table>\n<tr>");
    for h in head {
        let _ = write!(s, "<th>{}</th>", esc(h));
    }
    s.push_str("</tr>\n");
    for r in rows {
        s.push_str("<tr>");
        for c in r {
            let _ = write!(s, "<td>{}</td>", esc(c));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</table>\n");
    s
}

/// How many of the newest steps the step table shows.
pub const TABLE_STEPS: usize = 20;

fn step_table(metrics: &[StepMetrics]) -> String {
    let rewards = terms(metrics, |m| &m.reward);
    let losses = terms(metrics, |m| &m.loss);
    let mut head: Vec<String> = vec!["step".into(), "pass rate".into(), "samples".into()];
    head.extend(rewards.iter().map(|k| format!("reward {k}")));
    head.extend(losses.iter().map(|k| format!("loss {k}")));
    head.extend(["grad norm".into(), "lr".into(), "seconds".into()]);
    let rows: Vec<Vec<String>> = metrics[metrics.len().saturating_sub(TABLE_STEPS)..]
        .iter()
        .map(|m| {
            let mut r = vec![
                m.step.to_string(),
                cell(m.train_pass_rate(), true),
                m.samples.map(|n| n.to_string()).unwrap_or_default(),
            ];
            r.extend(
                rewards
                    .iter()
                    .map(|k| cell(m.reward.get(k).copied().flatten(), false)),
            );
            r.extend(
                losses
                    .iter()
                    .map(|k| cell(m.loss.get(k).copied().flatten(), false)),
            );
            let secs: f64 = m.seconds.values().flatten().sum();
            r.extend([
                cell(m.grad_norm, false),
                m.lr.map(|v| {
                    if v == 0.0 {
                        "0".into()
                    } else {
                        format!("{v:.2e}")
                    }
                })
                .unwrap_or_default(),
                format!("{secs:.1}"),
            ]);
            r
        })
        .collect();
    html_table(&head, &rows)
}

fn eval_table(evals: &[LabeledEval]) -> String {
    let pk = ks(evals.iter().map(|e| &e.result.pass_at));
    let ek = ks(evals.iter().map(|e| &e.result.exec_at));
    let mut head: Vec<String> = ["result", "strategy", "tasks", "n", "temperature"]
        .map(String::from)
        .into();
    head.extend(pk.iter().map(|k| format!("pass@{k}")));
    head.extend(ek.iter().map(|k| format!("exec@{k}")));
    head.push("seconds".into());
    let rows: Vec<Vec<String>> = evals
        .iter()
        .map(|e| {
            let r = &e.result;
            let mut row = vec![
                e.label.clone(),
                r.strategy.clone(),
                r.tasks.len().to_string(),
                r.samples_per_task.to_string(),
                format!("{}", r.temperature),
            ];
            row.extend(pk.iter().map(|k| cell(r.pass_at.get(k).copied(), true)));
            row.extend(ek.iter().map(|k| cell(r.exec_at.get(k).copied(), true)));
            row.push(format!("{:.1}", r.seconds));
            row
        })
        .collect();
    html_table(&head, &rows)
}

fn outcome_table(evals: &[LabeledEval]) -> String {
    let mut totals = BTreeMap::new();
    for e in evals {
        for (k, &n) in &e.result.outcomes {
            *totals.entry(k.clone()).or_insert(0.0) += n as f64;
        }
    }
    let mut head = vec!["outcome".to_string()];
    head.extend(evals.iter().map(|e| e.label.clone()));
    let rows: Vec<Vec<String>> = by_weight(&totals)
        .into_iter()
        .map(|k| {
            let mut r = vec![k.clone()];
            r.extend(
                evals
                    .iter()
                    .map(|e| e.result.outcomes.get(&k).copied().unwrap_or(0).to_string()),
            );
            r
        })
        .collect();
    html_table(&head, &rows)
}

fn figure_html(name: &str, alt: &str) -> String {
    format!(
        "<figure><a href=\"{n}.svg\"><img src=\"{n}.png\" alt=\"{a}\"></a>\
         <figcaption>{a} (<a href=\"{n}.svg\">SVG</a>)</figcaption></figure>\n",
        n = esc(name),
        a = esc(alt)
    )
}

const STYLE: &str = "body{font-family:sans-serif;margin:2em;color:#222;max-width:1100px}\
table{border-collapse:collapse;margin:1em 0;font-size:14px}\
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}\
th:first-child,td:first-child{text-align:left}th{background:#f3f3f3}\
img{max-width:100%;border:1px solid #eee}figure{margin:1.5em 0}\
figcaption{font-size:13px;color:#555}";

/// What [`write_report`] wrote.
#[derive(Debug, Clone)]
pub struct Written {
    pub index: PathBuf,
    /// Every file, `index.html` last.
    pub files: Vec<PathBuf>,
}

/// A file name for a label: lowercase letters, digits and dashes.
fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_owned()
}

/// Draw every figure `data` supports into `out` and write `index.html`
/// (last, so it never names a picture that is not there yet).
pub fn write_report(data: &RunData, out: &Path) -> Result<Written, ReportError> {
    std::fs::create_dir_all(out).map_err(io_err(out, "create directory"))?;
    let mut files = Vec::new();
    let mut html = String::new();
    let title = format!("falcon report: {}", data.dir.display());
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>{STYLE}</style></head><body>\n<h1>{t}</h1>\n<p>{} training steps, {} evaluation results.</p>\n",
        data.metrics.len(),
        data.evals.len(),
        t = esc(&title),
    );
    if !data.notes.is_empty() {
        html.push_str("<ul class=\"notes\">\n");
        for n in &data.notes {
            let _ = writeln!(html, "<li>{}</li>", esc(n));
        }
        html.push_str("</ul>\n");
    }
    let mut put = |name: &str, alt: &str, html: &mut String, r: Option<[PathBuf; 2]>| {
        if let Some(paths) = r {
            files.extend(paths);
            html.push_str(&figure_html(name, alt));
        }
    };
    if !data.metrics.is_empty() {
        html.push_str("<h2>Training</h2>\n");
        let r = reward_chart(data)
            .map(|c| save(&c, &out.join("reward")))
            .transpose()?;
        put(
            "reward",
            "Reward terms and pass rate over steps",
            &mut html,
            r,
        );
        let r = loss_chart(data)
            .map(|c| save(&c, &out.join("loss")))
            .transpose()?;
        put("loss", "Loss terms over steps", &mut html, r);
        let r = error_kind_chart(data)
            .map(|c| save(&c, &out.join("error_kinds")))
            .transpose()?;
        put(
            "error_kinds",
            "Outcomes of the training samples per step",
            &mut html,
            r,
        );
        let shown = data.metrics.len().min(TABLE_STEPS);
        let _ = writeln!(html, "<h3>The last {shown} steps</h3>");
        html.push_str(&step_table(&data.metrics));
    }
    if !data.evals.is_empty() {
        html.push_str("<h2>Evaluation</h2>\n");
        let r = pass_at_chart(&data.evals)
            .map(|c| save(&c, &out.join("pass_at_k")))
            .transpose()?;
        put("pass_at_k", "pass@k and exec@k by evaluation", &mut html, r);
        html.push_str(&eval_table(&data.evals));
        let r = outcome_chart(&data.evals)
            .map(|c| save(&c, &out.join("outcomes")))
            .transpose()?;
        put("outcomes", "Evaluation outcomes", &mut html, r);
        html.push_str("<h3>Samples by outcome</h3>\n");
        html.push_str(&outcome_table(&data.evals));
        let mut used = BTreeSet::new();
        for e in &data.evals {
            let Some(h) = transition_heatmap(e) else {
                continue;
            };
            let mut name = format!("transitions-{}", slug(&e.label));
            let mut i = 2;
            while !used.insert(name.clone()) {
                name = format!("transitions-{}-{i}", slug(&e.label));
                i += 1;
            }
            let r = save(&h, &out.join(&name))?;
            put(
                &name,
                &format!("Outcome transitions across repair attempts: {}", e.label),
                &mut html,
                Some(r),
            );
        }
    }
    html.push_str("</body></html>\n");
    let index = out.join("index.html");
    write_atomic(&index, html.as_bytes())?;
    files.push(index.clone());
    Ok(Written { index, files })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::data::load_run;
    use crate::report::tests::{eval, png_size, write_run};

    #[test]
    fn run_dir_report_draws_every_figure_and_links_it() {
        let dir = tempfile::tempdir().unwrap();
        write_run(dir.path());
        let data = load_run(dir.path()).unwrap();
        assert_eq!(data.metrics.len(), 5);
        assert_eq!(
            data.evals
                .iter()
                .map(|e| e.label.as_str())
                .collect::<Vec<_>>(),
            ["step 0", "step 4"]
        );
        let out = dir.path().join("report");
        let w = write_report(&data, &out).unwrap();
        for name in ["reward", "loss", "error_kinds", "pass_at_k", "outcomes"] {
            let png = out.join(format!("{name}.png"));
            let svg = out.join(format!("{name}.svg"));
            assert!(w.files.contains(&png) && w.files.contains(&svg), "{name}");
            let (width, height) = png_size(&png);
            assert_eq!(width, 1000, "{name}");
            assert!(height >= 200, "{name}: {height}");
        }
        let reward = std::fs::read_to_string(out.join("reward.svg")).unwrap();
        for s in [
            "coarse",
            "style",
            "total",
            "training pass rate",
            "held-out pass@1",
            "step",
        ] {
            assert!(reward.contains(s), "reward.svg lacks {s}");
        }
        // The null total loss is no point, the terms are.
        let loss = std::fs::read_to_string(out.join("loss.svg")).unwrap();
        assert!(loss.contains("fine") && loss.contains("grad norm"));
        let bars = std::fs::read_to_string(out.join("pass_at_k.svg")).unwrap();
        for s in [
            "step 0", "step 4", "pass@1", "pass@2", "exec@1", "40.0%", "60.0%",
        ] {
            assert!(bars.contains(s), "pass_at_k.svg lacks {s}");
        }
        let html = std::fs::read_to_string(&w.index).unwrap();
        for f in &w.files[..w.files.len() - 1] {
            let name = f.file_name().unwrap().to_string_lossy();
            assert!(
                html.contains(&format!("\"{name}\"")),
                "index.html lacks {name}"
            );
        }
        assert!(html.contains("<th>reward coarse</th>") && html.contains("<th>pass@2</th>"));
        assert!(
            !html.contains("transitions-"),
            "no repair attempts, no heatmap"
        );
    }

    #[test]
    fn directory_of_results_gives_bars_by_strategy_and_heatmaps() {
        let dir = tempfile::tempdir().unwrap();
        for (name, s, p, t) in [
            ("zero-shot", "zero-shot", 0.3, false),
            ("self-repair", "self-repair", 0.5, true),
        ] {
            std::fs::write(
                dir.path().join(format!("{name}.json")),
                serde_json::to_string(&eval(s, p, t)).unwrap(),
            )
            .unwrap();
        }
        std::fs::write(dir.path().join("other.json"), "{\"a\": 1}").unwrap();
        let data = load_run(dir.path()).unwrap();
        assert!(data.metrics.is_empty());
        assert_eq!(data.evals.len(), 2);
        assert_eq!(data.notes.len(), 1, "{:?}", data.notes);
        assert!(data.notes[0].contains("other.json"));
        let out = dir.path().join("r");
        let w = write_report(&data, &out).unwrap();
        assert!(!out.join("reward.png").exists());
        let bars = std::fs::read_to_string(out.join("pass_at_k.svg")).unwrap();
        assert!(bars.contains("self-repair") && bars.contains("zero-shot"));
        let heat = out.join("transitions-self-repair.png");
        assert!(w.files.contains(&heat));
        let (width, _) = png_size(&heat);
        assert!(width >= 560);
        let svg = std::fs::read_to_string(out.join("transitions-self-repair.svg")).unwrap();
        assert!(svg.contains("NameError") && svg.contains("from attempt i"));
        let html = std::fs::read_to_string(&w.index).unwrap();
        assert!(html.contains("transitions-self-repair.png") && html.contains("other.json"));
    }

    #[test]
    fn slugs_are_lowercase_words_and_dashes() {
        assert_eq!(slug("step 12"), "step-12");
        assert_eq!(slug("MemoCoder (v2)"), "memocoder-v2");
    }
}
