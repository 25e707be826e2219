//! The GGUF container (v2 and v3, little endian) over a memory map: the
//! header, metadata and tensor infos, every offset and length checked
//! before use; and the tensor types we dequantize to `f32`.

use crate::fsutil::io_err;
use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;

use super::GgufError;

pub(super) const GGUF_MAGIC: &[u8; 4] = b"GGUF";
pub(super) const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's GGML_MAX_DIMS; llama.cpp rejects tensors with more.
pub(super) const MAX_DIMS: u32 = 4;
/// Bounds recursion on nested arrays so a hostile file cannot overflow the stack.
pub(super) const MAX_ARRAY_NESTING: u32 = 8;

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

    pub(super) fn describe(&self) -> String {
        match self {
            MetaValue::String(s) => format!("string {s:?}"),
            MetaValue::Array(items) => format!("array of {} elements", items.len()),
            other => format!("{other:?}"),
        }
    }
}

/// ggml tensor types: (id, name, elements per block, bytes per block). Listing the types we cannot
/// dequantize too lets `open` check every tensor's extent and tell "unknown" from "unsupported".
pub(super) const GGML_TYPES: &[(u32, &str, u64, u64)] = &[
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

pub(super) const TYPE_F32: u32 = 0;
pub(super) const TYPE_F16: u32 = 1;
pub(super) const TYPE_Q4_0: u32 = 2;
pub(super) const TYPE_Q4_1: u32 = 3;
pub(super) const TYPE_Q5_0: u32 = 6;
pub(super) const TYPE_Q5_1: u32 = 7;
pub(super) const TYPE_Q8_0: u32 = 8;
pub(super) const TYPE_Q2_K: u32 = 10;
pub(super) const TYPE_Q3_K: u32 = 11;
pub(super) const TYPE_Q4_K: u32 = 12;
pub(super) const TYPE_Q5_K: u32 = 13;
pub(super) const TYPE_Q6_K: u32 = 14;
pub(super) const TYPE_IQ4_NL: u32 = 20;
pub(super) const TYPE_IQ4_XS: u32 = 23;
pub(super) const TYPE_BF16: u32 = 30;

/// The ggml type names [`dequantize_bytes`] handles, for messages.
pub const DEQUANTIZED_TYPES: &str =
    "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS";

/// IQ4_NL's and IQ4_XS's 16 non-linear levels (ggml's `kvalues_iq4nl`).
const IQ4_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

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
    pub(super) path: PathBuf,
    pub(super) map: Mmap,
    pub(super) version: u32,
    pub(super) alignment: u64,
    pub(super) data_offset: u64,
    pub(super) metadata: BTreeMap<String, MetaValue>,
    pub(super) tensors: Vec<TensorInfo>,
}

