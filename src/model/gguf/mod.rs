//! GGUF model files: reading them and turning them into a Hugging Face model directory.
//!
//! This module owns everything GGUF-specific in falcon-rl: parsing the container (v2 and v3,
//! little endian) over a memory map, dequantizing the tensor types we support to `f32` (the
//! legacy 4/5/8-bit blocks, the k-quants Q2_K-Q6_K and IQ4_NL/IQ4_XS), mapping
//! llama.cpp's tensor names and layouts back to the Hugging Face ones for the `llama`, `qwen2` and `qwen3`
//! architectures, and rebuilding `config.json`, `generation_config.json` and the tokenizer files
//! from the metadata. The reference for every choice is what `transformers` does when it loads
//! the same file with `from_pretrained(..., gguf_file=...)`, so that a converted directory and
//! the GGUF give the same weights and the same token ids.
//!
//! Nothing here panics on malformed input: every offset and length read from the file is
//! checked before it is used, and errors name the file.
//!
//! [`file`] reads the container and dequantizes; [`convert`] writes the
//! Hugging Face directory; [`tokenizer`] rebuilds the tokenizer files.

use crate::fsutil::IoError;
use std::path::PathBuf;

mod convert;
mod file;
#[cfg(test)]
mod testing;
mod tokenizer;

pub use convert::*;
pub use file::*;

/// Everything that can go wrong reading or converting a GGUF file. Each variant carries the path
/// of the file (or output file) it concerns.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// A file operation failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// The file does not start with the GGUF magic.
    #[error("{}: not a GGUF file (starts with {found:02x?}, expected \"GGUF\")", path.display())]
    BadMagic { path: PathBuf, found: Vec<u8> },
    /// Only GGUF versions 2 and 3 are read (v1 used 32-bit counts and is long obsolete).
    #[error("{}: GGUF version {version} is not supported (supported: 2, 3)", path.display())]
    UnsupportedVersion { path: PathBuf, version: u32 },
    /// The file ends before a structure it declares.
    #[error("{}: truncated: {what} at byte {offset} needs {needed} bytes, but the file is {len} bytes long", path.display())]
    Truncated {
        path: PathBuf,
        what: String,
        offset: u64,
        needed: u64,
        len: u64,
    },
    /// The file is structurally invalid in some other way.
    #[error("{}: malformed GGUF: {what}", path.display())]
    Malformed { path: PathBuf, what: String },
    /// A tensor's ggml type id is not one ggml defines.
    #[error("{}: tensor '{tensor}' has unknown ggml type id {type_id}", path.display())]
    UnknownTensorType {
        path: PathBuf,
        tensor: String,
        type_id: u32,
    },
    /// A tensor's type is a real ggml type that we do not dequantize.
    #[error("{}: tensor '{tensor}' has type {type_name} (id {type_id}), which cannot be dequantized here (supported: {})", path.display(), file::DEQUANTIZED_TYPES)]
    UnsupportedTensorType {
        path: PathBuf,
        tensor: String,
        type_name: &'static str,
        type_id: u32,
    },
    /// A tensor's data lies (partly) outside the file.
    #[error("{}: tensor '{tensor}' data [{start}, {end}) extends past the end of the file ({len} bytes)", path.display())]
    TensorOutOfBounds {
        path: PathBuf,
        tensor: String,
        start: u64,
        end: u64,
        len: u64,
    },
    /// A metadata key the conversion needs is absent.
    #[error("{}: metadata key '{key}' is missing", path.display())]
    MissingMetadata { path: PathBuf, key: String },
    /// A metadata key has a value of the wrong type or range.
    #[error("{}: metadata key '{key}' should be {expected}, found {found}", path.display())]
    BadMetadata {
        path: PathBuf,
        key: String,
        expected: &'static str,
        found: String,
    },
    /// A tensor the target architecture needs is absent.
    #[error("{}: tensor '{tensor}' is missing", path.display())]
    MissingTensor { path: PathBuf, tensor: String },
    /// A tensor's shape does not fit the model described by the metadata.
    #[error("{}: tensor '{tensor}': {what}", path.display())]
    BadTensorShape {
        path: PathBuf,
        tensor: String,
        what: String,
    },
    /// The file is valid but describes something the converter does not handle
    /// (an architecture or tokenizer model).
    #[error("{}: unsupported: {what}", path.display())]
    Unsupported { path: PathBuf, what: String },
}
