//! `falcon ablate --grid FILE`: a base run config and named variants of it
//! (dotted config keys set to new values), each trained with the base's
//! seeds into `<output_dir>/<grid name>/<variant>`, and a summary of all of
//! them (markdown, CSV and plots).
//!
//! This module owns the grid file, merging a variant's overrides into the
//! base TOML before the schema sees it (so `deny_unknown_fields` rejects a
//! misspelt key, and the error names the variant and the key), the
//! finished-variant marker, and the summary. The training loop itself is
//! the CLI's, shared with `falcon train`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{Job, RunConfig};
use crate::eval::report::{self, BarChart, ReportError};
use crate::fsutil::{io_err, write_atomic, IoError};

/// Written into a variant's directory once it has trained and been
/// evaluated; holds its [`SummaryRow`]. A variant with one is not rerun.
pub use crate::run_dir::ABLATE_DONE as DONE_FILE;
/// The variant's resolved config, written before it trains; a later run of
/// the grid that resolves the variant differently refuses to mix the two.
pub use crate::run_dir::CONFIG as CONFIG_FILE;

/// Problems with a grid, a variant or its run directory.
#[derive(Debug, thiserror::Error)]
pub enum AblateError {
    /// A file operation failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// The grid file itself: not TOML, or not a grid.
    #[error("{path}: {message}")]
    Grid { path: PathBuf, message: String },
    /// One variant's config could not be made.
    #[error("variant `{variant}`: {message}")]
    Variant { variant: String, message: String },
    /// A variant directory holds the results of a different config.
    #[error(
        "variant `{variant}`: {dir} was made with a different config (see its {CONFIG_FILE}); \
         delete that directory to rerun the variant, or give the grid a new name"
    )]
    Stale { variant: String, dir: PathBuf },
    #[error("{path}: {detail}")]
    BadMarker { path: PathBuf, detail: String },
    /// A finished variant's run directory lacks what the summary needs.
    #[error("variant `{variant}`: {message}")]
    Incomplete { variant: String, message: String },
    #[error(transparent)]
    Report(#[from] ReportError),
}

/// Dotted config keys and their new values, in the order they apply.
pub type Overrides = Vec<(String, toml::Value)>;

/// One named variant of the base config.
#[derive(Debug, Clone, PartialEq)]
pub struct Variant {
    pub name: String,
    pub set: Overrides,
}

/// A parsed grid file.
#[derive(Debug, Clone, PartialEq)]
pub struct Grid {
    /// Where the grid came from (for messages).
    pub path: PathBuf,
    /// The base run config, resolved against the grid file's directory.
    pub base: PathBuf,
    /// Names the grid's directory under the base's `run.output_dir`.
    pub name: String,
    /// Overrides every variant gets before its own.
    pub set: Overrides,
    pub variants: Vec<Variant>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GridFile {
    base: PathBuf,
    name: String,
    #[serde(default)]
    set: toml::Table,
    #[serde(default)]
    variant: Vec<VariantFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VariantFile {
    name: String,
    #[serde(default)]
    set: toml::Table,
}

/// `{ "reward.style" = "off" }` and `{ reward = { style = "off" } }` say the
/// same; both become `reward.style`.
fn flatten(prefix: &str, table: &toml::Table, out: &mut Overrides) {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(t) if !t.is_empty() => flatten(&key, t, out),
            v => out.push((key, v.clone())),
        }
    }
}

/// A name usable as a directory: what `[run] name` accepts, minus dots at
/// the start (hidden directories are too easy to miss).
fn check_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.starts_with('.') || name.contains(['/', '\\']) {
        return Err(format!(
            "{what} {name:?} must be a directory name: not empty, no '/' or '\\', not starting with '.'"
        ));
    }
    Ok(())
}

