//! GGUF model files: reading them and turning them into a Hugging Face model directory.
//!
//! This module owns everything GGUF-specific in falcon-rl: parsing the container (v2 and v3,
//! little endian) over a memory map, dequantizing the tensor types we support to `f32`, mapping
//! llama.cpp's tensor names and layouts back to the Hugging Face ones for the `llama` and `qwen2`
//! architectures, and rebuilding `config.json`, `generation_config.json` and the tokenizer files
//! from the metadata. The reference for every choice is what `transformers` does when it loads
//! the same file with `from_pretrained(..., gguf_file=...)`, so that a converted directory and
//! the GGUF give the same weights and the same token ids.
//!
//! Nothing here panics on malformed input: every offset and length read from the file is
//! checked before it is used, and errors name the file.

use crate::fsutil::{io_err, IoError};
use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use serde_json::{json, Map, Value};

const GGUF_MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's GGML_MAX_DIMS; llama.cpp rejects tensors with more.
const MAX_DIMS: u32 = 4;
/// Bounds recursion on nested arrays so a hostile file cannot overflow the stack.
const MAX_ARRAY_NESTING: u32 = 8;

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
    #[error("{}: tensor '{tensor}' has type {type_name} (id {type_id}), which cannot be dequantized here (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)", path.display())]
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

/// One metadata value, with the GGUF value type it was stored as.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// The value as a signed integer, for any integer type that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            MetaValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as an unsigned integer, for any integer type holding a non-negative value.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U64(v) => Some(v),
            _ => self.as_i64().and_then(|v| u64::try_from(v).ok()),
        }
    }

    /// The value as a float, for float types (integers are not silently widened).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a string slice, if it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as a bool, if it is a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The elements, if the value is an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(items) => Some(items),
            _ => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            MetaValue::String(s) => format!("string {s:?}"),
            MetaValue::Array(items) => format!("array of {} elements", items.len()),
            other => format!("{other:?}"),
        }
    }
}

/// ggml tensor types: (id, name, elements per block, bytes per block). Listing the types we cannot
/// dequantize too lets `open` check every tensor's extent and tell "unknown" from "unsupported".
const GGML_TYPES: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 36),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
];

const TYPE_F32: u32 = 0;
const TYPE_F16: u32 = 1;
const TYPE_Q4_0: u32 = 2;
const TYPE_Q4_1: u32 = 3;
const TYPE_Q8_0: u32 = 8;
const TYPE_BF16: u32 = 30;

/// One tensor's description from the GGUF header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The llama.cpp name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions as GGUF lists them: fastest-varying first (the reverse of the PyTorch shape).
    pub dims: Vec<u64>,
    /// ggml type id.
    pub type_id: u32,
    /// ggml type name, e.g. `Q4_1`.
    pub type_name: &'static str,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Byte length of the data.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// The PyTorch / Hugging Face shape (slowest-varying first).
    pub fn hf_shape(&self) -> Vec<usize> {
        // Fits in usize: open() checked the byte extent lies inside a mapped file.
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// An open, memory-mapped GGUF file with its parsed header.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: BTreeMap<String, MetaValue>,
    tensors: Vec<TensorInfo>,
}

/// Bounds-checked little-endian reader over the mapped bytes.
struct Reader<'a> {
    path: &'a Path,
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        let available = (self.buf.len() - self.pos) as u64;
        if n > available {
            return Err(GgufError::Truncated {
                path: self.path.to_path_buf(),
                what: what.to_string(),
                offset: self.pos as u64,
                needed: n,
                len: self.buf.len() as u64,
            });
        }
        // n <= available <= usize::MAX, so the cast is lossless.
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let at = self.pos;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::Malformed {
            path: self.path.to_path_buf(),
            what: format!("{what} at byte {at} is not valid UTF-8"),
        })
    }

    fn value(&mut self, value_type: u32, key: &str, depth: u32) -> Result<MetaValue, GgufError> {
        let what = format!("value of metadata key '{key}'");
        Ok(match value_type {
            0 => MetaValue::U8(u8::from_le_bytes(self.array(&what)?)),
            1 => MetaValue::I8(i8::from_le_bytes(self.array(&what)?)),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(&what)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(&what)?)),
            4 => MetaValue::U32(u32::from_le_bytes(self.array(&what)?)),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(&what)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(&what)?)),
            7 => MetaValue::Bool(u8::from_le_bytes(self.array(&what)?) != 0),
            8 => MetaValue::String(self.string(&what)?),
            9 => {
                if depth >= MAX_ARRAY_NESTING {
                    return Err(self.malformed(format!(
                        "metadata key '{key}' nests arrays more than {MAX_ARRAY_NESTING} deep"
                    )));
                }
                let item_type = self.u32(&what)?;
                let count = self.u64(&what)?;
                // Every element takes at least one byte, so a count beyond the remaining bytes is
                // a lie; checking it first keeps a hostile count from driving a huge allocation.
                if count > self.remaining() {
                    return Err(GgufError::Truncated {
                        path: self.path.to_path_buf(),
                        what: format!("{count}-element array of metadata key '{key}'"),
                        offset: self.pos as u64,
                        needed: count,
                        len: self.buf.len() as u64,
                    });
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(item_type, key, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(u64::from_le_bytes(self.array(&what)?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(&what)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(&what)?)),
            other => {
                return Err(self.malformed(format!(
                    "metadata key '{key}' has unknown value type {other}"
                )))
            }
        })
    }

    fn malformed(&self, what: String) -> GgufError {
        GgufError::Malformed {
            path: self.path.to_path_buf(),
            what,
        }
    }
}

