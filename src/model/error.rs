use std::path::PathBuf;

/// Everything that can go wrong while loading, running or saving a model.
/// File-related variants always carry the path, so a user knows which file to fix.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
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
    #[error("model not found: {0}")]
    NotFound(String),
    #[error(transparent)]
    Gguf(#[from] super::gguf::GgufError),
    #[error(transparent)]
    Write(#[from] crate::fsutil::WriteError),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn bad(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        ModelError::BadFile {
            path: path.into(),
            reason: reason.into(),
        }
    }
}