/// The overrides ablate sets itself or that would break "same seeds".
fn reserved(key: &str, variant: bool) -> Option<&'static str> {
    match key {
        "run.name" => Some("each variant's run is named after the variant"),
        "run.output_dir" if variant => {
            Some("variants run under <output_dir>/<grid name>; set run.output_dir in the grid's top-level `set`")
        }
        "run.seed" if variant => Some(
            "every variant runs with the same seeds; set run.seed in the base config or the grid's top-level `set`",
        ),
        _ => None,
    }
}

impl Grid {
    /// Read and check a grid file (not the variants' configs: see
    /// [`Grid::resolve`]).
    pub fn load(path: &Path) -> Result<Grid, AblateError> {
        let text = std::fs::read_to_string(path).map_err(io_err(path, "read"))?;
        Self::parse(&text, path)
    }

    /// Parse grid TOML; `path` locates the base config and names errors.
    pub fn parse(text: &str, path: &Path) -> Result<Grid, AblateError> {
        let bad = |message: String| AblateError::Grid {
            path: path.to_path_buf(),
            message,
        };
        let g: GridFile = toml::from_str(text).map_err(|e| bad(format!("not a grid: {e}")))?;
        check_name("name", &g.name).map_err(bad)?;
        if g.variant.is_empty() {
            return Err(bad(
                "no variants: add [[variant]] tables with a `name` (and `set`)".into(),
            ));
        }
        let mut set = Vec::new();
        flatten("", &g.set, &mut set);
        if let Some((k, why)) = set.iter().find_map(|(k, _)| Some((k, reserved(k, false)?))) {
            return Err(bad(format!("set: {k}: {why}")));
        }
        let mut seen = BTreeSet::new();
        let mut variants = Vec::new();
        for v in g.variant {
            check_name("variant name", &v.name).map_err(bad)?;
            if !seen.insert(v.name.clone()) {
                return Err(bad(format!("two variants are named {:?}", v.name)));
            }
            let mut vset = Vec::new();
            flatten("", &v.set, &mut vset);
            if let Some((k, why)) = vset.iter().find_map(|(k, _)| Some((k, reserved(k, true)?))) {
                return Err(AblateError::Variant {
                    variant: v.name,
                    message: format!("{k}: {why}"),
                });
            }
            variants.push(Variant {
                name: v.name,
                set: vset,
            });
        }
        let dir = path.parent().unwrap_or(Path::new(""));
        Ok(Grid {
            path: path.to_path_buf(),
            base: dir.join(g.base),
            name: g.name,
            set,
            variants,
        })
    }

    fn base_table(&self) -> Result<toml::Table, AblateError> {
        let text = std::fs::read_to_string(&self.base).map_err(io_err(&self.base, "read"))?;
        toml::from_str(&text).map_err(|e| AblateError::Grid {
            path: self.base.clone(),
            message: format!("base config is not TOML: {e}"),
        })
    }

    /// `<run.output_dir>/<name>` of the base with the grid's own overrides.
    pub fn output_dir(&self) -> Result<PathBuf, AblateError> {
        let cfg = self.config_of(&Variant {
            name: String::new(),
            set: Vec::new(),
        })?;
        Ok(cfg.run.output_dir.join(&self.name))
    }

    /// The base with the grid's and the variant's overrides, parsed; not
    /// yet named or validated.
    fn config_of(&self, v: &Variant) -> Result<RunConfig, AblateError> {
        let base = self.base_table()?;
        let all: Overrides = self.set.iter().chain(&v.set).cloned().collect();
        let who = if v.name.is_empty() {
            "(the grid's set)".to_owned()
        } else {
            v.name.clone()
        };
        let verr = |message: String| AblateError::Variant {
            variant: who.clone(),
            message,
        };
        let mut table = base.clone();
        apply_overrides(&mut table, &all).map_err(verr)?;
        match parse_config(table) {
            Ok(cfg) => Ok(cfg),
            Err(e) => {
                // Name the override at fault: the first that fails alone.
                for (k, val) in &all {
                    let mut t = base.clone();
                    let one = [(k.clone(), val.clone())];
                    if apply_overrides(&mut t, &one).is_ok() && parse_config(t).is_err() {
                        return Err(verr(format!(
                            "{k} = {val}: not in the config schema or the wrong type ({e})"
                        )));
                    }
                }
                Err(verr(format!("{}: {e}", self.base.display())))
            }
        }
    }

