//! The durable memory store: one SQLite file, [`DB_FILE`], in a run's
//! directory. It owns FALCON's long-term memory rows (§4.3: task, code,
//! feedback, scores, and the embedding a vector index is rebuilt from) and a
//! keyed JSON table for the other memory kinds (MEMCoder guidelines,
//! MemoCoder fixes and mentor state, error statistics), plus JSONL
//! export/import so a memory can move between runs.
//!
//! Every write is one transaction, so a run killed at any moment reopens
//! with whole batches only (the SIGKILL test below guards this).

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::exec::ExecReport;

/// The database's file name inside a run directory.
pub use crate::run_dir::MEMORY_DB as DB_FILE;
/// The schema this build writes; a database with any other version is refused.
pub const SCHEMA_VERSION: i64 = 1;
/// The name long-term rows go by in [`MemoryStore::counts`] and in exports;
/// reserved, so no record kind may use it.
pub const LONG_TERM_KIND: &str = "long_term";

/// Long enough for a `falcon memory stats` or an import in another process
/// to finish; WAL readers never block the writer, so only writers wait.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

const SCHEMA: &str = "
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
-- AUTOINCREMENT: ids are never reused after a truncation, so a stale vector
-- index can never point at a different row.
CREATE TABLE long_term (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    step         INTEGER NOT NULL CHECK (step >= 0),
    task_id      TEXT NOT NULL,
    task_text    TEXT NOT NULL,
    code         TEXT NOT NULL,
    report_json  TEXT NOT NULL,
    rewards_json TEXT NOT NULL,
    feedback     TEXT NOT NULL,
    embedder     TEXT NOT NULL,
    dim          INTEGER NOT NULL CHECK (dim >= 0),
    embedding    BLOB NOT NULL CHECK (length(embedding) = 4 * dim)
);
CREATE INDEX long_term_by_embedder ON long_term (embedder, id);
CREATE INDEX long_term_by_step ON long_term (step);
CREATE TABLE records (
    kind         TEXT NOT NULL,
    key          TEXT NOT NULL,
    json         TEXT NOT NULL,
    updated_step INTEGER NOT NULL CHECK (updated_step >= 0),
    PRIMARY KEY (kind, key)
) WITHOUT ROWID;
";

const LONG_TERM_COLUMNS: &str =
    "id, step, task_id, task_text, code, report_json, rewards_json, feedback, embedder, dim, embedding";

/// A failed store operation: which database, what it was doing, why.
#[derive(Debug, thiserror::Error)]
#[error("{}: cannot {action}: {kind}", path.display())]
pub struct StoreError {
    pub path: PathBuf,
    pub action: &'static str,
    #[source]
    pub kind: StoreErrorKind,
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreErrorKind {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(
        "the database has schema version {found}, newer than this build's {supported}; \
         open it with the falcon that wrote it"
    )]
    SchemaTooNew { found: i64, supported: i64 },
    #[error("unknown schema version {0:?} (this build reads version {SCHEMA_VERSION})")]
    SchemaUnknown(String),
    #[error("long-term row {0} does not exist")]
    Missing(i64),
    /// A bad value from the caller or a row that does not decode.
    #[error("{0}")]
    Invalid(String),
    /// A bad line of a JSONL import (1-based).
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
}

impl From<rusqlite::types::FromSqlError> for StoreErrorKind {
    fn from(e: rusqlite::types::FromSqlError) -> Self {
        StoreErrorKind::Invalid(format!("a column has the wrong type: {e}"))
    }
}

fn fail<'a, E: Into<StoreErrorKind>>(
    path: &'a Path,
    action: &'static str,
) -> impl FnOnce(E) -> StoreError + 'a {
    move |e| StoreError {
        path: path.to_path_buf(),
        action,
        kind: e.into(),
    }
}

/// A long-term memory entry: FALCON §4.3's `(D, W, T, F)` (task, code,
/// execution report, reward terms, with the step that produced them) plus
/// the feedback text and the embedding of task and feedback. The store
/// assigns each entry an id (increasing, never reused) that travels beside
/// it, not in it: an entry is the same whether or not it is stored yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LongTermRecord {
    /// Training step that produced the sample.
    pub step: u64,
    pub task_id: String,
    pub task_text: String,
    pub code: String,
    pub report: ExecReport,
    /// Each reward under its own name (STYLE.md §6); all finite.
    pub rewards: BTreeMap<String, f64>,
    pub feedback: String,
    /// Which embedding model made `embedding`; indexes are built per embedder.
    pub embedder: String,
    pub embedding: Vec<f32>,
}

/// What an import added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportSummary {
    pub long_term: u64,
    /// Records written (an existing `(kind, key)` is replaced).
    pub records: u64,
}

/// The memory database of one run.
pub struct MemoryStore {
    conn: Connection,
    path: PathBuf,
}

