//! One writer per directory: an exclusive advisory lock (`flock`) on a file
//! in it, held for as long as the [`DirLock`] lives. The kernel drops the
//! lock when the process dies, however it dies, so a SIGKILLed writer
//! never leaves a stale lock behind. The holder writes who it is (pid,
//! host, start time, command) into the file, so that a second writer is
//! told whom it met.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::{hostname, io_err, IoError};

/// Why a lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it.
    #[error(
        "{} is being written by another falcon process ({holder}); two writers would interleave \
         its logs and overwrite each other's checkpoints. Wait for that one to finish, or stop \
         it{} and run this command again (with --resume to continue the run)",
        dir.display(),
        holder.stop_hint()
    )]
    Held { dir: PathBuf, holder: Holder },
    /// The filesystem cannot lock (some network filesystems).
    #[error(
        "{}: cannot take the run's lock: {cause}. This filesystem does not support file locks \
         (some network filesystems do not), so nothing would keep a second writer out. Put the \
         run on a local or lock-capable filesystem, or pass --allow-unlocked to run without the \
         lock and make sure that nothing else writes {}",
        path.display(),
        dir.display()
    )]
    Unsupported {
        path: PathBuf,
        dir: PathBuf,
        cause: std::io::Error,
    },
    #[error(transparent)]
    Io(#[from] IoError),
}

/// What to do where the filesystem cannot lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unlockable {
    /// Refuse ([`LockError::Unsupported`]).
    Refuse,
    /// Go on without a lock (the user accepted the risk).
    Proceed,
}

/// A held lock; dropping it (or the process ending) releases it. The file
/// stays: removing it would let a process that opened it before the
/// removal lock a file nobody else can find.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    path: PathBuf,
}

impl DirLock {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Who holds a lock, as its file says (fields it did not write yet are
/// `None`: a holder that has just taken the lock).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holder {
    pub pid: Option<u32>,
    pub host: Option<String>,
    /// Seconds since the Unix epoch.
    pub started: Option<u64>,
    pub command: Option<String>,
}

impl Holder {
    fn of_this_process() -> Self {
        Holder {
            pid: Some(std::process::id()),
            host: Some(hostname()),
            started: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .ok()
                .map(|d| d.as_secs()),
            command: Some(
                std::env::args()
                    .map(|a| {
                        if a.contains(char::is_whitespace) {
                            format!("{a:?}")
                        } else {
                            a
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
        }
    }

    fn to_text(&self) -> String {
        let mut out = String::new();
        if let Some(p) = self.pid {
            out.push_str(&format!("pid={p}\n"));
        }
        if let Some(h) = &self.host {
            out.push_str(&format!("host={h}\n"));
        }
        if let Some(s) = self.started {
            out.push_str(&format!("started={s}\n"));
        }
        if let Some(c) = &self.command {
            out.push_str(&format!("command={}\n", c.replace('\n', " ")));
        }
        out
    }

    fn parse(text: &str) -> Self {
        let mut h = Holder::default();
        for line in text.lines() {
            match line.split_once('=') {
                Some(("pid", v)) => h.pid = v.trim().parse().ok(),
                Some(("host", v)) => h.host = Some(v.trim().to_owned()),
                Some(("started", v)) => h.started = v.trim().parse().ok(),
                Some(("command", v)) => h.command = Some(v.trim().to_owned()),
                _ => {}
            }
        }
        h
    }

    /// ` (kill PID)`, with the host when it is not this one.
    fn stop_hint(&self) -> String {
        match (self.pid, &self.host) {
            (Some(p), Some(h)) if *h != hostname() => format!(" (kill {p} on {h})"),
            (Some(p), _) => format!(" (kill {p})"),
            _ => String::new(),
        }
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.pid.is_none() && self.host.is_none() {
            return f.write_str("it has not written who it is yet");
        }
        let mut parts = Vec::new();
        if let Some(p) = self.pid {
            parts.push(format!("pid {p}"));
        }
        if let Some(h) = &self.host {
            parts.push(format!("on {h}"));
        }
        if let Some(s) = self.started {
            parts.push(format!("started {}", utc(s)));
        }
        if let Some(c) = &self.command {
            parts.push(format!("running `{c}`"));
        }
        f.write_str(&parts.join(", "))
    }
}

/// Take the exclusive lock on `dir/name` (creating `dir` and the file),
/// without waiting. `None` only where the filesystem cannot lock and
/// `unlockable` says to go on.
pub fn lock(dir: &Path, name: &str, unlockable: Unlockable) -> Result<Option<DirLock>, LockError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir, "create directory"))?;
    let path = dir.join(name);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io_err(&path, "open"))?;
    // SAFETY: flock on a descriptor this function owns.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let cause = std::io::Error::last_os_error();
        return match classify(&cause) {
            Refusal::Held => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                Err(LockError::Held {
                    dir: dir.to_path_buf(),
                    holder: Holder::parse(&text),
                })
            }
            Refusal::Unsupported if unlockable == Unlockable::Proceed => Ok(None),
            Refusal::Unsupported => Err(LockError::Unsupported {
                path,
                dir: dir.to_path_buf(),
                cause,
            }),
            Refusal::Other => Err(io_err(&path, "lock")(cause).into()),
        };
    }
    let me = Holder::of_this_process().to_text();
    file.set_len(0)
        .and_then(|()| file.seek(SeekFrom::Start(0)).map(drop))
        .and_then(|()| file.write_all(me.as_bytes()))
        .map_err(io_err(&path, "write"))?;
    Ok(Some(DirLock { _file: file, path }))
}