    /// Variant `v`'s run config, not yet checked: the base file, the
    /// grid's `set`, the variant's `set`; then named after the variant,
    /// placed under `<output_dir>/<grid name>`, with `eval_after` on (the
    /// summary reads the final held-out evaluation).
    pub fn variant_config(&self, v: &Variant) -> Result<RunConfig, AblateError> {
        let mut cfg = self.config_of(v)?;
        cfg.run.output_dir = cfg.run.output_dir.join(&self.name);
        cfg.run.name = v.name.clone();
        cfg.train.eval_after = true;
        Ok(cfg)
    }

    /// [`Grid::variant_config`], checked as `falcon train` checks a config.
    pub fn resolve(&self, v: &Variant) -> Result<RunConfig, AblateError> {
        let cfg = self.variant_config(v)?;
        cfg.check(Job::Train).map_err(|e| AblateError::Variant {
            variant: v.name.clone(),
            message: e.to_string(),
        })?;
        Ok(cfg)
    }
}

fn parse_config(table: toml::Table) -> Result<RunConfig, String> {
    toml::Value::Table(table)
        .try_into::<RunConfig>()
        // toml puts "in `section`" on a line of its own.
        .map_err(|e| e.to_string().trim().replace('\n', " "))
}

/// Set each dotted key of `set` in `table`, creating missing tables on the
/// way. A key whose path runs through a value that is not a table is an
/// error naming both.
pub fn apply_overrides(
    table: &mut toml::Table,
    set: &[(String, toml::Value)],
) -> Result<(), String> {
    for (key, value) in set {
        let parts: Vec<&str> = key.split('.').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(format!("{key:?} is not a dotted config key"));
        }
        let (last, path) = parts.split_last().expect("split yields one part");
        let mut t = &mut *table;
        for (i, p) in path.iter().enumerate() {
            let entry = t
                .entry(p.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            t = match entry {
                toml::Value::Table(inner) => inner,
                other => {
                    return Err(format!(
                        "{key}: {} is {other}, not a section",
                        parts[..=i].join(".")
                    ))
                }
            };
        }
        t.insert(last.to_string(), value.clone());
    }
    Ok(())
}

/// Whether a variant still has to run.
#[derive(Debug, Clone, PartialEq)]
pub enum VariantState {
    /// Trained and evaluated: its marker's row.
    Finished(SummaryRow),
    /// Started before (and interrupted): resumes from its newest checkpoint.
    Started,
    New,
}

/// Check `cfg`'s run directory against `cfg`: a finished variant gives its
/// row, a started one must have been started with the same config (else
/// [`AblateError::Stale`]). Writes the resolved config of a new one.
pub fn prepare_variant(cfg: &RunConfig) -> Result<VariantState, AblateError> {
    let dir = cfg.run.run_dir();
    let variant = cfg.run.name.clone();
    let text = cfg.to_toml_string().map_err(|e| AblateError::Variant {
        variant: variant.clone(),
        message: e.to_string(),
    })?;
    let cfg_path = dir.join(CONFIG_FILE);
    // A variant that failed before its first step (a config or file the
    // trainer refused) left only its config: nothing trained, so the
    // corrected grid starts it afresh instead of calling it stale.
    let trained = crate::run_dir::RunDir::new(&dir).existing_run().is_some();
    if cfg_path.is_file() && trained {
        let old = std::fs::read_to_string(&cfg_path).map_err(io_err(&cfg_path, "read"))?;
        if old != text {
            return Err(AblateError::Stale { variant, dir });
        }
        let done = dir.join(DONE_FILE);
        if done.is_file() {
            return read_marker(&done).map(VariantState::Finished);
        }
        return Ok(VariantState::Started);
    }
    std::fs::create_dir_all(&dir).map_err(io_err(&dir, "create directory"))?;
    write_atomic(&cfg_path, text.as_bytes())?;
    Ok(VariantState::New)
}