impl MemoryStore {
    /// Open (creating if needed) `run_dir/memory.sqlite`.
    pub fn open(run_dir: &Path) -> Result<Self, StoreError> {
        let path = run_dir.join(DB_FILE);
        std::fs::create_dir_all(run_dir).map_err(fail(&path, "create the run directory"))?;
        let conn = Connection::open(&path).map_err(fail(&path, "open"))?;
        configure(&conn).map_err(fail(&path, "configure"))?;
        let mut store = MemoryStore { conn, path };
        store.migrate()?;
        Ok(store)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn migrate(&mut self) -> Result<(), StoreError> {
        let Self { conn, path } = self;
        let err = fail(path, "check the schema version");
        // IMMEDIATE: two processes opening a new file at once must not both
        // create the schema.
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(fail(path, "check the schema version"))?;
        let tables: Vec<String> = (|| {
            let mut stmt = tx.prepare(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
            )?;
            let names = stmt.query_map([], |r| r.get(0))?;
            names.collect::<rusqlite::Result<Vec<String>>>()
        })()
        .map_err(fail(path, "check the schema version"))?;
        if tables.is_empty() {
            tx.execute_batch(SCHEMA)
                .and_then(|()| {
                    tx.execute(
                        "INSERT INTO meta (key, value) VALUES ('schema_version', ?1)",
                        [SCHEMA_VERSION.to_string()],
                    )
                })
                .and_then(|_| tx.commit())
                .map_err(fail(path, "create the schema"))?;
            return Ok(());
        }
        if !tables.iter().any(|t| t == "meta") {
            return Err(err(StoreErrorKind::Invalid(format!(
                "not a falcon memory database (it has tables {tables:?} but no meta table)"
            ))));
        }
        let found: Option<String> = tx
            .query_row(
                "SELECT value FROM meta WHERE key = 'schema_version'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(fail(path, "check the schema version"))?;
        let found = found.unwrap_or_default();
        match found.trim().parse::<i64>() {
            Ok(v) if v == SCHEMA_VERSION => Ok(()),
            Ok(v) if v > SCHEMA_VERSION => Err(err(StoreErrorKind::SchemaTooNew {
                found: v,
                supported: SCHEMA_VERSION,
            })),
            _ => Err(err(StoreErrorKind::SchemaUnknown(found))),
        }
    }

    /// SQLite's own consistency check; `Ok` only when it answers "ok".
    pub fn check_integrity(&self) -> Result<(), StoreError> {
        let err = fail(&self.path, "check integrity");
        let rows: Vec<String> = (|| {
            let mut stmt = self.conn.prepare("PRAGMA integrity_check")?;
            let rows = stmt.query_map([], |r| r.get(0))?;
            rows.collect::<rusqlite::Result<Vec<String>>>()
        })()
        .map_err(fail(&self.path, "check integrity"))?;
        if rows.len() == 1 && rows[0] == "ok" {
            Ok(())
        } else {
            Err(err(StoreErrorKind::Invalid(rows.join("; "))))
        }
    }

    /// Insert `rows` in one transaction; returns their ids in order. Nothing
    /// is written when any row is invalid.
    pub fn insert_long_term(&mut self, rows: &[LongTermRecord]) -> Result<Vec<i64>, StoreError> {
        let Self { conn, path } = self;
        let encoded = rows
            .iter()
            .map(EncodedRow::new)
            .collect::<Result<Vec<_>, _>>()
            .map_err(fail(path, "insert long-term memory"))?;
        crate::fsutil::failpoint::check("memory insert", path)
            .map_err(fail(path, "insert long-term memory"))?;
        let mut write = || -> rusqlite::Result<Vec<i64>> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut ids = Vec::with_capacity(rows.len());
            {
                let mut stmt = tx.prepare_cached(
                    "INSERT INTO long_term (step, task_id, task_text, code, report_json, \
                     rewards_json, feedback, embedder, dim, embedding) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                )?;
                for (row, enc) in rows.iter().zip(&encoded) {
                    stmt.execute(params![
                        enc.step,
                        row.task_id,
                        row.task_text,
                        row.code,
                        enc.report_json,
                        enc.rewards_json,
                        row.feedback,
                        row.embedder,
                        enc.dim,
                        enc.embedding,
                    ])?;
                    ids.push(tx.last_insert_rowid());
                }
            }
            tx.commit()?;
            Ok(ids)
        };
        write().map_err(fail(path, "insert long-term memory"))
    }

    /// All embeddings made by `embedder`, for rebuilding a vector index:
    /// ids ascending, the vectors concatenated row-major, and their dimension
    /// (0 when there are none). Mixed dimensions are an error.
    pub fn load_embeddings(
        &self,
        embedder: &str,
    ) -> Result<(Vec<i64>, Vec<f32>, usize), StoreError> {
        let action = "load embeddings";
        let err = fail(&self.path, action);
        let mut ids = Vec::new();
        let mut flat = Vec::new();
        let mut dim: Option<usize> = None;
        let mut read = || -> Result<(), StoreErrorKind> {
            let mut stmt = self.conn.prepare_cached(
                "SELECT id, dim, embedding FROM long_term WHERE embedder = ?1 ORDER BY id",
            )?;
            let mut rows = stmt.query([embedder])?;
            while let Some(row) = rows.next()? {
                let id: i64 = row.get(0)?;
                let d = usize::try_from(row.get::<_, i64>(1)?)
                    .map_err(|_| StoreErrorKind::Invalid(format!("row {id}: negative dim")))?;
                match dim {
                    None => dim = Some(d),
                    Some(first) if first != d => {
                        return Err(StoreErrorKind::Invalid(format!(
                            "embedder {embedder:?} has rows of dimension {first} and {d} (row {id})"
                        )))
                    }
                    Some(_) => {}
                }
                decode_embedding_into(id, d, row.get_ref(2)?.as_blob()?, &mut flat)?;
                ids.push(id);
            }
            Ok(())
        };
        read().map_err(err)?;
        Ok((ids, flat, dim.unwrap_or(0)))
    }

    /// The rows with these ids, with their ids, in the order asked. A missing id is an error
    /// ([`StoreErrorKind::Missing`]): ids come from this store, so a missing
    /// one means an index that is out of date.
    pub fn get_long_term(&self, ids: &[i64]) -> Result<Vec<(i64, LongTermRecord)>, StoreError> {
        let read = || -> Result<Vec<(i64, LongTermRecord)>, StoreErrorKind> {
            // One read transaction: every row comes from the same snapshot.
            let tx = self.conn.unchecked_transaction()?;
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT {LONG_TERM_COLUMNS} FROM long_term WHERE id = ?1"
            ))?;
            let mut out = Vec::with_capacity(ids.len());
            for &id in ids {
                let mut rows = stmt.query([id])?;
                match rows.next()? {
                    Some(row) => out.push(decode_long_term(row)?),
                    None => return Err(StoreErrorKind::Missing(id)),
                }
            }
            Ok(out)
        };
        read().map_err(fail(&self.path, "read long-term memory"))
    }