impl GgufFile {
    /// Opens and memory-maps `path`, parsing the header, metadata and tensor infos, and checking
    /// that every tensor's data lies inside the file.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let file = File::open(path).map_err(io_err(path, "cannot open"))?;
        // SAFETY: the map is read-only and private to this process. Another process truncating
        // or rewriting the file while we hold the map is the one hazard memmap2 cannot rule out;
        // model files are not edited in place, and that is the usual contract for mapping them.
        let map = unsafe { Mmap::map(&file) }.map_err(io_err(path, "cannot memory-map"))?;
        let mut gguf = GgufFile {
            path: path.to_path_buf(),
            map,
            version: 0,
            alignment: DEFAULT_ALIGNMENT,
            data_offset: 0,
            metadata: BTreeMap::new(),
            tensors: Vec::new(),
        };
        gguf.parse()?;
        Ok(gguf)
    }

    fn parse(&mut self) -> Result<(), GgufError> {
        let path = self.path.as_path();
        let mut r = Reader {
            path,
            buf: &self.map[..],
            pos: 0,
        };
        let len = r.buf.len() as u64;
        let magic = r.take(4, "magic")?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic {
                path: path.to_path_buf(),
                found: magic.to_vec(),
            });
        }
        let version = r.u32("version")?;
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion {
                path: path.to_path_buf(),
                version,
            });
        }
        let tensor_count = r.u64("tensor count")?;
        let kv_count = r.u64("metadata count")?;

        let mut metadata = BTreeMap::new();
        for i in 0..kv_count {
            let key = r.string(&format!("key of metadata entry {i}"))?;
            let value_type = r.u32(&format!("type of metadata key '{key}'"))?;
            let value = r.value(value_type, &key, 0)?;
            if metadata.contains_key(&key) {
                return Err(r.malformed(format!("duplicate metadata key '{key}'")));
            }
            metadata.insert(key, value);
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() => a,
                _ => {
                    return Err(r.malformed(format!(
                        "general.alignment must be a power of two, found {}",
                        v.describe()
                    )))
                }
            },
        };

        let mut raw = Vec::new();
        let mut seen = HashSet::new();
        for i in 0..tensor_count {
            let name = r.string(&format!("name of tensor {i}"))?;
            let what = format!("info of tensor '{name}'");
            let n_dims = r.u32(&what)?;
            if n_dims > MAX_DIMS {
                return Err(r.malformed(format!(
                    "tensor '{name}' has {n_dims} dimensions (at most {MAX_DIMS})"
                )));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64(&what)?);
            }
            let type_id = r.u32(&what)?;
            let offset = r.u64(&what)?;
            if !seen.insert(name.clone()) {
                return Err(r.malformed(format!("duplicate tensor name '{name}'")));
            }
            raw.push((name, dims, type_id, offset));
        }

        let header_end = r.pos as u64;
        // header_end <= file length, so rounding it up cannot overflow.
        let data_offset = header_end.div_ceil(alignment) * alignment;

        let mut tensors = Vec::with_capacity(raw.len());
        for (name, dims, type_id, rel_offset) in raw {
            let Some(&(_, type_name, block, type_size)) =
                GGML_TYPES.iter().find(|t| t.0 == type_id)
            else {
                return Err(GgufError::UnknownTensorType {
                    path: path.to_path_buf(),
                    tensor: name,
                    type_id,
                });
            };
            let n_elements = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| {
                    r.malformed(format!("tensor '{name}' has an overflowing shape {dims:?}"))
                })?;
            let row = dims.first().copied().unwrap_or(1);
            if !row.is_multiple_of(block) {
                return Err(r.malformed(format!(
                    "tensor '{name}' of type {type_name} has rows of {row} elements, not a multiple of its block size {block}"
                )));
            }
            let n_bytes = (n_elements / block)
                .checked_mul(type_size)
                .ok_or_else(|| r.malformed(format!("tensor '{name}' is too large")))?;
            let start = data_offset.checked_add(rel_offset);
            let end = start.and_then(|s| s.checked_add(n_bytes));
            match (start, end) {
                (Some(start), Some(end)) if end <= len => {
                    tensors.push(TensorInfo {
                        name,
                        dims,
                        type_id,
                        type_name,
                        offset: start,
                        n_bytes,
                    });
                }
                _ => {
                    return Err(GgufError::TensorOutOfBounds {
                        path: path.to_path_buf(),
                        tensor: name,
                        start: start.unwrap_or(u64::MAX),
                        end: end.unwrap_or(u64::MAX),
                        len,
                    })
                }
            }
        }

        self.version = version;
        self.alignment = alignment;
        self.data_offset = data_offset;
        self.metadata = metadata;
        self.tensors = tensors;
        Ok(())
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Data alignment (`general.alignment`, 32 when absent).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset where the tensor data section starts.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// `general.architecture`, e.g. `llama` or `qwen2`.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(MetaValue::as_str)
    }

    /// All metadata, by key.
    pub fn metadata(&self) -> &BTreeMap<String, MetaValue> {
        &self.metadata
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// Tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The info of the tensor named `name` (llama.cpp naming).
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of a tensor as stored in the file.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        // open() checked offset + n_bytes <= file length for every TensorInfo it built; `get`
        // keeps a TensorInfo from another file from panicking.
        let start = info.offset as usize;
        let end = start.saturating_add(info.n_bytes as usize);
        self.map.get(start..end).unwrap_or(&[])
    }

    /// Dequantizes a tensor to `f32`, in the file's element order (row-major for the HF shape).
    pub fn dequantize(&self, info: &TensorInfo) -> Result<Vec<f32>, GgufError> {
        let bytes = self.tensor_bytes(info);
        let n = info.n_elements() as usize;
        dequantize_bytes(info.type_id, bytes, n).ok_or_else(|| GgufError::UnsupportedTensorType {
            path: self.path.clone(),
            tensor: info.name.clone(),
            type_name: info.type_name,
            type_id: info.type_id,
        })
    }

    fn require_tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor(name).ok_or_else(|| GgufError::MissingTensor {
            path: self.path.clone(),
            tensor: name.to_string(),
        })
    }

    fn bad_metadata(&self, key: &str, expected: &'static str, found: &MetaValue) -> GgufError {
        GgufError::BadMetadata {
            path: self.path.clone(),
            key: key.to_string(),
            expected,
            found: found.describe(),
        }
    }

    fn opt_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.bad_metadata(key, "a non-negative integer", v)),
        }
    }

    fn req_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.opt_u64(key)?
            .ok_or_else(|| GgufError::MissingMetadata {
                path: self.path.clone(),
                key: key.to_string(),
            })
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.bad_metadata(key, "a float", v)),
        }
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.bad_metadata(key, "a bool", v)),
        }
    }

    fn opt_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.bad_metadata(key, "a string", v)),
        }
    }

    fn opt_str_array(&self, key: &str) -> Result<Option<Vec<&str>>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .and_then(|items| items.iter().map(MetaValue::as_str).collect())
                .map(Some)
                .ok_or_else(|| self.bad_metadata(key, "an array of strings", v)),
        }
    }

    fn opt_int_array(&self, key: &str) -> Result<Option<Vec<i64>>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .and_then(|items| items.iter().map(MetaValue::as_i64).collect())
                .map(Some)
                .ok_or_else(|| self.bad_metadata(key, "an array of integers", v)),
        }
    }
}

fn can_dequantize(type_id: u32) -> bool {
    matches!(
        type_id,
        TYPE_F32 | TYPE_F16 | TYPE_BF16 | TYPE_Q8_0 | TYPE_Q4_0 | TYPE_Q4_1
    )
}

/// `None` when the type is not one we dequantize. `bytes` must be exactly the tensor's extent
/// for `n` elements, which `GgufFile::open` guarantees; anything else yields a short result
/// rather than a panic.
fn dequantize_bytes(type_id: u32, bytes: &[u8], n: usize) -> Option<Vec<f32>> {
    let mut out = Vec::with_capacity(n);
    let half_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    match type_id {
        TYPE_F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        TYPE_F16 => out.extend(bytes.chunks_exact(2).map(|c| half_at(c, 0))),
        TYPE_BF16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()),
        ),
        TYPE_Q8_0 => {
            for block in bytes.chunks_exact(34) {
                let d = half_at(block, 0);
                out.extend(block[2..].iter().map(|&q| f32::from(q as i8) * d));
            }
        }
        TYPE_Q4_0 => {
            for block in bytes.chunks_exact(18) {
                let d = half_at(block, 0);
                let qs = &block[2..];
                // Low nibbles hold elements 0..16, high nibbles 16..32 (not interleaved).
                out.extend(qs.iter().map(|&q| f32::from((q & 0x0f) as i8 - 8) * d));
                out.extend(qs.iter().map(|&q| f32::from((q >> 4) as i8 - 8) * d));
            }
        }
        TYPE_Q4_1 => {
            for block in bytes.chunks_exact(20) {
                let d = half_at(block, 0);
                let m = half_at(block, 2);
                let qs = &block[4..];
                out.extend(qs.iter().map(|&q| f32::from(q & 0x0f) * d + m));
                out.extend(qs.iter().map(|&q| f32::from(q >> 4) * d + m));
            }
        }
        _ => return None,
    }
    Some(out)
}

/// Element type of the written `model.safetensors`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutDtype {
    F32,
    BF16,
    F16,
}

impl OutDtype {
    fn safetensors_name(self) -> &'static str {
        match self {
            OutDtype::F32 => "F32",
            OutDtype::BF16 => "BF16",
            OutDtype::F16 => "F16",
        }
    }

    fn torch_name(self) -> &'static str {
        match self {
            OutDtype::F32 => "float32",
            OutDtype::BF16 => "bfloat16",
            OutDtype::F16 => "float16",
        }
    }

    fn size(self) -> u64 {
        match self {
            OutDtype::F32 => 4,
            OutDtype::BF16 | OutDtype::F16 => 2,
        }
    }

    fn encode(self, values: &[f32], out: &mut Vec<u8>) {
        out.clear();
        out.reserve(values.len() * self.size() as usize);
        match self {
            OutDtype::F32 => values
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            // half's from_f32 rounds to nearest even, as torch's .to(dtype) does.
            OutDtype::BF16 => values
                .iter()
                .for_each(|v| out.extend_from_slice(&bf16::from_f32(*v).to_le_bytes())),
            OutDtype::F16 => values
                .iter()
                .for_each(|v| out.extend_from_slice(&f16::from_f32(*v).to_le_bytes())),
        }
    }
}