fn read_marker(path: &Path) -> Result<SummaryRow, AblateError> {
    let text = std::fs::read_to_string(path).map_err(io_err(path, "read"))?;
    serde_json::from_str(&text).map_err(|e| AblateError::BadMarker {
        path: path.to_path_buf(),
        detail: format!("not a summary row ({e}); delete it to rerun the variant"),
    })
}

/// Summarise a variant that has trained and been evaluated, and write its
/// marker (atomically: a crash before this leaves the variant to resume).
pub fn finish_variant(cfg: &RunConfig) -> Result<SummaryRow, AblateError> {
    let dir = cfg.run.run_dir();
    let row = summarize_run(&cfg.run.name, &dir)?;
    let text = serde_json::to_string_pretty(&row).expect("a row serialises");
    write_atomic(&dir.join(DONE_FILE), text.as_bytes())?;
    Ok(row)
}

/// One variant's line of the summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryRow {
    pub variant: String,
    /// Training steps taken (fewer than `[train] steps` after a
    /// `max_minutes` stop).
    pub steps: u64,
    /// The step of the final held-out evaluation.
    pub eval_step: u64,
    /// Its pass@k and exec@k by k.
    pub pass_at: BTreeMap<String, f64>,
    pub exec_at: BTreeMap<String, f64>,
    /// Each reward term (and `total`) averaged over the steps; a term that
    /// is `off` is absent.
    pub reward: BTreeMap<String, f64>,
    /// Seconds in generation, execution, reward, update and evaluation,
    /// summed over steps and evaluations: the run's wall time less model
    /// loading and checkpoint writes, and the same after an interruption.
    pub seconds: f64,
}

