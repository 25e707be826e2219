//! `falcon report`: plots (PNG and SVG) and an `index.html` with tables for
//! a run directory (`metrics.jsonl`, `eval/step-N.json`) or a directory of
//! evaluation results (`falcon eval --out`). The figure types here take plain
//! data, so `falcon ablate` draws its summary with the same code.
//!
//! Drawing uses `plotters` without system libraries: its `ttf` feature needs
//! fontconfig and freetype, so text goes through `ab_glyph` with DejaVu Sans
//! embedded by the `dejavu` crate, and PNGs are encoded by the `png` crate
//! (plotters' own encoder drags in all of `image`). SVGs carry `<text>`
//! elements, so a browser uses its own sans-serif there; the embedded font
//! only measures them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::Deserialize;

use super::EvalResult;
use crate::fsutil::{io_err, write_atomic, IoError};

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

// ---------------------------------------------------------------------------
// Inputs.

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
    fn train_pass_rate(&self) -> Option<f64> {
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

// ---------------------------------------------------------------------------
// Figures.

/// A figure that can be drawn on any plotters backend (SVG and bitmap).
pub trait Figure {
    /// Canvas size in pixels.
    fn size(&self) -> (u32, u32);
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String>;
}

/// One line (or marker set) of a [`Panel`].
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Dashed line: a second kind of figure on the same axes (held-out
    /// evaluations beside the training pass rate).
    pub dashed: bool,
}

/// One set of axes of a [`LineChart`].
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub series: Vec<Series>,
    /// Show y as a percentage of 1, on 0..100 %.
    pub percent: bool,
}

/// Lines over steps, one panel above the other, legends on the right.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    pub title: String,
    pub panels: Vec<Panel>,
}

/// Horizontal grouped bars: a row per category, a bar per series.
/// Horizontal because category names (strategies, variants, error kinds) are
/// long and the embedded font renderer cannot rotate text.
#[derive(Debug, Clone, PartialEq)]
pub struct BarChart {
    pub title: String,
    pub categories: Vec<String>,
    /// `(name, value per category)`; `None` draws no bar.
    pub series: Vec<(String, Vec<Option<f64>>)>,
    pub value_label: String,
    /// Values are fractions shown as percentages, on 0..100 %.
    pub percent: bool,
}

/// Vertical stacked bars of fractions: one bar per x, one layer per name.
#[derive(Debug, Clone, PartialEq)]
pub struct StackedBars {
    pub title: String,
    pub x_label: String,
    pub x: Vec<f64>,
    /// `(name, fraction per x)`, bottom layer first.
    pub layers: Vec<(String, Vec<f64>)>,
}

/// A count matrix with labelled rows and columns.
#[derive(Debug, Clone, PartialEq)]
pub struct Heatmap {
    pub title: String,
    pub row_title: String,
    pub col_title: String,
    pub labels: Vec<String>,
    pub counts: Vec<Vec<usize>>,
}

const FONT: &str = "sans-serif";
const TEXT: RGBColor = RGBColor(30, 30, 30);
const GRID: RGBColor = RGBColor(225, 225, 225);
/// Tableau 10, with its green kept for `pass`.
const PALETTE: [RGBColor; 9] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];
const PASS: RGBColor = RGBColor(44, 160, 44);

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// `pass` is green everywhere; other names take the palette in order.
fn colors_for(names: &[String]) -> Vec<RGBColor> {
    let mut next = 0;
    names
        .iter()
        .map(|n| {
            if n == "pass" || n == "total" {
                if n == "pass" {
                    PASS
                } else {
                    BLACK
                }
            } else {
                next += 1;
                color(next - 1)
            }
        })
        .collect()
}

fn de<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> String {
    e.to_string()
}

fn text_style(size: u32) -> TextStyle<'static> {
    (FONT, size).into_font().color(&TEXT)
}

