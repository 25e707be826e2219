//! The map of docs/architecture.md holds in the code: data flows down the
//! module order, so a module names only modules above it (`crate::X`), the
//! bottom layer (`config`, `fsutil`, `text`) names nothing else of the
//! crate, and no training step imports another step. The test reads the
//! sources as text and fails naming every edge that breaks the order.

use std::path::{Path, PathBuf};

use crate::common::root;

/// The module order, top of the map first. Modules of one rank may not
/// name each other; `cli` (the binary) may name everything.
const ORDER: &[&[&str]] = &[
    &["config", "fsutil", "text"],
    &["run_dir"],
    &["task"],
    &["dist"],
    &["kernels"],
    &["model"],
    &["exec"],
    &["reward"],
    &["memory"],
    &["rollout"],
    &["eval"],
    &["train"],
    &["report"],
    &["cli"],
];

fn rank(module: &str) -> Option<usize> {
    ORDER.iter().position(|r| r.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a source file belongs to (`main.rs` and `cli/`
/// are the binary).
fn module_of(rel: &Path) -> String {
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    match first.trim_end_matches(".rs") {
        "main" => "cli".into(),
        m => m.into(),
    }
}

/// The code of a file without its comments (line comments and doc
/// comments: an intra-doc link is not an import).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(at) if !l[..at].contains('"') => &l[..at],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every module a piece of code names as `crate::NAME`, with its line.
fn named_modules(code: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in code.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            let before = rest[..at].chars().last();
            rest = &rest[at + "crate::".len()..];
            // `falcon_rl::crate::` never occurs; a preceding identifier
            // character means a longer name (`my_crate::`).
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push((i + 1, name));
        }
    }
    out
}

#[test]
fn no_module_imports_one_below_it_or_beside_it() {
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut bad = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        if rel == Path::new("lib.rs") {
            continue;
        }
        let me = module_of(rel);
        let Some(my_rank) = rank(&me) else {
            bad.push(format!(
                "{}: module `{me}` is not in the map's order (tests/layers.rs)",
                rel.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(f).unwrap();
        assert!(
            !text.contains("crate::{"),
            "{}: name modules one by one (`crate::a::X`), so this test sees every edge",
            rel.display()
        );
        for (line, other) in named_modules(&code(&text)) {
            if other == me {
                continue;
            }
            match rank(&other) {
                Some(r) if r < my_rank => {}
                Some(_) => bad.push(format!(
                    "{}:{line}: `{me}` imports `{other}`, which is not above it",
                    rel.display()
                )),
                None => bad.push(format!(
                    "{}:{line}: `crate::{other}` is not a module of the map",
                    rel.display()
                )),
            }
        }
    }
    assert!(bad.is_empty(), "edges against the map:\n{}", bad.join("\n"));
}

#[test]
fn no_training_step_imports_another() {
    let dir = root().join("src/train/step");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    let steps: Vec<String> = files
        .iter()
        .filter_map(|f| f.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .filter(|s| s != "mod")
        .collect();
    assert!(steps.len() >= 3, "rl, meta and sft steps: {steps:?}");
    let mut bad = Vec::new();
    for f in &files {
        let me = f.file_stem().unwrap().to_string_lossy().into_owned();
        if me == "mod" {
            continue;
        }
        let text = code(&std::fs::read_to_string(f).unwrap());
        for other in steps.iter().filter(|s| **s != me) {
            for pat in [format!("step::{other}"), format!("super::{other}")] {
                if text.contains(&pat) {
                    bad.push(format!("step `{me}` names `{pat}`"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_checker_sees_an_upward_edge() {
    // The test above can fail: an edge from `model` to `train` is found.
    let found = named_modules(&code(
        "use crate::train::TrainState; // crate::eval in a comment\n/// [`crate::exec`]\nlet x = a_crate::b;",
    ));
    assert_eq!(found, vec![(1, "train".to_string())]);
    assert!(rank("train").unwrap() > rank("model").unwrap());
}