/// What `convert_to_hf` did.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertSummary {
    /// `general.architecture` of the source.
    pub architecture: String,
    /// Number of tensors written to `model.safetensors`.
    pub tensors_written: usize,
    /// Total number of elements written.
    pub parameters: u64,
    /// GGUF tensors with no Hugging Face counterpart, left out (e.g. `rope_freqs.weight`).
    pub skipped_tensors: Vec<String>,
    /// Whether `lm_head` shares the embedding (no `output.weight` in the GGUF).
    pub tie_word_embeddings: bool,
    /// Whether Q/K rows were un-permuted (llama.cpp permutes them for `llama` only).
    pub unpermuted_qk: bool,
    /// The files written, in `out_dir`.
    pub files: Vec<PathBuf>,
}

/// Model families this converter understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arch {
    Llama,
    Qwen2,
}

impl Arch {
    fn model_type(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
        }
    }

    fn class(self) -> &'static str {
        match self {
            Arch::Llama => "LlamaForCausalLM",
            Arch::Qwen2 => "Qwen2ForCausalLM",
        }
    }
}

/// The Hugging Face name of a llama.cpp tensor, for the decoder-only layout shared by `llama`
/// and `qwen2`; `None` for tensors that have no counterpart.
fn hf_tensor_name(gguf_name: &str) -> Option<String> {
    match gguf_name {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (module, kind) = rest.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    let hf_module = match module {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf_module}.{kind}"))
}

/// Inverse of llama.cpp's convert-time `permute(w, n_head, n_head_kv)`, which views the rows as
/// `(n_head, 2, half, ...)` and swaps the middle axes so that rotary pairs sit side by side as
/// llama.cpp's kernel wants; Hugging Face keeps the two rotary halves apart. `data` is row-major
/// with `rows` rows; `None` when `rows` does not split into `n_head` heads of even size.
fn unpermute_rows(data: &[f32], rows: usize, n_head: usize) -> Option<Vec<f32>> {
    if n_head == 0
        || rows == 0
        || !rows.is_multiple_of(2 * n_head)
        || !data.len().is_multiple_of(rows)
    {
        return None;
    }
    let cols = data.len() / rows;
    let half = rows / n_head / 2;
    let mut out = vec![0f32; data.len()];
    for h in 0..n_head {
        for j in 0..2 {
            for i in 0..half {
                let hf_row = h * 2 * half + j * half + i;
                let gguf_row = h * 2 * half + i * 2 + j;
                out[hf_row * cols..(hf_row + 1) * cols]
                    .copy_from_slice(&data[gguf_row * cols..(gguf_row + 1) * cols]);
            }
        }
    }
    Some(out)
}

/// Hyperparameters read from `{arch}.*` metadata.
struct Hparams {
    hidden: u64,
    intermediate: u64,
    layers: u64,
    heads: u64,
    kv_heads: u64,
    rms_eps: f64,
    rope_theta: f64,
    context: Option<u64>,
    head_dim: Option<u64>,
    vocab_size: Option<u64>,
}

fn read_hparams(g: &GgufFile, arch: &str) -> Result<Hparams, GgufError> {
    let key = |k: &str| format!("{arch}.{k}");
    let heads = g.req_u64(&key("attention.head_count"))?;
    if heads == 0 {
        return Err(g.bad_metadata(
            &key("attention.head_count"),
            "a positive integer",
            &MetaValue::U64(0),
        ));
    }
    let kv_heads = g.opt_u64(&key("attention.head_count_kv"))?.unwrap_or(heads);
    Ok(Hparams {
        hidden: g.req_u64(&key("embedding_length"))?,
        intermediate: g.req_u64(&key("feed_forward_length"))?,
        layers: g.req_u64(&key("block_count"))?,
        heads,
        kv_heads,
        // transformers' LlamaConfig / Qwen2Config default when the key is absent.
        rms_eps: g
            .opt_f64(&key("attention.layer_norm_rms_epsilon"))?
            .unwrap_or(1e-6),
        rope_theta: g.opt_f64(&key("rope.freq_base"))?.unwrap_or(10000.0),
        context: g.opt_u64(&key("context_length"))?,
        head_dim: g.opt_u64(&key("rope.dimension_count"))?,
        vocab_size: g.opt_u64(&key("vocab_size"))?,
    })
}

/// Special token ids from `tokenizer.ggml.*`.
struct SpecialIds {
    bos: Option<u64>,
    eos: Option<u64>,
    unk: Option<u64>,
    pad: Option<u64>,
}

fn read_special_ids(g: &GgufFile) -> Result<SpecialIds, GgufError> {
    Ok(SpecialIds {
        bos: g.opt_u64("tokenizer.ggml.bos_token_id")?,
        eos: g.opt_u64("tokenizer.ggml.eos_token_id")?,
        unk: g.opt_u64("tokenizer.ggml.unknown_token_id")?,
        pad: g.opt_u64("tokenizer.ggml.padding_token_id")?,
    })
}

fn build_config(
    arch: Arch,
    hp: &Hparams,
    ids: &SpecialIds,
    vocab_size: u64,
    tie: bool,
    attention_bias: bool,
    dtype: OutDtype,
) -> Value {
    let mut c = Map::new();
    c.insert("architectures".into(), json!([arch.class()]));
    c.insert("model_type".into(), json!(arch.model_type()));
    c.insert("hidden_size".into(), json!(hp.hidden));
    c.insert("intermediate_size".into(), json!(hp.intermediate));
    c.insert("num_hidden_layers".into(), json!(hp.layers));
    c.insert("num_attention_heads".into(), json!(hp.heads));
    c.insert("num_key_value_heads".into(), json!(hp.kv_heads));
    // transformers takes head_dim from rope.dimension_count for llama only.
    if arch == Arch::Llama {
        if let Some(hd) = hp.head_dim {
            c.insert("head_dim".into(), json!(hd));
        }
        c.insert("attention_bias".into(), json!(attention_bias));
    }
    c.insert("hidden_act".into(), json!("silu"));
    c.insert("rms_norm_eps".into(), json!(hp.rms_eps));
    // transformers 5 keeps rope settings in `rope_parameters`; `rope_theta` stays for readers
    // written against the older flat layout.
    c.insert("rope_theta".into(), json!(hp.rope_theta));
    c.insert(
        "rope_parameters".into(),
        json!({"rope_type": "default", "rope_theta": hp.rope_theta}),
    );
    if let Some(ctx) = hp.context {
        c.insert("max_position_embeddings".into(), json!(ctx));
    }
    c.insert("vocab_size".into(), json!(vocab_size));
    c.insert("tie_word_embeddings".into(), json!(tie));
    for (name, id) in [
        ("bos_token_id", ids.bos),
        ("eos_token_id", ids.eos),
        ("pad_token_id", ids.pad),
        ("unk_token_id", ids.unk),
    ] {
        if let Some(id) = id {
            c.insert(name.into(), json!(id));
        }
    }
    // transformers 5 reads `dtype`; older readers and our own tooling look for `torch_dtype`.
    c.insert("torch_dtype".into(), json!(dtype.torch_name()));
    c.insert("dtype".into(), json!(dtype.torch_name()));
    Value::Object(c)
}

/// One tensor of the output checkpoint, before its data is produced.
struct OutTensor<'a> {
    hf_name: String,
    info: &'a TensorInfo,
    shape: Vec<usize>,
    /// Heads to un-permute rows over (llama Q/K), if any.
    unpermute_heads: Option<usize>,
}

