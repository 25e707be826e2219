//! The process group of a data-parallel run: who this process is
//! ([`Launch`]: rank, world size, local rank and the rendezvous address,
//! read from torchrun's or Slurm's environment) and the collectives the
//! trainer needs ([`Group`]: all-reduce, bucketed gradient all-reduce,
//! broadcast, all-gather of bytes, barrier), all from libtorch's own c10d:
//! its `TCPStore` for the rendezvous and `ProcessGroupGloo` for the
//! collectives, the engine PyTorch DDP runs on, through a small C++ shim
//! (`shim/c10d.cpp`, compiled by build.rs against the installed libtorch's
//! headers).
//!
//! World size 1 needs no environment and no sockets: every collective is
//! the identity. CUDA tensors go through Gloo too, staged in host memory;
//! c10d's NCCL group is not wired yet (docs/multi-node.md says so).

use std::ffi::{c_char, c_int, c_void, CString};
use std::time::Duration;

use tch::{Device, Kind, Tensor};

/// What can go wrong in the process group.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    /// The launcher's environment is incomplete or malformed.
    #[error("distributed launch: {0}")]
    Env(String),
    /// Rendezvous failed (no store at the address, ranks missing).
    #[error("rendezvous with {addr} as rank {rank} of {world} failed: {msg}")]
    Rendezvous {
        addr: String,
        rank: usize,
        world: usize,
        msg: String,
    },
    /// A collective failed: a peer died or the timeout passed.
    #[error("{op} failed on rank {rank} of {world} (a rank died, or it waited past [dist] timeout_s = {timeout_s}): {msg}")]
    Collective {
        op: &'static str,
        rank: usize,
        world: usize,
        timeout_s: f64,
        msg: String,
    },
    /// The ranks do not agree on something they must share.
    #[error("{0}")]
    Mismatch(String),
}

/// Where a process sits in the job, as its launcher says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub rank: usize,
    pub world: usize,
    /// The index of this process on its node: the device it drives.
    pub local_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// A key prefix when the rendezvous store belongs to the launcher
    /// (torchrun's agent hosts it; the workers only connect).
    pub agent_store: Option<String>,
    /// `torchrun`, `slurm` or `single`.
    pub launcher: &'static str,
}

/// torchrun's default port, used when Slurm gives no `MASTER_PORT`.
const DEFAULT_PORT: u16 = 29500;

impl Launch {
    /// One process, no peers.
    pub fn single() -> Launch {
        Launch {
            rank: 0,
            world: 1,
            local_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: DEFAULT_PORT,
            agent_store: None,
            launcher: "single",
        }
    }

    /// From this process's environment: torchrun's `RANK` / `WORLD_SIZE` /
    /// `LOCAL_RANK` / `MASTER_ADDR` / `MASTER_PORT` first, else Slurm's
    /// `SLURM_PROCID` / `SLURM_NTASKS` / `SLURM_LOCALID` (master from
    /// `MASTER_ADDR` or the first host of the step's node list), else one
    /// process.
    pub fn from_env() -> Result<Launch, DistError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`Launch::from_env`] over any variable lookup.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Launch, DistError> {
        let num = |k: &str| -> Result<Option<usize>, DistError> {
            match var(k) {
                None => Ok(None),
                Some(v) => v.trim().parse().map(Some).map_err(|_| {
                    DistError::Env(format!("{k}={v:?} is not a non-negative integer"))
                }),
            }
        };
        let port = |default: Option<u16>| -> Result<u16, DistError> {
            match var("MASTER_PORT") {
                Some(v) => v
                    .trim()
                    .parse()
                    .map_err(|_| DistError::Env(format!("MASTER_PORT={v:?} is not a port"))),
                None => default.ok_or_else(|| DistError::Env("MASTER_PORT is not set".into())),
            }
        };
        let (launcher, rank, world, local) = if let Some(world) = num("WORLD_SIZE")? {
            let rank = num("RANK")?
                .ok_or_else(|| DistError::Env("WORLD_SIZE is set but RANK is not".into()))?;
            ("torchrun", rank, world, num("LOCAL_RANK")?.unwrap_or(0))
        } else if let Some(world) = num("SLURM_NTASKS")? {
            let rank = num("SLURM_PROCID")?.ok_or_else(|| {
                DistError::Env("SLURM_NTASKS is set but SLURM_PROCID is not".into())
            })?;
            ("slurm", rank, world, num("SLURM_LOCALID")?.unwrap_or(0))
        } else {
            return Ok(Launch::single());
        };
        if world == 0 || rank >= world {
            return Err(DistError::Env(format!(
                "rank {rank} is not below world size {world}"
            )));
        }
        if world == 1 {
            return Ok(Launch {
                local_rank: local,
                ..Launch::single()
            });
        }
        let (master_addr, master_port) = if launcher == "torchrun" {
            let addr = var("MASTER_ADDR")
                .ok_or_else(|| DistError::Env("WORLD_SIZE is set but MASTER_ADDR is not".into()))?;
            (addr, port(None)?)
        } else {
            let addr = match var("MASTER_ADDR") {
                Some(a) => a,
                None => {
                    let list = var("SLURM_STEP_NODELIST")
                        .or_else(|| var("SLURM_JOB_NODELIST"))
                        .ok_or_else(|| {
                            DistError::Env(
                                "Slurm gave no node list: set MASTER_ADDR to rank 0's host".into(),
                            )
                        })?;
                    first_host(&list)?
                }
            };
            (addr, port(Some(DEFAULT_PORT))?)
        };
        let agent_store = match var("TORCHELASTIC_USE_AGENT_STORE").as_deref() {
            Some("True") | Some("true") | Some("1") => Some(format!(
                "/worker/attempt_{}",
                var("TORCHELASTIC_RESTART_COUNT").unwrap_or_else(|| "0".into())
            )),
            _ => None,
        };
        Ok(Launch {
            rank,
            world,
            local_rank: local,
            master_addr,
            master_port,
            agent_store,
            launcher,
        })
    }
}

