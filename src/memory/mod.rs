//! Memory: FALCON's long-term memory (embedder + vector index + durable
//! store) and short-term device buffer, error-type statistics, MEMCoder's
//! evolving task/API guidelines and MemoCoder's fixing knowledge.
//!
//! - [`embed`]: `minilm`, `policy` and `hash` embedders (unit vectors).
//! - [`index`]: [`VectorIndex`]: exact on-device search, FAISS IVF/HNSW.
//! - [`store`]: the SQLite database in the run directory (WAL); every other
//!   memory persists through it, and the index is rebuilt from it.
//! - [`long_term`]: insert / retrieve of (task, code, feedback, scores) and
//!   FALCON's Table 7 prompt.
//! - [`short_term`]: ring buffer of recent samples as device tensors.
//! - [`stats`]: `P_error` over the run for `R_negative` (Eq. 11).
//! - [`render`]: how retrieved entries and fixes are shown in a prompt.
//! - [`guidelines`]: MEMCoder §IV, the evolving task and API guidelines;
//!   [`fixes`]: MemoCoder's fixing knowledge and mentor.
//! - [`open_long_term`]: the one opener of a run's long-term memory.
//!
//! See docs/memory.md.

pub mod embed;
pub mod fixes;
pub mod guidelines;
pub mod index;
pub mod long_term;
pub mod render;
pub mod short_term;
pub mod stats;
pub mod store;

use std::path::PathBuf;

pub use embed::{Embedder, HashEmbedder, MiniLm, PolicyEmbedder};
#[cfg(feature = "faiss")]
pub use index::FaissIndex;
pub use index::{ExactIndex, Hit, VectorIndex};
pub use long_term::{LongTerm, Retrieved};
pub use short_term::ShortTerm;
pub use store::{MemoryStore, StoreError};

use crate::model::ModelError;

/// What can go wrong in the memory module. File-related variants carry the
/// path.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    BadFile { path: PathBuf, reason: String },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Memcoder(#[from] guidelines::MemcoderError),
    #[error(transparent)]
    Stats(#[from] stats::StatsError),
    #[error(transparent)]
    Fixes(#[from] fixes::FixesError),
}

impl MemoryError {
    #[cfg_attr(not(feature = "faiss"), allow(dead_code))]
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        MemoryError::Io {
            path: path.into(),
            source,
        }
    }
}

/// The embedder `[memory] embedder` names. `policy` needs the loaded policy
/// and is built by the trainer with [`PolicyEmbedder::new`], not here.
pub fn embedder_from_config(
    cfg: &crate::config::MemoryConfig,
    device: tch::Device,
) -> Result<Box<dyn Embedder>, MemoryError> {
    use crate::config::EmbedderKind;
    match cfg.embedder {
        EmbedderKind::Hash => Ok(Box::new(HashEmbedder::new(cfg.hash_dim)?)),
        EmbedderKind::Minilm => {
            let dir = if cfg.minilm_dir.trim().is_empty() {
                embed::default_minilm_dir()
            } else {
                PathBuf::from(&cfg.minilm_dir)
            };
            Ok(Box::new(MiniLm::load(&dir, device)?))
        }
        EmbedderKind::Policy => Err(MemoryError::Invalid(
            "[memory] embedder = \"policy\" embeds with the policy of a run; outside a run use \"minilm\" or \"hash\"".into(),
        )),
    }
}

/// A run's long-term memory (store and index) with the embedder its
/// vectors were made by: retrieval and insertion need no other argument.
pub struct LongTermMemory {
    pub entries: LongTerm,
    pub embedder: Box<dyn Embedder>,
}

impl LongTermMemory {
    /// The `k` most similar past entries for each text, best first.
    pub fn retrieve(
        &mut self,
        texts: &[&str],
        k: usize,
    ) -> Result<Vec<Vec<Retrieved>>, MemoryError> {
        self.entries.retrieve(self.embedder.as_ref(), texts, k)
    }

    /// Embed, store and index a batch of finished samples.
    pub fn insert(
        &mut self,
        batch: Vec<long_term::LongTermRecord>,
    ) -> Result<Vec<i64>, MemoryError> {
        self.entries.insert(self.embedder.as_ref(), batch)
    }

    /// Entries in the store (of every embedder).
    pub fn len(&self) -> Result<u64, MemoryError> {
        Ok(self.entries.store().count_long_term()?)
    }

    pub fn is_empty(&self) -> Result<bool, MemoryError> {
        Ok(self.len()? == 0)
    }
}

/// How a command opens a run's long-term memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read what a run wrote: the database must be there, and its entries
    /// must have been embedded by `[memory] embedder` (else retrieval would
    /// silently find nothing).
    Read,
    /// The training run's own memory: created when missing; entries of
    /// steps after `step` are forgotten (a resumed run repeats those steps).
    Train { step: u64 },
}

/// The one opener of long-term memory: `run_dir`'s store searched with the
/// embedder and index `cfg` names.
pub fn open_long_term(
    cfg: &crate::config::MemoryConfig,
    run_dir: &std::path::Path,
    device: tch::Device,
    access: Access,
) -> Result<LongTermMemory, MemoryError> {
    let db = run_dir.join(store::DB_FILE);
    let store = match access {
        Access::Read if !db.is_file() => {
            return Err(MemoryError::Invalid(format!(
                "{}: no memory database here (a `falcon train` run with [meta] long_term = true writes it)",
                db.display()
            )))
        }
        Access::Read => MemoryStore::open(run_dir)?,
        Access::Train { step } => {
            let mut s = MemoryStore::open(run_dir)?;
            s.truncate_long_term_after(step)?;
            s
        }
    };
    let embedder = embedder_from_config(cfg, device)?;
    if access == Access::Read && store.count_long_term()? > 0 {
        let spaces = store.embedders()?;
        if !spaces.contains_key(&embedder.name()) {
            let here: Vec<String> = spaces
                .iter()
                .map(|(k, n)| format!("{k} ({n} entries)"))
                .collect();
            return Err(MemoryError::Invalid(format!(
                "{}: no long-term entries embedded by `{}`; the entries here were embedded by {}: set [memory] embedder to match the run",
                db.display(),
                embedder.name(),
                here.join(", ")
            )));
        }
    }
    let index = index_from_config(cfg, embedder.dim(), device)?;
    let entries = LongTerm::with_store(store, embedder.as_ref(), index)?;
    Ok(LongTermMemory { entries, embedder })
}

/// The vector index `[memory] index` names, for vectors of `dim`.
pub fn index_from_config(
    cfg: &crate::config::MemoryConfig,
    dim: usize,
    device: tch::Device,
) -> Result<Box<dyn VectorIndex>, MemoryError> {
    use crate::config::IndexKind;
    match cfg.index {
        IndexKind::Exact => Ok(Box::new(ExactIndex::new(dim, device))),
        #[cfg(feature = "faiss")]
        IndexKind::Faiss => Ok(Box::new(FaissIndex::new(
            dim,
            &cfg.faiss_factory,
            Some(cfg.nprobe),
            cfg.faiss_train_size,
        )?)),
        #[cfg(not(feature = "faiss"))]
        IndexKind::Faiss => Err(MemoryError::Invalid(
            "[memory] index = \"faiss\": this build has no FAISS (cargo feature `faiss`)".into(),
        )),
    }
}