/// Converts the GGUF at `gguf` into a Hugging Face model directory `out_dir` (created if needed):
/// `model.safetensors` (HF names and shapes, `dtype`, `{"format":"pt"}` metadata), `config.json`,
/// `generation_config.json`, `tokenizer.json`, `tokenizer_config.json` and
/// `special_tokens_map.json`. Each file is written atomically. Supports the `llama` and `qwen2`
/// architectures with a `gpt2` (byte-level BPE) tokenizer.
pub fn convert_to_hf(
    gguf: &Path,
    out_dir: &Path,
    dtype: OutDtype,
) -> Result<ConvertSummary, GgufError> {
    let g = GgufFile::open(gguf)?;
    let arch_name = g
        .opt_str("general.architecture")?
        .ok_or_else(|| GgufError::MissingMetadata {
            path: g.path.clone(),
            key: "general.architecture".into(),
        })?
        .to_string();
    let arch = match arch_name.as_str() {
        "llama" => Arch::Llama,
        "qwen2" => Arch::Qwen2,
        other => {
            return Err(GgufError::Unsupported {
                path: g.path.clone(),
                what: format!("architecture '{other}' (supported: llama, qwen2)"),
            })
        }
    };
    let hp = read_hparams(&g, &arch_name)?;
    let ids = read_special_ids(&g)?;

    // Build the tokenizer files first: they are cheap and fail fast on unsupported vocabularies.
    let tok = build_tokenizer_files(&g, &ids)?;

    let tie = g.tensor("output.weight").is_none();
    let (plan, skipped) = plan_tensors(&g, arch, &hp, tie)?;
    let embd = g.require_tensor("token_embd.weight")?;
    let vocab_size = hp
        .vocab_size
        .or(tok.vocab_len)
        .unwrap_or_else(|| embd.dims.get(1).copied().unwrap_or(0));
    let attention_bias = g.tensor("blk.0.attn_q.bias").is_some();
    let config = build_config(arch, &hp, &ids, vocab_size, tie, attention_bias, dtype);

    let mut generation = Map::new();
    generation.insert("_from_model_config".into(), json!(true));
    for (name, id) in [
        ("bos_token_id", ids.bos),
        ("eos_token_id", ids.eos),
        ("pad_token_id", ids.pad),
    ] {
        if let Some(id) = id {
            generation.insert(name.into(), json!(id));
        }
    }

    std::fs::create_dir_all(out_dir).map_err(io_err(out_dir, "cannot create directory"))?;
    let mut files = Vec::new();
    let st_path = out_dir.join("model.safetensors");
    let parameters = crate::fsutil::write_atomic_with(&st_path, |w, tmp| {
        write_safetensors(&g, &plan, dtype, w, tmp)
    })?;
    files.push(st_path);
    for (name, text) in [
        ("config.json", pretty(&config)),
        ("generation_config.json", pretty(&Value::Object(generation))),
        ("tokenizer.json", tok.tokenizer_json),
        ("tokenizer_config.json", pretty(&tok.tokenizer_config)),
        ("special_tokens_map.json", pretty(&tok.special_tokens_map)),
    ] {
        let path = out_dir.join(name);
        crate::fsutil::write_atomic_with(&path, |w, tmp| {
            w.write_all(text.as_bytes())
                .map_err(io_err(tmp, "cannot write"))
        })?;
        files.push(path);
    }

    Ok(ConvertSummary {
        architecture: arch_name,
        tensors_written: plan.len(),
        parameters,
        skipped_tensors: skipped,
        tie_word_embeddings: tie,
        unpermuted_qk: arch == Arch::Llama,
        files,
    })
}

fn pretty(v: &Value) -> String {
    // Serializing a Value built from strings and numbers cannot fail; fall back to compact.
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()) + "\n"
}

/// Decides which tensors go into the checkpoint, under which names and shapes, and checks that
/// every tensor the architecture needs is present with a consistent shape.
fn plan_tensors<'a>(
    g: &'a GgufFile,
    arch: Arch,
    hp: &Hparams,
    tie: bool,
) -> Result<(Vec<OutTensor<'a>>, Vec<String>), GgufError> {
    let mut required = vec![
        "token_embd.weight".to_string(),
        "output_norm.weight".to_string(),
    ];
    for l in 0..hp.layers {
        for m in [
            "attn_norm",
            "ffn_norm",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ] {
            required.push(format!("blk.{l}.{m}.weight"));
        }
    }
    for name in &required {
        g.require_tensor(name)?;
    }

    let mut plan = Vec::new();
    let mut skipped = Vec::new();
    for info in &g.tensors {
        let Some(hf_name) = hf_tensor_name(&info.name) else {
            skipped.push(info.name.clone());
            continue;
        };
        if tie && hf_name == "lm_head.weight" {
            continue;
        }
        // Layers past block_count would not be loaded by transformers either.
        if let Some(layer) = info
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|l| l.parse::<u64>().ok())
        {
            if layer >= hp.layers {
                skipped.push(info.name.clone());
                continue;
            }
        }
        let is_q = info.name.contains(".attn_q.");
        let is_k = info.name.contains(".attn_k.");
        let unpermute_heads = match (arch, is_q, is_k) {
            (Arch::Llama, true, _) => Some(hp.heads as usize),
            (Arch::Llama, _, true) => Some(hp.kv_heads as usize),
            _ => None,
        };
        let shape = info.hf_shape();
        if let Some(heads) = unpermute_heads {
            let rows = shape.first().copied().unwrap_or(0);
            if heads == 0 || !rows.is_multiple_of(2 * heads) {
                return Err(GgufError::BadTensorShape {
                    path: g.path.clone(),
                    tensor: info.name.clone(),
                    what: format!(
                        "{rows} rows do not split into {heads} heads of even size, so the rotary permutation cannot be undone"
                    ),
                });
            }
        }
        if !can_dequantize(info.type_id) {
            return Err(GgufError::UnsupportedTensorType {
                path: g.path.clone(),
                tensor: info.name.clone(),
                type_name: info.type_name,
                type_id: info.type_id,
            });
        }
        plan.push(OutTensor {
            hf_name,
            info,
            shape,
            unpermute_heads,
        });
    }
    plan.sort_by(|a, b| a.hf_name.cmp(&b.hf_name));
    Ok((plan, skipped))
}

/// Writes the safetensors layout (u64 header length, JSON header padded with spaces to 8 bytes,
/// then the tensors back to back) one tensor at a time, so peak memory is one dequantized tensor
/// rather than the whole model. Returns the number of elements written.
fn write_safetensors(
    g: &GgufFile,
    plan: &[OutTensor<'_>],
    dtype: OutDtype,
    w: &mut BufWriter<File>,
    path: &Path,
) -> Result<u64, GgufError> {
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0u64;
    for t in plan {
        let len = t.info.n_elements() * dtype.size();
        header.insert(
            t.hf_name.clone(),
            json!({
                "dtype": dtype.safetensors_name(),
                "shape": t.shape,
                "data_offsets": [offset, offset + len],
            }),
        );
        offset += len;
    }
    let mut header_bytes = Value::Object(header).to_string().into_bytes();
    while !header_bytes.len().is_multiple_of(8) {
        header_bytes.push(b' ');
    }
    let write_err = io_err(path, "cannot write");
    w.write_all(&(header_bytes.len() as u64).to_le_bytes())
        .and_then(|_| w.write_all(&header_bytes))
        .map_err(write_err)?;

    let mut parameters = 0u64;
    let mut buf = Vec::new();
    for t in plan {
        let mut values = g.dequantize(t.info)?;
        if let Some(heads) = t.unpermute_heads {
            let rows = t.shape.first().copied().unwrap_or(0);
            values =
                unpermute_rows(&values, rows, heads).ok_or_else(|| GgufError::BadTensorShape {
                    path: g.path.clone(),
                    tensor: t.info.name.clone(),
                    what: format!("cannot un-permute {rows} rows over {heads} heads"),
                })?;
        }
        dtype.encode(&values, &mut buf);
        w.write_all(&buf).map_err(io_err(path, "cannot write"))?;
        parameters += values.len() as u64;
    }
    Ok(parameters)
}

/// The three tokenizer files, rendered.
struct TokenizerFiles {
    tokenizer_json: String,
    tokenizer_config: Value,
    special_tokens_map: Value,
    vocab_len: Option<u64>,
}

/// llama.cpp token types (`tokenizer.ggml.token_type`).
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// GPT-2's reversible byte-to-character table: printable bytes stand for themselves, the rest
/// are shifted to code points from 256 up, in byte order.
fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = matches!(b, 33..=126 | 161..=172 | 174..=255);
        let code = if printable {
            b as u32
        } else {
            let c = next;
            next += 1;
            c
        };
        *slot = char::from_u32(code).unwrap_or('\u{fffd}');
    }
    table
}

