//! The figures of a run: reward and loss curves, error kinds by step,
//! pass@k and outcomes by evaluation, and repair-attempt transitions, each
//! `None` where the data has nothing to show.

use std::collections::{BTreeMap, BTreeSet};

use super::charts::{BarChart, Heatmap, LineChart, Panel, Series, StackedBars};
use super::data::{LabeledEval, RunData, StepMetrics};
use crate::eval::EvalResult;

pub(super) fn terms(
    metrics: &[StepMetrics],
    f: fn(&StepMetrics) -> &BTreeMap<String, Option<f64>>,
) -> Vec<String> {
    let keys: BTreeSet<&String> = metrics.iter().flat_map(|m| f(m).keys()).collect();
    // `total` last: it is drawn in black over the terms it sums. Keys
    // below a term (`judge/no_signal`: a count) are not terms.
    let mut v: Vec<String> = keys
        .into_iter()
        .filter(|k| *k != "total" && !k.contains('/'))
        .cloned()
        .collect();
    if metrics.iter().any(|m| f(m).contains_key("total")) {
        v.push("total".into());
    }
    v
}

fn term_series(
    metrics: &[StepMetrics],
    f: fn(&StepMetrics) -> &BTreeMap<String, Option<f64>>,
) -> Vec<Series> {
    terms(metrics, f)
        .into_iter()
        .map(|k| Series {
            points: metrics
                .iter()
                .filter_map(|m| Some((m.step as f64, (*f(m).get(&k)?)?)))
                .collect(),
            name: k,
            dashed: false,
        })
        .collect()
}

/// Sorted k of every `pass@k` / `exec@k` key over `evals`.
pub(super) fn ks<'a>(maps: impl Iterator<Item = &'a BTreeMap<String, f64>>) -> Vec<String> {
    let set: BTreeSet<(u64, String)> = maps
        .flat_map(|m| m.keys())
        .map(|k| (k.parse().unwrap_or(u64::MAX), k.clone()))
        .collect();
    set.into_iter().map(|(_, k)| k).collect()
}

/// Reward terms over steps above the pass rate (training, and held-out
/// pass@k at the steps `eval/step-N.json` was written).
pub fn reward_chart(data: &RunData) -> Option<LineChart> {
    let mut panels = Vec::new();
    let reward = term_series(&data.metrics, |m| &m.reward);
    if !reward.is_empty() {
        panels.push(Panel {
            title: "Reward terms (mean over scored samples)".into(),
            x_label: "step".into(),
            series: reward,
            percent: false,
        });
    }
    let mut pass = Vec::new();
    let train: Vec<(f64, f64)> = data
        .metrics
        .iter()
        .filter_map(|m| Some((m.step as f64, m.train_pass_rate()?)))
        .collect();
    if !train.is_empty() {
        pass.push(Series {
            name: "training pass rate".into(),
            points: train,
            dashed: false,
        });
    }
    let stepped: Vec<&LabeledEval> = data.evals.iter().filter(|e| e.step.is_some()).collect();
    for k in ks(stepped.iter().map(|e| &e.result.pass_at)) {
        pass.push(Series {
            name: format!("held-out pass@{k}"),
            points: stepped
                .iter()
                .filter_map(|e| Some((e.step? as f64, *e.result.pass_at.get(&k)?)))
                .collect(),
            dashed: true,
        });
    }
    if !pass.is_empty() {
        panels.push(Panel {
            title: "Pass rate".into(),
            x_label: "step".into(),
            series: pass,
            percent: true,
        });
    }
    (!panels.is_empty()).then(|| LineChart {
        title: "Rewards and pass rate".into(),
        panels,
    })
}

/// Loss terms over steps (and the gradient norm below them).
pub fn loss_chart(data: &RunData) -> Option<LineChart> {
    let loss = term_series(&data.metrics, |m| &m.loss);
    if loss.is_empty() {
        return None;
    }
    let mut panels = vec![Panel {
        title: "Loss terms".into(),
        x_label: "step".into(),
        series: loss,
        percent: false,
    }];
    let grad: Vec<(f64, f64)> = data
        .metrics
        .iter()
        .filter_map(|m| Some((m.step as f64, m.grad_norm?)))
        .collect();
    if !grad.is_empty() {
        panels.push(Panel {
            title: "Gradient norm (before clipping)".into(),
            x_label: "step".into(),
            series: vec![Series {
                name: "grad norm".into(),
                points: grad,
                dashed: false,
            }],
            percent: false,
        });
    }
    let mismatch = term_series(&data.metrics, |m| &m.mismatch);
    if !mismatch.is_empty() {
        panels.push(Panel {
            title: "Rollout engine vs trainer: |Δ log p| and KL per token".into(),
            x_label: "step".into(),
            series: mismatch,
            percent: false,
        });
    }
    Some(LineChart {
        title: "Losses".into(),
        panels,
    })
}