/// The first host of a Slurm node list: `node07`, `gpu[03-05,9]` →
/// `gpu03`, `a[1-2],b1` → `a1`.
pub fn first_host(list: &str) -> Result<String, DistError> {
    let bad = || DistError::Env(format!("cannot read the Slurm node list {list:?}"));
    let first = list.trim();
    let (prefix, rest) = match first.find(['[', ',']) {
        None => {
            return (!first.is_empty())
                .then(|| first.to_owned())
                .ok_or_else(bad)
        }
        Some(i) => first.split_at(i),
    };
    if prefix.is_empty() {
        return Err(bad());
    }
    if rest.starts_with(',') {
        return Ok(prefix.to_owned());
    }
    let inside = rest[1..].split(']').next().ok_or_else(bad)?;
    let range = inside.split(',').next().ok_or_else(bad)?;
    let lo = range.split('-').next().ok_or_else(bad)?;
    if lo.is_empty() || !lo.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    Ok(format!("{prefix}{lo}"))
}

mod ffi {
    use super::*;

    extern "C" {
        #[allow(clippy::too_many_arguments)]
        pub fn falcon_c10d_new(
            host: *const c_char,
            port: u16,
            store_server: c_int,
            prefix: *const c_char,
            rank: c_int,
            world: c_int,
            timeout_ms: i64,
            bind_host: *const c_char,
            err: *mut c_char,
            errlen: usize,
        ) -> *mut c_void;
        pub fn falcon_c10d_free(g: *mut c_void);
        pub fn falcon_c10d_allreduce(
            g: *mut c_void,
            t: *mut c_void,
            op: c_int,
            err: *mut c_char,
            errlen: usize,
        ) -> c_int;
        pub fn falcon_c10d_broadcast(
            g: *mut c_void,
            t: *mut c_void,
            root: c_int,
            err: *mut c_char,
            errlen: usize,
        ) -> c_int;
        pub fn falcon_c10d_allgather(
            g: *mut c_void,
            input: *mut c_void,
            outputs: *const *mut c_void,
            n: usize,
            err: *mut c_char,
            errlen: usize,
        ) -> c_int;
        pub fn falcon_c10d_barrier(g: *mut c_void, err: *mut c_char, errlen: usize) -> c_int;
    }
}

/// A reduction of [`Group::all_reduce`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduce {
    Sum,
    /// The sum divided by the world size (Gloo has no average).
    Mean,
    Max,
    Min,
}

/// A c10d Gloo process group, owned.
struct Gloo(*mut c_void);

// c10d's ProcessGroupGloo is thread-safe; the trainer uses it from one
// thread at a time anyway.
unsafe impl Send for Gloo {}
unsafe impl Sync for Gloo {}

impl Drop for Gloo {
    fn drop(&mut self) {
        unsafe { ffi::falcon_c10d_free(self.0) }
    }
}

/// The ranks of a run and their collectives (the identity for one process).
pub struct Group {
    launch: Launch,
    timeout: Duration,
    gloo: Option<Gloo>,
}

const ERR_LEN: usize = 2048;

/// The C++ exception's text, without the stack trace c10 appends.
fn message(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let text = String::from_utf8_lossy(&buf[..end]);
    let text = text.split("\nException raised from").next().unwrap_or("");
    text.trim().to_owned()
}