    /// How many long-term rows there are.
    pub fn count_long_term(&self) -> Result<u64, StoreError> {
        self.conn
            .query_row("SELECT count(*) FROM long_term", [], |r| r.get::<_, i64>(0))
            .map(|n| n as u64)
            .map_err(fail(&self.path, "count long-term memory"))
    }

    /// Long-term rows per embedder name (vector space), by name.
    pub fn embedders(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        let read = || -> rusqlite::Result<BTreeMap<String, u64>> {
            let mut stmt = self
                .conn
                .prepare("SELECT embedder, count(*) FROM long_term GROUP BY embedder")?;
            let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
            rows.map(|r| r.map(|(k, n)| (k, n as u64))).collect()
        };
        read().map_err(fail(&self.path, "list embedders"))
    }

    /// Call `f` on every long-term row and its id, ids ascending, from one
    /// snapshot.
    /// Stops at the first error `f` returns.
    pub fn for_each_long_term<E: From<StoreError>>(
        &self,
        mut f: impl FnMut(i64, LongTermRecord) -> Result<(), E>,
    ) -> Result<(), E> {
        let err = |e: StoreErrorKind| E::from(fail(&self.path, "read long-term memory")(e));
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT {LONG_TERM_COLUMNS} FROM long_term ORDER BY id"
            ))
            .map_err(|e| err(e.into()))?;
        let mut rows = stmt.query([]).map_err(|e| err(e.into()))?;
        while let Some(row) = rows.next().map_err(|e| err(e.into()))? {
            let (id, record) = decode_long_term(row).map_err(err)?;
            f(id, record)?;
        }
        Ok(())
    }

    /// Delete long-term rows written after `step`; returns how many. On
    /// resume from a checkpoint at `step`, rows of the abandoned steps would
    /// otherwise be remembered twice.
    pub fn truncate_long_term_after(&mut self, step: u64) -> Result<u64, StoreError> {
        let Self { conn, path } = self;
        let step = to_i64(step).map_err(fail(path, "truncate long-term memory"))?;
        let mut write = || -> rusqlite::Result<usize> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let n = tx.execute("DELETE FROM long_term WHERE step > ?1", [step])?;
            tx.commit()?;
            Ok(n)
        };
        write()
            .map(|n| n as u64)
            .map_err(fail(path, "truncate long-term memory"))
    }

    /// Store `value` as JSON under `(kind, key)`, replacing any previous one.
    pub fn put_record<T: Serialize + ?Sized>(
        &mut self,
        kind: &str,
        key: &str,
        step: u64,
        value: &T,
    ) -> Result<(), StoreError> {
        self.put_records(kind, step, [(key, value)]).map(|_| ())
    }

    /// Store many values of one kind in one transaction; returns how many.
    pub fn put_records<'v, K, T>(
        &mut self,
        kind: &str,
        step: u64,
        items: impl IntoIterator<Item = (K, &'v T)>,
    ) -> Result<usize, StoreError>
    where
        K: AsRef<str>,
        T: Serialize + ?Sized + 'v,
    {
        let Self { conn, path } = self;
        let action = "write records";
        check_kind(kind).map_err(fail(path, action))?;
        let step = to_i64(step).map_err(fail(path, action))?;
        let encoded = items
            .into_iter()
            .map(|(k, v)| Ok((k.as_ref().to_owned(), serde_json::to_string(v)?)))
            .collect::<Result<Vec<_>, serde_json::Error>>()
            .map_err(fail(path, action))?;
        crate::fsutil::failpoint::check("memory records", path).map_err(fail(path, action))?;
        let mut write = || -> rusqlite::Result<()> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            {
                let mut stmt = tx.prepare_cached(
                    "INSERT OR REPLACE INTO records (kind, key, json, updated_step) \
                     VALUES (?1, ?2, ?3, ?4)",
                )?;
                for (key, json) in &encoded {
                    stmt.execute(params![kind, key, json, step])?;
                }
            }
            tx.commit()
        };
        write().map_err(fail(path, action))?;
        Ok(encoded.len())
    }

    /// The value under `(kind, key)`, if any.
    pub fn get_record<T: DeserializeOwned>(
        &self,
        kind: &str,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        let read = || -> Result<Option<T>, StoreErrorKind> {
            let json: Option<String> = self
                .conn
                .prepare_cached("SELECT json FROM records WHERE kind = ?1 AND key = ?2")?
                .query_row([kind, key], |r| r.get(0))
                .optional()?;
            Ok(json.map(|j| serde_json::from_str(&j)).transpose()?)
        };
        read().map_err(fail(&self.path, "read a record"))
    }

    /// Every value of `kind`, ordered by key (byte order).
    pub fn records<T: DeserializeOwned>(&self, kind: &str) -> Result<Vec<(String, T)>, StoreError> {
        let read = || -> Result<Vec<(String, T)>, StoreErrorKind> {
            let mut stmt = self
                .conn
                .prepare_cached("SELECT key, json FROM records WHERE kind = ?1 ORDER BY key")?;
            let mut rows = stmt.query([kind])?;
            let mut out = Vec::new();
            while let Some(row) = rows.next()? {
                let key: String = row.get(0)?;
                let value = serde_json::from_str(row.get_ref(1)?.as_str()?).map_err(|e| {
                    StoreErrorKind::Invalid(format!("record {kind:?}/{key:?} does not decode: {e}"))
                })?;
                out.push((key, value));
            }
            Ok(out)
        };
        read().map_err(fail(&self.path, "read records"))
    }

    /// Delete `(kind, key)`; returns whether it existed.
    pub fn delete_record(&mut self, kind: &str, key: &str) -> Result<bool, StoreError> {
        let Self { conn, path } = self;
        let mut write = || -> rusqlite::Result<usize> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let n = tx.execute(
                "DELETE FROM records WHERE kind = ?1 AND key = ?2",
                [kind, key],
            )?;
            tx.commit()?;
            Ok(n)
        };
        write()
            .map(|n| n > 0)
            .map_err(fail(path, "delete a record"))
    }

    /// Entries per kind: [`LONG_TERM_KIND`] (always present) and each record kind.
    pub fn counts(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        let read = || -> rusqlite::Result<BTreeMap<String, u64>> {
            let tx = self.conn.unchecked_transaction()?;
            let n: i64 = tx.query_row("SELECT count(*) FROM long_term", [], |r| r.get(0))?;
            let mut out = BTreeMap::from([(LONG_TERM_KIND.to_owned(), n as u64)]);
            let mut stmt = tx.prepare("SELECT kind, count(*) FROM records GROUP BY kind")?;
            let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
            for row in rows {
                let (kind, n) = row?;
                out.insert(kind, n as u64);
            }
            Ok(out)
        };
        read().map_err(fail(&self.path, "count entries"))
    }

    /// Write the whole memory as JSONL, one object per line with a `kind`
    /// field: long-term rows (ids ascending) then records (by kind, key).
    /// Returns the number of lines. The caller picks the file (and makes
    /// the write atomic).
    pub fn export_jsonl<W: Write>(&self, mut out: W) -> Result<u64, StoreError> {
        let action = "export";
        let err = fail(&self.path, action);
        let mut lines = 0u64;
        let mut write_line = |v: serde_json::Value| -> Result<(), StoreErrorKind> {
            serde_json::to_writer(&mut out, &v)?;
            out.write_all(b"\n")?;
            lines += 1;
            Ok(())
        };
        let mut run = || -> Result<(), StoreErrorKind> {
            // One snapshot for both tables.
            let tx = self.conn.unchecked_transaction()?;
            {
                let mut stmt = tx.prepare(&format!(
                    "SELECT {LONG_TERM_COLUMNS} FROM long_term ORDER BY id"
                ))?;
                let mut rows = stmt.query([])?;
                while let Some(row) = rows.next()? {
                    let (id, record) = decode_long_term(row)?;
                    let mut v = serde_json::to_value(record)?;
                    v["id"] = id.into();
                    v["kind"] = LONG_TERM_KIND.into();
                    write_line(v)?;
                }
                let mut stmt = tx.prepare(
                    "SELECT kind, key, updated_step, json FROM records ORDER BY kind, key",
                )?;
                let mut rows = stmt.query([])?;
                while let Some(row) = rows.next()? {
                    let value: serde_json::Value = serde_json::from_str(row.get_ref(3)?.as_str()?)?;
                    write_line(serde_json::json!({
                        "kind": row.get::<_, String>(0)?,
                        "key": row.get::<_, String>(1)?,
                        "updated_step": row.get::<_, i64>(2)?,
                        "value": value,
                    }))?;
                }
            }
            Ok(())
        };
        run().map_err(err)?;
        out.flush().map_err(fail(&self.path, action))?;
        Ok(lines)
    }

    /// Import what [`export_jsonl`](Self::export_jsonl) wrote, in one
    /// transaction: any bad line (reported as `line N: reason`) imports
    /// nothing. A long-term line keeps its `id` when it has one (an id that
    /// already exists is an error; drop the ids to merge two memories); a
    /// record replaces any record under the same `(kind, key)`. Blank lines
    /// are skipped.
    pub fn import_jsonl<R: BufRead>(&mut self, input: R) -> Result<ImportSummary, StoreError> {
        let Self { conn, path } = self;
        let action = "import";
        let mut summary = ImportSummary::default();
        let run = || -> Result<(), StoreErrorKind> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            {
                let mut exists = tx.prepare("SELECT 1 FROM long_term WHERE id = ?1")?;
                let mut insert_lt = tx.prepare(
                    "INSERT INTO long_term (id, step, task_id, task_text, code, report_json, \
                     rewards_json, feedback, embedder, dim, embedding) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                )?;
                let mut insert_rec = tx.prepare(
                    "INSERT OR REPLACE INTO records (kind, key, json, updated_step) \
                     VALUES (?1, ?2, ?3, ?4)",
                )?;
                for (i, line) in input.lines().enumerate() {
                    let line_no = i + 1;
                    let bad = |reason: String| StoreErrorKind::Line {
                        line: line_no,
                        reason,
                    };
                    let line = line?;
                    if line.trim().is_empty() {
                        continue;
                    }
                    match parse_line(&line).map_err(bad)? {
                        ImportLine::LongTerm { id, row } => {
                            if let Some(id) = id {
                                if exists.exists([id])? {
                                    return Err(bad(format!(
                                        "long-term id {id} already exists (remove the \"id\" fields to merge)"
                                    )));
                                }
                            }
                            let enc = EncodedRow::new(&row).map_err(|e| bad(e.to_string()))?;
                            insert_lt.execute(params![
                                id,
                                enc.step,
                                row.task_id,
                                row.task_text,
                                row.code,
                                enc.report_json,
                                enc.rewards_json,
                                row.feedback,
                                row.embedder,
                                enc.dim,
                                enc.embedding,
                            ])?;
                            summary.long_term += 1;
                        }
                        ImportLine::Record(r) => {
                            insert_rec.execute(params![
                                r.kind,
                                r.key,
                                r.value.to_string(),
                                to_i64(r.updated_step).map_err(|e| bad(e.to_string()))?,
                            ])?;
                            summary.records += 1;
                        }
                    }
                }
            }
            tx.commit()?;
            Ok(())
        };
        run().map_err(fail(path, action))?;
        Ok(summary)
    }
}

