//! `falcon ablate --grid FILE`: a base run config and named variants of it
//! (dotted config keys set to new values), each trained with the base's
//! seeds into `<output_dir>/<grid name>/<variant>`, and a summary of all of
//! them (markdown, CSV and plots).
//!
//! This module owns the grid file, merging a variant's overrides into the
//! base TOML before the schema sees it (so `deny_unknown_fields` rejects a
//! misspelt key, and the error names the variant and the key), and the
//! finished-variant marker with its [`SummaryRow`]. The summary is drawn
//! by `report::ablation`, which reads the trained runs; the training loop
//! itself is the CLI's, shared with `falcon train`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{Job, RunConfig};
use crate::fsutil::{io_err, write_atomic, IoError};

/// Written into a variant's directory once it has trained and been
/// evaluated; holds its [`SummaryRow`]. A variant with one is not rerun.
pub use crate::run_dir::ABLATE_DONE as DONE_FILE;
/// The variant's resolved config, written before it trains; a later run of
/// the grid that resolves the variant differently refuses to mix the two.
pub use crate::run_dir::CONFIG as CONFIG_FILE;

/// A variant's keys are set as `--set` sets them.
pub use crate::config::apply_overrides;

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
            Ok(mut cfg) => {
                // As in a config file: custom reward paths are relative to
                // the base config's directory.
                let dir = self.base.parent().unwrap_or(std::path::Path::new("."));
                let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
                for term in &mut cfg.reward.custom {
                    term.rebase(&dir);
                }
                Ok(cfg)
            }
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

/// Write a finished variant's marker, its summary row (atomically: a
/// crash before this leaves the variant to resume).
pub fn mark_finished(cfg: &RunConfig, row: &SummaryRow) -> Result<(), IoError> {
    let text = serde_json::to_string_pretty(row).expect("a row serialises");
    write_atomic(&cfg.run.run_dir().join(DONE_FILE), text.as_bytes())
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

#[cfg(test)]
pub(crate) mod tests {
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
    pub(crate) fn grid(dir: &Path, variants: &str) -> Result<Grid, AblateError> {
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
    fn overrides_pick_a_custom_term_by_name() {
        let mut t: toml::Table = toml::from_str(
            "[[reward.custom]]\nname = \"a\"\nweight = 1.0\n[[reward.custom]]\nname = \"b\"\nweight = 1.0\n",
        )
        .unwrap();
        let set = |k: &str, v: toml::Value| vec![(k.to_owned(), v)];
        apply_overrides(&mut t, &set("reward.custom.b.weight", 0.25.into())).unwrap();
        apply_overrides(&mut t, &set("reward.custom.a.mode", "off".into())).unwrap();
        let custom = t["reward"]["custom"].as_array().unwrap();
        assert_eq!(custom[0]["mode"].as_str(), Some("off"));
        assert_eq!(custom[0]["weight"].as_float(), Some(1.0));
        assert_eq!(custom[1]["weight"].as_float(), Some(0.25));
        let e = apply_overrides(&mut t, &set("reward.custom.c.weight", 1.0.into())).unwrap_err();
        assert!(
            e.contains("no entry named \"c\"") && e.contains("a, b"),
            "{e}"
        );
        let e = apply_overrides(&mut t, &set("reward.custom.weight", 1.0.into())).unwrap_err();
        assert!(e.contains("list of tables"), "{e}");
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
}
