//! Failpoints: the durable writes of a run (atomic writes and their renames,
//! JSONL appends, TensorBoard flushes, memory-database transactions) each
//! pass through [`hit`] first, so that a test can make the N-th of them fail
//! and check what a resume makes of the run directory it left.
//!
//! Off unless the environment asks, and then read once:
//! - `FALCON_FAILPOINT=N:kill` SIGKILLs the process at the N-th write
//!   boundary (1-based); an append is torn first, half of its line written.
//! - `FALCON_FAILPOINT=N:enospc` makes the N-th write fail as a full disk
//!   does (`ENOSPC`), after a torn half-line for an append.
//! - `FALCON_FAILPOINT_LOG=FILE` appends `N<TAB>label<TAB>path` for every
//!   boundary passed, so a harness can list them from one clean run.
//!
//! This is a testing hook (`tests/crash.rs`); with neither variable set a
//! boundary costs one relaxed atomic load.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// What the N-th boundary does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Go on writing.
    None,
    /// The process dies here (SIGKILL: no destructor, no flush).
    Kill,
    /// The write fails with `ENOSPC`.
    NoSpace,
}

struct Plan {
    at: u64,
    fault: Fault,
    log: Option<std::path::PathBuf>,
}

fn plan() -> Option<&'static Plan> {
    static PLAN: OnceLock<Option<Plan>> = OnceLock::new();
    PLAN.get_or_init(|| {
        let log = std::env::var_os("FALCON_FAILPOINT_LOG").map(Into::into);
        let spec = std::env::var("FALCON_FAILPOINT").ok();
        let (at, fault) = match spec.as_deref().map(parse) {
            None => (0, Fault::None),
            Some(Ok(p)) => p,
            Some(Err(e)) => {
                eprintln!("falcon: ignoring FALCON_FAILPOINT: {e}");
                (0, Fault::None)
            }
        };
        (at > 0 || log.is_some()).then_some(Plan { at, fault, log })
    })
    .as_ref()
}

/// `N:kill` or `N:enospc`.
fn parse(spec: &str) -> Result<(u64, Fault), String> {
    let (n, what) = spec
        .split_once(':')
        .ok_or_else(|| format!("{spec:?} is not N:kill or N:enospc"))?;
    let n: u64 = n
        .trim()
        .parse()
        .map_err(|_| format!("{n:?} is not a boundary number"))?;
    let fault = match what.trim() {
        "kill" => Fault::Kill,
        "enospc" => Fault::NoSpace,
        w => return Err(format!("{w:?} is not kill or enospc")),
    };
    Ok((n, fault))
}

static PASSED: AtomicU64 = AtomicU64::new(0);

/// Pass the write boundary `label` (about to write `path`): what the plan
/// says happens here. A caller that can tear its write does so before
/// acting on [`Fault::Kill`] or [`Fault::NoSpace`]; the others call
/// [`check`].
pub fn hit(label: &str, path: &Path) -> Fault {
    let Some(plan) = plan() else {
        return Fault::None;
    };
    let n = PASSED.fetch_add(1, Ordering::Relaxed) + 1;
    if let Some(log) = &plan.log {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            let _ = writeln!(f, "{n}\t{label}\t{}", path.display());
        }
    }
    if n == plan.at {
        plan.fault
    } else {
        Fault::None
    }
}

/// Act on a fault: die, or the I/O error a full disk gives.
pub fn act(fault: Fault) -> std::io::Result<()> {
    match fault {
        Fault::None => Ok(()),
        Fault::Kill => {
            // SAFETY: raising a signal at ourselves has no memory effects.
            unsafe {
                libc::raise(libc::SIGKILL);
            }
            unreachable!("SIGKILL returned")
        }
        Fault::NoSpace => Err(std::io::Error::from_raw_os_error(libc::ENOSPC)),
    }
}

/// [`hit`] then [`act`], for a boundary that cannot tear.
pub fn check(label: &str, path: &Path) -> std::io::Result<()> {
    act(hit(label, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_mistakes_are_named() {
        assert_eq!(parse("3:kill"), Ok((3, Fault::Kill)));
        assert_eq!(parse("12:enospc"), Ok((12, Fault::NoSpace)));
        assert!(parse("3").unwrap_err().contains("N:kill"));
        assert!(parse("x:kill").unwrap_err().contains("boundary number"));
        assert!(parse("3:boom").unwrap_err().contains("\"boom\""));
    }

    #[test]
    fn a_full_disk_is_enospc() {
        let e = act(Fault::NoSpace).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        assert!(act(Fault::None).is_ok());
    }
}
