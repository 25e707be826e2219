//! The process group over real c10d Gloo between real processes: this test
//! binary starts copies of itself as the ranks (the `rank_main` entry reads
//! its role from the environment; a plain run lists it as skipped).

use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use falcon_rl::config::RunConfig;
use falcon_rl::dist::{Group, Launch, Reduce};
use falcon_rl::run_dir::RunDir;
use tch::{Kind, Tensor};

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Start `world` copies of this binary running `scenario` as the ranks of
/// one group; their outputs, rank order.
fn ranks(world: usize, scenario: &str, timeout_s: u64) -> Vec<Output> {
    let port = free_port();
    let children: Vec<_> = (0..world)
        .map(|r| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "dist::rank_main", "--ignored", "--nocapture"])
                .env("FALCON_DIST_SCENARIO", scenario)
                .env("FALCON_DIST_TIMEOUT", timeout_s.to_string())
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

fn both(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn floats(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(&t.to_kind(Kind::Double).reshape([-1])).unwrap()
}

/// The body of one rank, started by the tests below (`--ignored`): not a
/// test of its own, so a plain run lists it as skipped.
#[test]
#[ignore = "one rank's body; the dist tests start it"]
fn rank_main() {
    let scenario = std::env::var("FALCON_DIST_SCENARIO")
        .expect("FALCON_DIST_SCENARIO: started by a dist test, never alone");
    let timeout: u64 = std::env::var("FALCON_DIST_TIMEOUT")
        .unwrap()
        .parse()
        .unwrap();
    let launch = Launch::from_env().unwrap();
    let g = Group::init(&launch, Duration::from_secs(timeout)).unwrap();
    let (r, w) = (g.rank() as f64, g.world() as f64);
    match scenario.as_str() {
        "collectives" => {
            let a = Tensor::from_slice(&[r + 1.0, 10.0 * (r + 1.0)]);
            let b = Tensor::from_slice(&[r as f32]);
            g.all_reduce(&[a.shallow_clone(), b.shallow_clone()], Reduce::Sum)
                .unwrap();
            let sum: f64 = (1..=g.world()).map(|k| k as f64).sum();
            assert_eq!(floats(&a), vec![sum, 10.0 * sum]);
            assert_eq!(floats(&b), vec![(0..g.world()).sum::<usize>() as f64]);
            let m = Tensor::from_slice(&[r]);
            g.all_reduce(std::slice::from_ref(&m), Reduce::Mean)
                .unwrap();
            assert_eq!(floats(&m), vec![(w - 1.0) / 2.0]);
            let mut xs = [r, -r];
            g.all_reduce_f64(&mut xs, Reduce::Max).unwrap();
            assert_eq!(xs, [w - 1.0, 0.0]);
            // Lengths differ per rank, an empty one included.
            let mine = vec![g.rank() as u8; g.rank() * 3];
            let all = g.all_gather_bytes(&mine).unwrap();
            for (k, v) in all.iter().enumerate() {
                assert_eq!(v, &vec![k as u8; k * 3]);
            }
            // Two tensors of different shapes and dtypes in one call.
            let x = Tensor::from_slice(&[r, r]);
            let y = Tensor::from_slice(&[r as f32 + 5.0]);
            g.broadcast(&[x.shallow_clone(), y.shallow_clone()], 1)
                .unwrap();
            assert_eq!(floats(&x), vec![1.0, 1.0]);
            assert_eq!(floats(&y), vec![6.0]);
            // Gradients in several buckets and two dtypes, one parameter
            // without a gradient on rank 0.
            let params: Vec<Tensor> = [
                (3, Kind::Float),
                (5, Kind::Float),
                (4, Kind::Double),
                (2, Kind::Float),
            ]
            .iter()
            .map(|&(n, k)| Tensor::zeros([n], (k, tch::Device::Cpu)).set_requires_grad(true))
            .collect();
            for (i, p) in params.iter().enumerate() {
                if i == 3 && g.rank() == 0 {
                    continue;
                }
                let y = (p * (r + 1.0 + i as f64)).sum(Kind::Double);
                y.backward();
            }
            g.all_reduce_grads(&params, 16, true).unwrap();
            for (i, p) in params.iter().enumerate() {
                let n = p.numel();
                let expect = if i == 3 {
                    // Only rank 1 contributed (r + 1 + i = 5), averaged over 2.
                    5.0 / w
                } else {
                    (1..=g.world()).map(|k| k as f64 + i as f64).sum::<f64>() / w
                };
                assert_eq!(floats(&p.grad()), vec![expect; n], "parameter {i}");
            }
            g.require_same("config", b"same").unwrap();
            let differ = g.require_same("config hash", &[g.rank() as u8]);
            let e = differ.unwrap_err().to_string();
            assert!(e.contains("different config hash"), "{e}");
            g.barrier().unwrap();
            println!("RANK-OK {}", g.rank());
        }
        "die" => {
            g.barrier().unwrap();
            if g.rank() == 1 {
                // As a SIGKILL would: no clean-up, no goodbye.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
            let t0 = Instant::now();
            let t = Tensor::from_slice(&[1.0f64]);
            let e = g.all_reduce(&[t], Reduce::Sum).unwrap_err();
            println!("RANK-ERR after {:.1}s: {e}", t0.elapsed().as_secs_f64());
        }
        other => panic!("unknown scenario {other}"),
    }
}

#[test]
fn collectives_agree_across_two_processes_over_gloo() {
    let outs = ranks(2, "collectives", 60);
    for (r, o) in outs.iter().enumerate() {
        let text = both(o);
        assert!(o.status.success(), "rank {r}:\n{text}");
        assert!(text.contains(&format!("RANK-OK {r}")), "rank {r}:\n{text}");
    }
}

#[test]
fn a_killed_rank_fails_the_others_within_the_timeout() {
    let t0 = Instant::now();
    let outs = ranks(2, "die", 20);
    let text = both(&outs[0]);
    assert!(outs[0].status.success(), "rank 0:\n{text}");
    assert!(text.contains("RANK-ERR"), "rank 0:\n{text}");
    assert!(text.contains("all_reduce failed on rank 0 of 2"), "{text}");
    assert!(!outs[1].status.success());
    // Never a hang: well within the 20 s timeout plus start-up.
    assert!(t0.elapsed() < Duration::from_secs(60), "{:?}", t0.elapsed());
}

#[test]
fn a_missing_rank_is_a_rendezvous_error_not_a_hang() {
    let launch = Launch {
        rank: 0,
        world: 2,
        local_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: free_port(),
        agent_store: None,
        launcher: "torchrun",
    };
    let t0 = Instant::now();
    let e = Group::init(&launch, Duration::from_secs(3))
        .err()
        .expect("nobody else came");
    let text = e.to_string();
    assert!(text.contains("rendezvous with 127.0.0.1"), "{text}");
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
}

/// `falcon train` on `cfg` as `world` ranks (plain, without a launcher's
/// environment, for one), each with `extra` arguments; their outputs.
fn train_ranks(dir: &Path, cfg: &RunConfig, world: usize, extra: &[&str]) -> Vec<Child> {
    let path = write_config(dir, cfg, &format!("{}-{world}", cfg.run.name));
    let port = free_port().to_string();
    (0..world)
        .map(|r| {
            let (r, w) = (r.to_string(), world.to_string());
            let env: &[(&str, &str)] = if world > 1 {
                &[
                    ("RANK", &r),
                    ("WORLD_SIZE", &w),
                    ("LOCAL_RANK", &r),
                    ("MASTER_ADDR", "127.0.0.1"),
                    ("MASTER_PORT", &port),
                ]
            } else {
                &[]
            };
            falcon_train(&path, extra, env)
        })
        .collect()
}

/// `cfg` written to `dir/<name>.toml`.
fn write_config(dir: &Path, cfg: &RunConfig, name: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, cfg.to_toml_string().unwrap()).unwrap();
    path
}

/// `falcon train --config config EXTRA` started with `env` added, its
/// output captured.
pub fn falcon_train(config: &Path, extra: &[&str], env: &[(&str, &str)]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_falcon"))
        .args(["train", "--config", config.to_str().unwrap()])
        .args(extra)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

pub fn finish(children: Vec<Child>) -> Vec<Output> {
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

fn succeed(children: Vec<Child>) {
    let world = children.len();
    for (r, o) in finish(children).iter().enumerate() {
        let text = both(o);
        assert!(o.status.success(), "rank {r} failed:\n{text}");
        if world > 1 {
            assert!(text.contains(&format!("rank {r} of {world}")), "{text}");
        }
    }
}

/// The run's config for the equivalence tests: the tiny model and tasks of
/// tests/train.rs, no LoRA dropout (it draws from each process's own
/// generator), its own output directory.
fn dist_config(dir: &Path, out: &str, steps: u64) -> RunConfig {
    let mut cfg = crate::train::config(dir, steps, 62470);
    cfg.run.output_dir = dir.join(out);
    cfg.model.lora.dropout = 0.0;
    cfg.train.advantage = falcon_rl::config::AdvantageKind::GroupMean;
    cfg.train.checkpoint_every = 1;
    cfg.train.keep_last = 0;
    cfg.dist.timeout_s = 60.0;
    cfg
}

fn weights_at(cfg: &RunConfig, step: u64) -> std::collections::BTreeMap<String, Tensor> {
    let p = RunDir::of(cfg)
        .checkpoint(step)
        .join(falcon_rl::run_dir::checkpoint::WEIGHTS);
    falcon_rl::model::weights::read_all(&p).unwrap()
}

/// `metrics.jsonl` without the timings.
fn metrics_of(cfg: &RunConfig) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(RunDir::of(cfg).metrics()).unwrap();
    text.lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("seconds");
            v
        })
        .collect()
}

