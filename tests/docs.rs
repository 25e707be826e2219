//! The docs cannot drift from the CLI: every `falcon` command shown in
//! README.md, docs/*.md, the measurement logs of docs/results/ and
//! scripts/README.md (fenced blocks, and inline code that starts with
//! `falcon `) is run. Each is parsed by the real binary (`falcon ARGS
//! --help` fails on an unknown subcommand, flag or enum value), every
//! file of the repository it names (`configs/`, `data/`, `scripts/`) must
//! exist, and the commands that need nothing but the repository (`info`,
//! `config show`, `tasks check` on bundled data) run for real and must
//! succeed. Every `scripts/...` command shown must be an executable script.

use std::path::Path;

use crate::common::{falcon, root};

/// The shell words of a documented command line, with `[optional]`
/// brackets and a trailing `# comment` dropped.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                any = true;
            }
            (None, '#') if !any && cur.is_empty() => break,
            (None, c) if c.is_whitespace() => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            (None, '[' | ']') => {}
            (None, c) => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(cur);
    }
    out
}

/// The argument words of every `falcon` command in `text`, with the line.
fn commands(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let mut candidates: Vec<&str> = Vec::new();
        if fenced {
            candidates.push(t.strip_prefix("$ ").unwrap_or(t));
        } else {
            // Inline code spans: `falcon ...`.
            for (k, span) in t.split('`').enumerate() {
                if k % 2 == 1 {
                    candidates.push(span);
                }
            }
        }
        for c in candidates {
            let w = words(c);
            let Some(first) = w.first() else { continue };
            if matches!(first.as_str(), "falcon" | "$B" | "target/release/falcon") && w.len() > 1 {
                out.push((i + 1, w[1..].to_vec()));
            }
        }
    }
    out
}

/// Placeholders in the docs that a parser would refuse as values.
fn concrete(arg: &str) -> String {
    match arg {
        "N" => "1".into(),
        a => a.into(),
    }
}

fn doc_files() -> Vec<std::path::PathBuf> {
    let mut files = vec![root().join("README.md")];
    for dir in ["docs", "docs/results"] {
        let mut docs: Vec<_> = std::fs::read_dir(root().join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        docs.sort();
        files.extend(docs);
    }
    files.push(root().join("scripts").join("README.md"));
    files
}

#[test]
fn every_documented_falcon_command_parses_and_names_real_files() {
    let mut bad = Vec::new();
    let mut seen = 0;
    let mut ran = 0;
    for file in doc_files() {
        let name = file.strip_prefix(root()).unwrap().display().to_string();
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, args) in commands(&text) {
            seen += 1;
            let args: Vec<String> = args.iter().map(|a| concrete(a)).collect();
            let shown = args.join(" ");
            let mut help = args.clone();
            help.push("--help".into());
            let o = falcon(&help);
            if !o.status.success() {
                bad.push(format!(
                    "{name}:{line}: `falcon {shown}` does not parse: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
                continue;
            }
            for (k, a) in args.iter().enumerate() {
                let output = k > 0 && args[k - 1] == "--out";
                let repo = ["configs/", "data/", "scripts/"]
                    .iter()
                    .any(|p| a.starts_with(p));
                if repo && !output && !Path::new(&root().join(a)).exists() {
                    bad.push(format!(
                        "{name}:{line}: `falcon {shown}` names {a}, which is not in the repository"
                    ));
                }
            }
            let runs_here = match args.first().map(String::as_str) {
                Some("info") => true,
                Some("config") => args.get(1).is_some_and(|s| s == "show"),
                Some("tasks") => args.iter().any(|a| a.starts_with("data/")),
                _ => false,
            };
            if runs_here {
                ran += 1;
                let o = falcon(&args);
                if !o.status.success() {
                    bad.push(format!(
                        "{name}:{line}: `falcon {shown}` fails: {}",
                        String::from_utf8_lossy(&o.stderr).trim()
                    ));
                }
            }
        }
    }
    assert!(seen >= 30 && ran >= 3, "{seen} commands seen, {ran} run");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn every_documented_script_exists_and_is_executable() {
    use std::os::unix::fs::PermissionsExt;
    let mut bad = Vec::new();
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, line) in text.lines().enumerate() {
            // Prose, not shell: split on spaces, code marks and brackets.
            for w in line.split(|c: char| c.is_whitespace() || "`()[]\"".contains(c)) {
                let Some(rest) = w.strip_prefix("scripts/") else {
                    continue;
                };
                let rest = rest.split('\'').next().unwrap_or(rest);
                let name = rest.trim_end_matches([',', '.', ';', ':']);
                if name.is_empty() || name.contains('*') || name.contains('{') {
                    continue;
                }
                let p = root().join("scripts").join(name);
                let ok = p.is_file()
                    && (name.ends_with(".py")
                        || name.ends_with(".txt")
                        || std::fs::metadata(&p).unwrap().permissions().mode() & 0o111 != 0);
                if !ok {
                    bad.push(format!(
                        "{}:{}: scripts/{name} is not an executable script of the repository",
                        file.strip_prefix(root()).unwrap().display(),
                        i + 1
                    ));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_docs_reader_finds_commands_in_blocks_and_inline() {
    let text = "```sh\n$B eval --config run.toml [--out r.json]   # a comment\n```\nRun `falcon info` now; `cargo test` is not ours.\n";
    let found = commands(text);
    assert_eq!(
        found,
        vec![
            (
                2,
                vec!["eval", "--config", "run.toml", "--out", "r.json"]
                    .into_iter()
                    .map(String::from)
                    .collect::<Vec<_>>()
            ),
            (4, vec!["info".to_string()]),
        ]
    );
    assert_eq!(
        words("--prompt \"def f(x):\" --k N"),
        ["--prompt", "def f(x):", "--k", "N"]
    );
}

/// Nothing the product ships may point at the developers' own directory
/// beside the checkout: a user's clone has no such path. Every text file of
/// the shipped trees (and the CLI's `--help`, which lives in `src/`) is read.
#[test]
fn nothing_shipped_points_outside_the_repository() {
    let needles = [concat!("..", "/shared"), concat!("/shared", "/data")];
    let mut stack: Vec<std::path::PathBuf> = [
        "README.md",
        "docs",
        "configs",
        "examples",
        "scripts",
        "src",
        "tests",
        "data",
        ".ci",
    ]
    .iter()
    .map(|p| root().join(p))
    .collect();
    let mut read = 0;
    let mut hits = Vec::new();
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            for e in std::fs::read_dir(&p).unwrap().flatten() {
                stack.push(e.path());
            }
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&p) else {
            continue;
        };
        read += 1;
        for (n, line) in text.lines().enumerate() {
            if needles.iter().any(|s| line.contains(s)) {
                hits.push(format!("{}:{}: {}", p.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(read > 100, "only {read} files read: wrong root?");
    assert!(
        hits.is_empty(),
        "paths outside the repository:\n{}",
        hits.join("\n")
    );
}