fn fmt_num(v: f64) -> String {
    let a = v.abs();
    // Axis ticks at 0 come out as ±1e-17 from the tick arithmetic.
    if a < 1e-12 {
        "0".into()
    } else if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.001 {
        // Three significant figures at most, without trailing zeros.
        let decimals = if a >= 0.1 {
            3
        } else if a >= 0.01 {
            4
        } else {
            5
        };
        let s = format!("{v:.decimals$}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        format!("{v:.1e}")
    }
}

fn fmt_pct(v: f64) -> String {
    format!("{:.0}%", 100.0 * v)
}

fn fmt_step(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        format!("{v:.1}")
    }
}

/// Cut a label to `max` characters.
fn short(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(max - 1).collect();
        t.push('…');
        t
    }
}

/// The data range padded by 5 % (and widened when flat).
fn padded(lo: f64, hi: f64) -> (f64, f64) {
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    if hi - lo < 1e-12 {
        let d = if lo.abs() > 1e-12 {
            lo.abs() * 0.1
        } else {
            0.5
        };
        return (lo - d, hi + d);
    }
    let d = (hi - lo) * 0.05;
    (lo - d, hi + d)
}

#[derive(Clone, Copy)]
enum Mark {
    Line { dashed: bool },
    Square,
}

/// A legend column: a mark and a name per row, from `top` down.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    items: &[(String, RGBColor, Mark)],
    top: i32,
) -> Result<(), String> {
    let font = text_style(14).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, (name, c, mark)) in items.iter().enumerate() {
        let y = top + 22 * i as i32;
        match mark {
            Mark::Line { dashed: false } => area
                .draw(&PathElement::new(vec![(4, y), (30, y)], c.stroke_width(2)))
                .map_err(de)?,
            Mark::Line { dashed: true } => {
                for x in [4, 14, 24] {
                    area.draw(&PathElement::new(
                        vec![(x, y), (x + 6, y)],
                        c.stroke_width(2),
                    ))
                    .map_err(de)?;
                }
            }
            Mark::Square => area
                .draw(&Rectangle::new([(8, y - 6), (22, y + 6)], c.filled()))
                .map_err(de)?,
        }
        if let Mark::Line { .. } = mark {
            area.draw(&Circle::new((17, y), 3, c.filled()))
                .map_err(de)?;
        }
        area.draw(&Text::new(short(name, 32), (38, y), font.clone()))
            .map_err(de)?;
    }
    Ok(())
}

/// Pixels a legend of `names` needs.
fn legend_width<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, names: &[&str]) -> u32 {
    let font = text_style(14);
    let widest = names
        .iter()
        .filter_map(|n| area.estimate_text_size(&short(n, 32), &font).ok())
        .map(|(w, _)| w)
        .max()
        .unwrap_or(0);
    (widest + 52).clamp(110, 320)
}

fn title_area<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
) -> Result<DrawingArea<DB, Shift>, String> {
    root.fill(&WHITE).map_err(de)?;
    root.margin(8, 0, 0, 0)
        .titled(title, text_style(22))
        .map_err(de)
}

impl Figure for LineChart {
    fn size(&self) -> (u32, u32) {
        (1000, 50 + 330 * self.panels.len().max(1) as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let area = title_area(root, &self.title)?;
        // Panels share the x range and the legend width, so their steps line up.
        let xs = self
            .panels
            .iter()
            .flat_map(|p| &p.series)
            .flat_map(|s| &s.points)
            .map(|q| q.0)
            .filter(|x| x.is_finite());
        let (x0, x1) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(x), b.max(x))
        });
        let x = if !x0.is_finite() {
            (0.0, 1.0)
        } else if x1 - x0 < 1e-9 {
            (x0 - 1.0, x1 + 1.0)
        } else {
            (x0, x1)
        };
        let names: Vec<&str> = self
            .panels
            .iter()
            .flat_map(|p| &p.series)
            .map(|s| s.name.as_str())
            .collect();
        let lw = legend_width(&area, &names);
        let panels = area.split_evenly((self.panels.len().max(1), 1));
        for (p, a) in self.panels.iter().zip(&panels) {
            draw_panel(p, a, x, lw)?;
        }
        Ok(())
    }
}