/// Numbers within `tol` relative, everything else equal.
fn close(a: &serde_json::Value, b: &serde_json::Value, tol: f64, at: &str) {
    use serde_json::Value as V;
    match (a, b) {
        (V::Number(x), V::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!(
                (x - y).abs() <= tol * x.abs().max(y.abs()).max(1e-3),
                "{at}: {x} vs {y}"
            );
        }
        (V::Object(x), V::Object(y)) => {
            assert_eq!(
                x.keys().collect::<Vec<_>>(),
                y.keys().collect::<Vec<_>>(),
                "{at}"
            );
            for (k, v) in x {
                close(v, &y[k], tol, &format!("{at}.{k}"));
            }
        }
        (V::Array(x), V::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{at}");
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                close(p, q, tol, &format!("{at}[{i}]"));
            }
        }
        _ => assert_eq!(a, b, "{at}"),
    }
}

/// One rank against two over Gloo, same global batch and seeds: the LoRA
/// weights after every step and the metrics lines agree.
fn equivalent(tweak: impl Fn(&mut RunConfig), steps: u64) {
    // FALCON_KEEP_TEST_DIR=1 keeps both runs for a look.
    let tmp = crate::common::tmpdir();
    let (_guard, dir) = if std::env::var_os("FALCON_KEEP_TEST_DIR").is_some() {
        let d = tmp.keep();
        println!("test directory: {}", d.display());
        (None, d)
    } else {
        let d = tmp.path().to_path_buf();
        (Some(tmp), d)
    };
    let dir = dir.as_path();
    crate::train::setup(dir);
    let mut one = dist_config(dir, "one", steps);
    let mut two = dist_config(dir, "two", steps);
    tweak(&mut one);
    tweak(&mut two);
    succeed(train_ranks(dir, &one, 1, &[]));
    succeed(train_ranks(dir, &two, 2, &[]));
    // Relative to the tensor's norm (an element whose Adam step divides a
    // gradient of order eps by itself can differ more on its own: the two
    // runs add the same terms in another order and pad batches differently).
    for step in 1..=steps {
        let (a, b) = (weights_at(&one, step), weights_at(&two, step));
        assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
        let mut worst = 0f64;
        for (name, x) in &a {
            let y = &b[name];
            let rel = (x - y).norm().double_value(&[]) / x.norm().double_value(&[]).max(1e-12);
            assert!(rel <= 1e-5, "step {step} {name}: ‖Δ‖/‖w‖ = {rel:e}");
            worst = worst.max(rel);
        }
        println!("step {step}: largest ‖Δ‖/‖w‖ over the LoRA tensors {worst:.2e}");
    }
    // The steps did train.
    let (first, last) = (weights_at(&one, 1), weights_at(&one, steps));
    let moved: f64 = first
        .iter()
        .map(|(k, x)| (x - &last[k]).abs().max().double_value(&[]))
        .fold(0.0, f64::max);
    assert!(moved > 1e-4, "the weights did not change: {moved}");
    let (ma, mb) = (metrics_of(&one), metrics_of(&two));
    assert_eq!(ma.len(), steps as usize);
    close(
        &serde_json::Value::Array(ma),
        &serde_json::Value::Array(mb),
        1e-5,
        "metrics",
    );
    // Rank 0 alone wrote the samples, all of them.
    let lines = |c: &RunConfig| {
        std::fs::read_to_string(RunDir::of(c).samples())
            .unwrap()
            .lines()
            .count()
    };
    assert_eq!(lines(&one), lines(&two));
    // A checkpoint does not depend on the world size: the 2-rank run, its
    // last step lost, resumes on one process and ends where it did.
    let last = RunDir::of(&two).checkpoint(steps);
    let kept = weights_at(&two, steps);
    std::fs::remove_dir_all(&last).unwrap();
    succeed(train_ranks(dir, &two, 1, &["--resume"]));
    for (name, x) in &kept {
        let y = &weights_at(&two, steps)[name];
        let rel = (x - y).norm().double_value(&[]) / x.norm().double_value(&[]).max(1e-12);
        assert!(rel <= 1e-5, "resumed on 1 rank: {name}: ‖Δ‖/‖w‖ = {rel:e}");
    }
}

