//! Where a run's numbers go: TensorBoard event files (`EventWriter`, read back
//! by `read_events`, cut back on resume by `keep_events`) and the durable
//! `metrics.jsonl` (`JsonlWriter`, `keep_before_step`).
//!
//! Event files follow TensorFlow's TFRecord framing (`tensorflow/core/lib/io/
//! record_writer.cc`): `u64` little-endian length, masked CRC32C of those 8
//! bytes, the payload, masked CRC32C of the payload. Each payload is a
//! `tensorflow.Event` protobuf (`tensorflow/core/util/event.proto`); the few
//! fields we need are encoded by hand, so no protobuf crate is linked.
//!
//! `metrics.jsonl` is the record of truth (one JSON object per line, fsynced per
//! write); the event file is a view for TensorBoard and is only flushed to the
//! OS, never fsynced.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::fsutil::failpoint::{self, Fault};
use crate::fsutil::{io_err, IoError};

/// Errors from writing or reading metrics files. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// A file operation failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// An event record failed its CRC or did not decode. `offset` is the byte
    /// where the record starts.
    #[error("{path}: corrupt event record at byte {offset}: {detail}")]
    CorruptEvent {
        path: PathBuf,
        offset: u64,
        detail: String,
    },
    /// A line of a JSONL file could not be used (1-based `line`).
    #[error("{path}:{line}: {detail}")]
    BadLine {
        path: PathBuf,
        line: usize,
        detail: String,
    },
    /// A record handed to [`JsonlWriter::write`] is not a JSON object.
    #[error("{path}: cannot append record: {detail}")]
    BadRecord { path: PathBuf, detail: String },
}

/// Results of this module.
pub type Result<T, E = MetricsError> = std::result::Result<T, E>;

// ---------------------------------------------------------------------------
// CRC32C (Castagnoli), as TFRecord uses it.

const CRC32C_TABLE: [u32; 256] = {
    // Reflected form of the Castagnoli polynomial 0x1EDC6F41.
    const POLY: u32 = 0x82F6_3B78;
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// CRC32C (Castagnoli) of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// Continue a CRC32C: `crc32c_append(crc32c(a), b) == crc32c(a ++ b)`, so
/// large files are checksummed in chunks.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    let mut crc = !crc;
    for &b in data {
        crc = CRC32C_TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// The masked CRC32C that TFRecord stores. TensorFlow masks because a CRC of
/// data that itself embeds CRCs is weak; the constant is theirs.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    crc32c(data).rotate_right(15).wrapping_add(0xa282_ead8)
}

// ---------------------------------------------------------------------------
// Protobuf wire format, only as much as `tensorflow.Event` needs.

const WIRE_VARINT: u8 = 0;
const WIRE_FIXED64: u8 = 1;
const WIRE_LEN: u8 = 2;
const WIRE_FIXED32: u8 = 5;

fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn put_key(buf: &mut Vec<u8>, field: u32, wire: u8) {
    put_varint(buf, (u64::from(field) << 3) | u64::from(wire));
}

fn put_len(buf: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(buf, field, WIRE_LEN);
    put_varint(buf, bytes.len() as u64);
    buf.extend_from_slice(bytes);
}

/// `Event { wall_time = 1; step = 2; file_version = 3 | summary = 5 }`.
fn encode_event(wall_time: f64, step: i64, what: EventBody<'_>) -> Vec<u8> {
    let mut buf = Vec::with_capacity(64);
    put_key(&mut buf, 1, WIRE_FIXED64);
    buf.extend_from_slice(&wall_time.to_le_bytes());
    put_key(&mut buf, 2, WIRE_VARINT);
    // int64 is a plain two's-complement varint (not zigzag): negatives take 10 bytes.
    put_varint(&mut buf, step as u64);
    match what {
        EventBody::FileVersion(v) => put_len(&mut buf, 3, v.as_bytes()),
        EventBody::Scalars(values) => {
            // Summary { repeated Value value = 1 }, Value { tag = 1; simple_value = 2 }.
            let mut summary = Vec::with_capacity(values.len() * 24);
            let mut value = Vec::with_capacity(32);
            for (tag, v) in values {
                value.clear();
                put_len(&mut value, 1, tag.as_bytes());
                // simple_value sits in a oneof, so 0.0 must still be written to be seen.
                put_key(&mut value, 2, WIRE_FIXED32);
                value.extend_from_slice(&v.to_le_bytes());
                put_len(&mut summary, 1, &value);
            }
            put_len(&mut buf, 5, &summary);
        }
    }
    buf
}

enum EventBody<'a> {
    FileVersion(&'a str),
    Scalars(&'a [(&'a str, f32)]),
}