fn draw_panel<DB: DrawingBackend>(
    p: &Panel,
    area: &DrawingArea<DB, Shift>,
    (x0, x1): (f64, f64),
    legend_w: u32,
) -> Result<(), String> {
    let (plot, legend) = area.split_horizontally(area.dim_in_pixel().0.saturating_sub(legend_w));
    let pts = || p.series.iter().flat_map(|s| &s.points);
    let fold = |f: fn(f64, f64) -> f64, init: f64, g: fn(&(f64, f64)) -> f64| {
        pts().map(g).filter(|v| v.is_finite()).fold(init, f)
    };
    let (y0, y1) = if p.percent {
        (0.0, 1.02)
    } else {
        padded(
            fold(f64::min, f64::INFINITY, |q| q.1),
            fold(f64::max, f64::NEG_INFINITY, |q| q.1),
        )
    };
    let mut chart = ChartBuilder::on(&plot)
        .caption(&p.title, text_style(17))
        .margin(10)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(de)?;
    // Integer steps: no more ticks than steps, so none falls between two.
    let x_ticks = ((x1 - x0).round() as usize + 1).clamp(2, 12);
    let fy: &dyn Fn(&f64) -> String = if p.percent {
        &|v| fmt_pct(*v)
    } else {
        &|v| fmt_num(*v)
    };
    chart
        .configure_mesh()
        .max_light_lines(0)
        .bold_line_style(GRID)
        .x_labels(x_ticks)
        .y_labels(8)
        .x_label_formatter(&|v| fmt_step(*v))
        .y_label_formatter(fy)
        .x_desc(p.x_label.as_str())
        .label_style(text_style(13))
        .axis_desc_style(text_style(14))
        .draw()
        .map_err(de)?;
    let names: Vec<String> = p.series.iter().map(|s| s.name.clone()).collect();
    let colors = colors_for(&names);
    let mut items = Vec::new();
    for (s, &c) in p.series.iter().zip(&colors) {
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|q| q.0.is_finite() && q.1.is_finite())
            .collect();
        if s.dashed {
            chart
                .draw_series(DashedLineSeries::new(pts.clone(), 6, 4, c.stroke_width(2)))
                .map_err(de)?;
        } else {
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
                .map_err(de)?;
        }
        // Markers show single points and where the samples are; past a few
        // dozen they only blot the line.
        if pts.len() <= 60 || s.dashed {
            chart
                .draw_series(pts.iter().map(|&q| Circle::new(q, 3, c.filled())))
                .map_err(de)?;
        }
        items.push((s.name.clone(), c, Mark::Line { dashed: s.dashed }));
    }
    draw_legend(&legend, &items, 48)
}

