//! Checkpoints of a run: `runs/<name>/step-N/` directories published
//! atomically (filled in a temp sibling, every file fsynced, then renamed),
//! each with a manifest of its files' sizes and CRC32C checksums; finding the
//! newest checkpoint that verifies (a damaged one is skipped with a warning
//! and the previous one is used); and the keep-last-N retention policy.
//!
//! What goes in a checkpoint is the trainer's business: it passes a `fill`
//! closure that writes files into the directory. This module only makes the
//! directory appear whole or not at all, and checks it on the way back.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::metrics::crc32c_append;
use crate::fsutil::{self, WriteError};

pub use crate::run_dir::checkpoint::MANIFEST;
pub use crate::run_dir::step_dir;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error("{path}: {reason}")]
    Bad { path: PathBuf, reason: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn bad(path: &Path, reason: impl Into<String>) -> CheckpointError {
    CheckpointError::Bad {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// One file of a checkpoint as the manifest records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub bytes: u64,
    pub crc32c: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Manifest {
    format: u32,
    step: u64,
    files: BTreeMap<String, FileEntry>,
}

fn checksum(path: &Path) -> Result<FileEntry, CheckpointError> {
    let io = |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut buf = vec![0u8; 1 << 20];
    let (mut bytes, mut crc) = (0u64, 0u32);
    loop {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        bytes += n as u64;
        crc = crc32c_append(crc, &buf[..n]);
    }
    Ok(FileEntry { bytes, crc32c: crc })
}

/// Write checkpoint `step` of the run: `fill` writes the files into a temp
/// directory (use atomic writes or fsync them), then the manifest is written
/// and the directory renamed into place. An existing `step-N` is replaced
/// only once the new one is complete.
pub fn write<E>(
    run_dir: &Path,
    step: u64,
    fill: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<PathBuf, E>
where
    E: From<CheckpointError> + From<WriteError>,
{
    let out = step_dir(run_dir, step);
    fsutil::publish_dir(&out, true, |tmp| -> Result<(), E> {
        fill(tmp)?;
        let mut files = BTreeMap::new();
        let mut names: Vec<_> = std::fs::read_dir(tmp)
            .map_err(|source| CheckpointError::Io {
                path: tmp.to_path_buf(),
                source,
            })?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for name in names {
            let p = tmp.join(&name);
            if name == MANIFEST || !p.is_file() {
                continue;
            }
            files.insert(name, checksum(&p)?);
        }
        let m = Manifest {
            format: 1,
            step,
            files,
        };
        let text = serde_json::to_vec_pretty(&m).expect("manifest serialises");
        fsutil::write_atomic(&tmp.join(MANIFEST), &text)?;
        Ok(())
    })?;
    Ok(out)
}

/// Check a checkpoint directory against its manifest: every listed file
/// present with the recorded size and checksum.
pub fn verify(dir: &Path) -> Result<u64, CheckpointError> {
    if !dir.is_dir() {
        return Err(bad(
            dir,
            "no checkpoint here: the directory does not exist (a `falcon train` or `falcon sft` \
             run writes runs/NAME/step-N; list the run directory to see its steps)",
        ));
    }
    let mpath = dir.join(MANIFEST);
    if !mpath.is_file() {
        let steps = list(dir).unwrap_or_default();
        return Err(bad(
            dir,
            match steps.last() {
                Some(last) => format!(
                    "a run directory, not a checkpoint: give one of its step-N directories, \
                     e.g. {}",
                    step_dir(dir, *last).display()
                ),
                None => format!(
                    "not a checkpoint: it has no {MANIFEST} (an interrupted write leaves none; \
                     use an earlier step-N)"
                ),
            },
        ));
    }
    let text = std::fs::read(&mpath).map_err(|source| CheckpointError::Io {
        path: mpath.clone(),
        source,
    })?;
    let m: Manifest = serde_json::from_slice(&text)
        .map_err(|e| bad(&mpath, format!("unreadable manifest: {e}")))?;
    if m.format != 1 {
        return Err(bad(
            &mpath,
            format!("manifest format {} is not supported", m.format),
        ));
    }
    for (name, want) in &m.files {
        let got = checksum(&dir.join(name))?;
        if &got != want {
            return Err(bad(
                &dir.join(name),
                format!(
                    "does not match the manifest ({} bytes, crc {:08x}; expected {} bytes, crc {:08x})",
                    got.bytes, got.crc32c, want.bytes, want.crc32c
                ),
            ));
        }
    }
    Ok(m.step)
}

/// Clear what interrupted writes left behind: temp files and directories of
/// atomic writes (`.NAME.tmp-PID`) in the run directory and its `eval/` and
/// `tb/`, and checkpoints moved aside for a replacement (`.step-N.old-PID`),
/// which go back into place when the replacement never arrived. Only for
/// the process that holds the run's lock: a live writer's temp files look
/// the same. Returns what was removed or put back.
pub fn remove_leftovers(run_dir: &Path) -> Vec<PathBuf> {
    let mut gone = Vec::new();
    let dirs = [
        run_dir.to_path_buf(),
        run_dir.join(crate::run_dir::EVAL),
        run_dir.join(crate::run_dir::TENSORBOARD),
    ];
    for dir in dirs {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(inner) = name.strip_prefix('.') else {
                continue;
            };
            let path = e.path();
            if let Some((target, _)) = inner.rsplit_once(".old-") {
                let back = dir.join(target);
                if crate::run_dir::parse_step_dir(target).is_some() && !back.exists() {
                    if std::fs::rename(&path, &back).is_ok() {
                        gone.push(path);
                    }
                    continue;
                }
            } else if !inner.contains(".tmp-") {
                continue;
            }
            let removed = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            if removed.is_ok() {
                gone.push(path);
            }
        }
    }
    gone
}

/// The steps of every `step-N` directory in `run_dir`, ascending. Temp
/// directories of interrupted writes never count.
pub fn list(run_dir: &Path) -> Result<Vec<u64>, CheckpointError> {
    let rd = match std::fs::read_dir(run_dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(CheckpointError::Io {
                path: run_dir.to_path_buf(),
                source,
            })
        }
    };
    let mut steps = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(n) = crate::run_dir::parse_step_dir(&name) {
            if e.path().is_dir() {
                steps.push(n);
            }
        }
    }
    steps.sort_unstable();
    Ok(steps)
}

/// The newest checkpoint that verifies, with a warning (via `warn`) for each
/// newer one that does not. `None` when there is none.
pub fn latest_valid(
    run_dir: &Path,
    mut warn: impl FnMut(String),
) -> Result<Option<(u64, PathBuf)>, CheckpointError> {
    for step in list(run_dir)?.into_iter().rev() {
        let dir = step_dir(run_dir, step);
        match verify(&dir) {
            Ok(s) if s == step => return Ok(Some((step, dir))),
            Ok(s) => warn(format!(
                "{}: manifest says step {s}; ignoring this checkpoint",
                dir.display()
            )),
            Err(e) => warn(format!("ignoring damaged checkpoint: {e}")),
        }
    }
    Ok(None)
}

/// Which steps keep-last-`keep` deletes: all but the newest `keep`
/// (`keep == 0` keeps everything). Pure, so the policy is tested on its own.
pub fn to_delete(steps: &[u64], keep: usize) -> Vec<u64> {
    if keep == 0 {
        return Vec::new();
    }
    let mut s = steps.to_vec();
    s.sort_unstable();
    s.dedup();
    let n = s.len().saturating_sub(keep);
    s.truncate(n);
    s
}

/// Apply keep-last-`keep` to `run_dir`; returns the steps removed. The
/// newest checkpoint is never removed.
pub fn apply_retention(run_dir: &Path, keep: usize) -> Result<Vec<u64>, CheckpointError> {
    let doomed = to_delete(&list(run_dir)?, keep);
    for &s in &doomed {
        let d = step_dir(run_dir, s);
        std::fs::remove_dir_all(&d).map_err(|source| CheckpointError::Io { path: d, source })?;
    }
    Ok(doomed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::time::Duration;

    fn fill_with(step: u64) -> impl FnOnce(&Path) -> Result<(), CheckpointError> {
        move |d: &Path| {
            // A payload big enough that a kill often lands mid-write.
            let body: Vec<u8> = (0..300_000u32)
                .flat_map(|i| (i as u64 * step).to_le_bytes())
                .collect();
            fsutil::write_atomic(&d.join("weights.bin"), &body)?;
            fsutil::write_atomic(
                &d.join("state.json"),
                format!("{{\"step\": {step}}}").as_bytes(),
            )?;
            Ok(())
        }
    }

    #[test]
    fn retention_keeps_the_newest() {
        assert_eq!(to_delete(&[1, 2, 3, 4, 5], 2), vec![1, 2, 3]);
        assert_eq!(to_delete(&[5, 1, 3], 3), Vec::<u64>::new());
        assert_eq!(to_delete(&[5, 1, 3], 0), Vec::<u64>::new(), "0 keeps all");
        assert_eq!(to_delete(&[9, 2, 2, 7], 1), vec![2, 7]);
        let dir = tempfile::tempdir().unwrap();
        for s in [10, 20, 30] {
            write(dir.path(), s, fill_with(s)).unwrap();
        }
        assert_eq!(apply_retention(dir.path(), 2).unwrap(), vec![10]);
        assert_eq!(list(dir.path()).unwrap(), vec![20, 30]);
    }

    #[test]
    fn damaged_newest_falls_back_to_the_previous_one() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), 1, fill_with(1)).unwrap();
        write(dir.path(), 2, fill_with(2)).unwrap();
        // Flip a byte of the newest checkpoint's weights.
        let w = step_dir(dir.path(), 2).join("weights.bin");
        let mut b = std::fs::read(&w).unwrap();
        b[1000] ^= 1;
        std::fs::write(&w, b).unwrap();
        // And leave a stale temp directory as a killed writer would.
        std::fs::create_dir_all(dir.path().join(".step-3.tmp-999")).unwrap();
        let mut warnings = Vec::new();
        let (s, d) = latest_valid(dir.path(), |w| warnings.push(w))
            .unwrap()
            .unwrap();
        assert_eq!((s, d), (1, step_dir(dir.path(), 1)));
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].contains("weights.bin") && warnings[0].contains("manifest"),
            "{warnings:?}"
        );
        assert_eq!(
            list(dir.path()).unwrap(),
            vec![1, 2],
            "temp dirs never count"
        );
        assert_eq!(
            remove_leftovers(dir.path()),
            vec![dir.path().join(".step-3.tmp-999")]
        );
        // A killed atomic write's temp files go; a checkpoint moved aside for
        // a replacement that never arrived comes back.
        let eval = dir.path().join(crate::run_dir::EVAL);
        std::fs::create_dir_all(&eval).unwrap();
        std::fs::write(eval.join(".step-2.json.tmp-77"), "{").unwrap();
        std::fs::write(dir.path().join(".metrics.jsonl.tmp-77"), "").unwrap();
        std::fs::rename(step_dir(dir.path(), 2), dir.path().join(".step-2.old-77")).unwrap();
        let mut gone = remove_leftovers(dir.path());
        gone.sort();
        assert_eq!(gone.len(), 3, "{gone:?}");
        assert_eq!(list(dir.path()).unwrap(), vec![1, 2], "step-2 is back");
        assert!(std::fs::read_dir(&eval).unwrap().next().is_none());
        assert!(!dir.path().join(".metrics.jsonl.tmp-77").exists());
        // A missing manifest is damage too.
        std::fs::remove_file(step_dir(dir.path(), 1).join(MANIFEST)).unwrap();
        assert!(latest_valid(dir.path(), |_| {}).unwrap().is_none());
        assert!(latest_valid(&dir.path().join("nothing"), |_| {})
            .unwrap()
            .is_none());
    }

    const CHILD_ENV: &str = "FALCON_CKPT_SIGKILL_CHILD";

    #[test]
    fn sigkill_never_leaves_a_checkpoint_that_loads_but_is_wrong() {
        if let Ok(dir) = std::env::var(CHILD_ENV) {
            // Child: write checkpoints forever (the parent kills it).
            for step in 1.. {
                write(Path::new(&dir), step, fill_with(step)).unwrap();
                println!("WROTE {step}");
                if step > 10_000 {
                    break;
                }
            }
            return;
        }
        let module = module_path!().split_once("::").unwrap().1;
        let name = format!("{module}::sigkill_never_leaves_a_checkpoint_that_loads_but_is_wrong");
        for (round, delay_ms) in [0u64, 3, 11, 29].into_iter().enumerate() {
            let dir = tempfile::tempdir().unwrap();
            let mut child = Command::new(std::env::current_exe().unwrap())
                .args(["--exact", &name, "--nocapture", "--test-threads=1"])
                .env(CHILD_ENV, dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            // Wait for at least one whole checkpoint, then kill at some moment.
            let t0 = std::time::Instant::now();
            while list(dir.path()).unwrap().is_empty() {
                assert!(
                    t0.elapsed() < Duration::from_secs(60),
                    "round {round}: nothing written"
                );
                std::thread::sleep(Duration::from_millis(2));
            }
            std::thread::sleep(Duration::from_millis(delay_ms));
            child.kill().unwrap();
            child.wait().unwrap();
            let (step, d) = latest_valid(dir.path(), |w| panic!("round {round}: {w}"))
                .unwrap()
                .expect("a checkpoint");
            let state = std::fs::read_to_string(d.join("state.json")).unwrap();
            assert_eq!(state, format!("{{\"step\": {step}}}"), "round {round}");
            let w = std::fs::read(d.join("weights.bin")).unwrap();
            assert_eq!(w.len(), 300_000 * 8);
            assert_eq!(u64::from_le_bytes(w[8..16].try_into().unwrap()), step);
        }
    }
}
