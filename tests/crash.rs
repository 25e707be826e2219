//! Crash anywhere: a small run is made to fail at each of its durable
//! writes in turn (every metrics and samples append, TensorBoard flush,
//! memory transaction, evaluation result, checkpoint file, manifest and
//! rename: the failpoints of `fsutil::failpoint`), once by SIGKILL and once
//! by a full disk, then resumed; the resumed run directory must hold every
//! step once and equal an uninterrupted run's, timings aside. Single-level
//! RL and FOMAML with both memories, checkpoints every 2 steps, held-out
//! evaluations at step 2 and at the end; and a data-parallel run at the
//! boundaries where rank 0 writes a step's logs and a checkpoint.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use falcon_rl::config::RunConfig;
use falcon_rl::run_dir::RunDir;
use serde_json::Value;

use crate::common::{text, tmpdir};

const STEPS: u64 = 3;

/// The crash runs' config: tests/train.rs's tiny model and tasks, 3 steps,
/// a checkpoint every 2, evaluations at step 2 and after the last; short
/// answers in groups of 2, since the harness runs about 400 of these.
fn crash_config(dir: &Path, name: &str, uid_base: u32, meta: bool) -> RunConfig {
    let mut cfg = crate::train::config(dir, STEPS, uid_base);
    cfg.run.name = name.into();
    cfg.train.checkpoint_every = 2;
    cfg.train.keep_last = 0;
    cfg.tasks.tags = vec!["train".into()];
    cfg.eval.tags = vec!["heldout".into()];
    cfg.train.eval_every = 2;
    cfg.train.eval_after = true;
    cfg.generation.max_new_tokens = 8;
    cfg.train.group_size = 2;
    if meta {
        cfg.meta.algorithm = falcon_rl::config::MetaAlgorithm::Fomaml;
        cfg.meta.inner_steps = 1;
        cfg.meta.inner_lr = 0.05;
        cfg.meta.long_term = true;
        cfg.meta.short_term_samples = 2;
        cfg.memory.short_term_capacity = 64;
        cfg.memory.short_term_max_len = 256;
    }
    cfg
}

/// Sandbox uids of this file's runs, apart from every other test's (a
/// sandbox's clean-up kills whatever runs under its uids).
fn uid_base(meta: bool) -> u32 {
    if meta {
        64100
    } else {
        64000
    }
}

fn write_config(dir: &Path, cfg: &RunConfig) -> PathBuf {
    let path = dir.join(format!("{}.toml", cfg.run.name));
    std::fs::write(&path, cfg.to_toml_string().unwrap()).unwrap();
    path
}

fn falcon_train(config: &Path, resume: bool, env: &[(&str, String)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_falcon"))
        .args(["--threads", "1", "train", "--config"])
        .arg(config)
        .args(if resume { &["--resume"][..] } else { &[] })
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap()
}

/// Drop every timing (and the run's name and paths, which differ between
/// the runs compared) from a JSON value.
fn untimed(mut v: Value) -> Value {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.retain(|k, _| !matches!(k.as_str(), "seconds" | "train_seconds" | "id"));
                m.values_mut().for_each(walk);
            }
            Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut v);
    v
}

fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            untimed(
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display())),
            )
        })
        .collect()
}

/// What a run directory holds, in comparable form.
#[derive(Debug, PartialEq)]
struct Held {
    metrics: Vec<Value>,
    samples: Vec<Value>,
    /// Every TensorBoard scalar of every event file: (step, tag, value),
    /// sorted; timings left out.
    tensorboard: Vec<(i64, String, u32)>,
    evals: BTreeMap<String, Value>,
    memory: Vec<Value>,
    checkpoints: Vec<u64>,
    /// The last checkpoint's files, byte for byte (its trainer state and
    /// config without the time spent and the run's name).
    last: BTreeMap<String, Vec<u8>>,
}