impl Figure for BarChart {
    fn size(&self) -> (u32, u32) {
        let per = (self.series.len().max(1) as u32 * 20 + 12).max(30);
        (1000, 130 + per * self.categories.len().max(1) as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let area = title_area(root, &self.title)?;
        let names: Vec<&str> = self.series.iter().map(|s| s.0.as_str()).collect();
        let lw = legend_width(&area, &names);
        let (plot, legend) = area.split_horizontally(area.dim_in_pixel().0.saturating_sub(lw));
        let n = self.categories.len().max(1);
        let values = || {
            self.series
                .iter()
                .flat_map(|s| s.1.iter().flatten().copied())
        };
        let (lo, hi) = if self.percent {
            (0.0, 1.0)
        } else {
            values().fold((0.0f64, 0.0f64), |(a, b), v| (a.min(v), b.max(v)))
        };
        let (lo, hi) = if hi - lo < 1e-12 {
            (lo, lo + 1.0)
        } else {
            (lo, hi)
        };
        // Room past the bar ends for the value labels.
        let span = hi - lo;
        let x_range_lo = lo - if lo < 0.0 { 0.18 * span } else { 0.0 };
        let x_range = x_range_lo..(hi + 0.18 * span);
        let label_font = text_style(13);
        let label_w = self
            .categories
            .iter()
            .filter_map(|c| plot.estimate_text_size(&short(c, 40), &label_font).ok())
            .map(|(w, _)| w)
            .max()
            .unwrap_or(0)
            + 16;
        let mut chart = ChartBuilder::on(&plot)
            .margin(10)
            .x_label_area_size(44)
            .y_label_area_size(label_w.max(40))
            .build_cartesian_2d(x_range, -0.5..n as f64 - 0.5)
            .map_err(de)?;
        let fx: &dyn Fn(&f64) -> String = if self.percent {
            &|v| fmt_pct(*v)
        } else {
            &|v| fmt_num(*v)
        };
        chart
            .configure_mesh()
            .max_light_lines(0)
            .bold_line_style(GRID)
            .disable_y_mesh()
            .x_labels(10)
            .y_labels(0)
            .x_label_formatter(fx)
            .x_desc(self.value_label.as_str())
            .label_style(label_font.clone())
            .axis_desc_style(text_style(14))
            .draw()
            .map_err(de)?;
        // Category names by hand, category 0 on top: plotters places its
        // own labels at "nice" values, which need not be the integers.
        let right = label_font.pos(Pos::new(HPos::Right, VPos::Center));
        for (i, c) in self.categories.iter().enumerate() {
            let (x, y) = chart.backend_coord(&(x_range_lo, (n - 1 - i) as f64));
            root.draw(&Text::new(short(c, 40), (x - 8, y), right.clone()))
                .map_err(de)?;
        }
        let m = self.series.len().max(1) as f64;
        let h = 0.8 / m;
        let colors = colors_for(&self.series.iter().map(|s| s.0.clone()).collect::<Vec<_>>());
        let value_font = text_style(12);
        let mut items = Vec::new();
        for (j, ((name, vals), &c)) in self.series.iter().zip(&colors).enumerate() {
            for (i, v) in vals.iter().enumerate().take(n) {
                let Some(v) = v.filter(|v| v.is_finite()) else {
                    continue;
                };
                let top = (n - 1 - i) as f64 + 0.4 - j as f64 * h;
                let bottom = top - h * 0.9;
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(0.0f64.min(v), bottom), (0.0f64.max(v), top)],
                        c.filled(),
                    )))
                    .map_err(de)?;
                let label = if self.percent {
                    format!("{:.1}%", 100.0 * v)
                } else {
                    fmt_num(v)
                };
                let (pos, x) = if v < 0.0 {
                    (Pos::new(HPos::Right, VPos::Center), v - 0.01 * span)
                } else {
                    (Pos::new(HPos::Left, VPos::Center), v + 0.01 * span)
                };
                chart
                    .draw_series(std::iter::once(Text::new(
                        label,
                        (x, (top + bottom) / 2.0),
                        value_font.pos(pos),
                    )))
                    .map_err(de)?;
            }
            items.push((name.clone(), c, Mark::Square));
        }
        if lo < 0.0 {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(0.0, -0.5), (0.0, n as f64 - 0.5)],
                    TEXT.stroke_width(1),
                )))
                .map_err(de)?;
        }
        draw_legend(&legend, &items, 24)
    }
}