#[test]
fn two_ranks_train_as_one_single_level() {
    equivalent(|_| {}, 3);
}

#[test]
fn two_ranks_train_as_one_fomaml() {
    equivalent(
        |c| {
            // FALCON as the main job runs it: Table 7 prompts from
            // long-term memory, demonstrations, short-term rows.
            c.meta.algorithm = falcon_rl::config::MetaAlgorithm::Fomaml;
            c.meta.long_term = true;
            c.meta.short_term_samples = 2;
            c.meta.long_term_demos = 1;
        },
        2,
    );
}

/// Each rank scores its share with the user's own term, then gathers: the
/// same weights and metrics as one rank scoring everything.
#[test]
fn two_ranks_train_as_one_with_a_custom_reward_term() {
    let files = crate::common::tmpdir();
    let file = files.path().join("rewards.py");
    std::fs::write(
        &file,
        "def short(completions, **kwargs):\n    return [1.0 / (1 + len(c)) for c in completions]\n",
    )
    .unwrap();
    let python = crate::common::python().display().to_string();
    equivalent(
        |c| {
            c.reward.custom = vec![falcon_rl::config::CustomTermConfig {
                name: "short".into(),
                path: Some(file.clone()),
                python: python.clone(),
                weight: 2.0,
                ..Default::default()
            }];
        },
        2,
    );
}