fn held(run: &RunDir) -> Held {
    let mut tensorboard = Vec::new();
    for e in std::fs::read_dir(run.tensorboard()).unwrap().flatten() {
        let file = falcon_rl::train::metrics::read_events(&e.path()).unwrap();
        assert_eq!(file.truncated_at, None, "{}", e.path().display());
        for ev in file.events {
            for (tag, v) in ev.scalars {
                if !tag.starts_with("seconds/") {
                    tensorboard.push((ev.step, tag, v.to_bits()));
                }
            }
        }
    }
    tensorboard.sort();
    let evals = std::fs::read_dir(run.eval_dir())
        .map(|d| {
            d.flatten()
                .map(|e| {
                    let v: Value =
                        serde_json::from_str(&std::fs::read_to_string(e.path()).unwrap()).unwrap();
                    (e.file_name().to_string_lossy().into_owned(), untimed(v))
                })
                .collect()
        })
        .unwrap_or_default();
    let memory = if run.memory_db().is_file() {
        let store = falcon_rl::memory::MemoryStore::open(run.path()).unwrap();
        let mut out = Vec::new();
        store.export_jsonl(&mut out).unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| untimed(serde_json::from_str(l).unwrap()))
            .collect()
    } else {
        Vec::new()
    };
    let checkpoints = falcon_rl::train::checkpoint::list(run.path()).unwrap();
    let mut last = BTreeMap::new();
    if let Some(&n) = checkpoints.last() {
        for e in std::fs::read_dir(run.checkpoint(n)).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let bytes = std::fs::read(e.path()).unwrap();
            let bytes = match name.as_str() {
                // The manifest checksums the two files below.
                "manifest.json" | "config.toml" => continue,
                "trainer_state.json" => {
                    serde_json::to_vec(&untimed(serde_json::from_slice(&bytes).unwrap())).unwrap()
                }
                _ => bytes,
            };
            last.insert(name, bytes);
        }
    }
    Held {
        metrics: jsonl(&run.metrics()),
        samples: jsonl(&run.samples()),
        tensorboard,
        evals,
        memory,
        checkpoints,
        last,
    }
}

/// Paths under `dir` that an interrupted write left (temp files and
/// directories, directories moved aside).
fn leftovers(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.contains(".tmp-") || name.contains(".old-") {
            out.push(e.path());
        }
        if e.path().is_dir() {
            out.extend(leftovers(&e.path()));
        }
    }
    out
}

/// One boundary as the failpoint log lists it.
#[derive(Debug, Clone)]
struct Boundary {
    n: usize,
    label: String,
    path: String,
}

fn boundaries(log: &Path) -> Vec<Boundary> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| {
            let mut f = l.splitn(3, '\t');
            Boundary {
                n: f.next().unwrap().parse().unwrap(),
                label: f.next().unwrap().to_owned(),
                path: f.next().unwrap().to_owned(),
            }
        })
        .collect()
}