impl Figure for StackedBars {
    fn size(&self) -> (u32, u32) {
        (1000, 420)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let area = title_area(root, &self.title)?;
        let names: Vec<&str> = self.layers.iter().map(|s| s.0.as_str()).collect();
        let lw = legend_width(&area, &names);
        let (plot, legend) = area.split_horizontally(area.dim_in_pixel().0.saturating_sub(lw));
        let lo = self.x.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = self.x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let (lo, hi) = if lo.is_finite() { (lo, hi) } else { (0.0, 0.0) };
        let mut chart = ChartBuilder::on(&plot)
            .margin(10)
            .x_label_area_size(44)
            .y_label_area_size(56)
            .build_cartesian_2d(lo - 0.5..hi + 0.5, 0.0..1.0)
            .map_err(de)?;
        chart
            .configure_mesh()
            .max_light_lines(0)
            .bold_line_style(GRID)
            .disable_x_mesh()
            .x_labels(((hi - lo).round() as usize + 1).clamp(2, 12))
            .y_labels(6)
            .x_label_formatter(&|v| fmt_step(*v))
            .y_label_formatter(&|v| fmt_pct(*v))
            .x_desc(self.x_label.as_str())
            .label_style(text_style(13))
            .axis_desc_style(text_style(14))
            .draw()
            .map_err(de)?;
        let colors = colors_for(&self.layers.iter().map(|s| s.0.clone()).collect::<Vec<_>>());
        let half = if self.x.len() > 80 { 0.5 } else { 0.4 };
        let mut base = vec![0.0f64; self.x.len()];
        let mut items = Vec::new();
        for ((name, fr), &c) in self.layers.iter().zip(&colors) {
            let rects: Vec<_> = self
                .x
                .iter()
                .zip(fr)
                .zip(base.iter_mut())
                .filter(|((_, &f), _)| f > 0.0)
                .map(|((&x, &f), b)| {
                    let r = Rectangle::new([(x - half, *b), (x + half, *b + f)], c.filled());
                    *b += f;
                    r
                })
                .collect();
            chart.draw_series(rects).map_err(de)?;
            items.push((name.clone(), c, Mark::Square));
        }
        // The legend reads top-down like the stack.
        items.reverse();
        draw_legend(&legend, &items, 24)
    }
}

impl Heatmap {
    fn cell(&self) -> u32 {
        let widest = self
            .labels
            .iter()
            .map(|l| short(l, 20).chars().count() as u32)
            .max()
            .unwrap_or(1);
        // About 7 px a character at 13 px: a column is as wide as its label.
        (widest * 7 + 14).max(56)
    }

    fn row_label_w(&self) -> u32 {
        let widest = self
            .labels
            .iter()
            .map(|l| short(l, 20).chars().count() as u32)
            .max()
            .unwrap_or(1)
            .max(self.row_title.chars().count() as u32);
        widest * 7 + 24
    }
}

impl Figure for Heatmap {
    fn size(&self) -> (u32, u32) {
        let n = self.labels.len().max(1) as u32;
        let w = self.row_label_w() + n * self.cell() + 30;
        (w.max(560), 120 + n * self.cell() + 30)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let area = title_area(root, &self.title)?;
        let n = self.labels.len();
        let cell = self.cell() as i32;
        let x0 = self.row_label_w() as i32;
        let y0 = 64;
        let max = self
            .counts
            .iter()
            .flatten()
            .copied()
            .max()
            .unwrap_or(0)
            .max(1);
        let small = text_style(13);
        area.draw(&Text::new(
            self.col_title.clone(),
            (x0 + cell * n as i32 / 2, 10),
            text_style(14).pos(Pos::new(HPos::Center, VPos::Top)),
        ))
        .map_err(de)?;
        area.draw(&Text::new(
            self.row_title.clone(),
            (x0 - 10, y0 - 10),
            text_style(14).pos(Pos::new(HPos::Right, VPos::Bottom)),
        ))
        .map_err(de)?;
        for (j, l) in self.labels.iter().enumerate() {
            area.draw(&Text::new(
                short(l, 20),
                (x0 + cell * j as i32 + cell / 2, y0 - 8),
                small.pos(Pos::new(HPos::Center, VPos::Bottom)),
            ))
            .map_err(de)?;
        }
        for (i, l) in self.labels.iter().enumerate() {
            let y = y0 + cell * i as i32;
            area.draw(&Text::new(
                short(l, 20),
                (x0 - 10, y + cell / 2),
                small.pos(Pos::new(HPos::Right, VPos::Center)),
            ))
            .map_err(de)?;
            for j in 0..n {
                let v = self
                    .counts
                    .get(i)
                    .and_then(|r| r.get(j))
                    .copied()
                    .unwrap_or(0);
                let t = v as f64 / max as f64;
                // White to the palette's blue.
                let mix = |a: u8, b: u8| (a as f64 + (b as f64 - a as f64) * t).round() as u8;
                let fill = RGBColor(mix(255, 31), mix(255, 119), mix(255, 180));
                let x = x0 + cell * j as i32;
                area.draw(&Rectangle::new(
                    [(x, y), (x + cell, y + cell)],
                    fill.filled(),
                ))
                .map_err(de)?;
                area.draw(&Rectangle::new(
                    [(x, y), (x + cell, y + cell)],
                    GRID.stroke_width(1),
                ))
                .map_err(de)?;
                let ink = if t > 0.55 { WHITE } else { TEXT };
                area.draw(&Text::new(
                    v.to_string(),
                    (x + cell / 2, y + cell / 2),
                    (FONT, 14)
                        .into_font()
                        .color(&ink)
                        .pos(Pos::new(HPos::Center, VPos::Center)),
                ))
                .map_err(de)?;
            }
        }
        Ok(())
    }
}

