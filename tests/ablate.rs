//! `falcon ablate` end to end on the tiny random model of the training
//! tests: a two-variant grid trains each variant once with the same seed,
//! writes the summary, and a second run retrains nothing; a variant whose
//! marker is lost resumes from its checkpoint instead of starting over.

use std::path::Path;
use std::process::Output;

use crate::common::tmpdir;
use crate::train::{config, setup};

fn ablate(grid: &Path) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_falcon"))
        .args(["ablate", "--grid", grid.to_str().unwrap()])
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn ablate_trains_each_variant_once_then_skips_or_resumes() {
    let dir = tmpdir();
    let d = dir.path();
    setup(d);
    let mut cfg = config(d, 1, 62700);
    cfg.train.checkpoint_every = 1;
    cfg.tasks.tags = vec!["train".into()];
    cfg.eval.tags = vec!["heldout".into()];
    std::fs::write(d.join("base.toml"), toml::to_string(&cfg).unwrap()).unwrap();
    let grid = d.join("grid.toml");
    std::fs::write(
        &grid,
        r#"base = "base.toml"
name = "abl"
[[variant]]
name = "full"
[[variant]]
name = "no-style"
set = { "reward.style" = "off" }
"#,
    )
    .unwrap();
    let o = ablate(&grid);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("variant 1/2 full in") && err.contains("variant 2/2 no-style in"),
        "{err}"
    );
    let out = d.join("runs/abl");
    for f in [
        "summary.md",
        "summary.csv",
        "pass_at_k.png",
        "pass_at_k.svg",
        "reward_terms.png",
    ] {
        assert!(out.join(f).is_file(), "{f}");
    }
    let csv = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 3, "{csv}");
    assert!(lines[0].contains("reward_style"), "{csv}");
    assert!(
        lines[1].starts_with("full,1,") && lines[2].starts_with("no-style,1,"),
        "{csv}"
    );
    let md = String::from_utf8_lossy(&o.stdout);
    assert!(
        md.contains("| `full` | 1 |") && md.contains("| `no-style` | 1 |"),
        "{md}"
    );
    // Same seed; the style term is reported only where it is on.
    let metrics = |v: &str| std::fs::read_to_string(out.join(v).join("metrics.jsonl")).unwrap();
    let step = |v: &str| -> serde_json::Value { serde_json::from_str(&metrics(v)).unwrap() };
    assert!(step("full")["reward"].get("style").is_some());
    assert!(step("no-style")["reward"].get("style").is_none());
    for v in ["full", "no-style"] {
        let c = falcon_rl::config::RunConfig::load(&out.join(v).join("config.toml")).unwrap();
        assert_eq!((c.run.seed, c.run.name.as_str()), (cfg.run.seed, v));
        assert!(out.join(v).join("ablate-done.json").is_file());
        assert!(out.join(v).join("eval/step-1.json").is_file());
    }
    let before = (metrics("full"), metrics("no-style"), csv.clone());

    // Again: nothing is retrained, the summary is the same.
    let o = ablate(&grid);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(
        err.matches("finished before, not rerun").count(),
        2,
        "{err}"
    );
    assert!(!err.contains("evaluating"), "{err}");
    let csv = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    assert_eq!((metrics("full"), metrics("no-style"), csv), before);

    // A lost marker: the variant resumes at its last checkpoint (step 1 of
    // 1), so it trains no step and its metrics stay as they were.
    std::fs::remove_file(out.join("no-style/ablate-done.json")).unwrap();
    let o = ablate(&grid);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("no-style, resuming") && err.contains("resumed from"),
        "{err}"
    );
    assert_eq!(metrics("no-style"), before.1);
    assert!(out.join("no-style/ablate-done.json").is_file());

    // A changed grid does not mix configs in one variant directory.
    let text = std::fs::read_to_string(&grid).unwrap();
    std::fs::write(&grid, text.replace("\"off\"", "\"log_only\"")).unwrap();
    let o = ablate(&grid);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("variant `no-style`") && stderr(&o).contains("different config"),
        "{}",
        stderr(&o)
    );
}

/// The shipped custom-reward grid (configs/ablate-custom-reward.toml), its
/// `[set]` and variants as they are, on the tiny model for one step: each
/// variant reports the user's term where it is computed, with its weight.
#[test]
fn the_shipped_custom_reward_grid_runs_one_tiny_step() {
    let dir = tmpdir();
    let d = dir.path();
    setup(d);
    let mut cfg = config(d, 1, 62720);
    cfg.tasks.tags = vec!["train".into()];
    cfg.eval.tags = vec!["heldout".into()];
    std::fs::write(d.join("base.toml"), toml::to_string(&cfg).unwrap()).unwrap();
    let shipped = crate::common::root().join("configs/ablate-custom-reward.toml");
    let mut grid: toml::Table = std::fs::read_to_string(&shipped).unwrap().parse().unwrap();
    grid.insert("base".into(), "base.toml".into());
    // Its path is relative to the shipped grid; here the grid lives in `d`.
    let term = grid["set"]["reward.custom"].as_array().unwrap()[0].clone();
    let mut term = term.as_table().unwrap().clone();
    let path = shipped
        .parent()
        .unwrap()
        .join(term["path"].as_str().unwrap());
    assert!(path.is_file(), "{}", path.display());
    term.insert("path".into(), path.display().to_string().into());
    term.insert(
        "python".into(),
        crate::common::python().display().to_string().into(),
    );
    grid["set"].as_table_mut().unwrap().insert(
        "reward.custom".into(),
        toml::Value::Array(vec![toml::Value::Table(term)]),
    );
    let file = d.join("grid.toml");
    std::fs::write(&file, toml::to_string(&grid).unwrap()).unwrap();
    let o = ablate(&file);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = d.join(format!("runs/{}", grid["name"].as_str().unwrap()));
    let step = |v: &str| -> serde_json::Value {
        let text = std::fs::read_to_string(out.join(v).join("metrics.jsonl")).unwrap();
        serde_json::from_str(text.lines().next().unwrap()).unwrap()
    };
    let variants: Vec<&str> = grid["variant"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(variants.len(), 4);
    for v in &variants {
        let reward = &step(v)["reward"];
        let computed = reward.get("has_docstring").is_some();
        assert_eq!(computed, *v != "falcon-only", "{v}: {reward}");
        if computed {
            assert_eq!(reward["has_docstring/no_signal"], 0.0, "{v}: {reward}");
        }
    }
    let csv = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    assert_eq!(csv.lines().count(), 5, "{csv}");
}