/// The uninterrupted run of `meta`'s config, with the list of its write
/// boundaries.
fn reference(dir: &Path, meta: bool) -> (Held, Vec<Boundary>) {
    let name = if meta { "ref-meta" } else { "ref-rl" };
    let cfg = crash_config(dir, name, uid_base(meta), meta);
    let log = dir.join(format!("{name}.failpoints"));
    let o = falcon_train(
        &write_config(dir, &cfg),
        false,
        &[("FALCON_FAILPOINT_LOG", log.display().to_string())],
    );
    assert!(o.status.success(), "{}", text(&o));
    let run = RunDir::of(&cfg);
    let h = held(&run);
    let steps: Vec<u64> = h
        .metrics
        .iter()
        .map(|m| m["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [0, 1, 2]);
    assert_eq!(h.checkpoints, [2, 3]);
    assert_eq!(h.evals.len(), 2, "step 2 and after");
    (h, boundaries(&log))
}

/// Fail `cfg`'s run at boundary `b` (`kill` or `enospc`), resume it, and
/// compare with `want`. Returns a description of what differed.
fn crash_and_resume(dir: &Path, cfg: &RunConfig, b: &Boundary, fault: &str, want: &Held) {
    let at = format!("boundary {} ({} {}), {fault}", b.n, b.label, b.path);
    let path = write_config(dir, cfg);
    let run = RunDir::of(cfg);
    let o = falcon_train(
        &path,
        false,
        &[("FALCON_FAILPOINT", format!("{}:{fault}", b.n))],
    );
    let out = text(&o);
    match fault {
        "kill" => assert_eq!(o.status.signal(), Some(9), "{at}: not killed:\n{out}"),
        _ => {
            assert_eq!(o.status.code(), Some(1), "{at}: no failure:\n{out}");
            assert!(
                out.contains("the disk is full") && out.contains("--resume"),
                "{at}: no clear error:\n{out}"
            );
            // The message names what could not be written, and the last
            // good checkpoint when there is one.
            let named = Path::new(&b.path).file_name().unwrap().to_string_lossy();
            let named = named.split(".tmp-").next().unwrap().trim_start_matches('.');
            // An event file's name holds its creation time.
            let named = if named.starts_with("events.out.tfevents.") {
                "events.out.tfevents."
            } else {
                named
            };
            assert!(out.contains(named), "{at}: the path is not named:\n{out}");
            match falcon_rl::train::checkpoint::list(run.path())
                .unwrap()
                .last()
            {
                Some(n) => assert!(
                    out.contains(&format!("step-{n} (step {n}), is intact")),
                    "{at}:\n{out}"
                ),
                None => assert!(
                    out.contains("No checkpoint had been written"),
                    "{at}:\n{out}"
                ),
            }
            let left = leftovers(run.path());
            assert!(left.is_empty(), "{at}: left behind {left:?}");
        }
    }
    let o = falcon_train(&path, true, &[]);
    assert!(o.status.success(), "{at}: the resume failed:\n{}", text(&o));
    let left = leftovers(run.path());
    assert!(
        left.is_empty(),
        "{at}: left behind after the resume {left:?}"
    );
    let got = held(&run);
    macro_rules! same {
        ($field:ident) => {
            assert!(
                got.$field == want.$field,
                "{at}: {} differs from the uninterrupted run's:\n got {:?}\nwant {:?}",
                stringify!($field),
                got.$field,
                want.$field
            );
        };
    }
    same!(metrics);
    same!(samples);
    same!(tensorboard);
    same!(evals);
    same!(memory);
    same!(checkpoints);
    same!(last);
}

/// Every boundary of `meta`'s run, by SIGKILL and by a full disk, on two
/// workers (each with its own sandbox uids).
fn every_boundary(meta: bool) {
    let tmp = tmpdir();
    let dir = tmp.path();
    crate::train::setup(dir);
    let t0 = std::time::Instant::now();
    let (want, points) = reference(dir, meta);
    // The kinds of write the issue lists are all there.
    let labels: std::collections::BTreeSet<&str> =
        points.iter().map(|b| b.label.as_str()).collect();
    let mut kinds = vec!["append", "flush events", "write", "rename"];
    if meta {
        kinds.push("memory insert");
    }
    for k in kinds {
        assert!(labels.contains(k), "no {k:?} boundary in {labels:?}");
    }
    for file in [
        "metrics.jsonl",
        "samples.jsonl",
        "manifest.json",
        "step-2.json",
    ] {
        assert!(
            points.iter().any(|b| b.path.contains(file)),
            "no boundary writes {file}"
        );
    }
    let jobs: Vec<(&Boundary, &str)> = points
        .iter()
        .flat_map(|b| [(b, "kill"), (b, "enospc")])
        .collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for worker in 0..2u32 {
            let (jobs, next, want) = (&jobs, &next, &want);
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((b, fault)) = jobs.get(i) else {
                    break;
                };
                let name = format!("crash-{}-{}-{fault}", if meta { "meta" } else { "rl" }, b.n);
                let cfg = crash_config(dir, &name, uid_base(meta) + 10 * (worker + 1), meta);
                crash_and_resume(dir, &cfg, b, fault, want);
                // Each case checked; its directory is no longer needed.
                let _ = std::fs::remove_dir_all(RunDir::of(&cfg).path());
            });
        }
    });
    eprintln!(
        "crash: {} boundaries x 2 faults ({}), {:.0} s",
        points.len(),
        if meta { "fomaml" } else { "rl" },
        t0.elapsed().as_secs_f64()
    );
}

#[test]
fn a_single_level_run_resumes_exactly_from_a_crash_at_every_write() {
    every_boundary(false);
}

#[test]
fn a_meta_run_with_both_memories_resumes_exactly_from_a_crash_at_every_write() {
    every_boundary(true);
}

/// `falcon train` on `config` as the two ranks of a data-parallel run,
/// with `env0` on rank 0 only; their outputs.
fn train_two_ranks(config: &Path, resume: bool, env0: &[(&str, String)]) -> Vec<Output> {
    let port = crate::dist::free_port().to_string();
    let extra: &[&str] = if resume { &["--resume"] } else { &[] };
    let children = (0..2)
        .map(|r| {
            let rank = r.to_string();
            let mut env = vec![
                ("RANK", rank.as_str()),
                ("WORLD_SIZE", "2"),
                ("LOCAL_RANK", rank.as_str()),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", port.as_str()),
            ];
            if r == 0 {
                env.extend(env0.iter().map(|(k, v)| (*k, v.as_str())));
            }
            crate::dist::falcon_train(config, extra, &env)
        })
        .collect();
    crate::dist::finish(children)
}