#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    Held,
    Unsupported,
    Other,
}

/// What a failed `flock` means.
fn classify(e: &std::io::Error) -> Refusal {
    match e.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Refusal::Held,
        // NFS without a lock manager answers ENOLCK; FUSE and some others
        // answer that the operation is not supported.
        Some(libc::ENOLCK) | Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Refusal::Unsupported,
        _ => Refusal::Other,
    }
}

/// `2026-12-06 21:03:12 UTC` for Unix seconds `secs` (the civil-from-days
/// algorithm of Howard Hinnant's `chrono`-compatible date library).
fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("falcon-lock-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_second_writer_is_refused_with_its_holder_until_the_first_lets_go() {
        let d = tmp("second");
        let first = lock(&d, "falcon.lock", Unlockable::Refuse)
            .unwrap()
            .unwrap();
        // flock locks belong to an open file description: a second open in
        // this process is refused just as another process would be.
        match lock(&d, "falcon.lock", Unlockable::Proceed) {
            Err(LockError::Held { holder, .. }) => {
                assert_eq!(holder.pid, Some(std::process::id()));
                assert!(holder.started.is_some() && holder.command.is_some());
                let text = LockError::Held {
                    dir: d.clone(),
                    holder,
                }
                .to_string();
                assert!(
                    text.contains(&format!("pid {}", std::process::id()))
                        && text.contains(" UTC")
                        && text.contains("--resume"),
                    "{text}"
                );
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        drop(first);
        let again = lock(&d, "falcon.lock", Unlockable::Refuse).unwrap();
        assert!(again.is_some(), "released with its holder");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn filesystems_that_cannot_lock_are_told_apart() {
        use std::io::Error;
        assert_eq!(
            classify(&Error::from_raw_os_error(libc::EWOULDBLOCK)),
            Refusal::Held
        );
        for e in [libc::ENOLCK, libc::EOPNOTSUPP, libc::ENOSYS] {
            assert_eq!(classify(&Error::from_raw_os_error(e)), Refusal::Unsupported);
        }
        assert_eq!(
            classify(&Error::from_raw_os_error(libc::EBADF)),
            Refusal::Other
        );
        let text = LockError::Unsupported {
            path: "runs/x/falcon.lock".into(),
            dir: "runs/x".into(),
            cause: Error::from_raw_os_error(libc::ENOLCK),
        }
        .to_string();
        assert!(
            text.contains("--allow-unlocked") && text.contains("runs/x"),
            "{text}"
        );
    }

    #[test]
    fn holders_read_back_and_dates_are_utc() {
        let h = Holder {
            pid: Some(42),
            host: Some("node7".into()),
            started: Some(1_796_591_000),
            command: Some("falcon train --config a.toml".into()),
        };
        assert_eq!(Holder::parse(&h.to_text()), h);
        assert_eq!(Holder::parse(""), Holder::default());
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_796_591_000), "2026-12-06 21:03:20 UTC");
    }
}
