//! A user's first hour, as a new user would spend it: rerunning a command
//! into a run that exists, fixing a failed ablation variant, comparing the
//! wrong files, asking the memory of a run, and reading the errors of the
//! obvious mistakes. None of it may append to an old run or give a result
//! that means nothing; every error must say what to do, once, in words.

use crate::common::{falcon, text, tmpdir};
use crate::train::{config, setup};
use std::path::{Path, PathBuf};

fn lines(p: &Path) -> usize {
    std::fs::read_to_string(p).map_or(0, |t| t.lines().count())
}

/// A one-step config of the tiny model written to `dir/NAME.toml`.
fn write_config(
    dir: &Path,
    name: &str,
    uid_base: u32,
    tweak: impl FnOnce(&mut falcon_rl::config::RunConfig),
) -> PathBuf {
    let mut cfg = config(dir, 1, uid_base);
    cfg.run.name = name.into();
    cfg.tasks.tags = vec!["train".into()];
    cfg.eval.tags = vec!["heldout".into()];
    tweak(&mut cfg);
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, cfg.to_toml_string().unwrap()).unwrap();
    p
}

#[test]
fn a_rerun_never_appends_to_the_old_run() {
    let dir = tmpdir();
    setup(dir.path());
    for (cmd, name) in [("train", "again"), ("sft", "again-sft")] {
        let c = write_config(dir.path(), name, 63300, |_| {});
        let c = c.to_str().unwrap();
        let metrics = dir.path().join("runs").join(name).join("metrics.jsonl");
        let o = falcon(&[cmd, "--config", c]);
        assert!(o.status.success(), "{cmd}: {}", text(&o));
        assert_eq!(lines(&metrics), 1);
        // The same command again: refused, with what to do, and nothing added.
        let o = falcon(&[cmd, "--config", c]);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {}", text(&o));
        let t = text(&o);
        assert!(
            t.contains("already holds a run")
                && t.contains("--resume")
                && t.contains("--overwrite"),
            "{t}"
        );
        assert_eq!(lines(&metrics), 1, "{cmd}: nothing appended");
        // --resume continues (nothing left to do); --overwrite starts clean.
        let o = falcon(&[cmd, "--config", c, "--resume"]);
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(lines(&metrics), 1);
        let o = falcon(&[cmd, "--config", c, "--overwrite"]);
        assert!(o.status.success(), "{}", text(&o));
        let m = std::fs::read_to_string(&metrics).unwrap();
        assert_eq!(m.lines().count(), 1, "{m}");
        assert!(m.contains("\"step\":0"), "{m}");
        // The run keeps the config it ran with.
        assert!(dir
            .path()
            .join("runs")
            .join(name)
            .join("config.toml")
            .is_file());
    }

    // An evaluation written to --out is not replaced or mixed by accident.
    let c = write_config(dir.path(), "eval", 63310, |_| {});
    let out = dir.path().join("r.json");
    let args = |extra: &[&str]| -> Vec<String> {
        let mut v = vec![
            "eval",
            "--config",
            c.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let run = |extra: &[&str]| {
        let a = args(extra);
        falcon(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let o = run(&[]);
    assert!(o.status.success(), "{}", text(&o));
    let first = std::fs::read_to_string(&out).unwrap();
    let o = run(&[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("already holds an evaluation"),
        "{}",
        text(&o)
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), first);
    let o = run(&["--resume"]);
    assert_eq!(o.status.code(), Some(2), "a finished result: {}", text(&o));
    let o = run(&["--overwrite"]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn a_failed_ablation_variant_does_not_block_the_corrected_grid() {
    let dir = tmpdir();
    setup(dir.path());
    write_config(dir.path(), "base", 63320, |c| c.train.eval_after = true);
    let grid = dir.path().join("grid.toml");
    let write_grid = |tags: &str| {
        std::fs::write(
            &grid,
            format!("base = \"base.toml\"\nname = \"abl\"\n[[variant]]\nname = \"v\"\nset = {{ \"tasks.tags\" = [{tags}] }}\n"),
        )
        .unwrap();
    };
    // No task carries the tag: the variant fails when its tasks load, after
    // its directory got its config.
    write_grid("\"no-such-tag\"");
    let o = falcon(&["ablate", "--grid", grid.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("no-such-tag"), "{}", text(&o));
    write_grid("\"train\"");
    let o = falcon(&["ablate", "--grid", grid.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(dir.path().join("runs/abl/v/ablate-done.json").is_file());
    // A variant that did train is still refused when its config changes.
    write_grid("\"train\", \"heldout\"");
    let o = falcon(&["ablate", "--grid", grid.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("different config"), "{}", text(&o));
}

#[test]
fn compare_refuses_results_without_a_common_task() {
    let dir = tmpdir();
    let result = |id: &str| {
        serde_json::json!({"tasks": [{"id": id, "n": 1, "passed": 1, "executed": 1, "samples": [
            {"completion": "", "outcome": "pass", "passed": true, "executed": true}]}],
            "pass_at": {"1": 1.0}, "exec_at": {"1": 1.0}, "outcomes": {"pass": 1},
            "samples_per_task": 1, "temperature": 0.0, "seconds": 1.0})
        .to_string()
    };
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    std::fs::write(&a, result("x")).unwrap();
    std::fs::write(&b, result("y")).unwrap();
    let o = falcon(&["eval", "compare", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("share no task"), "{}", text(&o));
    std::fs::write(&b, result("x")).unwrap();
    let o = falcon(&["eval", "compare", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("1 in common"), "{}", text(&o));
}

#[test]
fn memory_commands_read_the_runs_own_config_and_show_p_error() {
    let dir = tmpdir();
    setup(dir.path());
    // A meta-RL run with the hash embedder (not the default MiniLM).
    let c = write_config(dir.path(), "meta", 63330, |c| {
        c.meta.algorithm = falcon_rl::config::MetaAlgorithm::Fomaml;
        c.meta.short_term_samples = 1;
        c.memory.short_term_capacity = 32;
        c.memory.short_term_max_len = 256;
        c.train.checkpoint_every = 1;
    });
    let o = falcon(&["train", "--config", c.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("memory holds") && t.contains("long-term entries"),
        "{t}"
    );
    assert!(t.contains("mean reward over the run"), "{t}");
    let run = dir.path().join("runs/meta");
    let o = falcon(&[
        "memory",
        "query",
        run.to_str().unwrap(),
        "--text",
        "add two numbers",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("cos "), "{}", text(&o));
    let o = falcon(&["memory", "stats", run.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("P_error over"), "{}", text(&o));
}

#[test]
fn errors_say_what_to_do_once_and_in_words() {
    let dir = tmpdir();
    setup(dir.path());
    let d = dir.path();
    let missing_init = write_config(d, "init", 63340, |c| {
        c.train.init_from = Some(d.join("runs/demo-sft/step-20"));
    });
    let bad = write_config(d, "bad", 63350, |c| {
        c.train.steps = 1;
        c.train.warmup_steps = 2;
        c.train.schedule = falcon_rl::config::ScheduleKind::Cosine;
        c.train.loss.kl = 0.1;
        c.model.lora.enabled = false;
    });
    let p = |x: &Path| x.to_str().unwrap().to_owned();
    let cases: Vec<Vec<String>> = vec![
        vec!["train".into(), "--config".into(), p(&missing_init)],
        vec!["config".into(), "check".into(), p(&bad)],
        vec![
            "export".into(),
            "--checkpoint".into(),
            p(&d.join("runs/none/step-3")),
            "--out".into(),
            p(&d.join("x")),
        ],
        vec![
            "eval".into(),
            "--config".into(),
            p(&bad),
            "--checkpoint".into(),
            p(&d.join("runs/none/step-3")),
        ],
        vec!["memory".into(), "stats".into(), p(&d.join("runs/none"))],
        vec![
            "generate".into(),
            "--model".into(),
            "embedded:foo".into(),
            "--prompt".into(),
            "hi".into(),
        ],
        vec![
            "generate".into(),
            "--model".into(),
            p(&d.join("no-model")),
            "--prompt".into(),
            "hi".into(),
        ],
        vec!["tasks".into(), "check".into(), p(&d.join("no-tasks.jsonl"))],
        vec!["report".into(), p(&d.join("runs/none"))],
    ];
    for args in &cases {
        let o = falcon(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let t = text(&o);
        assert!(!o.status.success(), "{args:?}: {t}");
        assert!(t.contains("error: "), "{args:?}: {t}");
        for debug in [
            "Some(", "None)", "Rl ", "Sft ", "(Length", "Pass)", "Fp32", "Cpu",
        ] {
            assert!(
                !t.contains(debug),
                "{args:?}: Rust's debug form `{debug}` in\n{t}"
            );
        }
        for os in ["(os error 2)", "entity already exists"] {
            assert!(t.matches(os).count() <= 1, "{args:?}: `{os}` twice in\n{t}");
        }
    }
    // What each of the first ones says to do.
    let o = falcon(&cases[0].iter().map(String::as_str).collect::<Vec<_>>());
    let t = text(&o);
    assert!(t.contains("init_from") && t.contains("falcon sft"), "{t}");
    let o = falcon(&cases[1].iter().map(String::as_str).collect::<Vec<_>>());
    let t = text(&o);
    for key in ["train.warmup_steps", "train.loss.kl"] {
        assert!(t.contains(key), "{key} in {t}");
    }
    let o = falcon(&cases[5].iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        text(&o).contains("embedded:smollm2-135m-instruct"),
        "{}",
        text(&o)
    );
}

#[test]
fn the_console_counts_steps_as_metrics_do() {
    let dir = tmpdir();
    setup(dir.path());
    let c = write_config(dir.path(), "count", 63360, |_| {});
    // Not a terminal: one plain line per step, numbered as metrics.jsonl.
    let o = falcon(&["train", "--config", c.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("\nstep 0 ") && !t.contains("\nstep 1 "), "{t}");
}