/// A cursor over one protobuf message. Errors are short descriptions; the
/// caller adds the file and offset.
struct Pb<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Pb<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                format!(
                    "field runs past the end of its message at byte {}",
                    self.pos
                )
            })?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.take(1)?[0];
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!("varint longer than 10 bytes at byte {}", self.pos))
    }

    /// The next `(field number, wire type)`, or `None` at the end.
    fn key(&mut self) -> Result<Option<(u64, u8)>, String> {
        if self.pos == self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        Ok(Some((key >> 3, (key & 7) as u8)))
    }

    fn fixed64(&mut self) -> Result<[u8; 8], String> {
        Ok(self.take(8)?.try_into().expect("took 8 bytes"))
    }

    fn fixed32(&mut self) -> Result<[u8; 4], String> {
        Ok(self.take(4)?.try_into().expect("took 4 bytes"))
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.varint()?;
        let n = usize::try_from(n).map_err(|_| format!("length {n} too large"))?;
        self.take(n)
    }

    fn string(&mut self) -> Result<String, String> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| "string field is not UTF-8".to_owned())
    }

    fn skip(&mut self, wire: u8) -> Result<(), String> {
        match wire {
            WIRE_VARINT => self.varint().map(drop),
            WIRE_FIXED64 => self.take(8).map(drop),
            WIRE_LEN => self.bytes().map(drop),
            WIRE_FIXED32 => self.take(4).map(drop),
            // Groups (3, 4) are proto2-only and absent from event.proto.
            w => Err(format!("unsupported wire type {w} at byte {}", self.pos)),
        }
    }
}

fn decode_event(data: &[u8]) -> Result<Event, String> {
    let mut ev = Event::default();
    let mut pb = Pb::new(data);
    while let Some((field, wire)) = pb.key()? {
        // A known field number with an unexpected wire type is treated as unknown.
        match (field, wire) {
            (1, WIRE_FIXED64) => ev.wall_time = f64::from_le_bytes(pb.fixed64()?),
            (2, WIRE_VARINT) => ev.step = pb.varint()? as i64,
            (3, WIRE_LEN) => ev.file_version = Some(pb.string()?),
            (5, WIRE_LEN) => decode_summary(pb.bytes()?, &mut ev.scalars)?,
            (_, w) => pb.skip(w)?,
        }
    }
    Ok(ev)
}

fn decode_summary(data: &[u8], out: &mut Vec<(String, f32)>) -> Result<(), String> {
    let mut pb = Pb::new(data);
    while let Some((field, wire)) = pb.key()? {
        if (field, wire) != (1, WIRE_LEN) {
            pb.skip(wire)?;
            continue;
        }
        let mut value = Pb::new(pb.bytes()?);
        let (mut tag, mut simple) = (String::new(), None);
        while let Some((field, wire)) = value.key()? {
            match (field, wire) {
                (1, WIRE_LEN) => tag = value.string()?,
                (2, WIRE_FIXED32) => simple = Some(f32::from_le_bytes(value.fixed32()?)),
                (_, w) => value.skip(w)?,
            }
        }
        // Images, histograms and tensors carry no simple_value; they are not scalars.
        if let Some(v) = simple {
            out.push((tag, v));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Event files.

/// The `file_version` TensorBoard expects in the first record.
pub const FILE_VERSION: &str = "brain.Event:2";

/// Appends scalar summaries to a new TensorBoard event file.
///
/// Writes are buffered; [`flush`](Self::flush) hands them to the OS, and drop
/// flushes too (ignoring errors: call `flush` to see them). NaN and infinities
/// are written as they are. After a resume from an earlier step, keep writing
/// into a new `EventWriter`: TensorBoard drops the older file's points past the
/// step where the new one restarts.
pub struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
    last_wall_time: f64,
}

impl EventWriter {
    /// Create `dir` if needed and start
    /// `events.out.tfevents.<unix_secs>.<hostname>.falcon` in it, with the
    /// `file_version` record first. A name already taken (two writers in one
    /// second) gets a `.1`, `.2`, ... suffix instead of being overwritten.
    pub fn create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io_err(dir, "create directory"))?;
        let now = wall_time_now();
        let base = format!("events.out.tfevents.{}.{}.falcon", now as u64, hostname());
        let mut suffix = 0u32;
        let (path, file) = loop {
            let name = match suffix {
                0 => base.clone(),
                n => format!("{base}.{n}"),
            };
            let path = dir.join(name);
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(f) => break (path, f),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => suffix += 1,
                Err(e) => return Err(io_err(&path, "create")(e).into()),
            }
        };
        let mut w = Self {
            path,
            out: BufWriter::new(file),
            last_wall_time: now,
        };
        w.write_record(&encode_event(now, 0, EventBody::FileVersion(FILE_VERSION)))?;
        w.flush()?;
        Ok(w)
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Record one scalar `value` under `tag` at `step`.
    pub fn scalar(&mut self, tag: &str, value: f32, step: i64) -> Result<()> {
        self.scalars(step, &[(tag, value)])
    }

    /// Record several scalars at `step` as one event. An empty slice writes nothing.
    pub fn scalars(&mut self, step: i64, values: &[(&str, f32)]) -> Result<()> {
        if values.is_empty() {
            return Ok(());
        }
        // A clock stepped back (NTP) would make TensorBoard's relative-time axis
        // run backwards; hold the last time instead.
        let t = wall_time_now().max(self.last_wall_time);
        self.last_wall_time = t;
        self.write_record(&encode_event(t, step, EventBody::Scalars(values)))
    }

    /// Push buffered records to the OS (no fsync: see the module header).
    pub fn flush(&mut self) -> Result<()> {
        failpoint::check("flush events", &self.path).map_err(io_err(&self.path, "flush"))?;
        Ok(self.out.flush().map_err(io_err(&self.path, "flush"))?)
    }

    fn write_record(&mut self, data: &[u8]) -> Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        let mut rec = Vec::with_capacity(data.len() + 16);
        rec.extend_from_slice(&len);
        rec.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
        rec.extend_from_slice(data);
        rec.extend_from_slice(&masked_crc32c(data).to_le_bytes());
        self.out
            .write_all(&rec)
            .map_err(io_err(&self.path, "write"))?;
        Ok(())
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        let _ = self.out.flush();
    }
}