fn configure(conn: &Connection) -> Result<(), StoreErrorKind> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        // Only in-memory or exotic VFS setups end up here; refuse rather than
        // silently lose the crash guarantees WAL gives.
        return Err(StoreErrorKind::Invalid(format!(
            "journal_mode is {mode}, not wal"
        )));
    }
    // NORMAL, not FULL: in WAL mode a commit is in the WAL file (the OS page
    // cache) before it returns, so a killed process (SIGKILL, OOM killer,
    // panic) never loses or tears a committed transaction. Only an OS crash
    // or power loss can drop the last commits, and even then the file stays
    // consistent. That is the right trade for a memory that is rebuilt from
    // samples anyway; FULL would fsync on every commit of a write-heavy loop.
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", true)?;
    Ok(())
}

fn check_kind(kind: &str) -> Result<(), StoreErrorKind> {
    if kind.is_empty() || kind == LONG_TERM_KIND {
        return Err(StoreErrorKind::Invalid(format!(
            "{kind:?} is not a usable record kind (empty and {LONG_TERM_KIND:?} are reserved)"
        )));
    }
    Ok(())
}

fn to_i64(v: u64) -> Result<i64, StoreErrorKind> {
    i64::try_from(v).map_err(|_| StoreErrorKind::Invalid(format!("{v} does not fit in an i64")))
}