fn ensure_font() -> Result<(), String> {
    static OK: OnceLock<bool> = OnceLock::new();
    let ok = *OK.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err("the embedded DejaVu Sans font did not load".into())
    }
}

fn encode_png(rgb: &[u8], (w, h): (u32, u32)) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header().map_err(|e| e.to_string())?;
    writer.write_image_data(rgb).map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())?;
    Ok(out)
}

/// Draw `fig` to `<stem>.svg` and `<stem>.png`, each written atomically.
/// Returns both paths (SVG first).
pub fn save<F: Figure>(fig: &F, stem: &Path) -> Result<[PathBuf; 2], ReportError> {
    let svg_path = stem.with_extension("svg");
    let png_path = stem.with_extension("png");
    let draw_err = |path: &Path| {
        let path = path.to_path_buf();
        move |detail| ReportError::Draw { path, detail }
    };
    ensure_font().map_err(draw_err(&png_path))?;
    let size = fig.size();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        fig.draw(&root)
            .and_then(|()| root.present().map_err(de))
            .map_err(draw_err(&svg_path))?;
    }
    let mut rgb = vec![0u8; size.0 as usize * size.1 as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, size).into_drawing_area();
        fig.draw(&root)
            .and_then(|()| root.present().map_err(de))
            .map_err(draw_err(&png_path))?;
    }
    let png = encode_png(&rgb, size).map_err(draw_err(&png_path))?;
    write_atomic(&svg_path, svg.as_bytes())?;
    write_atomic(&png_path, &png)?;
    Ok([svg_path, png_path])
}

// ---------------------------------------------------------------------------
// The figures of a run.

fn terms(
    metrics: &[StepMetrics],
    f: fn(&StepMetrics) -> &BTreeMap<String, Option<f64>>,
) -> Vec<String> {
    let keys: BTreeSet<&String> = metrics.iter().flat_map(|m| f(m).keys()).collect();
    // `total` last: it is drawn in black over the terms it sums.
    let mut v: Vec<String> = keys
        .into_iter()
        .filter(|k| *k != "total")
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
fn ks<'a>(maps: impl Iterator<Item = &'a BTreeMap<String, f64>>) -> Vec<String> {
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
fn by_weight(totals: &BTreeMap<String, f64>) -> Vec<String> {
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

// ---------------------------------------------------------------------------
// index.html.

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

    fn step_line(step: u64, pass: f64) -> String {
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

    /// A result built from JSON with only the fields every version of the
    /// format has, so the test does not follow `EvalResult`'s field list.
    fn eval(strategy: &str, p1: f64, transitions: bool) -> EvalResult {
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

    fn write_run(dir: &Path) {
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

    fn png_size(path: &Path) -> (u32, u32) {
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

    #[test]
    fn slugs_and_number_formats() {
        assert_eq!(slug("step 12"), "step-12");
        assert_eq!(slug("MemoCoder (v2)"), "memocoder-v2");
        assert_eq!(fmt_num(0.0), "0");
        assert_eq!(fmt_num(0.25), "0.25");
        assert_eq!(fmt_num(12.345), "12.3");
        assert_eq!(fmt_num(4.8e-17), "0");
        assert_eq!(fmt_num(-3e-5), "-3.0e-5");
        assert_eq!(fmt_num(0.0066), "0.0066");
        assert_eq!(fmt_step(3.0), "3");
        assert_eq!(short("abcdef", 4), "abc…");
    }
}
