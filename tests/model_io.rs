//! Bad model input gets a clear error that names the file and the problem,
//! never a panic.

use std::path::Path;

use falcon_rl::model::tokenizer::TextTokenizer;
use falcon_rl::model::{Dtype, Policy};
use tch::Device;

use crate::common::*;

fn load_err(dir: &Path) -> String {
    match Policy::load(dir, Dtype::Fp32, Device::Cpu) {
        Ok(_) => panic!("{} loaded but should not", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn qwen_copy() -> tempfile::TempDir {
    let d = tmpdir();
    copy_dir(&fixture("tiny-qwen2"), d.path());
    d
}

#[test]
fn truncated_safetensors_names_the_file() {
    let d = qwen_copy();
    let f = d.path().join("model.safetensors");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    let e = load_err(d.path());
    assert!(e.contains("model.safetensors"), "{e}");
    assert!(e.contains("not a valid safetensors file"), "{e}");
}

#[test]
fn config_missing_field_names_file_and_field() {
    let d = qwen_copy();
    let f = d.path().join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("hidden_size");
    std::fs::write(&f, v.to_string()).unwrap();
    let e = load_err(d.path());
    assert!(
        e.contains("config.json") && e.contains("hidden_size"),
        "{e}"
    );
}

#[test]
fn unsupported_model_type_and_bad_json_are_reported() {
    let d = qwen_copy();
    let f = d.path().join("config.json");
    let text = std::fs::read_to_string(&f)
        .unwrap()
        .replace("\"qwen2\"", "\"mamba\"");
    std::fs::write(&f, text).unwrap();
    let e = load_err(d.path());
    assert!(e.contains("model_type `mamba`"), "{e}");
    std::fs::write(&f, "{ not json").unwrap();
    let e = load_err(d.path());
    assert!(
        e.contains("config.json") && e.contains("invalid JSON"),
        "{e}"
    );
}

#[test]
fn shape_mismatch_names_the_tensor() {
    let d = qwen_copy();
    let f = d.path().join("config.json");
    let text = std::fs::read_to_string(&f)
        .unwrap()
        .replace("\"intermediate_size\": 84", "\"intermediate_size\": 85");
    std::fs::write(&f, text).unwrap();
    let e = load_err(d.path());
    assert!(e.contains("mlp") && e.contains("shape"), "{e}");
}

#[test]
fn missing_weights_file_is_reported() {
    let d = qwen_copy();
    std::fs::remove_file(d.path().join("model.safetensors")).unwrap();
    let e = load_err(d.path());
    assert!(e.contains("model.safetensors"), "{e}");
}

#[test]
fn unparsable_tokenizer_json_names_the_file() {
    let d = tmpdir();
    std::fs::write(d.path().join("tokenizer.json"), "{\"model\": 42}").unwrap();
    let e = TextTokenizer::from_dir(d.path())
        .err()
        .expect("must fail")
        .to_string();
    assert!(
        e.contains("tokenizer.json") && e.contains("does not parse"),
        "{e}"
    );
}
