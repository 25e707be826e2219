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
//! - [`memcoder`]: MEMCoder §IV; [`fixes`]: MemoCoder's fixing knowledge and
//!   mentor.
//!
//! See docs/memory.md.

pub mod embed;
pub mod fixes;
pub mod index;
pub mod long_term;
pub mod memcoder;
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
    Memcoder(#[from] memcoder::MemcoderError),
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
