//! The static documentation `D` of MEMCoder's private library: [`ApiDoc`]
//! entries read from a JSON array or a JSONL file, with errors that name
//! the `path:line` of the entry to fix.
//!
//! An array's elements are parsed one by one, each from where it starts,
//! so a field error points at its element's line rather than line 1.

use std::collections::HashMap;
use std::path::Path;

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};

use super::MemcoderError;
use crate::text::python;

/// One API of the private library's static documentation (`D_a`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiDoc {
    /// Fully qualified, e.g. `numpy.zeros`.
    pub name: String,
    pub signature: String,
    pub description: String,
    /// The definition's source code, when the docs carry it.
    #[serde(default)]
    pub source: Option<String>,
}

/// Reads API docs from a JSON array or a JSONL file (one object per line,
/// blank lines skipped). Names must be dotted identifiers and unique.
pub fn load_api_docs(path: &Path) -> Result<Vec<ApiDoc>, MemcoderError> {
    let text = std::fs::read_to_string(path).map_err(|source| MemcoderError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse_api_docs(&text, path)
}

/// [`load_api_docs`] on text already read; `path` only names the errors.
pub fn parse_api_docs(text: &str, path: &Path) -> Result<Vec<ApiDoc>, MemcoderError> {
    let bad = |line: usize, reason: String| MemcoderError::BadDoc {
        path: path.to_owned(),
        line,
        reason,
    };
    let mut entries: Vec<(usize, &str)> = Vec::new();
    if text.trim_start().starts_with('[') {
        // Check the whole array first so syntax errors get serde's line; then
        // parse element by element so field errors point at their element.
        if let Err(e) = serde_json::from_str::<Vec<serde_json::Value>>(text) {
            return Err(bad(e.line(), e.to_string()));
        }
        for (start, end) in array_elements(text) {
            entries.push((line_of(text, start), &text[start..end]));
        }
    } else {
        for (i, line) in text.lines().enumerate() {
            if !line.trim().is_empty() {
                entries.push((i + 1, line));
            }
        }
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut docs = Vec::with_capacity(entries.len());
    for (line, json) in entries {
        let doc: ApiDoc = serde_json::from_str(json)
            .map_err(|e| bad(line + e.line().saturating_sub(1), e.to_string()))?;
        if !is_dotted_name(&doc.name) {
            return Err(bad(
                line,
                format!(
                    "API name {:?} is not a dotted identifier like `pkg.mod.func`",
                    doc.name
                ),
            ));
        }
        if let Some(first) = seen.insert(doc.name.clone(), line) {
            return Err(bad(
                line,
                format!("duplicate API {:?} (first at line {first})", doc.name),
            ));
        }
        docs.push(doc);
    }
    Ok(docs)
}

/// Byte ranges of the elements of a JSON array that serde has already
/// accepted: serde_json reads each element where it starts (so strings and
/// nesting are its business) and says where it ended; only the whitespace
/// and commas between elements are stepped over here.
fn array_elements(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = text.find('[').map_or(text.len(), |i| i + 1);
    loop {
        at += text[at..]
            .find(|c: char| !matches!(c, ' ' | '\t' | '\r' | '\n' | ','))
            .unwrap_or(text.len() - at);
        if text[at..].starts_with(']') || at == text.len() {
            return out;
        }
        let mut one = serde_json::Deserializer::from_str(&text[at..]).into_iter::<IgnoredAny>();
        if !matches!(one.next(), Some(Ok(_))) {
            return out;
        }
        out.push((at, at + one.byte_offset()));
        at += one.byte_offset();
    }
}

fn line_of(text: &str, byte: usize) -> usize {
    text[..byte].matches('\n').count() + 1
}

/// Whether `name` is a dotted identifier like `pkg.mod.func`.
pub(super) fn is_dotted_name(name: &str) -> bool {
    !name.is_empty() && name.split('.').all(python::is_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_load_from_json_array_and_jsonl_with_line_errors() {
        let p = Path::new("docs.json");
        let array = r#"[
  {"name": "numpy.zeros", "signature": "zeros(shape)", "description": "d"},
  {"name": "ndonnx.asarray", "signature": "asarray(obj)",
   "description": "d, with a ] and } in it", "source": "def asarray(obj): ..."}
]"#;
        let docs = parse_api_docs(array, p).unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1].source.as_deref(), Some("def asarray(obj): ..."));
        let jsonl = "{\"name\": \"a.b\", \"signature\": \"s\", \"description\": \"d\"}\n\n\
                     {\"name\": \"a.c\", \"signature\": \"s\", \"description\": \"d\"}\n";
        assert_eq!(parse_api_docs(jsonl, p).unwrap().len(), 2);

        let err = |text: &str| parse_api_docs(text, p).unwrap_err().to_string();
        let missing = "[\n  {\"name\": \"a.b\", \"signature\": \"s\", \"description\": \"d\"},\n  {\"name\": \"a.c\",\n   \"signature\": \"s\"}\n]";
        assert!(
            err(missing).starts_with("docs.json:4: missing field `description`"),
            "{}",
            err(missing)
        );
        let syntax = "[\n  {\"name\": \"a.b\",}\n]";
        assert!(err(syntax).starts_with("docs.json:2: "), "{}", err(syntax));
        let dup =
            format!("{jsonl}{{\"name\": \"a.b\", \"signature\": \"s\", \"description\": \"d\"}}\n");
        assert_eq!(
            err(&dup),
            "docs.json:4: duplicate API \"a.b\" (first at line 1)"
        );
        let badname = "{\"name\": \"a b\", \"signature\": \"s\", \"description\": \"d\"}\n";
        assert!(err(badname).starts_with("docs.json:1: API name"));
        let badline =
            "{\"name\": \"a.b\", \"signature\": \"s\", \"description\": \"d\"}\nnot json\n";
        assert!(
            err(badline).starts_with("docs.json:2: "),
            "{}",
            err(badline)
        );
        assert!(matches!(
            load_api_docs(Path::new("/nonexistent/docs.json")),
            Err(MemcoderError::Io { .. })
        ));
    }

    #[test]
    fn array_elements_are_the_values_between_the_commas() {
        let text = " [ {\"a\": \"],\\\"\"} ,\n 2, [3, [4]],\"x\"\n] ";
        let got: Vec<&str> = array_elements(text)
            .into_iter()
            .map(|(s, e)| &text[s..e])
            .collect();
        assert_eq!(got, ["{\"a\": \"],\\\"\"}", "2", "[3, [4]]", "\"x\""]);
        assert!(array_elements("[]").is_empty());
        assert!(array_elements("[ \n ]").is_empty());
    }
}
