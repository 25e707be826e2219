//! One writer per run directory: a second `falcon train` on a running run
//! is refused at once, naming the first, and leaves it alone; a SIGKILLed
//! holder leaves no stale lock; the other writing commands (`eval --out`,
//! `memory import`) take their lock too.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use falcon_rl::fsutil::lock::{lock, Unlockable};
use falcon_rl::run_dir::{RunDir, LOCK};
use serde_json::Value;

use crate::common::{text, tmpdir};

const STEPS: u64 = 6;

fn write_config(dir: &Path, name: &str) -> (std::path::PathBuf, RunDir) {
    let mut cfg = crate::train::config(dir, STEPS, 64200);
    cfg.run.name = name.into();
    cfg.train.checkpoint_every = 2;
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, cfg.to_toml_string().unwrap()).unwrap();
    (path, RunDir::of(&cfg))
}

fn start(config: &Path, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_falcon"))
        .args(["--threads", "1", "train", "--config"])
        .arg(config)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn run(config: &Path, extra: &[&str]) -> Output {
    start(config, extra).wait_with_output().unwrap()
}

/// Wait until `ready` holds, or fail after 120 s.
fn wait_for(what: &str, child: &mut Child, ready: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !ready() {
        assert!(child.try_wait().unwrap().is_none(), "exited before {what}");
        assert!(t0.elapsed() < Duration::from_secs(120), "no {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn metrics(run: &RunDir) -> Vec<Value> {
    std::fs::read_to_string(run.metrics())
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("seconds");
            v
        })
        .collect()
}

#[test]
fn a_second_writer_is_refused_and_the_first_trains_as_if_alone() {
    let tmp = tmpdir();
    let dir = tmp.path();
    crate::train::setup(dir);
    let (alone_cfg, alone) = write_config(dir, "alone");
    let o = run(&alone_cfg, &[]);
    assert!(o.status.success(), "{}", text(&o));

    let (cfg, shared) = write_config(dir, "shared");
    let mut first = start(&cfg, &[]);
    let pid = first.id();
    // The lock is taken first thing; the holder writes who it is.
    let lock_file = shared.path().join(LOCK);
    wait_for("lock", &mut first, || {
        std::fs::read_to_string(&lock_file).is_ok_and(|t| t.contains(&format!("pid={pid}")))
    });
    for extra in [&["--resume"][..], &["--overwrite"], &[]] {
        let t0 = Instant::now();
        let o = run(&cfg, extra);
        let out = text(&o);
        assert_eq!(o.status.code(), Some(2), "{extra:?}:\n{out}");
        assert!(
            out.contains("is being written by another falcon process")
                && out.contains(&format!("pid {pid}"))
                && out.contains(" UTC")
                && out.contains(&format!("kill {pid}")),
            "{extra:?}:\n{out}"
        );
        // At once: before the model loads, let alone a step.
        assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    }
    assert!(
        first.try_wait().unwrap().is_none(),
        "the first run ended before the second writer was tried"
    );
    let o = first.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    // --overwrite was refused before it deleted anything: the first run's
    // files are its own, as a lone run writes them.
    assert_eq!(metrics(&shared), metrics(&alone));
    assert_eq!(
        falcon_rl::train::checkpoint::list(shared.path()).unwrap(),
        [4, 6]
    );
}

#[test]
fn a_sigkilled_holder_leaves_no_lock_behind() {
    let tmp = tmpdir();
    let dir = tmp.path();
    crate::train::setup(dir);
    let (cfg, run_dir) = write_config(dir, "killed");
    let mut first = start(&cfg, &[]);
    wait_for("first step", &mut first, || {
        std::fs::read_to_string(run_dir.metrics()).is_ok_and(|t| !t.is_empty())
    });
    first.kill().unwrap(); // SIGKILL
    first.wait().unwrap();
    let o = run(&cfg, &["--resume"]);
    assert!(o.status.success(), "{}", text(&o));
    crate::crash::assert_each_step_once(&run_dir, STEPS);
}

#[test]
fn evaluations_and_memory_imports_take_their_lock_too() {
    let tmp = tmpdir();
    let dir = tmp.path();
    crate::train::setup(dir);
    let (cfg, run_dir) = write_config(dir, "held");
    // This test process holds the locks: another process (falcon) meets
    // them as it would meet a training run.
    let held = lock(run_dir.path(), LOCK, Unlockable::Refuse)
        .unwrap()
        .unwrap();
    let out = dir.join("result.json");
    let held_out = lock(dir, ".result.json.lock", Unlockable::Refuse)
        .unwrap()
        .unwrap();
    let me = format!("pid {}", std::process::id());
    let falcon = |args: &[&std::ffi::OsStr]| {
        Command::new(env!("CARGO_BIN_EXE_falcon"))
            .args(args)
            .output()
            .unwrap()
    };
    let o = falcon(&[
        "eval".as_ref(),
        "--config".as_ref(),
        cfg.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains(&me), "{}", text(&o));
    assert!(!out.exists());
    let export = dir.join("empty.jsonl");
    std::fs::write(&export, "").unwrap();
    let o = falcon(&[
        "memory".as_ref(),
        "import".as_ref(),
        run_dir.path().as_os_str(),
        "--in".as_ref(),
        export.as_os_str(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains(&me), "{}", text(&o));
    assert!(!run_dir.memory_db().exists(), "nothing written");
    let o = run(&cfg, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains(&me), "{}", text(&o));
    drop((held, held_out));
    let o = run(&cfg, &[]);
    assert!(o.status.success(), "released: {}", text(&o));
}