impl Group {
    /// The group of one process.
    pub fn single() -> Group {
        Group {
            launch: Launch::single(),
            timeout: Duration::from_secs(1800),
            gloo: None,
        }
    }

    /// Join the group `launch` describes (rendezvous through c10d's
    /// TCPStore: rank 0 hosts it unless the launcher does); waits up to
    /// `timeout` for the other ranks, and every later collective does too.
    pub fn init(launch: &Launch, timeout: Duration) -> Result<Group, DistError> {
        if launch.world == 1 {
            return Ok(Group {
                launch: launch.clone(),
                timeout,
                gloo: None,
            });
        }
        let cstr = |s: &str| {
            CString::new(s).map_err(|_| DistError::Env(format!("{s:?} contains a NUL byte")))
        };
        let host = cstr(&launch.master_addr)?;
        let prefix = cstr(launch.agent_store.as_deref().unwrap_or(""))?;
        // Gloo binds where rank 0's address says this machine is reachable
        // when all ranks share it (one node), else on this host's name.
        let local = matches!(
            launch.master_addr.as_str(),
            "127.0.0.1" | "localhost" | "::1"
        );
        let bind = cstr(if local { "127.0.0.1" } else { "" })?;
        let mut err = vec![0u8; ERR_LEN];
        let g = unsafe {
            ffi::falcon_c10d_new(
                host.as_ptr(),
                launch.master_port,
                (launch.rank == 0 && launch.agent_store.is_none()) as c_int,
                prefix.as_ptr(),
                launch.rank as c_int,
                launch.world as c_int,
                timeout.as_millis().min(i64::MAX as u128) as i64,
                bind.as_ptr(),
                err.as_mut_ptr().cast(),
                err.len(),
            )
        };
        if g.is_null() {
            return Err(DistError::Rendezvous {
                addr: format!("{}:{}", launch.master_addr, launch.master_port),
                rank: launch.rank,
                world: launch.world,
                msg: message(&err),
            });
        }
        Ok(Group {
            launch: launch.clone(),
            timeout,
            gloo: Some(Gloo(g)),
        })
    }

    pub fn rank(&self) -> usize {
        self.launch.rank
    }

    pub fn world(&self) -> usize {
        self.launch.world
    }

    pub fn local_rank(&self) -> usize {
        self.launch.local_rank
    }

    /// Rank 0: the one that writes the run's files.
    pub fn is_main(&self) -> bool {
        self.launch.rank == 0
    }

    /// Run one shim call (`call(group, err, errlen)`, nonzero on failure)
    /// and turn its C++ exception text into the error of `op`. Nothing to
    /// do for one process.
    fn collective(
        &self,
        op: &'static str,
        call: impl FnOnce(*mut c_void, *mut c_char, usize) -> c_int,
    ) -> Result<(), DistError> {
        let Some(g) = &self.gloo else { return Ok(()) };
        let mut err = vec![0u8; ERR_LEN];
        if call(g.0, err.as_mut_ptr().cast(), err.len()) != 0 {
            return Err(DistError::Collective {
                op,
                rank: self.rank(),
                world: self.world(),
                timeout_s: self.timeout.as_secs_f64(),
                msg: message(&err),
            });
        }
        Ok(())
    }

    /// Reduce CPU tensors in place across the ranks, one collective each.
    fn reduce_host(&self, ts: &[Tensor], op: Reduce) -> Result<(), DistError> {
        let code = match op {
            Reduce::Sum | Reduce::Mean => 0,
            Reduce::Max => 1,
            Reduce::Min => 2,
        };
        for t in ts {
            let ptr = t.as_ptr() as *mut c_void;
            self.collective("all_reduce", |g, err, len| unsafe {
                ffi::falcon_c10d_allreduce(g, ptr, code, err, len)
            })?;
            if op == Reduce::Mean {
                let _ = t.shallow_clone().divide_scalar_(self.world() as f64);
            }
        }
        Ok(())
    }

    /// Reduce `ts` in place across the ranks (every rank ends with the
    /// result). Tensors must have the same shapes and dtypes on every rank.
    pub fn all_reduce(&self, ts: &[Tensor], op: Reduce) -> Result<(), DistError> {
        if self.gloo.is_none() || ts.is_empty() {
            return Ok(());
        }
        if ts.iter().all(|t| t.device() == Device::Cpu) {
            return self.reduce_host(ts, op);
        }
        let host: Vec<Tensor> = ts.iter().map(|t| t.to_device(Device::Cpu)).collect();
        self.reduce_host(&host, op)?;
        tch::no_grad(|| {
            for (t, h) in ts.iter().zip(&host) {
                t.shallow_clone().copy_(h);
            }
        });
        Ok(())
    }