fn wall_time_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The host name for the file name, reduced to characters safe in one.
fn hostname() -> String {
    crate::fsutil::hostname()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// One decoded `tensorflow.Event`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Event {
    /// Seconds since the Unix epoch.
    pub wall_time: f64,
    pub step: i64,
    /// Set on the file's first record.
    pub file_version: Option<String>,
    /// `(tag, simple_value)` in file order; summary values of other kinds are skipped.
    pub scalars: Vec<(String, f32)>,
}

impl Event {
    /// The first scalar recorded under `tag` in this event.
    pub fn scalar(&self, tag: &str) -> Option<f32> {
        self.scalars.iter().find(|(t, _)| t == tag).map(|&(_, v)| v)
    }
}

/// What [`read_events`] found in one event file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventFile {
    /// Every complete, CRC-checked record, in file order.
    pub events: Vec<Event>,
    /// The byte offset where an incomplete last record starts, if the file
    /// ends inside one (what a killed writer leaves). `None` for a whole file.
    pub truncated_at: Option<u64>,
}

/// Read and verify every record of the event file at `path`.
///
/// Both CRCs of every record are checked; a mismatch, or a record that does not
/// decode, is [`MetricsError::CorruptEvent`] with the record's byte offset. A
/// file that ends inside its last record is not an error: the complete records
/// come back with [`EventFile::truncated_at`] set. The whole file is read into
/// memory (event files hold a few hundred bytes per step).
pub fn read_events(path: &Path) -> Result<EventFile> {
    let bytes = std::fs::read(path).map_err(io_err(path, "read"))?;
    let scan = scan_records(&bytes);
    if let Some((offset, detail)) = scan.corrupt {
        return Err(MetricsError::CorruptEvent {
            path: path.to_path_buf(),
            offset: offset as u64,
            detail,
        });
    }
    Ok(EventFile {
        events: scan.records.into_iter().map(|(_, e)| e).collect(),
        truncated_at: scan.truncated_at.map(|o| o as u64),
    })
}

/// What [`scan_records`] found: every good record (its byte range and
/// event), up to a torn tail or the first corrupt record.
struct Scan {
    records: Vec<(std::ops::Range<usize>, Event)>,
    truncated_at: Option<usize>,
    corrupt: Option<(usize, String)>,
}

fn scan_records(bytes: &[u8]) -> Scan {
    let mut scan = Scan {
        records: Vec::new(),
        truncated_at: None,
        corrupt: None,
    };
    let mut pos = 0usize;
    while pos < bytes.len() {
        let rest = &bytes[pos..];
        if rest.len() < 12 {
            scan.truncated_at = Some(pos);
            break;
        }
        let len_bytes = &rest[..8];
        let stored = u32::from_le_bytes(rest[8..12].try_into().expect("4 bytes"));
        let computed = masked_crc32c(len_bytes);
        if stored != computed {
            scan.corrupt = Some((
                pos,
                format!("length CRC mismatch (stored {stored:#010x}, computed {computed:#010x})"),
            ));
            break;
        }
        // The length is CRC-checked, so one that overruns the file means a torn tail.
        let len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes"));
        if rest.len() < 16 || len > (rest.len() - 16) as u64 {
            scan.truncated_at = Some(pos);
            break;
        }
        let len = len as usize;
        let data = &rest[12..12 + len];
        let stored = u32::from_le_bytes(rest[12 + len..16 + len].try_into().expect("4 bytes"));
        let computed = masked_crc32c(data);
        if stored != computed {
            scan.corrupt = Some((
                pos,
                format!("data CRC mismatch (stored {stored:#010x}, computed {computed:#010x})"),
            ));
            break;
        }
        match decode_event(data) {
            Ok(event) => scan.records.push((pos..pos + 16 + len, event)),
            Err(e) => {
                scan.corrupt = Some((pos, format!("malformed Event protobuf: {e}")));
                break;
            }
        }
        pos += 16 + len;
    }
    scan
}