/// Bounds-checked little-endian reader over the mapped bytes.
pub(super) struct Reader<'a> {
    pub(super) path: &'a Path,
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
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

    pub(super) fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub(super) fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(super) fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    pub(super) fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    pub(super) fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let at = self.pos;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::Malformed {
            path: self.path.to_path_buf(),
            what: format!("{what} at byte {at} is not valid UTF-8"),
        })
    }

    pub(super) fn value(
        &mut self,
        value_type: u32,
        key: &str,
        depth: u32,
    ) -> Result<MetaValue, GgufError> {
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

    pub(super) fn malformed(&self, what: String) -> GgufError {
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

    pub(super) fn parse(&mut self) -> Result<(), GgufError> {
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

    pub(super) fn require_tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor(name).ok_or_else(|| GgufError::MissingTensor {
            path: self.path.clone(),
            tensor: name.to_string(),
        })
    }

    pub(super) fn bad_metadata(
        &self,
        key: &str,
        expected: &'static str,
        found: &MetaValue,
    ) -> GgufError {
        GgufError::BadMetadata {
            path: self.path.clone(),
            key: key.to_string(),
            expected,
            found: found.describe(),
        }
    }

    pub(super) fn opt_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.bad_metadata(key, "a non-negative integer", v)),
        }
    }

    pub(super) fn req_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.opt_u64(key)?
            .ok_or_else(|| GgufError::MissingMetadata {
                path: self.path.clone(),
                key: key.to_string(),
            })
    }

    pub(super) fn opt_f64(&self, key: &str) -> Result<Option<f64>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.bad_metadata(key, "a float", v)),
        }
    }

    pub(super) fn opt_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.bad_metadata(key, "a bool", v)),
        }
    }

    pub(super) fn opt_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.bad_metadata(key, "a string", v)),
        }
    }

    pub(super) fn opt_str_array(&self, key: &str) -> Result<Option<Vec<&str>>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .and_then(|items| items.iter().map(MetaValue::as_str).collect())
                .map(Some)
                .ok_or_else(|| self.bad_metadata(key, "an array of strings", v)),
        }
    }

    pub(super) fn opt_int_array(&self, key: &str) -> Result<Option<Vec<i64>>, GgufError> {
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

pub(super) fn can_dequantize(type_id: u32) -> bool {
    matches!(
        type_id,
        TYPE_F32
            | TYPE_F16
            | TYPE_BF16
            | TYPE_Q8_0
            | TYPE_Q4_0
            | TYPE_Q4_1
            | TYPE_Q5_0
            | TYPE_Q5_1
            | TYPE_Q2_K
            | TYPE_Q3_K
            | TYPE_Q4_K
            | TYPE_Q5_K
            | TYPE_Q6_K
            | TYPE_IQ4_NL
            | TYPE_IQ4_XS
    )
}

fn half_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Q4_K's and Q5_K's eight 6-bit (scale, min) pairs, packed in 12 bytes.
fn k_scale_min(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 2) & 0x30);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
    (sc, mn)
}