/// A row's columns that need encoding, made before the transaction starts so
/// a bad row writes nothing.
struct EncodedRow {
    step: i64,
    report_json: String,
    rewards_json: String,
    dim: i64,
    embedding: Vec<u8>,
}

impl EncodedRow {
    fn new(row: &LongTermRecord) -> Result<Self, StoreErrorKind> {
        if let Some((name, v)) = row.rewards.iter().find(|(_, v)| !v.is_finite()) {
            return Err(StoreErrorKind::Invalid(format!(
                "task {:?}: reward {name:?} is {v}, not a finite number",
                row.task_id
            )));
        }
        if row.embedding.iter().any(|x| !x.is_finite()) {
            return Err(StoreErrorKind::Invalid(format!(
                "task {:?}: the embedding has a non-finite value",
                row.task_id
            )));
        }
        let mut embedding = Vec::with_capacity(row.embedding.len() * 4);
        for x in &row.embedding {
            embedding.extend_from_slice(&x.to_le_bytes());
        }
        Ok(EncodedRow {
            step: to_i64(row.step)?,
            report_json: serde_json::to_string(&row.report)?,
            rewards_json: serde_json::to_string(&row.rewards)?,
            dim: row.embedding.len() as i64,
            embedding,
        })
    }
}

fn decode_embedding_into(
    id: i64,
    dim: usize,
    blob: &[u8],
    out: &mut Vec<f32>,
) -> Result<(), StoreErrorKind> {
    if blob.len() != dim * 4 {
        return Err(StoreErrorKind::Invalid(format!(
            "row {id}: embedding has {} bytes, expected {} for dimension {dim}",
            blob.len(),
            dim * 4
        )));
    }
    out.extend(
        blob.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    );
    Ok(())
}