/// Names ordered `pass` first, then by total count, then by name.
pub(super) fn by_weight(totals: &BTreeMap<String, f64>) -> Vec<String> {
    let mut v: Vec<(&String, f64)> = totals.iter().map(|(k, &n)| (k, n)).collect();
    v.sort_by(|a, b| {
        (a.0 != "pass")
            .cmp(&(b.0 != "pass"))
            .then(b.1.total_cmp(&a.1))
            .then(a.0.cmp(b.0))
    });
    v.into_iter().map(|(k, _)| k.clone()).collect()
}

/// Share of each outcome among the training samples of every step.
pub fn error_kind_chart(data: &RunData) -> Option<StackedBars> {
    let steps: Vec<&StepMetrics> = data
        .metrics
        .iter()
        .filter(|m| m.error_kinds.values().sum::<u64>() > 0)
        .collect();
    if steps.is_empty() {
        return None;
    }
    let mut totals = BTreeMap::new();
    for m in &steps {
        for (k, &n) in &m.error_kinds {
            *totals.entry(k.clone()).or_insert(0.0) += n as f64;
        }
    }
    let layers = by_weight(&totals)
        .into_iter()
        .map(|k| {
            let fr = steps
                .iter()
                .map(|m| {
                    let all = m.error_kinds.values().sum::<u64>() as f64;
                    m.error_kinds.get(&k).copied().unwrap_or(0) as f64 / all
                })
                .collect();
            (k, fr)
        })
        .collect();
    Some(StackedBars {
        title: "Outcomes of the training samples (share per step)".into(),
        x_label: "step".into(),
        x: steps.iter().map(|m| m.step as f64).collect(),
        layers,
    })
}

/// pass@k and exec@k of every evaluation result.
pub fn pass_at_chart(evals: &[LabeledEval]) -> Option<BarChart> {
    if evals.is_empty() {
        return None;
    }
    let mut series = Vec::new();
    for (what, get) in [
        (
            "pass",
            (|r: &EvalResult| &r.pass_at) as fn(&EvalResult) -> &BTreeMap<String, f64>,
        ),
        ("exec", |r: &EvalResult| &r.exec_at),
    ] {
        for k in ks(evals.iter().map(|e| get(&e.result))) {
            series.push((
                format!("{what}@{k}"),
                evals
                    .iter()
                    .map(|e| get(&e.result).get(&k).copied())
                    .collect(),
            ));
        }
    }
    Some(BarChart {
        title: "pass@k and exec@k by evaluation".into(),
        categories: evals.iter().map(|e| e.label.clone()).collect(),
        series,
        value_label: "share of tasks (unbiased estimator)".into(),
        percent: true,
    })
}

/// Share of samples by outcome, a bar per evaluation result.
pub fn outcome_chart(evals: &[LabeledEval]) -> Option<BarChart> {
    let mut totals = BTreeMap::new();
    for e in evals {
        let all = e.result.outcomes.values().sum::<usize>().max(1) as f64;
        for (k, &n) in &e.result.outcomes {
            *totals.entry(k.clone()).or_insert(0.0) += n as f64 / all;
        }
    }
    if totals.is_empty() {
        return None;
    }
    let categories = by_weight(&totals);
    let series = evals
        .iter()
        .map(|e| {
            let all = e.result.outcomes.values().sum::<usize>().max(1) as f64;
            let v = categories
                .iter()
                .map(|k| Some(e.result.outcomes.get(k).copied().unwrap_or(0) as f64 / all))
                .collect();
            (e.label.clone(), v)
        })
        .collect();
    Some(BarChart {
        title: "Evaluation outcomes (share of samples)".into(),
        categories,
        series,
        value_label: "share of samples".into(),
        percent: true,
    })
}

/// The error transition matrix of one result, when it has one.
pub fn transition_heatmap(e: &LabeledEval) -> Option<Heatmap> {
    let t = &e.result.transitions;
    (!t.is_empty()).then(|| Heatmap {
        title: format!("Outcome transitions across repair attempts: {}", e.label),
        row_title: "from attempt i".into(),
        col_title: "to attempt i+1".into(),
        labels: t.labels.clone(),
        counts: t.counts.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::step_line;

    #[test]
    fn the_engine_mismatch_gets_a_panel_only_when_logged() {
        let plain: StepMetrics = serde_json::from_str(&step_line(0, 0.5)).unwrap();
        let mut with = plain.clone();
        with.mismatch = [
            ("abs_mean".to_owned(), Some(3e-6)),
            ("kl".to_owned(), Some(1e-9)),
        ]
        .into();
        let data = |m: StepMetrics| RunData {
            metrics: vec![m],
            ..RunData::default()
        };
        let panels = |d: &RunData| loss_chart(d).unwrap().panels;
        assert_eq!(panels(&data(plain)).len(), 2);
        let p = panels(&data(with));
        assert_eq!(p.len(), 3);
        assert!(p[2].title.contains("log p"), "{}", p[2].title);
        assert_eq!(p[2].series.len(), 2);
    }
}