/// Data-parallel FOMAML with both memories, rank 0 writing: SIGKILLed
/// right after step 2's metrics line, out of disk while writing the last
/// checkpoint's weights, and SIGKILLed as the step-2 evaluation's result
/// goes into place; each resumed on both ranks equals an uninterrupted
/// 2-rank run.
#[test]
fn a_data_parallel_run_resumes_exactly_from_a_crash_on_rank_0() {
    let tmp = tmpdir();
    let dir = tmp.path();
    crate::train::setup(dir);
    let dp = |name: &str| {
        let mut cfg = crash_config(dir, name, 64300, true);
        cfg.model.lora.dropout = 0.0;
        cfg.dist.timeout_s = 20.0;
        cfg
    };
    let cfg = dp("dp-ref");
    let log = dir.join("dp.failpoints");
    let outs = train_two_ranks(
        &write_config(dir, &cfg),
        false,
        &[("FALCON_FAILPOINT_LOG", log.display().to_string())],
    );
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {r}:\n{}", text(o));
    }
    let want = held(&RunDir::of(&cfg));
    let points = boundaries(&log);
    let metrics_appends: Vec<&Boundary> = points
        .iter()
        .filter(|b| b.label == "append" && b.path.ends_with("metrics.jsonl"))
        .collect();
    assert_eq!(metrics_appends.len(), 3, "rank 0 alone writes the logs");
    let after_step_2 = &points[metrics_appends[2].n]; // the boundary after it
    let weights = points
        .iter()
        .find(|b| {
            b.label == "write" && b.path.contains(".step-3.tmp") && b.path.contains("trainable")
        })
        .expect("the last checkpoint's weights");
    let eval = points
        .iter()
        .find(|b| b.label == "rename" && b.path.ends_with("step-2.json"))
        .expect("the step-2 evaluation");
    for (i, (b, fault)) in [(after_step_2, "kill"), (weights, "enospc"), (eval, "kill")]
        .into_iter()
        .enumerate()
    {
        let at = format!("boundary {} ({} {}), {fault}", b.n, b.label, b.path);
        let cfg = dp(&format!("dp-{i}"));
        let path = write_config(dir, &cfg);
        let outs = train_two_ranks(
            &path,
            false,
            &[("FALCON_FAILPOINT", format!("{}:{fault}", b.n))],
        );
        assert!(
            !outs[0].status.success() && !outs[1].status.success(),
            "{at}"
        );
        if fault == "enospc" {
            assert!(
                text(&outs[0]).contains("the disk is full"),
                "{at}:\n{}",
                text(&outs[0])
            );
        }
        let outs = train_two_ranks(&path, true, &[]);
        for (r, o) in outs.iter().enumerate() {
            assert!(o.status.success(), "{at}: rank {r} resumed:\n{}", text(o));
        }
        let got = held(&RunDir::of(&cfg));
        assert!(got == want, "{at}:\n got {got:?}\nwant {want:?}");
        assert!(leftovers(RunDir::of(&cfg).path()).is_empty(), "{at}");
    }
}

/// A run directory's logs hold each of `steps` steps exactly once:
/// `metrics.jsonl` lines `0..steps`, as many samples for every step, and
/// one TensorBoard point per tag and step. For runs whose content cannot
/// be compared with an uninterrupted one (a vLLM server samples anew).
pub fn assert_each_step_once(run: &RunDir, steps: u64) {
    let metrics = jsonl(&run.metrics());
    let got: Vec<u64> = metrics
        .iter()
        .map(|m| m["step"].as_u64().unwrap())
        .collect();
    assert_eq!(got, (0..steps).collect::<Vec<_>>(), "metrics.jsonl steps");
    let mut per_step = BTreeMap::<u64, usize>::new();
    for s in jsonl(&run.samples()) {
        *per_step.entry(s["step"].as_u64().unwrap()).or_default() += 1;
    }
    assert_eq!(
        per_step.len() as u64,
        steps,
        "samples.jsonl steps: {per_step:?}"
    );
    let counts: std::collections::BTreeSet<usize> = per_step.values().copied().collect();
    assert_eq!(counts.len(), 1, "samples per step differ: {per_step:?}");
    let mut seen = std::collections::BTreeSet::new();
    for e in std::fs::read_dir(run.tensorboard()).unwrap().flatten() {
        for ev in falcon_rl::train::metrics::read_events(&e.path())
            .unwrap()
            .events
        {
            for (tag, _) in ev.scalars {
                assert!(
                    seen.insert((ev.step, tag.clone())),
                    "TensorBoard: {tag} twice at step {}",
                    ev.step
                );
            }
        }
    }
    for s in 0..steps as i64 {
        assert!(
            seen.contains(&(s, "pass_rate".to_owned())),
            "TensorBoard: no step {s}"
        );
    }
}