fn decode_long_term(row: &rusqlite::Row<'_>) -> Result<(i64, LongTermRecord), StoreErrorKind> {
    let id: i64 = row.get(0)?;
    let bad = |what: &str, e: &dyn std::fmt::Display| {
        StoreErrorKind::Invalid(format!("row {id}: {what} does not decode: {e}"))
    };
    let step = u64::try_from(row.get::<_, i64>(1)?).map_err(|e| bad("step", &e))?;
    let report = serde_json::from_str(row.get_ref(5)?.as_str()?).map_err(|e| bad("report", &e))?;
    let rewards =
        serde_json::from_str(row.get_ref(6)?.as_str()?).map_err(|e| bad("rewards", &e))?;
    let dim = usize::try_from(row.get::<_, i64>(9)?).map_err(|e| bad("dim", &e))?;
    let mut embedding = Vec::with_capacity(dim);
    decode_embedding_into(id, dim, row.get_ref(10)?.as_blob()?, &mut embedding)?;
    let record = LongTermRecord {
        step,
        task_id: row.get(2)?,
        task_text: row.get(3)?,
        code: row.get(4)?,
        report,
        rewards,
        feedback: row.get(7)?,
        embedder: row.get(8)?,
        embedding,
    };
    Ok((id, record))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordLine {
    kind: String,
    key: String,
    updated_step: u64,
    value: serde_json::Value,
}

enum ImportLine {
    LongTerm {
        id: Option<i64>,
        row: Box<LongTermRecord>,
    },
    Record(RecordLine),
}

fn parse_line(line: &str) -> Result<ImportLine, String> {
    let mut obj: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(line).map_err(|e| format!("not a JSON object: {e}"))?;
    let kind = match obj.get("kind") {
        Some(serde_json::Value::String(k)) => k.clone(),
        Some(_) => return Err("\"kind\" is not a string".into()),
        None => return Err("no \"kind\" field".into()),
    };
    if kind == LONG_TERM_KIND {
        obj.remove("kind");
        let id = match obj.remove("id") {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => Some(
                v.as_i64()
                    .filter(|id| *id > 0)
                    .ok_or_else(|| format!("\"id\" {v} is not a positive integer"))?,
            ),
        };
        let row: Box<LongTermRecord> = serde_json::from_value(serde_json::Value::Object(obj))
            .map_err(|e| format!("bad long-term entry: {e}"))?;
        Ok(ImportLine::LongTerm { id, row })
    } else {
        check_kind(&kind).map_err(|e| e.to_string())?;
        let rec: RecordLine = serde_json::from_value(serde_json::Value::Object(obj))
            .map_err(|e| format!("bad {kind:?} record: {e}"))?;
        Ok(ImportLine::Record(rec))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{ErrorKind, TestResult, TestStatus};
    use std::process::{Command, Stdio};
    use std::time::Instant;

    fn report(i: usize) -> ExecReport {
        let status = if i.is_multiple_of(3) {
            TestStatus::Pass
        } else {
            TestStatus::Error {
                kind: ErrorKind::ValueError,
                message: format!("bad value {i}"),
            }
        };
        ExecReport::from_tests(
            vec![TestResult {
                index: 0,
                status,
                error_lines: vec![i as u32 % 7 + 1],
                seconds: 0.25,
            }],
            format!("out {i}"),
            0.5,
        )
    }

    fn row(i: usize, step: u64, embedder: &str, dim: usize) -> LongTermRecord {
        LongTermRecord {
            step,
            task_id: format!("task-{i}"),
            task_text: format!("Write f{i} — ünïcode ✓"),
            code: format!("def f{i}(x):\n    return x + {i}\n"),
            report: report(i),
            rewards: BTreeMap::from([("T".to_owned(), 0.5 + i as f64), ("E".to_owned(), -0.1)]),
            feedback: format!("feedback {i}"),
            embedder: embedder.to_owned(),
            embedding: (0..dim).map(|d| (i * 31 + d) as f32 / 7.0 - 3.3).collect(),
        }
    }

    #[test]
    fn long_term_round_trips_and_rebuilds_an_index() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = MemoryStore::open(dir.path()).unwrap();
        let rows: Vec<_> = (0..5).map(|i| row(i, i as u64, "e1", 8)).collect();
        let ids = s.insert_long_term(&rows).unwrap();
        assert_eq!(ids.len(), 5);
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        s.insert_long_term(&[row(9, 9, "e2", 3)]).unwrap();
        assert_eq!(s.count_long_term().unwrap(), 6);

        let got = s.get_long_term(&[ids[3], ids[1]]).unwrap();
        assert_eq!(got[0], (ids[3], rows[3].clone()));
        assert_eq!(got[1], (ids[1], rows[1].clone()));
        assert!(matches!(
            s.get_long_term(&[12345]).unwrap_err().kind,
            StoreErrorKind::Missing(12345)
        ));

        let (eids, flat, dim) = s.load_embeddings("e1").unwrap();
        assert_eq!((eids, dim), (ids.clone(), 8));
        let want: Vec<f32> = rows.iter().flat_map(|r| r.embedding.clone()).collect();
        assert_eq!(flat, want);
        assert_eq!(s.load_embeddings("none").unwrap(), (vec![], vec![], 0));

        let mut seen = Vec::new();
        s.for_each_long_term(|id, _| {
            seen.push(id);
            Ok::<_, StoreError>(())
        })
        .unwrap();
        assert_eq!(seen.len(), 6);

        assert_eq!(s.truncate_long_term_after(2).unwrap(), 3);
        assert_eq!(s.count_long_term().unwrap(), 3);
        // Ids are not reused after a truncation.
        let next = s.insert_long_term(&[row(0, 3, "e1", 8)]).unwrap()[0];
        assert!(next > *ids.iter().max().unwrap() + 1);
    }

    #[test]
    fn invalid_rows_write_nothing_and_mixed_dims_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = MemoryStore::open(dir.path()).unwrap();
        let mut bad = row(1, 1, "e", 4);
        bad.rewards.insert("S".into(), f64::NAN);
        let e = s.insert_long_term(&[row(0, 0, "e", 4), bad]).unwrap_err();
        assert!(e.to_string().contains("reward \"S\""), "{e}");
        assert_eq!(s.count_long_term().unwrap(), 0);
        s.insert_long_term(&[row(0, 0, "e", 4), row(1, 0, "e", 5)])
            .unwrap();
        let e = s.load_embeddings("e").unwrap_err();
        assert!(e.to_string().contains("dimension 4 and 5"), "{e}");
    }

    #[test]
    fn records_put_get_list_delete_and_count() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = MemoryStore::open(dir.path()).unwrap();
        s.put_record("stats", "error", 3, &vec![1u32, 2]).unwrap();
        s.put_records(
            "fix",
            4,
            [("b", &"two".to_owned()), ("a", &"one".to_owned())],
        )
        .unwrap();
        s.put_record("fix", "c", 5, "three").unwrap();
        s.put_record("fix", "a", 6, "uno").unwrap();
        assert_eq!(
            s.get_record::<Vec<u32>>("stats", "error").unwrap(),
            Some(vec![1, 2])
        );
        assert_eq!(s.get_record::<String>("stats", "nope").unwrap(), None);
        let fixes: Vec<(String, String)> = s.records("fix").unwrap();
        let keys: Vec<_> = fixes
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(keys, [("a", "uno"), ("b", "two"), ("c", "three")]);
        assert!(s.delete_record("fix", "b").unwrap());
        assert!(!s.delete_record("fix", "b").unwrap());
        s.insert_long_term(&[row(0, 0, "e", 2)]).unwrap();
        let counts = s.counts().unwrap();
        let counts: Vec<_> = counts.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(counts, [("fix", 2), ("long_term", 1), ("stats", 1)]);
        let e = s.put_record(LONG_TERM_KIND, "x", 0, &1).unwrap_err();
        assert!(e.to_string().contains("reserved"), "{e}");
        // A record of the wrong type is an error, not a panic.
        assert!(s.records::<u32>("fix").is_err());
    }

    #[test]
    fn newer_or_unknown_schema_is_refused_with_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        drop(MemoryStore::open(dir.path()).unwrap());
        let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
        raw.execute(
            "UPDATE meta SET value = '7' WHERE key = 'schema_version'",
            [],
        )
        .unwrap();
        drop(raw);
        let e = MemoryStore::open(dir.path()).err().unwrap();
        let msg = e.to_string();
        assert!(matches!(
            e.kind,
            StoreErrorKind::SchemaTooNew { found: 7, .. }
        ));
        assert!(
            msg.contains("memory.sqlite") && msg.contains("schema version 7"),
            "{msg}"
        );

        let raw = Connection::open(dir.path().join(DB_FILE)).unwrap();
        raw.execute(
            "UPDATE meta SET value = 'x' WHERE key = 'schema_version'",
            [],
        )
        .unwrap();
        drop(raw);
        let e = MemoryStore::open(dir.path()).err().unwrap();
        assert!(matches!(e.kind, StoreErrorKind::SchemaUnknown(_)), "{e}");

        let other = tempfile::tempdir().unwrap();
        let raw = Connection::open(other.path().join(DB_FILE)).unwrap();
        raw.execute_batch("CREATE TABLE t (x)").unwrap();
        drop(raw);
        let e = MemoryStore::open(other.path()).err().unwrap();
        assert!(
            e.to_string().contains("not a falcon memory database"),
            "{e}"
        );
    }

    #[test]
    fn export_import_round_trips_and_a_bad_line_imports_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = MemoryStore::open(dir.path()).unwrap();
        let mut rows: Vec<_> = (0..20).map(|i| row(i, i as u64, "e", 16)).collect();
        // Awkward floats must survive the JSON trip bit for bit.
        rows[0].embedding = vec![
            f32::MIN_POSITIVE,
            f32::MAX,
            -0.0,
            1.0e-40, // subnormal
            0.1,
            1.0 / 3.0,
            16777217.0,
            -2.5e-8,
        ];
        s.insert_long_term(&rows).unwrap();
        s.put_record("stats", "error", 7, &serde_json::json!({"a": [1, 2.5]}))
            .unwrap();
        s.put_record("fix", "000001", 8, "x").unwrap();
        let mut buf = Vec::new();
        assert_eq!(s.export_jsonl(&mut buf).unwrap(), 22);

        let dir2 = tempfile::tempdir().unwrap();
        let mut t = MemoryStore::open(dir2.path()).unwrap();
        let sum = t.import_jsonl(&buf[..]).unwrap();
        assert_eq!(
            sum,
            ImportSummary {
                long_term: 20,
                records: 2
            }
        );
        let mut buf2 = Vec::new();
        t.export_jsonl(&mut buf2).unwrap();
        assert_eq!(
            String::from_utf8(buf.clone()).unwrap(),
            String::from_utf8(buf2).unwrap()
        );
        let got = t.get_long_term(&[1]).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got[0].1.embedding), bits(&rows[0].embedding));

        // Importing the same ids again collides; nothing of the file lands.
        let e = t.import_jsonl(&buf[..]).unwrap_err();
        assert!(
            e.to_string()
                .contains("line 1: long-term id 1 already exists"),
            "{e}"
        );

        let text = String::from_utf8(buf).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        lines.truncate(4);
        lines[2] = lines[2].replace("\"task_id\"", "\"task_idd\"");
        let before = t.counts().unwrap();
        let fresh = tempfile::tempdir().unwrap();
        let mut u = MemoryStore::open(fresh.path()).unwrap();
        let e = u.import_jsonl(lines.join("\n").as_bytes()).unwrap_err();
        assert!(e.to_string().contains("line 3: bad long-term entry"), "{e}");
        assert_eq!(u.count_long_term().unwrap(), 0, "all or nothing");
        for (bad, want) in [
            ("[1]", "line 2: not a JSON object"),
            ("{\"key\":\"k\"}", "line 2: no \"kind\""),
            (
                "{\"kind\":\"fix\",\"key\":\"k\",\"updated_step\":1}",
                "line 2: bad \"fix\" record",
            ),
        ] {
            let input = format!("{}\n{bad}\n", lines[0]);
            let e = u.import_jsonl(input.as_bytes()).unwrap_err();
            assert!(e.to_string().contains(want), "{e} / {want}");
        }
        assert_eq!(u.count_long_term().unwrap(), 0);
        assert_eq!(t.counts().unwrap(), before);

        // Without ids, the same rows merge in under new ids.
        let merged: String = text
            .lines()
            .filter(|l| l.contains("\"long_term\""))
            .map(|l| {
                let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                v.as_object_mut().unwrap().remove("id");
                format!("{v}\n\n")
            })
            .collect();
        assert_eq!(t.import_jsonl(merged.as_bytes()).unwrap().long_term, 20);
        assert_eq!(t.count_long_term().unwrap(), 40);
    }

    /// One 10k-row batch is one transaction (speed is `scripts/bench/run memory`'s job).
    #[test]
    fn ten_thousand_inserts_in_one_batch() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = MemoryStore::open(dir.path()).unwrap();
        let rows: Vec<_> = (0..10_000).map(|i| row(i, 1, "e", 384)).collect();
        let ids = s.insert_long_term(&rows).unwrap();
        assert_eq!(ids.len(), 10_000);
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(s.count_long_term().unwrap(), 10_000);
    }

    const CHILD_ENV: &str = "FALCON_STORE_SIGKILL_CHILD";
    const BATCH: usize = 100;
    const DIM: usize = 24;

    /// The child half of the SIGKILL test: insert whole batches forever.
    fn sigkill_child(dir: &Path) {
        let mut s = MemoryStore::open(dir).unwrap();
        let mut batch = s.count_long_term().unwrap() as usize / BATCH;
        let deadline = Instant::now() + Duration::from_secs(60);
        // The deadline only stops an orphan whose parent died.
        while Instant::now() < deadline {
            let rows: Vec<_> = (0..BATCH)
                .map(|i| {
                    let mut r = row(i, batch as u64, "e", DIM);
                    r.task_id = format!("batch-{batch}");
                    r.embedding[0] = batch as f32;
                    r
                })
                .collect();
            s.insert_long_term(&rows).unwrap();
            s.put_record("progress", "last", batch as u64, &batch)
                .unwrap();
            println!("COMMITTED {batch}");
            batch += 1;
        }
    }

    #[test]
    fn sigkill_mid_write_leaves_only_whole_batches() {
        if let Ok(dir) = std::env::var(CHILD_ENV) {
            sigkill_child(Path::new(&dir));
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        // The test's path inside this crate, so it works wherever the module sits.
        let module = module_path!().split_once("::").unwrap().1;
        let name = format!("{module}::sigkill_mid_write_leaves_only_whole_batches");
        let jitter = (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
            % 5) as u64;
        // (batches to see committed, then how long to wait before the kill)
        for (round, (after, delay_ms)) in [(1, 0), (3, 1 + jitter), (2, 7 + jitter), (5, 23)]
            .into_iter()
            .enumerate()
        {
            let mut child = Command::new(std::env::current_exe().unwrap())
                .args(["--exact", &name, "--nocapture", "--test-threads=1"])
                .env(CHILD_ENV, dir.path())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
            let (tx, rx) = std::sync::mpsc::channel();
            // Keep draining the pipe so the child never blocks on it.
            let reader = std::thread::spawn(move || {
                for line in stdout.lines().map_while(Result::ok) {
                    if line.starts_with("COMMITTED") {
                        let _ = tx.send(());
                    }
                }
            });
            for _ in 0..after {
                if rx.recv_timeout(Duration::from_secs(30)).is_err() {
                    let _ = child.kill();
                    panic!("round {round}: the child stopped committing");
                }
            }
            std::thread::sleep(Duration::from_millis(delay_ms));
            child.kill().unwrap(); // SIGKILL on Unix
            child.wait().unwrap();
            reader.join().unwrap();

            let s = MemoryStore::open(dir.path()).unwrap();
            s.check_integrity().unwrap();
            let n = s.count_long_term().unwrap() as usize;
            assert!(n > 0 && n.is_multiple_of(BATCH), "round {round}: {n} rows");
            let batches = n / BATCH;
            let mut per_batch = vec![0usize; batches];
            s.for_each_long_term(|_, r| {
                let b: usize = r.task_id["batch-".len()..].parse().unwrap();
                assert_eq!(r.step as usize, b);
                assert_eq!(r.embedding.len(), DIM);
                assert_eq!(r.embedding[0], b as f32);
                per_batch[b] += 1;
                Ok::<_, StoreError>(())
            })
            .unwrap();
            assert!(per_batch.iter().all(|&c| c == BATCH), "round {round}");
            let (_, flat, dim) = s.load_embeddings("e").unwrap();
            assert_eq!((flat.len(), dim), (n * DIM, DIM));
            // The progress record is written after its batch, in its own
            // transaction: it is the last batch or the one before.
            let last: usize = s.get_record("progress", "last").unwrap().unwrap();
            assert!(
                last + 1 == batches || last + 2 == batches,
                "{last} vs {batches}"
            );
            eprintln!("round {round}: killed after {batches} whole batches");
        }
    }
}
