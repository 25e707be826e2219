//! File helpers at the bottom of the crate: crash-safe writes, shared by
//! every module that persists something a user relies on (exports,
//! converted models, task files, checkpoints): write a temp file beside the
//! target, fsync, rename over it, fsync the directory, so readers see the
//! old file or the whole new one, never a torn one; and [`IoError`], the one
//! shape of a failed file operation (`PATH: cannot ACTION: REASON`).
//! Also the failpoints every durable write passes ([`failpoint`]), how to
//! tell a full disk from other failures ([`is_disk_full`]), and the
//! advisory lock that keeps a second writer out of a directory ([`lock`]).

pub mod failpoint;
pub mod lock;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// A failed file operation: which file, what was being done, and the OS's
/// reason. The reason is part of the message and deliberately not a
/// `source()`, so a report that prints the chain does not say it twice.
#[derive(Debug, thiserror::Error)]
#[error("{}: cannot {action}: {cause}", path.display())]
pub struct IoError {
    pub path: PathBuf,
    pub action: &'static str,
    pub cause: std::io::Error,
}

/// A failed atomic write.
pub type WriteError = IoError;

/// `map_err(io_err(path, "read"))`: the OS error of `action` on `path`.
pub fn io_err<'a>(
    path: &'a Path,
    action: &'static str,
) -> impl FnOnce(std::io::Error) -> IoError + 'a {
    move |cause| IoError {
        path: path.to_path_buf(),
        action,
        cause,
    }
}

fn err<'a>(path: &'a Path, action: &'static str) -> impl FnOnce(std::io::Error) -> WriteError + 'a {
    io_err(path, action)
}

/// This machine's host name (`localhost` when it has none): who holds a
/// lock, and the name of a TensorBoard event file.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// The directory `path` is in (`.` for a bare name) and its file name: where
/// the temp files, lock files and moved-aside copies that belong to it go.
pub fn parent_and_name(path: &Path) -> (&Path, String) {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    (dir, name)
}

/// Stream the contents of `path` through `body`, atomically. `body` gets the
/// buffered temp file and its path (for its own error messages).
pub fn write_atomic_with<T, E: From<WriteError>>(
    path: &Path,
    body: impl FnOnce(&mut BufWriter<File>, &Path) -> Result<T, E>,
) -> Result<T, E> {
    let (dir, name) = parent_and_name(path);
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        failpoint::check("write", &tmp).map_err(err(&tmp, "write"))?;
        let file = File::create(&tmp).map_err(err(&tmp, "create"))?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        let value = body(&mut w, &tmp)?;
        let file = w
            .into_inner()
            .map_err(|e| err(&tmp, "write")(e.into_error()))?;
        file.sync_all().map_err(err(&tmp, "fsync"))?;
        failpoint::check("rename", path).map_err(err(path, "rename into place"))?;
        std::fs::rename(&tmp, path).map_err(err(path, "rename into place"))?;
        Ok(value)
    })();
    if result.is_err() {
        // The error being returned matters more than a leftover temp file.
        let _ = std::fs::remove_file(&tmp);
    } else if let Ok(d) = File::open(dir) {
        // Persist the rename itself; not every filesystem can fsync a directory.
        let _ = d.sync_all();
    }
    result
}

/// Write `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    write_atomic_with(path, |w, tmp| w.write_all(bytes).map_err(err(tmp, "write")))
}

/// Build directory `out` by filling a fresh temp sibling with `fill`, then
/// renaming it into place, so a crash never leaves a half-written directory
/// that a later run would trust. An existing `out` is replaced only with
/// `overwrite` (and then only after the new one is complete).
pub fn publish_dir<E: From<WriteError>>(
    out: &Path,
    overwrite: bool,
    fill: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<(), E> {
    if out.exists() && !overwrite {
        return Err(IoError {
            path: out.to_path_buf(),
            action: "replace it without --overwrite",
            cause: std::io::ErrorKind::AlreadyExists.into(),
        }
        .into());
    }
    let (parent, name) = parent_and_name(out);
    std::fs::create_dir_all(parent).map_err(err(parent, "create directory"))?;
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(err(&tmp, "create directory"))?;
    if let Err(e) = fill(&tmp) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let old = parent.join(format!(".{name}.old-{}", std::process::id()));
    let placed = (|| {
        if out.exists() {
            failpoint::check("move aside", out)
                .map_err(err(out, "move the old directory aside"))?;
            std::fs::rename(out, &old).map_err(err(out, "move the old directory aside"))?;
        }
        failpoint::check("rename", out).map_err(err(out, "rename into place"))?;
        std::fs::rename(&tmp, out).map_err(err(out, "rename into place"))
    })();
    if let Err(e) = placed {
        // Put back what was moved aside; the new copy goes, as on any error.
        if old.exists() && !out.exists() {
            let _ = std::fs::rename(&old, out);
        }
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e.into());
    }
    let _ = std::fs::remove_dir_all(&old);
    if let Ok(d) = File::open(parent) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Whether `e` (or one of its causes) is a full disk or an exhausted quota:
/// `ENOSPC` / `EDQUOT` from the OS, or SQLite's "database or disk is full".
pub fn is_disk_full(e: &(dyn std::error::Error + 'static)) -> bool {
    let full = |c: &std::io::Error| {
        matches!(c.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
            || c.kind() == std::io::ErrorKind::StorageFull
            || c.kind() == std::io::ErrorKind::QuotaExceeded
    };
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<IoError>() {
            if full(&io.cause) {
                return true;
            }
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if full(io) {
                return true;
            }
        }
        // Errors that keep their cause as text (SQLite's, or ours that
        // format one into a message) still say so in words.
        let text = c.to_string();
        if [
            "No space left on device",
            "Disk quota exceeded",
            "database or disk is full",
        ]
        .iter()
        .any(|w| text.contains(w))
        {
            return true;
        }
        cur = c.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_told_from_other_failures() {
        let full = IoError {
            path: "x".into(),
            action: "write",
            cause: std::io::Error::from_raw_os_error(libc::ENOSPC),
        };
        assert!(is_disk_full(&full));
        let denied = IoError {
            path: "x".into(),
            action: "write",
            cause: std::io::ErrorKind::PermissionDenied.into(),
        };
        assert!(!is_disk_full(&denied));
        let sqlite = std::io::Error::other("insert: database or disk is full");
        assert!(is_disk_full(&sqlite));
    }

    #[test]
    fn replaces_whole_file_and_leaves_no_temp_on_error() {
        let d = std::env::temp_dir().join(format!("falcon-fsutil-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("a.txt");
        write_atomic(&f, b"old").unwrap();
        write_atomic(&f, b"new contents").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"new contents");
        let r: Result<(), WriteError> = write_atomic_with(&f, |w, tmp| {
            w.write_all(b"partial").map_err(err(tmp, "write"))?;
            Err(err(tmp, "write")(std::io::Error::other("boom")))
        });
        assert!(r.is_err());
        assert_eq!(
            std::fs::read(&f).unwrap(),
            b"new contents",
            "old file intact"
        );
        let left: Vec<_> = std::fs::read_dir(&d).unwrap().flatten().collect();
        assert_eq!(left.len(), 1, "no temp file left behind");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