/// Rewrite every event file in `dir` (`events.out.tfevents.*`) keeping the
/// records `keep` accepts, for a run resumed from an earlier step: each
/// (tag, step) then appears once across the old files and the new
/// session's. A file's `file_version` record always stays. A torn tail
/// goes; so does everything from a corrupt record on (the file is a view;
/// `metrics.jsonl` is the record of truth). Returns how many records went.
pub fn keep_events(dir: &Path, keep: impl Fn(&Event) -> bool) -> Result<usize> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_err(dir, "list")(e).into()),
    };
    let mut paths: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("events.out.tfevents."))
        })
        .collect();
    paths.sort();
    let mut removed = 0;
    for path in paths {
        let bytes = std::fs::read(&path).map_err(io_err(&path, "read"))?;
        let scan = scan_records(&bytes);
        let kept: Vec<&std::ops::Range<usize>> = scan
            .records
            .iter()
            .filter(|(_, e)| e.file_version.is_some() || keep(e))
            .map(|(r, _)| r)
            .collect();
        let whole = scan.truncated_at.is_none() && scan.corrupt.is_none();
        if whole && kept.len() == scan.records.len() {
            continue;
        }
        removed += scan.records.len() - kept.len() + usize::from(!whole);
        crate::fsutil::write_atomic_with(&path, |w, tmp| {
            kept.iter()
                .try_for_each(|r| w.write_all(&bytes[(*r).clone()]))
                .map_err(io_err(tmp, "write"))
        })?;
    }
    Ok(removed)
}

// ---------------------------------------------------------------------------
// metrics.jsonl

/// Appends one JSON object per line to a JSONL file, durably.
///
/// Every [`write`](Self::write) is one `write` call of the whole line and its
/// newline, then `sync_data`: callers write once per step, and a metrics file
/// that survives a crash matters more than speed. Opening a file whose last
/// line has no newline (a write torn by a crash) cuts that partial line off so
/// that what follows stays valid JSONL; [`dropped_tail`](Self::dropped_tail)
/// says how many bytes went.
pub struct JsonlWriter {
    path: PathBuf,
    file: File,
    /// Length of the file after the last complete line, to undo a failed write.
    len: u64,
    dropped_tail: u64,
}