/// Read a variant's row from its run directory: `metrics.jsonl` and the
/// newest `eval/step-N.json`.
pub fn summarize_run(variant: &str, dir: &Path) -> Result<SummaryRow, AblateError> {
    let incomplete = |message: String| AblateError::Incomplete {
        variant: variant.to_owned(),
        message,
    };
    let data = report::load_run(dir)?;
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
    let mut v: Vec<String> = set.into_iter().filter(|k| *k != "total").cloned().collect();
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
) -> Result<Vec<PathBuf>, AblateError> {
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
    files.extend(report::save(&bars, &out.join("pass_at_k"))?);
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
        files.extend(report::save(&rewards, &out.join("reward_terms"))?);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[run]
name = "base"
seed = 3
output_dir = "OUT"
[reward]
style = "on"
[tasks]
path = "TASKS"
[train]
steps = 2
[train.loss]
fine = 1.0
"#;

    /// A grid file and its base config in a temp dir; the base's output_dir
    /// points into the same dir.
    fn grid(dir: &Path, variants: &str) -> Result<Grid, AblateError> {
        let out = dir.join("runs");
        let tasks = dir.join("tasks.jsonl");
        std::fs::write(&tasks, "").unwrap();
        std::fs::write(
            dir.join("base.toml"),
            BASE.replace("OUT", out.to_str().unwrap())
                .replace("TASKS", tasks.to_str().unwrap()),
        )
        .unwrap();
        let text = format!("base = \"base.toml\"\nname = \"abl\"\n{variants}");
        std::fs::write(dir.join("grid.toml"), &text).unwrap();
        Grid::load(&dir.join("grid.toml"))
    }

    #[test]
    fn overrides_nest_create_tables_and_name_what_blocks_them() {
        let mut t: toml::Table = toml::from_str(BASE).unwrap();
        let set = vec![
            ("reward.style".to_string(), toml::Value::from("off")),
            ("train.loss.fine".into(), toml::Value::from(0.0)),
            ("meta.algorithm".into(), toml::Value::from("fomaml")),
            ("model.lora.rank".into(), toml::Value::from(4)),
        ];
        apply_overrides(&mut t, &set).unwrap();
        let cfg = parse_config(t.clone()).unwrap();
        assert_eq!(cfg.reward.style, crate::config::TermMode::Off);
        assert_eq!(cfg.train.loss.fine, 0.0);
        assert_eq!(cfg.meta.algorithm, crate::config::MetaAlgorithm::Fomaml);
        assert_eq!(cfg.model.lora.rank, 4);
        // Untouched keys keep the base's values.
        assert_eq!((cfg.run.seed, cfg.train.steps), (3, 2));
        let e = apply_overrides(&mut t, &[("reward.style.mode".into(), "off".into())]).unwrap_err();
        assert!(e.contains("reward.style is \"off\", not a section"), "{e}");
        let e = apply_overrides(&mut t, &[("reward..style".into(), "off".into())]).unwrap_err();
        assert!(e.contains("not a dotted config key"), "{e}");
    }

    #[test]
    fn variants_resolve_with_the_base_seed_under_the_grid_dir() {
        let dir = tempfile::tempdir().unwrap();
        let g = grid(
            dir.path(),
            r#"
set = { "train.steps" = 1 }
[[variant]]
name = "full"
[[variant]]
name = "no-style"
set = { reward = { style = "off" }, "train.loss.fine" = 0.0 }
"#,
        )
        .unwrap();
        assert_eq!(g.base, dir.path().join("base.toml"));
        assert_eq!(g.output_dir().unwrap(), dir.path().join("runs/abl"));
        let full = g.resolve(&g.variants[0]).unwrap();
        let ns = g.resolve(&g.variants[1]).unwrap();
        assert_eq!(full.run.run_dir(), dir.path().join("runs/abl/full"));
        assert_eq!(ns.run.run_dir(), dir.path().join("runs/abl/no-style"));
        assert_eq!((full.run.seed, ns.run.seed), (3, 3));
        assert_eq!((full.train.steps, ns.train.steps), (1, 1));
        assert!(full.train.eval_after && ns.train.eval_after);
        assert_eq!(full.reward.style, crate::config::TermMode::On);
        assert_eq!(ns.reward.style, crate::config::TermMode::Off);
        assert_eq!(ns.train.loss.fine, 0.0);
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_variant_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let g = grid(
            dir.path(),
            r#"
[[variant]]
name = "typo"
set = { "train.steps" = 3, "reward.stlye" = "off" }
[[variant]]
name = "wrong-type"
set = { "reward.style" = 1 }
[[variant]]
name = "out-of-range"
set = { "reward.beta" = -1.0 }
"#,
        )
        .unwrap();
        let e = g.resolve(&g.variants[0]).unwrap_err().to_string();
        assert!(
            e.starts_with("variant `typo`: reward.stlye = \"off\"") && e.contains("stlye"),
            "{e}"
        );
        let e = g.resolve(&g.variants[1]).unwrap_err().to_string();
        assert!(
            e.starts_with("variant `wrong-type`: reward.style = 1"),
            "{e}"
        );
        let e = g.resolve(&g.variants[2]).unwrap_err().to_string();
        assert!(
            e.starts_with("variant `out-of-range`: invalid config") && e.contains("reward.beta"),
            "{e}"
        );
    }

    #[test]
    fn grid_errors_are_clear() {
        let dir = tempfile::tempdir().unwrap();
        let e = grid(dir.path(), "").unwrap_err().to_string();
        assert!(e.contains("no variants"), "{e}");
        let e = grid(
            dir.path(),
            "[[variant]]\nname = \"a\"\n[[variant]]\nname = \"a\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("two variants are named \"a\""), "{e}");
        let e = grid(
            dir.path(),
            "[[variant]]\nname = \"a\"\nset = { \"run.seed\" = 9 }\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("variant `a`: run.seed: every variant runs with the same seeds"),
            "{e}"
        );
        let e = grid(dir.path(), "[[variant]]\nname = \"../x\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("must be a directory name"), "{e}");
        let e = grid(dir.path(), "[[variant]]\nnme = \"a\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("grid.toml: not a grid") && e.contains("nme"),
            "{e}"
        );
    }

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