    /// Reduce numbers across the ranks.
    pub fn all_reduce_f64(&self, xs: &mut [f64], op: Reduce) -> Result<(), DistError> {
        if self.gloo.is_none() || xs.is_empty() {
            return Ok(());
        }
        let t = Tensor::from_slice(xs);
        self.reduce_host(std::slice::from_ref(&t), op)?;
        xs.copy_from_slice(&Vec::<f64>::try_from(&t).expect("f64 tensor"));
        Ok(())
    }

    /// Sum (`mean = false`) or average the gradients of `params` across the
    /// ranks, in buckets of about `bucket_bytes` (one collective each, as
    /// PyTorch DDP's buckets). A parameter without a gradient counts as
    /// zeros, so every rank takes part in every bucket.
    pub fn all_reduce_grads(
        &self,
        params: &[Tensor],
        bucket_bytes: usize,
        mean: bool,
    ) -> Result<(), DistError> {
        if self.gloo.is_none() {
            return Ok(());
        }
        let op = if mean { Reduce::Mean } else { Reduce::Sum };
        let mut start = 0;
        while start < params.len() {
            let mut end = start;
            let mut bytes = 0usize;
            // Buckets hold parameters of one dtype, at least one each.
            let kind = params[start].kind();
            while end < params.len()
                && params[end].kind() == kind
                && (end == start || bytes + nbytes(&params[end]) <= bucket_bytes)
            {
                bytes += nbytes(&params[end]);
                end += 1;
            }
            let chunk = &params[start..end];
            tch::no_grad(|| -> Result<(), DistError> {
                let flat: Vec<Tensor> = chunk
                    .iter()
                    .map(|p| {
                        let g = p.grad();
                        if g.defined() {
                            g.reshape([-1]).to_device(Device::Cpu)
                        } else {
                            Tensor::zeros([p.numel() as i64], (kind, Device::Cpu))
                        }
                    })
                    .collect();
                let bucket = Tensor::cat(&flat, 0);
                self.reduce_host(std::slice::from_ref(&bucket), op)?;
                let mut off = 0i64;
                for p in chunk {
                    let n = p.numel() as i64;
                    let part = bucket.narrow(0, off, n).view(p.size().as_slice());
                    let mut g = p.grad();
                    if g.defined() {
                        g.copy_(&part);
                    } else if part.abs().max().double_value(&[]) != 0.0 {
                        // Another rank's gradient for a parameter this rank
                        // never touched: give it one.
                        set_grad(p, &part.to_device(p.device()));
                    }
                    off += n;
                }
                Ok(())
            })?;
            start = end;
        }
        Ok(())
    }

    /// Overwrite `ts` on every rank with rank `root`'s values (one
    /// collective each).
    pub fn broadcast(&self, ts: &[Tensor], root: usize) -> Result<(), DistError> {
        if self.gloo.is_none() {
            return Ok(());
        }
        for t in ts {
            let host = t.to_device(Device::Cpu);
            let ptr = host.as_ptr() as *mut c_void;
            self.collective("broadcast", |g, err, len| unsafe {
                ffi::falcon_c10d_broadcast(g, ptr, root as c_int, err, len)
            })?;
            if t.device() != Device::Cpu {
                tch::no_grad(|| t.shallow_clone().copy_(&host));
            }
        }
        Ok(())
    }

    fn gather_host(&self, input: &Tensor, outputs: &[Tensor]) -> Result<(), DistError> {
        let ptrs: Vec<*mut c_void> = outputs.iter().map(|t| t.as_ptr() as *mut c_void).collect();
        let input = input.as_ptr() as *mut c_void;
        self.collective("all_gather", |g, err, len| unsafe {
            ffi::falcon_c10d_allgather(g, input, ptrs.as_ptr(), ptrs.len(), err, len)
        })
    }

