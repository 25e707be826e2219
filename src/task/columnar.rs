//! Columnar task files: parquet (the HF Hub's exports, verl's data files)
//! and Arrow IPC (the HF `datasets` cache and `save_to_disk`), one file or a
//! directory of them. They are read record batch by record batch; each row
//! becomes the JSON object the format readers decode, so a parquet file and
//! its JSONL export load alike, and only one batch is held as JSON at a time.

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use serde_json::Value;

use super::formats::{self, Loc, Raw, Unit};
use super::{Builder, LoadOptions, TaskError, TaskFormat, TaskSet};

/// Rows decoded at a time.
const BATCH_ROWS: usize = 256;

/// Whether `path` is read here: a directory, or a `.parquet` / `.arrow` file.
pub(super) fn is_columnar(path: &Path) -> bool {
    path.is_dir() || kind_of(path).is_some()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Parquet,
    Arrow,
}

fn kind_of(path: &Path) -> Option<Kind> {
    match path.extension()?.to_str()? {
        "parquet" => Some(Kind::Parquet),
        "arrow" => Some(Kind::Arrow),
        _ => None,
    }
}

fn invalid(path: &Path, reason: String) -> TaskError {
    TaskError::UnknownFormat {
        path: path.to_path_buf(),
        reason,
    }
}

/// The data files of `path`: itself, or every `.parquet` / `.arrow` file
/// under it (sorted, so shards come in order), of `split` when given. A
/// directory mixing both kinds is refused: an HF cache directory holds
/// `.arrow` shards and may hold a parquet export of the same rows.
fn data_files(path: &Path, split: Option<&str>) -> Result<Vec<PathBuf>, TaskError> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    let mut others = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| TaskError::Io {
            path: dir.clone(),
            source,
        })?;
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name();
            if name.to_string_lossy().starts_with('.') {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else if kind_of(&p).is_some() {
                files.push(p);
            } else {
                others.push(p);
            }
        }
    }
    files.sort();
    if let Some(split) = split {
        files.retain(|f| in_split(f.strip_prefix(path).unwrap_or(f), split));
    }
    if files.is_empty() {
        let json: Vec<String> = others
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "jsonl" || e == "json"))
            .take(3)
            .map(|p| p.display().to_string())
            .collect();
        let hint = if json.is_empty() {
            String::new()
        } else {
            format!("; JSON files are read one at a time: point the path at one of {json:?}")
        };
        return Err(invalid(
            path,
            match split {
                Some(s) => {
                    format!("the directory holds no .parquet or .arrow file of split {s:?}{hint}")
                }
                None => format!("the directory holds no .parquet or .arrow file{hint}"),
            },
        ));
    }
    let kinds: std::collections::BTreeSet<_> = files
        .iter()
        .filter_map(|f| kind_of(f))
        .map(|k| k as u8)
        .collect();
    if kinds.len() > 1 {
        return Err(invalid(
            path,
            "the directory holds both .parquet and .arrow files (the same rows twice?); \
             point [tasks] path at one file or one kind"
                .to_owned(),
        ));
    }
    Ok(files)
}

/// Whether `rel` (a path inside the dataset directory) belongs to `split`:
/// HF names shards `SPLIT-00000-of-00002.parquet` (Hub) or
/// `NAME-SPLIT-00000-of-00002.arrow` / `NAME-SPLIT.arrow` (cache), and
/// `save_to_disk` puts each split in a directory of its own.
fn in_split(rel: &Path, split: &str) -> bool {
    let dirs = rel
        .parent()
        .into_iter()
        .flat_map(|p| p.components())
        .any(|c| c.as_os_str() == split);
    let stem = rel.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let parts: Vec<&str> = stem.split('-').collect();
    dirs || parts.contains(&split)
}