/// The k-quant and 5-bit blocks, element by element as ggml's
/// `dequantize_row_*` (and the `gguf` package) lay them out; the products
/// are in the same order, so the results are the same floats.
fn dequantize_block(type_id: u32, b: &[u8], out: &mut Vec<f32>) {
    match type_id {
        TYPE_Q5_0 | TYPE_Q5_1 => {
            let d = half_at(b, 0);
            let (m, rest) = if type_id == TYPE_Q5_1 {
                (Some(half_at(b, 2)), &b[4..])
            } else {
                (None, &b[2..])
            };
            let qh = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
            let qs = &rest[4..];
            for half in 0..2 {
                for (j, &q) in qs.iter().enumerate() {
                    let low = (q >> (4 * half)) & 0x0f;
                    let high = ((qh >> (j + 16 * half)) & 1) as u8;
                    let q = low | (high << 4);
                    out.push(match m {
                        Some(m) => d * f32::from(q) + m,
                        None => d * f32::from(q as i8 - 16),
                    });
                }
            }
        }
        TYPE_Q2_K => {
            let (scales, qs) = (&b[..16], &b[16..80]);
            let (d, dmin) = (half_at(b, 80), half_at(b, 82));
            for i in 0..256 {
                let (h, s, l) = (i / 128, (i / 32) % 4, i % 32);
                let q = (qs[h * 32 + l] >> (2 * s)) & 3;
                let sc = scales[i / 16];
                let dl = d * f32::from(sc & 0x0f);
                let ml = dmin * f32::from(sc >> 4);
                out.push(dl * f32::from(q) - ml);
            }
        }
        TYPE_Q3_K => {
            let (hmask, qs, packed) = (&b[..32], &b[32..96], &b[96..108]);
            let d = half_at(b, 108);
            let mut scales = [0f32; 16];
            for (i, scale) in scales.iter_mut().enumerate() {
                let low = (packed[i % 8] >> (4 * (i / 8))) & 0x0f;
                let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
                *scale = f32::from((low | (high << 4)) as i8 - 32);
            }
            for i in 0..256 {
                let (h, s, l) = (i / 128, (i / 32) % 4, i % 32);
                let low = ((qs[h * 32 + l] >> (2 * s)) & 3) as i8;
                // The offset of 4 applies where the mask bit is clear.
                let bit = (hmask[l] >> (i / 32)) & 1;
                let q = low - (((bit ^ 1) << 2) as i8);
                out.push((d * scales[i / 16]) * f32::from(q));
            }
        }
        TYPE_Q4_K | TYPE_Q5_K => {
            let (d, dmin) = (half_at(b, 0), half_at(b, 2));
            let (sc, mn) = k_scale_min(&b[4..16]);
            let (qh, qs) = if type_id == TYPE_Q5_K {
                (Some(&b[16..48]), &b[48..176])
            } else {
                (None, &b[16..144])
            };
            for sb in 0..8 {
                let (c, s) = (sb / 2, sb % 2);
                let dl = d * f32::from(sc[sb]);
                let ml = dmin * f32::from(mn[sb]);
                for l in 0..32 {
                    let mut q = (qs[c * 32 + l] >> (4 * s)) & 0x0f;
                    if let Some(qh) = qh {
                        q |= ((qh[l] >> sb) & 1) << 4;
                    }
                    out.push(dl * f32::from(q) - ml);
                }
            }
        }
        TYPE_Q6_K => {
            let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
            let d = half_at(b, 208);
            for i in 0..256 {
                let (h, r) = (i / 128, i % 128);
                let low = (ql[h * 64 + r % 64] >> (4 * (r / 64))) & 0x0f;
                let high = (qh[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
                let q = (low | (high << 4)) as i8 - 32;
                let dl = d * f32::from(scales[i / 16] as i8);
                out.push(dl * f32::from(q));
            }
        }
        TYPE_IQ4_NL => {
            let d = half_at(b, 0);
            let qs = &b[2..18];
            for s in 0..2 {
                for &q in qs {
                    out.push(d * f32::from(IQ4_LEVELS[usize::from((q >> (4 * s)) & 0x0f)]));
                }
            }
        }
        TYPE_IQ4_XS => {
            let d = half_at(b, 0);
            let scales_h = u16::from_le_bytes([b[2], b[3]]);
            let (scales_l, qs) = (&b[4..8], &b[8..136]);
            for ib in 0..8 {
                let low = (scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f;
                let high = ((scales_h >> (2 * ib)) & 3) as u8;
                let dl = d * f32::from((low | (high << 4)) as i8 - 32);
                for s in 0..2 {
                    for &q in &qs[ib * 16..ib * 16 + 16] {
                        let level = IQ4_LEVELS[usize::from((q >> (4 * s)) & 0x0f)];
                        out.push(dl * f32::from(level));
                    }
                }
            }
        }
        _ => {}
    }
}

/// `None` when the type is not one we dequantize. `bytes` must be exactly the tensor's extent
/// for `n` elements, which `GgufFile::open` guarantees; anything else yields a short result
/// rather than a panic.
pub(super) fn dequantize_bytes(type_id: u32, bytes: &[u8], n: usize) -> Option<Vec<f32>> {
    let mut out = Vec::with_capacity(n);
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
        TYPE_Q5_0 | TYPE_Q5_1 | TYPE_Q2_K | TYPE_Q3_K | TYPE_Q4_K | TYPE_Q5_K | TYPE_Q6_K
        | TYPE_IQ4_NL | TYPE_IQ4_XS => {
            let size = GGML_TYPES
                .iter()
                .find(|t| t.0 == type_id)
                .map_or(1, |t| t.3 as usize);
            for block in bytes.chunks_exact(size) {
                dequantize_block(type_id, block, &mut out);
            }
        }
        _ => return None,
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

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
        w.tensor("iq2", &[256], 16, &[0; 66]);
        let dir = tempfile::tempdir().expect("tempdir");
        let g = GgufFile::open(&write_file(&dir, "iq2.gguf", &w.finish())).expect("open");
        let t = g.tensor("iq2").expect("tensor");
        let err = g.dequantize(t).expect_err("IQ2_XXS is not supported");
        assert!(
            matches!(&err, GgufError::UnsupportedTensorType { tensor, type_name: "IQ2_XXS", .. } if tensor == "iq2"),
            "{err}"
        );
        assert!(
            err.to_string().contains("Q6_K"),
            "names what is supported: {err}"
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
    fn duplicate_metadata_key_is_rejected() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut w = tiny_llama(TINY);
        w.u32("llama.block_count", 2);
        let err = GgufFile::open(&write_file(&dir, "dup.gguf", &w.finish())).expect_err("dup");
        assert!(err.to_string().contains("duplicate metadata key"), "{err}");
    }
}