impl JsonlWriter {
    /// Open `path` for appending, creating it (and its parent directory) if
    /// needed, and repair a torn last line as described on the type.
    pub fn open(path: &Path) -> Result<Self> {
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(io_err(parent, "create directory"))?;
        let existed = path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(io_err(path, "open"))?;
        let old_len = file.metadata().map_err(io_err(path, "stat"))?.len();
        let len = complete_prefix_len(&mut file, old_len).map_err(io_err(path, "read"))?;
        if len != old_len {
            file.set_len(len)
                .map_err(io_err(path, "truncate torn line"))?;
            file.sync_data().map_err(io_err(path, "fsync"))?;
        }
        if !existed {
            // Make the new directory entry itself survive a crash.
            if let Ok(d) = File::open(parent) {
                let _ = d.sync_all();
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
            len,
            dropped_tail: old_len - len,
        })
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of a torn last line removed by [`open`](Self::open); 0 normally.
    pub fn dropped_tail(&self) -> u64 {
        self.dropped_tail
    }

    /// Append `record`, which must serialize to a JSON object, as one line and
    /// fsync it.
    pub fn write<T: serde::Serialize + ?Sized>(&mut self, record: &T) -> Result<()> {
        self.write_all(std::iter::once(record))
    }

    /// Append `records` (each a JSON object) as one write of their lines and
    /// one fsync: a step's samples land together or not at all.
    pub fn write_all<'r, T: serde::Serialize + ?Sized + 'r>(
        &mut self,
        records: impl IntoIterator<Item = &'r T>,
    ) -> Result<()> {
        let bad = |detail: String| MetricsError::BadRecord {
            path: self.path.clone(),
            detail,
        };
        let mut lines = Vec::new();
        for record in records {
            let value = serde_json::to_value(record).map_err(|e| bad(e.to_string()))?;
            if !value.is_object() {
                return Err(bad(format!("expected a JSON object, got {value}")));
            }
            // Compact JSON escapes newlines inside strings, so this is one line.
            serde_json::to_writer(&mut lines, &value).map_err(|e| bad(e.to_string()))?;
            lines.push(b'\n');
        }
        if lines.is_empty() {
            return Ok(());
        }
        let fault = failpoint::hit("append", &self.path);
        let written = if fault == Fault::None {
            self.file
                .write_all(&lines)
                .and_then(|()| self.file.flush())
                .and_then(|()| self.file.sync_data())
        } else {
            // A torn append, as a crash or a full disk mid-write leaves one.
            let _ = self.file.write_all(&lines[..lines.len() / 2]);
            failpoint::act(fault)
        };
        if let Err(e) = written {
            // Cut a partial line off now so the next write does not glue onto it.
            let _ = self.file.set_len(self.len);
            return Err(io_err(&self.path, "append")(e).into());
        }
        self.len += lines.len() as u64;
        Ok(())
    }
}

/// The length of `file` up to and including its last `\n` (0 if it has none).
fn complete_prefix_len(file: &mut File, len: u64) -> io::Result<u64> {
    const CHUNK: u64 = 64 * 1024;
    let mut end = len;
    let mut buf = vec![0u8; CHUNK as usize];
    while end > 0 {
        let start = end.saturating_sub(CHUNK);
        let chunk = &mut buf[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(chunk)?;
        if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// Rewrite the JSONL file at `path` keeping only the lines whose integer
/// `"step"` is below `step`, for a run resumed from checkpoint `step-N`:
/// that checkpoint holds the state after steps `0..N`, whose lines carry
/// `"step": 0` to `N - 1`; step N and later are redone and logged again.
/// Returns how many lines were removed.
///
/// Lines with no `"step"` field are kept (they are not tied to a step); a torn
/// last line is dropped; a complete line that is not a JSON object, or whose
/// `"step"` is not an integer, is an error and leaves the file untouched. The
/// rewrite is atomic (temp file, fsync, rename, fsync of the directory), so run
/// it before opening a [`JsonlWriter`] on the same path. A missing file has
/// nothing to remove.
pub fn keep_before_step(path: &Path, step: i64) -> Result<usize> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_err(path, "read")(e).into()),
    };
    let bad = |line: usize, detail: String| MetricsError::BadLine {
        path: path.to_path_buf(),
        line,
        detail,
    };
    let mut kept: Vec<&[u8]> = Vec::new();
    let mut removed = 0usize;
    // `split_inclusive` keeps each `\n`, so a last piece without one is torn.
    for (i, line) in text.split_inclusive(|&b| b == b'\n').enumerate() {
        if line.last() != Some(&b'\n') {
            removed += 1;
            break;
        }
        let value: serde_json::Value =
            serde_json::from_slice(line).map_err(|e| bad(i + 1, format!("not JSON: {e}")))?;
        let obj = value
            .as_object()
            .ok_or_else(|| bad(i + 1, "not a JSON object".to_owned()))?;
        let keep = match obj.get("step") {
            None => true,
            Some(s) => {
                let s = s
                    .as_i64()
                    .ok_or_else(|| bad(i + 1, format!("\"step\" is not an integer: {s}")))?;
                s < step
            }
        };
        if keep {
            kept.push(line);
        } else {
            removed += 1;
        }
    }
    if removed == 0 {
        return Ok(0);
    }
    crate::fsutil::write_atomic_with(path, |w, tmp| {
        kept.iter()
            .try_for_each(|l| w.write_all(l))
            .map_err(io_err(tmp, "write"))
    })?;
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh directory per test; no tempfile crate in this module's deps.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let p = std::env::temp_dir().join(format!(
                "falcon-metrics-{name}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Self(p)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Write a file with the version record plus `n` scalar events; return its path.
    fn write_sample(dir: &Path, n: i64) -> PathBuf {
        let mut w = EventWriter::create(dir).unwrap();
        for s in 0..n {
            w.scalars(
                s,
                &[("loss", 1.0 / (s + 1) as f32), ("reward/pass", s as f32)],
            )
            .unwrap();
        }
        w.path().to_path_buf()
    }

    /// Byte offsets where each record of an event file starts.
    fn record_starts(bytes: &[u8]) -> Vec<usize> {
        let mut starts = Vec::new();
        let mut pos = 0;
        while pos < bytes.len() {
            starts.push(pos);
            let len = u64::from_le_bytes(bytes[pos..pos + 8].try_into().unwrap()) as usize;
            pos += 16 + len;
        }
        starts
    }

    #[test]
    fn crc32c_matches_known_vectors() {
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        // RFC 3720 (iSCSI) appendix B.4.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xFFu8; 32]), 0x62A8_AB43);
        let ascending: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&ascending), 0x46DD_794E);
        assert_eq!(
            crc32c_append(crc32c(&ascending[..13]), &ascending[13..]),
            0x46DD_794E
        );
    }

    #[test]
    fn masked_crc32c_matches_tensorflow_mask() {
        // Values from tensorboard 2.21's own masked_crc32c (crc32c("123456789") = 0xE3069283).
        assert_eq!(masked_crc32c(b"123456789"), 0xC78A_B0E5);
        assert_eq!(masked_crc32c(b""), 0xa282_ead8);
    }

    #[test]
    fn first_record_is_file_version() {
        let dir = TempDir::new("version");
        let path = write_sample(&dir.0, 0);
        let name = path.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with("events.out.tfevents.") && name.ends_with(".falcon"));
        let file = read_events(&path).unwrap();
        assert_eq!(file.truncated_at, None);
        assert_eq!(file.events.len(), 1);
        let first = &file.events[0];
        assert_eq!(first.file_version.as_deref(), Some(FILE_VERSION));
        assert_eq!(first.step, 0);
        assert!(first.scalars.is_empty());
        assert!(first.wall_time > 1.0e9);
    }

    #[test]
    fn scalars_round_trip_exactly() {
        let dir = TempDir::new("roundtrip");
        let path = {
            let mut w = EventWriter::create(&dir.0).unwrap();
            w.scalar("loss", 0.5, 1).unwrap();
            w.scalars(2, &[("loss", 0.25), ("reward/exec", -3.0), ("zero", 0.0)])
                .unwrap();
            w.scalar("weird", f32::NAN, 3).unwrap();
            w.scalar("weird", f32::INFINITY, -4).unwrap();
            w.scalar("big", f32::MAX, i64::MAX).unwrap();
            w.scalars(7, &[]).unwrap();
            w.path().to_path_buf()
            // Dropped here: the buffered records must reach the file.
        };
        let file = read_events(&path).unwrap();
        assert_eq!(file.truncated_at, None);
        let ev = &file.events;
        assert_eq!(ev.len(), 6, "version record + 5 scalar events, none for []");
        assert_eq!(ev[1].step, 1);
        assert_eq!(ev[1].scalars, vec![("loss".to_owned(), 0.5)]);
        assert_eq!(ev[2].step, 2);
        assert_eq!(ev[2].scalar("reward/exec"), Some(-3.0));
        assert_eq!(ev[2].scalar("zero"), Some(0.0));
        assert_eq!(ev[2].scalar("missing"), None);
        assert_eq!(ev[2].scalars.len(), 3);
        assert!(ev[3].scalar("weird").unwrap().is_nan());
        assert_eq!(
            (ev[4].step, ev[4].scalar("weird")),
            (-4, Some(f32::INFINITY))
        );
        assert_eq!(
            (ev[5].step, ev[5].scalar("big")),
            (i64::MAX, Some(f32::MAX))
        );
        assert!(ev[1..].iter().all(|e| e.file_version.is_none()));
        assert!(ev.windows(2).all(|p| p[0].wall_time <= p[1].wall_time));
    }

    #[test]
    fn flush_makes_records_readable_while_writing() {
        let dir = TempDir::new("flush");
        let mut w = EventWriter::create(&dir.0).unwrap();
        w.scalar("a", 1.0, 1).unwrap();
        w.flush().unwrap();
        assert_eq!(read_events(w.path()).unwrap().events.len(), 2);
    }

    #[test]
    fn writers_in_one_directory_do_not_overwrite_each_other() {
        let dir = TempDir::new("twice");
        let a = write_sample(&dir.0, 1);
        let b = write_sample(&dir.0, 2);
        assert_ne!(a, b);
        assert_eq!(read_events(&a).unwrap().events.len(), 2);
        assert_eq!(read_events(&b).unwrap().events.len(), 3);
    }

    #[test]
    fn corrupted_byte_is_a_crc_error_naming_the_record_offset() {
        let dir = TempDir::new("corrupt");
        let path = write_sample(&dir.0, 3);
        let clean = std::fs::read(&path).unwrap();
        let starts = record_starts(&clean);
        assert_eq!(starts.len(), 4);
        // One byte in the length field, then one in the payload, of record 2.
        for (at, what) in [(starts[2] + 1, "length CRC"), (starts[2] + 20, "data CRC")] {
            let mut bytes = clean.clone();
            bytes[at] ^= 0x40;
            std::fs::write(&path, &bytes).unwrap();
            match read_events(&path) {
                Err(MetricsError::CorruptEvent { offset, detail, .. }) => {
                    assert_eq!(offset, starts[2] as u64);
                    assert!(detail.contains(what), "{detail}");
                }
                other => panic!("expected a CRC error, got {other:?}"),
            }
            let msg = read_events(&path).unwrap_err().to_string();
            assert!(msg.contains(&format!("at byte {}", starts[2])), "{msg}");
        }
    }

    #[test]
    fn truncated_file_keeps_complete_records_and_says_where() {
        let dir = TempDir::new("truncated");
        let path = write_sample(&dir.0, 3);
        let clean = std::fs::read(&path).unwrap();
        let last = *record_starts(&clean).last().unwrap();
        // Every cut inside the last record, header included.
        for cut in last + 1..clean.len() {
            std::fs::write(&path, &clean[..cut]).unwrap();
            let file = read_events(&path).unwrap();
            assert_eq!(file.truncated_at, Some(last as u64), "cut at {cut}");
            assert_eq!(file.events.len(), 3, "cut at {cut}");
            assert_eq!(file.events[2].step, 1);
        }
        // A cut exactly between records is a whole, shorter file.
        std::fs::write(&path, &clean[..last]).unwrap();
        assert_eq!(read_events(&path).unwrap().truncated_at, None);
    }

    #[test]
    fn a_resume_keeps_only_the_points_before_its_step() {
        let dir = TempDir::new("keepevents");
        // A session that logged steps 0..=3, an evaluation at 2, and died
        // inside its last record.
        let path = write_sample(&dir.0, 4);
        let mut w = EventWriter::create(&dir.0.join("other")).unwrap();
        w.scalars(2, &[("eval/pass@1", 0.5)]).unwrap();
        w.flush().unwrap();
        drop(w);
        let eval = std::fs::read(
            dir.0
                .join("other")
                .read_dir()
                .unwrap()
                .next()
                .unwrap()
                .unwrap()
                .path(),
        )
        .unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&eval[record_starts(&eval)[1]..]);
        bytes.extend_from_slice(&eval[record_starts(&eval)[1]..][..9]);
        std::fs::write(&path, &bytes).unwrap();
        std::fs::remove_dir_all(dir.0.join("other")).unwrap();
        let keep = |e: &Event| {
            let is_eval = e.scalars.iter().all(|(t, _)| t.starts_with("eval/"));
            if is_eval {
                e.step <= 2
            } else {
                e.step < 2
            }
        };
        // Steps 2 and 3 go, and the torn tail; the version record and the
        // evaluation stay.
        assert_eq!(keep_events(&dir.0, keep).unwrap(), 3);
        let file = read_events(&path).unwrap();
        assert_eq!(file.truncated_at, None);
        assert_eq!(file.events[0].file_version.as_deref(), Some(FILE_VERSION));
        let kept: Vec<(i64, &str)> = file.events[1..]
            .iter()
            .map(|e| (e.step, e.scalars[0].0.as_str()))
            .collect();
        assert_eq!(kept, [(0, "loss"), (1, "loss"), (2, "eval/pass@1")]);
        assert_eq!(keep_events(&dir.0, keep).unwrap(), 0, "nothing more to cut");
        assert_eq!(
            std::fs::read_dir(&dir.0).unwrap().count(),
            1,
            "no temp file"
        );
        assert_eq!(keep_events(&dir.0.join("absent"), keep).unwrap(), 0);
    }

    #[test]
    fn reader_skips_unknown_fields_by_wire_type() {
        let mut value = Vec::new();
        put_len(&mut value, 7, b"node"); // node_name
        put_len(&mut value, 1, b"acc");
        put_len(&mut value, 9, &[0x0a, 0x00]); // metadata
        put_key(&mut value, 2, WIRE_FIXED32);
        value.extend_from_slice(&0.75f32.to_le_bytes());
        let mut image = Vec::new(); // a Value with no simple_value
        put_len(&mut image, 1, b"img");
        put_len(&mut image, 4, b"png bytes");
        let mut summary = Vec::new();
        put_len(&mut summary, 1, &value);
        put_len(&mut summary, 1, &image);
        let mut event = Vec::new();
        put_key(&mut event, 2, WIRE_VARINT);
        put_varint(&mut event, 9);
        put_key(&mut event, 12, WIRE_FIXED32); // unknown fixed32
        event.extend_from_slice(&[1, 2, 3, 4]);
        put_key(&mut event, 13, WIRE_FIXED64); // unknown fixed64
        event.extend_from_slice(&[0; 8]);
        put_key(&mut event, 14, WIRE_VARINT); // unknown varint
        put_varint(&mut event, u64::MAX);
        put_len(&mut event, 6, b"log message");
        put_len(&mut event, 5, &summary);
        let ev = decode_event(&event).unwrap();
        assert_eq!(ev.step, 9);
        assert_eq!(ev.scalars, vec![("acc".to_owned(), 0.75)]);

        // A length running past the message is an error, not a panic.
        let mut bad = Vec::new();
        put_key(&mut bad, 6, WIRE_LEN);
        put_varint(&mut bad, 100);
        assert!(decode_event(&bad).is_err());
    }

    #[test]
    fn empty_event_file_reads_as_no_events() {
        let dir = TempDir::new("empty");
        let path = dir.0.join("events.out.tfevents.0.h.falcon");
        std::fs::write(&path, b"").unwrap();
        assert_eq!(read_events(&path).unwrap(), EventFile::default());
    }

    fn lines(path: &Path) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(path).unwrap();
        assert!(text.is_empty() || text.ends_with('\n'));
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn jsonl_appends_one_object_per_line() {
        let dir = TempDir::new("jsonl");
        let path = dir.0.join("run").join("metrics.jsonl");
        let mut w = JsonlWriter::open(&path).unwrap();
        w.write(&serde_json::json!({"step": 1, "loss": 0.5, "note": "a\nb"}))
            .unwrap();
        #[derive(serde::Serialize)]
        struct Row {
            step: i64,
            loss: f64,
        }
        w.write(&Row {
            step: 2,
            loss: 0.25,
        })
        .unwrap();
        assert!(matches!(
            w.write(&[1, 2]),
            Err(MetricsError::BadRecord { .. })
        ));
        drop(w);
        // Reopening appends after what is there.
        JsonlWriter::open(&path)
            .unwrap()
            .write(&serde_json::json!({"step": 3}))
            .unwrap();
        let got = lines(&path);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0]["note"], "a\nb");
        assert_eq!(got[2]["step"], 3);
    }

    #[test]
    fn jsonl_open_cuts_a_torn_last_line() {
        let dir = TempDir::new("torn");
        let path = dir.0.join("metrics.jsonl");
        std::fs::write(&path, "{\"step\":1}\n{\"step\":2}\n{\"step\":3,\"lo").unwrap();
        let mut w = JsonlWriter::open(&path).unwrap();
        assert_eq!(w.dropped_tail(), "{\"step\":3,\"lo".len() as u64);
        w.write(&serde_json::json!({"step": 3})).unwrap();
        let steps: Vec<_> = lines(&path)
            .iter()
            .map(|v| v["step"].as_i64().unwrap())
            .collect();
        assert_eq!(steps, [1, 2, 3]);

        // A file that is nothing but a torn line ends up empty.
        std::fs::write(&path, "{\"st").unwrap();
        assert_eq!(JsonlWriter::open(&path).unwrap().dropped_tail(), 4);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);

        // A torn line longer than the backwards-scan chunk.
        let long = format!("{{\"step\":1}}\n{{\"x\":\"{}", "y".repeat(200_000));
        std::fs::write(&path, &long).unwrap();
        JsonlWriter::open(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"step\":1}\n");
    }

    #[test]
    fn a_resume_keeps_the_lines_of_the_steps_its_checkpoint_holds() {
        let dir = TempDir::new("truncstep");
        let path = dir.0.join("metrics.jsonl");
        let text = "{\"run\":\"x\"}\n{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n\
                    {\"step\":4}\n{\"step\":5}\n{\"step\":6,";
        std::fs::write(&path, text).unwrap();
        // step-4 holds steps 0..=3: their lines stay, 4, 5 and the torn 6 go.
        assert_eq!(keep_before_step(&path, 4).unwrap(), 3);
        let got = lines(&path);
        assert_eq!(got[0]["run"], "x");
        let steps: Vec<_> = got[1..]
            .iter()
            .map(|v| v["step"].as_i64().unwrap())
            .collect();
        assert_eq!(steps, [1, 2, 3]);
        // Nothing left over beside it, and a second call removes nothing.
        assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 1);
        assert_eq!(keep_before_step(&path, 4).unwrap(), 0);
        assert_eq!(keep_before_step(&path, 3).unwrap(), 1, "step 3 is redone");
        assert_eq!(keep_before_step(&dir.0.join("absent.jsonl"), 0).unwrap(), 0);
    }

    #[test]
    fn a_bad_line_is_refused_and_the_file_left_as_it_was() {
        let dir = TempDir::new("truncbad");
        let path = dir.0.join("metrics.jsonl");
        let text = "{\"step\":1}\nnot json\n{\"step\":5}\n";
        std::fs::write(&path, text).unwrap();
        match keep_before_step(&path, 2) {
            Err(MetricsError::BadLine { line, .. }) => assert_eq!(line, 2),
            other => panic!("expected a bad line, got {other:?}"),
        }
        std::fs::write(&path, "{\"step\":\"7\"}\n").unwrap();
        assert!(matches!(
            keep_before_step(&path, 2),
            Err(MetricsError::BadLine { line: 1, .. })
        ));
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"step\":\"7\"}\n"
        );
    }
}