/// Rebuilds the tokenizer the way transformers does for a GGUF (see
/// `transformers/integrations/gguf/gguf_tokenizer_mapping.py`): a GPT-2 style byte-level BPE
/// whose pre-tokenizer regex is swapped for a few known `tokenizer.ggml.pre` values, control
/// tokens added as special tokens and user-defined ones as plain added tokens.
fn build_tokenizer_files(g: &GgufFile, ids: &SpecialIds) -> Result<TokenizerFiles, GgufError> {
    let model = g.opt_str("tokenizer.ggml.model")?;
    match model {
        Some("gpt2") => {}
        Some(other) => {
            return Err(GgufError::Unsupported {
                path: g.path.clone(),
                what: format!(
                    "tokenizer model '{other}' (only 'gpt2' byte-level BPE is converted)"
                ),
            })
        }
        None => {
            return Err(GgufError::MissingMetadata {
                path: g.path.clone(),
                key: "tokenizer.ggml.model".into(),
            })
        }
    }
    let tokens =
        g.opt_str_array("tokenizer.ggml.tokens")?
            .ok_or_else(|| GgufError::MissingMetadata {
                path: g.path.clone(),
                key: "tokenizer.ggml.tokens".into(),
            })?;
    let merges =
        g.opt_str_array("tokenizer.ggml.merges")?
            .ok_or_else(|| GgufError::MissingMetadata {
                path: g.path.clone(),
                key: "tokenizer.ggml.merges".into(),
            })?;
    let token_types = g.opt_int_array("tokenizer.ggml.token_type")?;
    if let Some(tt) = &token_types {
        if tt.len() != tokens.len() {
            return Err(GgufError::BadMetadata {
                path: g.path.clone(),
                key: "tokenizer.ggml.token_type".into(),
                expected: "one entry per token",
                found: format!("{} entries for {} tokens", tt.len(), tokens.len()),
            });
        }
    }
    let token_at = |key: &str, id: Option<u64>| -> Result<Option<&str>, GgufError> {
        match id {
            None => Ok(None),
            Some(id) => usize::try_from(id)
                .ok()
                .and_then(|i| tokens.get(i).copied())
                .map(Some)
                .ok_or_else(|| GgufError::BadMetadata {
                    path: g.path.clone(),
                    key: key.into(),
                    expected: "a token id within the vocabulary",
                    found: format!("{id} (vocabulary has {} tokens)", tokens.len()),
                }),
        }
    };
    let bos = token_at("tokenizer.ggml.bos_token_id", ids.bos)?;
    let eos = token_at("tokenizer.ggml.eos_token_id", ids.eos)?;
    let unk = token_at("tokenizer.ggml.unknown_token_id", ids.unk)?;
    let pad = token_at("tokenizer.ggml.padding_token_id", ids.pad)?;
    let add_bos = g.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false);
    let add_eos = g.opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let pre = g.opt_str("tokenizer.ggml.pre")?;
    let chat_template = g.opt_str("tokenizer.chat_template")?;

    // Vocabulary entries are spelled in the byte alphabet; a token written in plain text
    // (outside that alphabet) is respelled from its UTF-8 bytes, as transformers does.
    let table = byte_to_char_table();
    let alphabet: HashSet<char> = table.iter().copied().collect();
    let spelled = |t: &str| -> String {
        if t.chars().all(|c| alphabet.contains(&c)) {
            t.to_string()
        } else {
            t.bytes().map(|b| table[b as usize]).collect()
        }
    };
    // A JSON object keeps the last id of a duplicated token, as a Python dict would.
    let mut vocab = Map::new();
    for (id, t) in tokens.iter().enumerate() {
        vocab.insert(spelled(t), json!(id));
    }
    let merges_json: Vec<Value> = merges
        .iter()
        .map(|m| match m.split_once(' ') {
            Some((a, b)) => json!([a, b]),
            None => json!([m, ""]),
        })
        .collect();

    // Added tokens, in the order transformers adds them: control tokens (special), then
    // user-defined ones (not special). A control token outside the byte alphabet is a llama.cpp
    // mislabel that transformers skips, and so do we.
    let mut added: Vec<(usize, &str, bool)> = Vec::new();
    let mut added_ids = HashSet::new();
    if let Some(tt) = &token_types {
        for (id, (t, &ty)) in tokens.iter().zip(tt).enumerate() {
            if ty == TOKEN_TYPE_CONTROL
                && t.chars().all(|c| alphabet.contains(&c))
                && added_ids.insert(id)
            {
                added.push((id, t, true));
            }
        }
        for (id, (t, &ty)) in tokens.iter().zip(tt).enumerate() {
            if ty == TOKEN_TYPE_USER_DEFINED && vocab.contains_key(*t) && added_ids.insert(id) {
                added.push((id, t, false));
            }
        }
    }
    // transformers also registers bos/eos/unk/pad as special tokens.
    for id in [ids.bos, ids.eos, ids.unk, ids.pad] {
        if let Some(id) = id.and_then(|i| usize::try_from(i).ok()) {
            if let Some(t) = tokens.get(id) {
                if added_ids.insert(id) {
                    added.push((id, t, true));
                }
            }
        }
    }
    added.sort_by_key(|a| a.0);
    let added_json: Vec<Value> = added
        .iter()
        .map(|&(id, content, special)| {
            json!({
                "id": id,
                "content": content,
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": special,
            })
        })
        .collect();

    let byte_level = |use_regex: bool| {
        json!({
            "type": "ByteLevel",
            "add_prefix_space": false,
            "trim_offsets": true,
            "use_regex": use_regex,
        })
    };
    let pre_tokenizer = match pre.and_then(split_regex_for) {
        Some(regex) => json!({
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": regex},
                    "behavior": "Isolated",
                    "invert": false,
                },
                byte_level(false),
            ],
        }),
        None => byte_level(true),
    };
    let post_processor = template_post_processor(
        if add_bos { bos.zip(ids.bos) } else { None },
        if add_eos { eos.zip(ids.eos) } else { None },
    );

    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_json,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": true,
            "trim_offsets": true,
            "use_regex": true,
        },
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": merges_json,
        },
    });

    let mut decoder = Map::new();
    for &(id, content, special) in &added {
        decoder.insert(
            id.to_string(),
            json!({
                "content": content,
                "lstrip": false,
                "normalized": false,
                "rstrip": false,
                "single_word": false,
                "special": special,
            }),
        );
    }
    let mut config = Map::new();
    config.insert("add_bos_token".into(), json!(add_bos));
    config.insert("add_eos_token".into(), json!(add_eos));
    config.insert("added_tokens_decoder".into(), Value::Object(decoder));
    config.insert("clean_up_tokenization_spaces".into(), json!(false));
    let mut special_map = Map::new();
    for (name, token) in [
        ("bos_token", bos),
        ("eos_token", eos),
        ("unk_token", unk),
        ("pad_token", pad),
    ] {
        config.insert(name.into(), json!(token));
        if let Some(t) = token {
            special_map.insert(name.into(), json!(t));
        }
    }
    if let Some(t) = chat_template {
        config.insert("chat_template".into(), json!(t));
    }
    config.insert("tokenizer_class".into(), json!("TokenizersBackend"));
    let extra: Vec<&str> = added
        .iter()
        .filter(|a| a.2)
        .map(|a| a.1)
        .filter(|t| ![bos, eos, unk, pad].contains(&Some(*t)))
        .collect();
    if !extra.is_empty() {
        special_map.insert("additional_special_tokens".into(), json!(extra));
    }

    Ok(TokenizerFiles {
        tokenizer_json: tokenizer.to_string(),
        tokenizer_config: Value::Object(config),
        special_tokens_map: Value::Object(special_map),
        vocab_len: Some(tokens.len() as u64),
    })
}

