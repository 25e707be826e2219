//! HF safetensors checkpoints: reading a single `model.safetensors` or a
//! sharded set (`model.safetensors.index.json`) into a VarStore by name, and
//! writing tensors back atomically.
//!
//! Every failure names the file: a truncated file, a header that does not
//! parse, a missing tensor, a shape that does not match the config.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype as StDtype, SafeTensors, TensorView};
use tch::{Kind, Tensor};

use super::ModelError;

/// The safetensors files that make up the checkpoint in `dir`.
pub fn checkpoint_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| ModelError::bad(&index, format!("invalid JSON: {e}")))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| ModelError::bad(&index, "no `weight_map` object"))?;
        let mut files: Vec<String> = map
            .values()
            .map(|f| {
                f.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| ModelError::bad(&index, "weight_map values must be file names"))
            })
            .collect::<Result<HashSet<_>, _>>()?
            .into_iter()
            .collect();
        files.sort();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    Err(ModelError::NotFound(format!(
        "{}: neither model.safetensors nor model.safetensors.index.json",
        dir.display()
    )))
}

fn kind_of(dtype: StDtype) -> Option<Kind> {
    Some(match dtype {
        StDtype::F32 => Kind::Float,
        StDtype::F16 => Kind::Half,
        StDtype::BF16 => Kind::BFloat16,
        StDtype::F64 => Kind::Double,
        StDtype::I64 => Kind::Int64,
        StDtype::I32 => Kind::Int,
        StDtype::I8 => Kind::Int8,
        StDtype::U8 => Kind::Uint8,
        StDtype::BOOL => Kind::Bool,
        _ => return None,
    })
}

fn st_dtype(kind: Kind) -> Option<StDtype> {
    Some(match kind {
        Kind::Float => StDtype::F32,
        Kind::Half => StDtype::F16,
        Kind::BFloat16 => StDtype::BF16,
        Kind::Double => StDtype::F64,
        Kind::Int64 => StDtype::I64,
        Kind::Int => StDtype::I32,
        Kind::Int8 => StDtype::I8,
        Kind::Uint8 => StDtype::U8,
        Kind::Bool => StDtype::BOOL,
        _ => return None,
    })
}

fn view_to_tensor(path: &Path, name: &str, view: &TensorView<'_>) -> Result<Tensor, ModelError> {
    let kind = kind_of(view.dtype()).ok_or_else(|| {
        ModelError::bad(
            path,
            format!("tensor `{name}` has unsupported dtype {:?}", view.dtype()),
        )
    })?;
    let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
    Tensor::f_from_data_size(view.data(), &shape, kind)
        .map_err(|e| ModelError::bad(path, format!("tensor `{name}`: {e}")))
}

/// Memory-map `path` and hand its parsed tensors to `f`.
pub fn with_safetensors<R>(
    path: &Path,
    f: impl FnOnce(&SafeTensors<'_>) -> Result<R, ModelError>,
) -> Result<R, ModelError> {
    let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
    // SAFETY: the map is read-only and lives only for this call; a checkpoint
    // being rewritten underneath us is replaced by rename, never in place.
    let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
    let st = SafeTensors::deserialize(&mmap)
        .map_err(|e| ModelError::bad(path, format!("not a valid safetensors file: {e}")))?;
    f(&st)
}

/// Read every tensor of one safetensors file onto the CPU.
pub fn read_all(path: &Path) -> Result<BTreeMap<String, Tensor>, ModelError> {
    with_safetensors(path, |st| {
        st.tensors()
            .into_iter()
            .map(|(name, view)| Ok((name.clone(), view_to_tensor(path, &name, &view)?)))
            .collect()
    })
}

/// Copy the checkpoint's tensors into `vars` (name → variable). Values are
/// converted to each variable's dtype and device. Every variable must be
/// found with the right shape; tensors without a variable are returned (a
/// caller may tolerate e.g. rotary buffers), never silently dropped.
pub fn load_into(
    files: &[PathBuf],
    vars: &HashMap<String, Tensor>,
) -> Result<Vec<String>, ModelError> {
    let mut seen: HashSet<String> = HashSet::new();
    let mut unused = Vec::new();
    for path in files {
        with_safetensors(path, |st| {
            for (name, view) in st.tensors() {
                let Some(var) = vars.get(&name) else {
                    unused.push(name);
                    continue;
                };
                let want = var.size();
                let got: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
                if want != got {
                    return Err(ModelError::bad(
                        path,
                        format!("tensor `{name}` has shape {got:?}, the config implies {want:?}"),
                    ));
                }
                let t = view_to_tensor(path, &name, &view)?;
                tch::no_grad(|| {
                    let mut v = var.shallow_clone();
                    v.f_copy_(&t.to_kind(var.kind()))
                })
                .map_err(|e| ModelError::bad(path, format!("tensor `{name}`: {e}")))?;
                seen.insert(name);
            }
            Ok(())
        })?;
    }
    let mut missing: Vec<&String> = vars.keys().filter(|k| !seen.contains(*k)).collect();
    if !missing.is_empty() {
        missing.sort();
        let shown: Vec<&str> = missing.iter().take(5).map(|s| s.as_str()).collect();
        let where_ = files
            .first()
            .and_then(|f| f.parent())
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        return Err(ModelError::bad(
            where_,
            format!(
                "{} tensor(s) missing from the checkpoint, e.g. {}",
                missing.len(),
                shown.join(", ")
            ),
        ));
    }
    Ok(unused)
}

/// Write `tensors` (name → tensor, any device) as one safetensors file,
/// atomically: temp file in the same directory, fsync, rename.
pub fn save_safetensors(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: Option<HashMap<String, String>>,
) -> Result<(), ModelError> {
    struct Owned {
        dtype: StDtype,
        shape: Vec<usize>,
        data: Vec<u8>,
    }
    impl safetensors::View for &Owned {
        fn dtype(&self) -> StDtype {
            self.dtype
        }
        fn shape(&self) -> &[usize] {
            &self.shape
        }
        fn data(&self) -> std::borrow::Cow<'_, [u8]> {
            std::borrow::Cow::Borrowed(&self.data)
        }
        fn data_len(&self) -> usize {
            self.data.len()
        }
    }
    let mut owned = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let t = t.to_device(tch::Device::Cpu).contiguous();
        let dtype = st_dtype(t.kind()).ok_or_else(|| {
            ModelError::Invalid(format!(
                "tensor `{name}`: dtype {:?} cannot be saved",
                t.kind()
            ))
        })?;
        let numel = t.numel();
        let mut data = vec![0u8; numel * t.kind().elt_size_in_bytes()];
        t.f_copy_data_u8(&mut data, numel)?;
        let shape = t.size().iter().map(|&d| d as usize).collect();
        owned.push((name.clone(), Owned { dtype, shape, data }));
    }
    let views: Vec<(&str, &Owned)> = owned.iter().map(|(n, o)| (n.as_str(), o)).collect();
    let bytes = safetensors::serialize(views, metadata)
        .map_err(|e| ModelError::bad(path, format!("serialising: {e}")))?;
    write_atomic(path, &bytes)
}

/// Write `bytes` to `path` atomically (see [`crate::fsutil`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ModelError> {
    Ok(crate::fsutil::write_atomic(path, bytes)?)
}