#[test]
fn a_killed_rank_stops_the_others_and_resume_finishes_the_run() {
    let tmp = crate::common::tmpdir();
    let dir = tmp.path();
    crate::train::setup(dir);
    let mut cfg = dist_config(dir, "runs-fault", 6);
    cfg.dist.timeout_s = 20.0;
    let mut children = train_ranks(dir, &cfg, 2, &[]);
    let first = RunDir::of(&cfg).checkpoint(1);
    let t0 = Instant::now();
    while !first.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "no checkpoint came"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    children[1].kill().unwrap(); // SIGKILL
    let killed = Instant::now();
    let outs = finish(children);
    let text = both(&outs[0]);
    assert!(!outs[0].status.success(), "rank 0 went on alone:\n{text}");
    assert!(text.contains("failed on rank 0 of 2"), "{text}");
    // Never a hang: within the timeout (and the step it was in).
    assert!(
        killed.elapsed() < Duration::from_secs(60),
        "{:?}",
        killed.elapsed()
    );
    succeed(train_ranks(dir, &cfg, 2, &["--resume"]));
    let steps: Vec<u64> = metrics_of(&cfg)
        .iter()
        .map(|m| m["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, (0..6).collect::<Vec<_>>());
}

#[test]
fn ranks_with_different_configs_are_refused_at_start() {
    let tmp = crate::common::tmpdir();
    let dir = tmp.path();
    crate::train::setup(dir);
    let cfg = dist_config(dir, "runs-mismatch", 1);
    let mut other = cfg.clone();
    other.train.lr *= 2.0;
    let port = free_port().to_string();
    let children: Vec<Child> = [&cfg, &other]
        .iter()
        .enumerate()
        .map(|(r, c)| {
            let path = write_config(dir, c, &format!("rank{r}"));
            let env = [
                ("RANK", r.to_string()),
                ("WORLD_SIZE", "2".into()),
                ("MASTER_ADDR", "127.0.0.1".into()),
                ("MASTER_PORT", port.clone()),
            ];
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            falcon_train(&path, &[], &env)
        })
        .collect();
    for (r, o) in finish(children).iter().enumerate() {
        let text = both(o);
        assert!(!o.status.success(), "rank {r} trained:\n{text}");
        assert!(text.contains("different configs"), "rank {r}:\n{text}");
    }
    assert!(!RunDir::of(&cfg).checkpoint(1).exists());
}

#[test]
fn torchrun_and_slurm_launch_the_trainer() {
    let tmp = crate::common::tmpdir();
    let dir = tmp.path();
    crate::train::setup(dir);
    // torchrun from the libtorch virtualenv, as a user would type it, with
    // held-out evaluations (rank 0 evaluates, the other waits for it).
    let mut cfg = dist_config(dir, "runs-torchrun", 2);
    cfg.eval.path = Some(dir.join("tasks.jsonl"));
    cfg.train.eval_before = true;
    cfg.train.eval_every = 1;
    cfg.train.eval_after = true;
    let path = write_config(dir, &cfg, "torchrun");
    let torchrun = crate::common::python().with_file_name("torchrun");
    let o = Command::new(&torchrun)
        .args(["--no-python", "--nproc-per-node", "2", "--master-port"])
        .arg(free_port().to_string())
        .arg(env!("CARGO_BIN_EXE_falcon"))
        .args(["train", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let text = both(&o);
    assert!(o.status.success(), "{text}");
    assert!(text.contains("rank 1 of 2 (launched by torchrun"), "{text}");
    assert_eq!(metrics_of(&cfg).len(), 2);
    for step in 0..=2 {
        let e = RunDir::of(&cfg).eval(step);
        assert!(e.is_file(), "{} missing:\n{text}", e.display());
    }
    // Slurm's variables (srun sets them; no Slurm here), master from the
    // step's node list.
    let cfg = dist_config(dir, "runs-slurm", 1);
    let path = write_config(dir, &cfg, "slurm");
    let port = free_port().to_string();
    let children: Vec<Child> = (0..2)
        .map(|r| {
            let r = r.to_string();
            let env = [
                ("SLURM_PROCID", r.as_str()),
                ("SLURM_NTASKS", "2"),
                ("SLURM_LOCALID", r.as_str()),
                ("SLURM_STEP_NODELIST", "localhost"),
                ("MASTER_PORT", port.as_str()),
            ];
            falcon_train(&path, &[], &env)
        })
        .collect();
    for (r, o) in finish(children).iter().enumerate() {
        let text = both(o);
        assert!(o.status.success(), "rank {r}:\n{text}");
        assert!(
            text.contains("launched by slurm, rendezvous at localhost"),
            "{text}"
        );
    }
    assert_eq!(metrics_of(&cfg).len(), 1);
}