/// Reads every data file of `path` into one task set; rows are numbered
/// from 0 across all files.
pub(super) fn load(
    path: &Path,
    format: TaskFormat,
    opts: &LoadOptions,
) -> Result<TaskSet, TaskError> {
    let files = data_files(path, opts.split.as_deref())?;
    let mut builder = Builder::new(path, opts);
    let mut format = format;
    let mut row = 0usize;
    for file in &files {
        // A format named (or detected from an earlier file) is checked
        // against the schema before any row is read.
        let named = format;
        let check = |schema: &[String]| check_schema(file, schema, named, opts);
        let mut on_batch = |batch: RecordBatch| -> Result<(), TaskError> {
            let values = batch_rows(&batch).map_err(|e| invalid(file, e))?;
            let raws: Vec<(Loc, Raw<'_>)> = values
                .into_iter()
                .enumerate()
                .map(|(i, v)| {
                    let loc = Loc {
                        number: row + i,
                        unit: Unit::Row,
                    };
                    (loc, Raw::Element(v))
                })
                .collect();
            let raws = formats::rename(raws, &opts.columns);
            if format == TaskFormat::Auto {
                format = formats::resolve(format, &raws, file)?;
            }
            let n = raws.len();
            for (loc, record) in formats::decode_all(format, raws, row) {
                builder.push(loc, record)?;
            }
            row += n;
            Ok(())
        };
        match kind_of(file) {
            Some(Kind::Parquet) => read_parquet(file, &check, &mut on_batch)?,
            _ => read_arrow(file, &check, &mut on_batch)?,
        }
    }
    if row == 0 {
        return Err(invalid(path, "the file holds no rows".to_owned()));
    }
    Ok(builder.set)
}

/// A format named explicitly whose keys the schema lacks is a whole-file
/// error that names what was found and what is needed, not one per row.
fn check_schema(
    file: &Path,
    schema: &[String],
    format: TaskFormat,
    opts: &LoadOptions,
) -> Result<(), TaskError> {
    let found: Vec<String> = schema
        .iter()
        .map(|c| {
            opts.columns
                .iter()
                .find(|(_, f)| *f == c)
                .map_or_else(|| c.clone(), |(w, _)| w.clone())
        })
        .collect();
    let missing: Vec<&str> = formats::required_keys(format)
        .iter()
        .copied()
        .filter(|k| !found.iter().any(|c| c == k))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(invalid(
        file,
        format!(
            "format {format} needs the columns {missing:?}, which the file lacks; its columns are \
             {schema:?}; rename with [tasks.columns] (e.g. {} = \"{}\")",
            missing[0],
            schema.first().map_or("COLUMN", String::as_str)
        ),
    ))
}

type Check<'a> = dyn Fn(&[String]) -> Result<(), TaskError> + 'a;
type OnBatch<'a> = dyn FnMut(RecordBatch) -> Result<(), TaskError> + 'a;

/// Checks a parquet file's column names with `check`, then calls
/// `on_batch` with each of its record batches.
fn read_parquet(
    file: &Path,
    check: &Check<'_>,
    on_batch: &mut OnBatch<'_>,
) -> Result<(), TaskError> {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let f = File::open(file).map_err(|source| TaskError::Io {
        path: file.to_path_buf(),
        source,
    })?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(f)
        .map_err(|e| invalid(file, format!("not a readable parquet file: {e}")))?;
    check(&names(builder.schema()))?;
    let reader = builder
        .with_batch_size(BATCH_ROWS)
        .build()
        .map_err(|e| invalid(file, format!("not a readable parquet file: {e}")))?;
    for batch in reader {
        on_batch(batch.map_err(|e| invalid(file, format!("a row group cannot be read: {e}")))?)?;
    }
    Ok(())
}

/// The same for an Arrow IPC file: the stream format (what `datasets`
/// writes) or the file format (`ARROW1` magic).
fn read_arrow(file: &Path, check: &Check<'_>, on_batch: &mut OnBatch<'_>) -> Result<(), TaskError> {
    let open = || {
        File::open(file).map_err(|source| TaskError::Io {
            path: file.to_path_buf(),
            source,
        })
    };
    let mut magic = [0u8; 6];
    let is_file_format = {
        use std::io::Read as _;
        let mut f = open()?;
        f.read_exact(&mut magic).is_ok() && &magic == b"ARROW1"
    };
    let bad =
        |e: arrow_schema::ArrowError| invalid(file, format!("not a readable Arrow file: {e}"));
    if is_file_format {
        let reader = arrow_ipc::reader::FileReader::try_new(open()?, None).map_err(bad)?;
        check(&names(&reader.schema()))?;
        for batch in reader {
            on_batch(batch.map_err(bad)?)?;
        }
    } else {
        let reader =
            arrow_ipc::reader::StreamReader::try_new(std::io::BufReader::new(open()?), None)
                .map_err(bad)?;
        check(&names(&reader.schema()))?;
        for batch in reader {
            on_batch(batch.map_err(bad)?)?;
        }
    }
    Ok(())
}

fn names(schema: &arrow_schema::Schema) -> Vec<String> {
    schema.fields().iter().map(|f| f.name().clone()).collect()
}

/// Each row of `batch` as a JSON object (structs as objects, lists as
/// arrays, nulls left out as a JSON export leaves them).
fn batch_rows(batch: &RecordBatch) -> Result<Vec<Value>, String> {
    let mut w = arrow_json::LineDelimitedWriter::new(Vec::new());
    w.write(batch)
        .and_then(|()| w.finish())
        .map_err(|e| format!("a record batch cannot be read as JSON: {e}"))?;
    let bytes = w.into_inner();
    bytes
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).map_err(|e| format!("a row is not JSON: {e}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::in_split;
    use std::path::Path;

    #[test]
    fn split_files_are_found_by_the_names_hf_gives_them() {
        let yes = [
            "data/train-00000-of-00002.parquet",
            "mbpp-train.arrow",
            "mbpp-train-00001-of-00003.arrow",
            "train/data-00000-of-00001.arrow",
            "train.parquet",
        ];
        for f in yes {
            assert!(in_split(Path::new(f), "train"), "{f}");
        }
        for f in [
            "data/test-00000-of-00001.parquet",
            "mbpp-test.arrow",
            "training.parquet",
        ] {
            assert!(!in_split(Path::new(f), "train"), "{f}");
        }
    }
}
