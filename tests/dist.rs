//! The process group over real c10d Gloo between real processes: this test
//! binary starts copies of itself as the ranks (the `rank_main` entry reads
//! its role from the environment and does nothing in a normal run).

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use falcon_rl::dist::{Group, Launch, Reduce};
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
                .args(["--exact", "dist::rank_main", "--nocapture"])
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

/// The body of one rank (only when a test above started it).
#[test]
fn rank_main() {
    let Ok(scenario) = std::env::var("FALCON_DIST_SCENARIO") else {
        return;
    };
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
            g.all_reduce(std::slice::from_ref(&m), Reduce::Mean).unwrap();
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
            let x = Tensor::from_slice(&[r, r]);
            g.broadcast(std::slice::from_ref(&x), 1).unwrap();
            assert_eq!(floats(&x), vec![1.0, 1.0]);
            // Gradients in several buckets and two dtypes, one parameter
            // without a gradient on rank 0.
            let params: Vec<Tensor> = [(3, Kind::Float), (5, Kind::Float), (4, Kind::Double), (2, Kind::Float)]
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
