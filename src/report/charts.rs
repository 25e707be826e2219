//! The figure types ([`LineChart`], [`BarChart`], [`StackedBars`],
//! [`Heatmap`]), which take plain data, and [`save`], which draws one to
//! SVG and PNG.
//!
//! Drawing uses `plotters` without system libraries: its `ttf` feature needs
//! fontconfig and freetype, so text goes through `ab_glyph` with DejaVu Sans
//! embedded by the `dejavu` crate, and PNGs are encoded by the `png` crate
//! (plotters' own encoder drags in all of `image`). SVGs carry `<text>`
//! elements, so a browser uses its own sans-serif there; the embedded font
//! only measures them.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::ReportError;
use crate::fsutil::write_atomic;

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

pub(super) fn fmt_num(v: f64) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_formats() {
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