/// The `TemplateProcessing` transformers' `update_post_processor` builds: `[bos] $A [eos]` for a
/// single sequence and the same followed by `[bos] $B [eos]` (type id 1) for a pair.
fn template_post_processor(bos: Option<(&str, u64)>, eos: Option<(&str, u64)>) -> Value {
    let part = |type_id: u32, seq: &str| -> Vec<Value> {
        let tok = |t: &str| json!({"SpecialToken": {"id": t, "type_id": type_id}});
        let mut out = Vec::new();
        if let Some((t, _)) = bos {
            out.push(tok(t));
        }
        out.push(json!({"Sequence": {"id": seq, "type_id": type_id}}));
        if let Some((t, _)) = eos {
            out.push(tok(t));
        }
        out
    };
    let single = part(0, "A");
    let pair: Vec<Value> = single.iter().cloned().chain(part(1, "B")).collect();
    let mut special = Map::new();
    for (t, id) in bos.into_iter().chain(eos) {
        special.insert(t.into(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    json!({
        "type": "TemplateProcessing",
        "single": single,
        "pair": pair,
        "special_tokens": special,
    })
}

/// The split regex transformers substitutes for a `tokenizer.ggml.pre` value, if any. Values
/// not listed (e.g. SmolLM2's `smollm`) keep GPT-2's ByteLevel regex.
fn split_regex_for(pre: &str) -> Option<&'static str> {
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" | "dbrx" | "smaug-bpe" => LLAMA3,
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" => QWEN2,
        "qwen35" => QWEN35,
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => GPT4O,
        "tekken" => TEKKEN,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Test-only GGUF writer: just enough of the format to build fixtures byte by byte.
    struct Writer {
        version: u32,
        alignment: usize,
        kv: Vec<u8>,
        n_kv: u64,
        infos: Vec<u8>,
        n_tensors: u64,
        data: Vec<u8>,
    }

    fn put_str(buf: &mut Vec<u8>, s: &str) {
        buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
        buf.extend_from_slice(s.as_bytes());
    }

    impl Writer {
        fn new() -> Self {
            Writer {
                version: 3,
                alignment: 32,
                kv: Vec::new(),
                n_kv: 0,
                infos: Vec::new(),
                n_tensors: 0,
                data: Vec::new(),
            }
        }

        fn key(&mut self, key: &str, value_type: u32) -> &mut Vec<u8> {
            self.n_kv += 1;
            put_str(&mut self.kv, key);
            self.kv.extend_from_slice(&value_type.to_le_bytes());
            &mut self.kv
        }

        fn u32(&mut self, key: &str, v: u32) -> &mut Self {
            self.key(key, 4).extend_from_slice(&v.to_le_bytes());
            self
        }

        fn f32(&mut self, key: &str, v: f32) -> &mut Self {
            self.key(key, 6).extend_from_slice(&v.to_le_bytes());
            self
        }

        fn bool(&mut self, key: &str, v: bool) -> &mut Self {
            self.key(key, 7).push(u8::from(v));
            self
        }

        fn str(&mut self, key: &str, v: &str) -> &mut Self {
            put_str(self.key(key, 8), v);
            self
        }

        fn str_array(&mut self, key: &str, items: &[&str]) -> &mut Self {
            let buf = self.key(key, 9);
            buf.extend_from_slice(&8u32.to_le_bytes());
            buf.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for s in items {
                put_str(buf, s);
            }
            self
        }

        fn i32_array(&mut self, key: &str, items: &[i32]) -> &mut Self {
            let buf = self.key(key, 9);
            buf.extend_from_slice(&5u32.to_le_bytes());
            buf.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for v in items {
                buf.extend_from_slice(&v.to_le_bytes());
            }
            self
        }

        fn tensor(&mut self, name: &str, dims: &[u64], type_id: u32, bytes: &[u8]) -> &mut Self {
            while !self.data.len().is_multiple_of(self.alignment) {
                self.data.push(0);
            }
            self.n_tensors += 1;
            put_str(&mut self.infos, name);
            self.infos
                .extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                self.infos.extend_from_slice(&d.to_le_bytes());
            }
            self.infos.extend_from_slice(&type_id.to_le_bytes());
            self.infos
                .extend_from_slice(&(self.data.len() as u64).to_le_bytes());
            self.data.extend_from_slice(bytes);
            self
        }

        fn f32_tensor(&mut self, name: &str, dims: &[u64], values: &[f32]) -> &mut Self {
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            self.tensor(name, dims, TYPE_F32, &bytes)
        }

        fn finish(&self) -> Vec<u8> {
            let mut out = Vec::new();
            out.extend_from_slice(b"GGUF");
            out.extend_from_slice(&self.version.to_le_bytes());
            out.extend_from_slice(&self.n_tensors.to_le_bytes());
            out.extend_from_slice(&self.n_kv.to_le_bytes());
            out.extend_from_slice(&self.kv);
            out.extend_from_slice(&self.infos);
            while !out.len().is_multiple_of(self.alignment) {
                out.push(0);
            }
            out.extend_from_slice(&self.data);
            out
        }
    }

    fn write_file(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).expect("write fixture");
        path
    }

    fn f16_bytes(v: f32) -> [u8; 2] {
        f16::from_f32(v).to_le_bytes()
    }

    /// One tensor of each supported type with hand-computable values.
    fn typed_fixture() -> Writer {
        let mut w = Writer::new();
        w.str("general.architecture", "llama")
            .u32("general.alignment", 32)
            .str_array("general.languages", &["en", "fr"])
            .i32_array("some.ints", &[-1, 7])
            .bool("some.flag", true)
            .f32("some.eps", 1e-5);
        w.f32_tensor("f32", &[2, 2], &[1.5, -2.0, 0.25, 8.0]);
        let f16s: Vec<u8> = [1.0f32, -0.5, 65504.0]
            .iter()
            .flat_map(|&v| f16_bytes(v))
            .collect();
        w.tensor("f16", &[3], TYPE_F16, &f16s);
        let bf16s: Vec<u8> = [3.0f32, -1.25]
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect();
        w.tensor("bf16", &[2], TYPE_BF16, &bf16s);
        // Q8_0: d = 0.5, q = i - 16 for i in 0..32.
        let mut q8 = f16_bytes(0.5).to_vec();
        q8.extend((0..32).map(|i| (i as i8 - 16) as u8));
        w.tensor("q8_0", &[32], TYPE_Q8_0, &q8);
        // Q4_0: d = 2, byte j holds low nibble j and high nibble 15 - j.
        let mut q4 = f16_bytes(2.0).to_vec();
        q4.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        w.tensor("q4_0", &[32], TYPE_Q4_0, &q4);
        // Q4_1: d = 0.5, m = -1, same nibbles.
        let mut q41 = f16_bytes(0.5).to_vec();
        q41.extend_from_slice(&f16_bytes(-1.0));
        q41.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        w.tensor("q4_1", &[32], TYPE_Q4_1, &q41);
        w
    }

    #[test]
    fn parses_metadata_and_dequantizes_each_type() {
        let dir = tempfile::tempdir().expect("tempdir");
        for version in [2, 3] {
            let mut w = typed_fixture();
            w.version = version;
            let path = write_file(&dir, &format!("typed-v{version}.gguf"), &w.finish());
            let g = GgufFile::open(&path).expect("open");
            assert_eq!(g.version(), version);
            assert_eq!(g.architecture(), Some("llama"));
            assert_eq!(g.alignment(), 32);
            assert_eq!(g.data_offset() % 32, 0);
            let langs = g.get("general.languages").and_then(MetaValue::as_array);
            assert_eq!(
                langs.map(|l| l.iter().filter_map(MetaValue::as_str).collect::<Vec<_>>()),
                Some(vec!["en", "fr"])
            );
            assert_eq!(
                g.get("some.ints"),
                Some(&MetaValue::Array(vec![
                    MetaValue::I32(-1),
                    MetaValue::I32(7)
                ]))
            );
            assert_eq!(g.get("some.flag"), Some(&MetaValue::Bool(true)));
            assert_eq!(g.tensors().len(), 6);

            let deq = |name: &str| {
                let t = g.tensor(name).expect("tensor present");
                g.dequantize(t).expect("dequantize")
            };
            assert_eq!(deq("f32"), vec![1.5, -2.0, 0.25, 8.0]);
            assert_eq!(g.tensor("f32").map(TensorInfo::hf_shape), Some(vec![2, 2]));
            assert_eq!(deq("f16"), vec![1.0, -0.5, 65504.0]);
            assert_eq!(deq("bf16"), vec![3.0, -1.25]);
            let q8: Vec<f32> = (0..32).map(|i| (i - 16) as f32 * 0.5).collect();
            assert_eq!(deq("q8_0"), q8);
            let mut q4: Vec<f32> = (0..16).map(|j| (j - 8) as f32 * 2.0).collect();
            q4.extend((0..16).map(|j| (15 - j - 8) as f32 * 2.0));
            assert_eq!(deq("q4_0"), q4);
            let mut q41: Vec<f32> = (0..16).map(|j| j as f32 * 0.5 - 1.0).collect();
            q41.extend((0..16).map(|j| (15 - j) as f32 * 0.5 - 1.0));
            assert_eq!(deq("q4_1"), q41);
        }
    }

    #[test]
    fn hf_shape_reverses_gguf_dims() {
        let mut w = Writer::new();
        w.f32_tensor("m", &[3, 2], &[0.0; 6]);
        let dir = tempfile::tempdir().expect("tempdir");
        let g = GgufFile::open(&write_file(&dir, "m.gguf", &w.finish())).expect("open");
        let t = g.tensor("m").expect("tensor");
        assert_eq!(t.dims, vec![3, 2]);
        assert_eq!(t.hf_shape(), vec![2, 3]);
    }

    #[test]
    fn truncated_files_are_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bytes = typed_fixture().finish();
        // Every cut inside the header or metadata must fail cleanly, never panic.
        for cut in [0, 3, 4, 7, 12, 20, 24, 40, 100, 200] {
            let path = write_file(&dir, "cut.gguf", &bytes[..cut]);
            match GgufFile::open(&path) {
                Err(GgufError::Truncated { path: p, .. }) => assert_eq!(p, path),
                other => panic!("cut at {cut}: expected Truncated, got {other:?}"),
            }
        }
        // Cutting into the tensor data leaves the header whole but the last tensor short.
        let path = write_file(&dir, "short-data.gguf", &bytes[..bytes.len() - 1]);
        let err = GgufFile::open(&path).expect_err("must fail");
        assert!(
            matches!(&err, GgufError::TensorOutOfBounds { tensor, .. } if tensor == "q4_1"),
            "{err}"
        );
        assert!(err.to_string().contains("short-data.gguf"), "{err}");
    }

    #[test]
    fn unknown_tensor_type_names_the_tensor() {
        let mut w = Writer::new();
        w.tensor("blk.0.mystery.weight", &[4], 99, &[0; 16]);
        let dir = tempfile::tempdir().expect("tempdir");
        let err = GgufFile::open(&write_file(&dir, "u.gguf", &w.finish())).expect_err("fails");
        let msg = err.to_string();
        assert!(
            matches!(err, GgufError::UnknownTensorType { type_id: 99, .. }),
            "{msg}"
        );
        assert!(
            msg.contains("blk.0.mystery.weight") && msg.contains("99"),
            "{msg}"
        );
    }

    #[test]
    fn unsupported_tensor_type_is_an_error_on_dequantize() {
        let mut w = Writer::new();
        w.tensor("q5", &[32], 6, &[0; 22]);
        let dir = tempfile::tempdir().expect("tempdir");
        let g = GgufFile::open(&write_file(&dir, "q5.gguf", &w.finish())).expect("open");
        let t = g.tensor("q5").expect("tensor");
        let err = g.dequantize(t).expect_err("Q5_0 is not supported");
        assert!(
            matches!(&err, GgufError::UnsupportedTensorType { tensor, type_name: "Q5_0", .. } if tensor == "q5"),
            "{err}"
        );
    }

    #[test]
    fn bad_magic_version_and_alignment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut bytes = Writer::new().finish();
        bytes[0] = b'X';
        let err = GgufFile::open(&write_file(&dir, "magic.gguf", &bytes)).expect_err("magic");
        assert!(matches!(err, GgufError::BadMagic { .. }), "{err}");

        let mut w = Writer::new();
        w.version = 1;
        let err = GgufFile::open(&write_file(&dir, "v1.gguf", &w.finish())).expect_err("v1");
        assert!(
            matches!(err, GgufError::UnsupportedVersion { version: 1, .. }),
            "{err}"
        );

        let mut w = Writer::new();
        w.u32("general.alignment", 3);
        let err = GgufFile::open(&write_file(&dir, "al.gguf", &w.finish())).expect_err("align");
        assert!(matches!(err, GgufError::Malformed { .. }), "{err}");

        // A huge array count must be rejected before anything is allocated for it.
        let mut w = Writer::new();
        let buf = w.key("big", 9);
        buf.extend_from_slice(&4u32.to_le_bytes());
        buf.extend_from_slice(&u64::MAX.to_le_bytes());
        let err = GgufFile::open(&write_file(&dir, "big.gguf", &w.finish())).expect_err("count");
        assert!(matches!(err, GgufError::Truncated { .. }), "{err}");
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // llama.cpp's permute with 2 heads of 4 rows: within each head, HF rows [a0 a1 b0 b1]
        // (the two rotary halves) are stored interleaved as [a0 b0 a1 b1].
        let gguf_rows: Vec<f32> = vec![0., 1., 2., 3., 4., 5., 6., 7.];
        let hf = unpermute_rows(&gguf_rows, 8, 2).expect("valid shape");
        assert_eq!(hf, vec![0., 2., 1., 3., 4., 6., 5., 7.]);

        // With two columns the whole row moves.
        let gguf_2col: Vec<f32> = vec![0., 10., 1., 11., 2., 12., 3., 13.];
        let hf = unpermute_rows(&gguf_2col, 4, 1).expect("valid shape");
        assert_eq!(hf, vec![0., 10., 2., 12., 1., 11., 3., 13.]);

        // One head of six rows (half = 3): stored [a0 b0 a1 b1 a2 b2].
        let hf = unpermute_rows(&[0., 1., 2., 3., 4., 5.], 6, 1).expect("valid shape");
        assert_eq!(hf, vec![0., 2., 4., 1., 3., 5.]);

        assert!(unpermute_rows(&[0.; 6], 6, 2).is_none());
    }

    #[test]
    fn maps_tensor_names() {
        assert_eq!(
            hf_tensor_name("blk.12.attn_q.bias").as_deref(),
            Some("model.layers.12.self_attn.q_proj.bias")
        );
        assert_eq!(
            hf_tensor_name("blk.0.ffn_norm.weight").as_deref(),
            Some("model.layers.0.post_attention_layernorm.weight")
        );
        assert_eq!(
            hf_tensor_name("output.weight").as_deref(),
            Some("lm_head.weight")
        );
        assert_eq!(hf_tensor_name("rope_freqs.weight"), None);
        assert_eq!(hf_tensor_name("blk.x.attn_q.weight"), None);
    }

    /// A one-layer llama, hidden size 4, one KV head, with a tiny byte-level vocabulary.
    struct Tiny {
        tied: bool,
        n_head: u32,
        block_count: u32,
        tokenizer_model: &'static str,
    }

    const TINY: Tiny = Tiny {
        tied: true,
        n_head: 2,
        block_count: 1,
        tokenizer_model: "gpt2",
    };

    fn tiny_llama(opts: Tiny) -> Writer {
        let Tiny {
            tied,
            n_head,
            block_count,
            tokenizer_model,
        } = opts;
        let head_dim = 4 / u64::from(n_head);
        let mut w = Writer::new();
        let tokens = [
            "<|endoftext|>",
            "<|im_start|>",
            "a",
            "b",
            "ab",
            "\u{120}",
            "\u{120}ab",
        ];
        w.str("general.architecture", "llama")
            .u32("llama.block_count", block_count)
            .u32("llama.context_length", 64)
            .u32("llama.embedding_length", 4)
            .u32("llama.feed_forward_length", 8)
            .u32("llama.attention.head_count", n_head)
            .u32("llama.attention.head_count_kv", 1)
            .f32("llama.rope.freq_base", 100000.0)
            .f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
            .u32("llama.rope.dimension_count", head_dim as u32)
            .str("tokenizer.ggml.model", tokenizer_model)
            .str("tokenizer.ggml.pre", "smollm")
            .str_array("tokenizer.ggml.tokens", &tokens)
            .i32_array("tokenizer.ggml.token_type", &[3, 3, 1, 1, 1, 1, 1])
            .str_array("tokenizer.ggml.merges", &["a b", "\u{120} ab"])
            .u32("tokenizer.ggml.bos_token_id", 1)
            .u32("tokenizer.ggml.eos_token_id", 0)
            .bool("tokenizer.ggml.add_bos_token", false)
            .str("tokenizer.chat_template", "{{ messages }}");
        let seq = |n: usize| -> Vec<f32> { (0..n).map(|i| i as f32).collect() };
        w.f32_tensor("token_embd.weight", &[4, 7], &seq(28));
        w.f32_tensor("output_norm.weight", &[4], &[1.0; 4]);
        if !tied {
            w.f32_tensor("output.weight", &[4, 7], &seq(28));
        }
        w.f32_tensor("blk.0.attn_norm.weight", &[4], &[1.0; 4]);
        w.f32_tensor("blk.0.ffn_norm.weight", &[4], &[1.0; 4]);
        // Row r of q (4 rows of 4) holds r*10 + column, so moved rows are easy to spot.
        let q: Vec<f32> = (0..16).map(|i| ((i / 4) * 10 + i % 4) as f32).collect();
        w.f32_tensor("blk.0.attn_q.weight", &[4, 4], &q);
        let kv = (4 * head_dim) as usize;
        w.f32_tensor("blk.0.attn_k.weight", &[4, head_dim], &seq(kv));
        w.f32_tensor("blk.0.attn_v.weight", &[4, head_dim], &seq(kv));
        w.f32_tensor("blk.0.attn_output.weight", &[4, 4], &seq(16));
        w.f32_tensor("blk.0.ffn_gate.weight", &[4, 8], &seq(32));
        w.f32_tensor("blk.0.ffn_up.weight", &[4, 8], &seq(32));
        w.f32_tensor("blk.0.ffn_down.weight", &[8, 4], &seq(32));
        w.f32_tensor("rope_freqs.weight", &[1], &[1.0]);
        w
    }

    fn read_json(path: &Path) -> Value {
        let text = std::fs::read_to_string(path).expect("read json");
        serde_json::from_str(&text).expect("parse json")
    }

    #[test]
    fn converts_tiny_llama() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = write_file(&dir, "tiny.gguf", &tiny_llama(TINY).finish());
        let out = dir.path().join("hf");
        let summary = convert_to_hf(&src, &out, OutDtype::F32).expect("convert");
        assert!(summary.tie_word_embeddings && summary.unpermuted_qk);
        assert_eq!(
            summary.skipped_tensors,
            vec!["rope_freqs.weight".to_string()]
        );
        assert_eq!(summary.tensors_written, 11);

        let bytes = std::fs::read(out.join("model.safetensors")).expect("read safetensors");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("valid safetensors");
        let get = |name: &str| -> (Vec<usize>, Vec<f32>) {
            let t = st.tensor(name).expect(name);
            let v = t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (t.shape().to_vec(), v)
        };
        assert!(st.tensor("lm_head.weight").is_err(), "tied: no lm_head");
        assert_eq!(get("model.embed_tokens.weight").0, vec![7, 4]);
        assert_eq!(get("model.layers.0.mlp.down_proj.weight").0, vec![4, 8]);
        let (shape, q) = get("model.layers.0.self_attn.q_proj.weight");
        assert_eq!(shape, vec![4, 4]);
        // With head_dim 2 each rotary half is one row, so the permutation is the identity.
        assert_eq!(q[4..8], [10., 11., 12., 13.]);
        let (kshape, k) = get("model.layers.0.self_attn.k_proj.weight");
        assert_eq!(kshape, vec![2, 4]);
        assert_eq!(k, (0..8).map(|i| i as f32).collect::<Vec<_>>());

        let config = read_json(&out.join("config.json"));
        assert_eq!(config["architectures"], json!(["LlamaForCausalLM"]));
        assert_eq!(config["num_key_value_heads"], json!(1));
        assert_eq!(config["head_dim"], json!(2));
        assert_eq!(config["vocab_size"], json!(7));
        assert_eq!(config["tie_word_embeddings"], json!(true));
        assert_eq!(config["rope_theta"], json!(100000.0));
        assert_eq!(config["max_position_embeddings"], json!(64));
        assert_eq!(config["bos_token_id"], json!(1));
        let tc = read_json(&out.join("tokenizer_config.json"));
        assert_eq!(tc["bos_token"], json!("<|im_start|>"));
        assert_eq!(tc["eos_token"], json!("<|endoftext|>"));
        assert_eq!(tc["chat_template"], json!("{{ messages }}"));

        let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).expect("load");
        let enc = tok.encode("ab ab<|im_start|>", false).expect("encode");
        assert_eq!(enc.get_ids(), &[4, 6, 1]);
        assert_eq!(tok.decode(&[4, 6], false).expect("decode"), "ab ab");
    }

    #[test]
    fn untied_model_keeps_lm_head_and_unpermutes_wider_heads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = write_file(
            &dir,
            "untied.gguf",
            &tiny_llama(Tiny {
                tied: false,
                n_head: 1,
                ..TINY
            })
            .finish(),
        );
        let out = dir.path().join("hf");
        let summary = convert_to_hf(&src, &out, OutDtype::BF16).expect("convert");
        assert!(!summary.tie_word_embeddings);
        let bytes = std::fs::read(out.join("model.safetensors")).expect("read");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("valid");
        let lm = st.tensor("lm_head.weight").expect("lm_head present");
        assert_eq!(lm.dtype(), safetensors::Dtype::BF16);
        assert_eq!(lm.shape(), &[7, 4]);
        // One head of 4 rows (half 2): GGUF rows [r0 r1 r2 r3] hold HF rows [r0 r2 r1 r3].
        let q: Vec<f32> = st
            .tensor("model.layers.0.self_attn.q_proj.weight")
            .expect("q")
            .data()
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .step_by(4)
            .collect();
        assert_eq!(q, vec![0., 20., 10., 30.]);
        let config = read_json(&out.join("config.json"));
        assert_eq!(config["torch_dtype"], json!("bfloat16"));
        assert_eq!(config["tie_word_embeddings"], json!(false));
    }

    #[test]
    fn unsupported_architecture_and_tokenizer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut w = Writer::new();
        w.str("general.architecture", "mamba");
        let src = write_file(&dir, "mamba.gguf", &w.finish());
        let err = convert_to_hf(&src, &dir.path().join("o"), OutDtype::F32).expect_err("arch");
        assert!(
            matches!(&err, GgufError::Unsupported { what, .. } if what.contains("mamba")),
            "{err}"
        );

        let src = write_file(
            &dir,
            "spm.gguf",
            &tiny_llama(Tiny {
                tokenizer_model: "bert",
                ..TINY
            })
            .finish(),
        );
        let err = convert_to_hf(&src, &dir.path().join("o"), OutDtype::F32).expect_err("tok");
        assert!(
            matches!(&err, GgufError::Unsupported { what, .. } if what.contains("'bert'")),
            "{err}"
        );
    }

    #[test]
    fn missing_layer_tensor_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let w = tiny_llama(Tiny {
            block_count: 2,
            ..TINY
        });
        let src = write_file(&dir, "short.gguf", &w.finish());
        let err = convert_to_hf(&src, &dir.path().join("o"), OutDtype::F32).expect_err("missing");
        assert!(
            matches!(&err, GgufError::MissingTensor { tensor, .. } if tensor == "blk.1.attn_norm.weight"),
            "{err}"
        );
    }

    #[test]
    fn duplicate_metadata_key_is_rejected() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut w = tiny_llama(TINY);
        w.u32("llama.block_count", 2);
        let err = GgufFile::open(&write_file(&dir, "dup.gguf", &w.finish())).expect_err("dup");
        assert!(err.to_string().contains("duplicate metadata key"), "{err}");
    }
}