    /// Every rank's `bytes`, in rank order (lengths may differ).
    pub fn all_gather_bytes(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, DistError> {
        if self.gloo.is_none() {
            return Ok(vec![bytes.to_vec()]);
        }
        let w = self.world();
        let len = Tensor::from_slice(&[bytes.len() as i64]);
        let lens: Vec<Tensor> = (0..w)
            .map(|_| Tensor::zeros([1], (Kind::Int64, Device::Cpu)))
            .collect();
        self.gather_host(&len, &lens)?;
        let lens: Vec<usize> = lens.iter().map(|t| t.int64_value(&[0]) as usize).collect();
        let max = lens.iter().copied().max().unwrap_or(0).max(1);
        let mut padded = bytes.to_vec();
        padded.resize(max, 0);
        let input = Tensor::from_slice(&padded);
        let outs: Vec<Tensor> = (0..w)
            .map(|_| Tensor::zeros([max as i64], (Kind::Uint8, Device::Cpu)))
            .collect();
        self.gather_host(&input, &outs)?;
        Ok(outs
            .iter()
            .zip(lens)
            .map(|(t, n)| {
                let v = Vec::<u8>::try_from(t).expect("u8 tensor");
                v[..n].to_vec()
            })
            .collect())
    }

    /// Wait until every rank gets here.
    pub fn barrier(&self) -> Result<(), DistError> {
        self.collective("barrier", |g, err, len| unsafe {
            ffi::falcon_c10d_barrier(g, err, len)
        })
    }

    /// Refuse to go on unless every rank holds the same `value` (a config's
    /// hash, a checkpoint step): `what` names it in the error.
    pub fn require_same(&self, what: &str, value: &[u8]) -> Result<(), DistError> {
        let all = self.all_gather_bytes(value)?;
        if let Some(r) = all.iter().position(|v| v != value) {
            return Err(DistError::Mismatch(format!(
                "rank {r} and rank {} have different {what}: every rank must run the same one",
                self.rank()
            )));
        }
        Ok(())
    }
}

fn nbytes(t: &Tensor) -> usize {
    t.numel() * t.kind().elt_size_in_bytes()
}

/// Give the leaf `p` (which has none) the gradient `grad`: tch has no
/// setter, and d/dp Σ(p ⊙ grad) is exactly `grad`.
fn set_grad(p: &Tensor, grad: &Tensor) {
    tch::with_grad(|| (p * grad.detach()).sum(Kind::Float).backward());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn no_launcher_is_one_process() {
        assert_eq!(Launch::from_vars(vars(&[])).unwrap(), Launch::single());
    }

    #[test]
    fn torchrun_environment() {
        let l = Launch::from_vars(vars(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "n0"),
            ("MASTER_PORT", "29400"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ("TORCHELASTIC_RESTART_COUNT", "2"),
        ]))
        .unwrap();
        assert_eq!((l.rank, l.world, l.local_rank), (3, 4, 1));
        assert_eq!((l.master_addr.as_str(), l.master_port), ("n0", 29400));
        assert_eq!(l.agent_store.as_deref(), Some("/worker/attempt_2"));
        assert_eq!(l.launcher, "torchrun");
    }

    #[test]
    fn slurm_environment_takes_the_first_node() {
        let l = Launch::from_vars(vars(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_STEP_NODELIST", "gpu[07-09,12]"),
        ]))
        .unwrap();
        assert_eq!((l.rank, l.world, l.local_rank), (5, 8, 1));
        assert_eq!((l.master_addr.as_str(), l.master_port), ("gpu07", 29500));
        assert_eq!(l.launcher, "slurm");
    }

    #[test]
    fn bad_environments_say_which_variable() {
        let e = Launch::from_vars(vars(&[("WORLD_SIZE", "2"), ("RANK", "x")])).unwrap_err();
        assert!(e.to_string().contains("RANK=\"x\""), "{e}");
        let e = Launch::from_vars(vars(&[("WORLD_SIZE", "2"), ("RANK", "2")])).unwrap_err();
        assert!(e.to_string().contains("not below world size"), "{e}");
        let e = Launch::from_vars(vars(&[("WORLD_SIZE", "2"), ("RANK", "0")])).unwrap_err();
        assert!(e.to_string().contains("MASTER_ADDR"), "{e}");
    }

    #[test]
    fn slurm_node_lists() {
        assert_eq!(first_host("node07").unwrap(), "node07");
        assert_eq!(first_host("gpu[03-05,9]").unwrap(), "gpu03");
        assert_eq!(first_host("a1,b[1-2]").unwrap(), "a1");
        assert!(first_host("[1-2]").is_err());
        assert!(first_host("").is_err());
    }

    #[test]
    fn one_process_collectives_are_the_identity() {
        let g = Group::single();
        let t = Tensor::from_slice(&[1.0f32, 2.0]);
        g.all_reduce(std::slice::from_ref(&t), Reduce::Mean)
            .unwrap();
        assert_eq!(Vec::<f32>::try_from(&t).unwrap(), vec![1.0, 2.0]);
        assert_eq!(g.all_gather_bytes(b"x").unwrap(), vec![b"x".to_vec()]);
        g.barrier().unwrap();
        g.require_same("config", b"abc").unwrap();
    }
}
