//! One validation: `falcon config check` (and `falcon ablate --dry-run`)
//! accept exactly the configs the trainer's constructor accepts. Checked on
//! every run config under `configs/` as shipped, with the mistakes a new
//! user makes, and on every variant of every ablation grid; each side runs
//! for real (the CLI as a process, the constructor loading tasks, model and
//! sandbox and opening the run), into a temporary output directory.

use std::path::{Path, PathBuf};
use std::process::Command;

use falcon_rl::config::{Job, RunConfig};
use falcon_rl::train::{load, Silent, Start};

use crate::common::{root, tmpdir};

/// What `falcon config check --for JOB` says of `cfg` (written to `file`),
/// and the problems it printed.
fn cli_check(cfg: &RunConfig, job: Job, file: &Path) -> (bool, String) {
    std::fs::write(file, cfg.to_toml_string().unwrap()).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_falcon"))
        .current_dir(root())
        .args(["config", "check", "--for", job.name()])
        .arg(file)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() || o.status.code() == Some(2),
        "config check failed as a program, not a check: {text}"
    );
    (o.status.success(), text)
}

/// Whether the trainer's constructor accepts `cfg` for `job`, and why not.
fn constructor(cfg: &RunConfig, job: Job) -> Result<(), String> {
    let mut loaded = load(cfg, job, &mut Silent).map_err(|e| e.to_string())?;
    loaded
        .state(Start::New, &mut Silent)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Runs both sides; panics naming the case when they disagree. Returns
/// whether the config was accepted.
fn agree(case: &str, mut cfg: RunConfig, job: Job, out: &Path) -> bool {
    // Each case its own output directory: a run one case opened must not
    // be in the way of the next.
    let n = std::fs::read_dir(out).map_or(0, |d| d.count());
    cfg.run.output_dir = out.join(format!("runs-{n}"));
    // Its own uids, apart from the sandboxes of tests running beside it.
    cfg.exec.uid_base = 63200;
    let (checked, text) = cli_check(&cfg, job, &out.join("check.toml"));
    let built = constructor(&cfg, job);
    assert_eq!(
        checked,
        built.is_ok(),
        "{case}: `config check` says {}, the trainer's constructor says {:?}\n{text}",
        if checked { "ok" } else { "no" },
        built
    );
    checked
}

fn shipped(name: &str) -> RunConfig {
    RunConfig::from_file(&root().join("configs").join(name)).unwrap()
}

#[test]
fn config_check_and_the_trainer_accept_the_same_configs() {
    let dir = tmpdir();
    let out = dir.path();
    let mut answers: Vec<bool> = Vec::new();

    // Every run config as shipped, for the command it is for.
    let mut names: Vec<String> = std::fs::read_dir(root().join("configs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml") && !n.starts_with("ablate-"))
        .collect();
    names.sort();
    assert!(names.len() >= 4, "{names:?}");
    for name in &names {
        if name.starts_with("eval-") {
            // An evaluation config trains nothing: it must pass the check
            // `falcon eval` runs, as shipped.
            let (ok, text) = cli_check(&shipped(name), Job::Eval, &out.join("eval.toml"));
            assert!(ok, "{name}: {text}");
            continue;
        }
        let job = if name.contains("sft") {
            Job::Sft
        } else {
            Job::Train
        };
        answers.push(agree(name, shipped(name), job, out));
    }

    // The FALCON stage without its SFT start: a valid meta-RL run.
    let mut falcon = shipped("demo.toml");
    falcon.train.init_from = None;
    assert!(agree(
        "demo.toml without init_from",
        falcon,
        Job::Train,
        out
    ));
    answers.push(true);

    // The mistakes of a new user's first hour: each refused by both.
    type Mistake = (&'static str, &'static str, Job, fn(&mut RunConfig));
    let mistakes: [Mistake; 12] = [
        (
            "a warm-up longer than the run",
            "demo-sft.toml",
            Job::Sft,
            |c| {
                c.train.steps = 1;
                c.train.warmup_steps = 2;
            },
        ),
        (
            "a task file that is not there",
            "demo-sft.toml",
            Job::Sft,
            |c| {
                c.tasks.path = Some(PathBuf::from("data/no-such-tasks.jsonl"));
            },
        ),
        (
            "a model directory that is not there",
            "demo-sft.toml",
            Job::Sft,
            |c| {
                c.model.path = "models/no-such-model".into();
            },
        ),
        (
            "an embedded model that does not exist",
            "demo-sft.toml",
            Job::Sft,
            |c| {
                c.model.path = "embedded:foo".into();
            },
        ),
        (
            "meta-RL run by `falcon sft`",
            "demo-sft.toml",
            Job::Sft,
            |c| {
                c.meta.algorithm = falcon_rl::config::MetaAlgorithm::Fomaml;
            },
        ),
        (
            "an init_from checkpoint that is not there",
            "demo.toml",
            Job::Train,
            |c| {
                c.train.init_from = Some(PathBuf::from("runs/no-such-run/step-20"));
            },
        ),
        (
            "second-order MAML without LoRA",
            "demo.toml",
            Job::Train,
            |c| {
                c.train.init_from = None;
                c.meta.algorithm = falcon_rl::config::MetaAlgorithm::Maml;
                c.model.lora.enabled = false;
            },
        ),
        ("a KL penalty without LoRA", "demo.toml", Job::Train, |c| {
            c.train.init_from = None;
            c.meta.algorithm = falcon_rl::config::MetaAlgorithm::Off;
            c.model.lora.enabled = false;
            c.train.loss.kl = 0.1;
        }),
        ("no task file at all", "demo.toml", Job::Train, |c| {
            c.train.init_from = None;
            c.tasks.path = None;
        }),
        (
            "meta-RL on vLLM without LoRA",
            "demo.toml",
            Job::Train,
            |c| {
                c.train.init_from = None;
                c.meta.algorithm = falcon_rl::config::MetaAlgorithm::Fomaml;
                c.model.lora.enabled = false;
                c.rollout.engine = falcon_rl::config::EngineKind::Vllm;
            },
        ),
        (
            "full fine-tuning on external vLLM servers",
            "demo.toml",
            Job::Train,
            |c| {
                c.train.init_from = None;
                c.meta.algorithm = falcon_rl::config::MetaAlgorithm::Off;
                c.model.lora.enabled = false;
                c.rollout.engine = falcon_rl::config::EngineKind::Vllm;
                c.rollout.vllm.urls = vec!["http://127.0.0.1:8000".into()];
            },
        ),
        ("the vLLM engine for SFT", "demo-sft.toml", Job::Sft, |c| {
            c.rollout.engine = falcon_rl::config::EngineKind::Vllm;
        }),
    ];
    for (case, base, job, mistake) in mistakes {
        let mut c = shipped(base);
        mistake(&mut c);
        assert!(!agree(case, c, job, out), "{case}: accepted");
        answers.push(false);
    }

    // Every variant of every ablation grid, as `falcon ablate` resolves it.
    for e in std::fs::read_dir(root().join("configs")).unwrap() {
        let p = e.unwrap().path();
        let n = p.file_name().unwrap().to_string_lossy().into_owned();
        if !n.starts_with("ablate-") {
            continue;
        }
        let grid = falcon_rl::train::ablate::Grid::load(&p).unwrap();
        for v in &grid.variants {
            let cfg = grid.variant_config(v).unwrap();
            let resolved = grid.resolve(v);
            let ok = agree(&format!("{n} variant {}", v.name), cfg, Job::Train, out);
            assert_eq!(ok, resolved.is_ok(), "{n} {}: {resolved:?}", v.name);
            answers.push(ok);
        }
    }
    // The test can tell the two apart only if both answers occur.
    let accepted = answers.iter().filter(|&&a| a).count();
    let refused = answers.len() - accepted;
    assert!(
        accepted >= 2 && refused >= 9,
        "{accepted} accepted, {refused} refused"
    );
}
