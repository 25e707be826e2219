//! Static judges for style `S` and complexity `C` on FALCON's −1..2 scale
//! (§4.4 uses an LM judge with Tables 8 and 9; these are the deterministic,
//! model-free default).
//!
//! - Style: ruff's findings (rules `E,W,F,N,B,UP,SIM` by default: pycodestyle,
//!   pyflakes, pep8-naming, bugbear, pyupgrade, simplify), counted per 10
//!   non-blank lines: `S = 2 − 3·min(1, d / d_worst)` with `d` the findings
//!   per 10 lines and `d_worst` (default 4) the density that earns −1. Code
//!   ruff cannot parse scores −1.
//! - Complexity: McCabe cyclomatic complexity of the most complex block
//!   (function, method, class body or module top level), computed from
//!   Python's `ast` by a small embedded script: `C = 2` up to `cc_simple`
//!   (default 5), `−1` from `cc_worst` (default 20), linear between. Code
//!   Python cannot parse scores −1.
//!
//! Both tools only parse the candidate code; neither compiles nor runs it.
//! Each run has a wall-clock timeout; a timeout or a tool failure on one
//! sample gives no signal for that sample (counted), never a guessed score.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::process::{resolve_tool, run_tool, ToolRunError};
use super::{Aspect, Judge, JudgeStats, RewardError};
use crate::config::StaticJudgeConfig;

/// The McCabe script run by `python3 -I -S -c`. It reads the code on stdin,
/// calls `ast.parse` (no compile, no exec), and prints one JSON object:
/// `{"blocks": [{"name", "line", "complexity"}]}`, or `{"syntax_error": true,
/// "line", "message"}`, or `{"failed": "<exception>"}` (too deep to parse).
/// With the argument `--batch` it reads a JSON list of codes and prints a
/// JSON list of such objects (one interpreter start for a whole batch).
pub const MCCABE_SCRIPT: &str = r#"
# A block's complexity is 1 + its decision points (nested def/class bodies
# are blocks of their own; lambdas count toward the enclosing block):
#   if / elif / ternary: +1        for / while: +1, and +1 for an else
#   except clause: +1              match case: +1
#   and / or: +1 per extra operand comprehension: +1 per for, +1 per if
import ast, json, sys

def measure(src):
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError) as e:
        return {"syntax_error": True, "line": getattr(e, "lineno", None), "message": str(e)}
    except (RecursionError, MemoryError) as e:
        return {"failed": type(e).__name__}
    blocks = [{"name": "<module>", "line": 1, "complexity": 1}]
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    stack = [(child, 0) for child in ast.iter_child_nodes(tree)]
    while stack:
        node, b = stack.pop()
        if isinstance(node, scopes):
            blocks.append({"name": node.name, "line": node.lineno, "complexity": 1})
            b = len(blocks) - 1
        elif isinstance(node, (ast.If, ast.IfExp, ast.ExceptHandler, ast.match_case)):
            blocks[b]["complexity"] += 1
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            blocks[b]["complexity"] += 1 + (1 if node.orelse else 0)
        elif isinstance(node, ast.BoolOp):
            blocks[b]["complexity"] += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            blocks[b]["complexity"] += 1 + len(node.ifs)
        stack.extend((child, b) for child in ast.iter_child_nodes(node))
    return {"blocks": blocks}

if sys.argv[1:] == ["--batch"]:
    codes = json.loads(sys.stdin.buffer.read())
    print(json.dumps([measure(code.encode("utf-8", "surrogatepass")) for code in codes]))
else:
    print(json.dumps(measure(sys.stdin.buffer.read())))
"#;

/// The file name ruff is told the stdin code has (it affects only messages).
const STDIN_FILENAME: &str = "cand.py";

/// One ruff finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// ruff's rule code (`E711`), or `invalid-syntax` / `None` for a syntax error.
    pub code: Option<String>,
    /// 1-based line in the code.
    pub line: u32,
    pub message: String,
}

impl Finding {
    /// Whether this finding is ruff's report that the code does not parse.
    pub fn is_syntax_error(&self) -> bool {
        match self.code.as_deref() {
            None => true,
            Some(code) => code == "invalid-syntax" || code == "E999",
        }
    }
}

/// One block's McCabe complexity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Block {
    /// Function, method or class name; `<module>` for top-level statements.
    pub name: String,
    pub line: u32,
    pub complexity: u32,
}

/// What the McCabe script found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McCabe {
    /// Every block with its complexity (the first is `<module>`).
    Blocks(Vec<Block>),
    /// Python could not parse the code.
    SyntaxError { line: Option<u32>, message: String },
}

/// `S` from ruff's findings: `2 − 3·min(1, d / d_worst)`, with `d` the
/// findings per 10 non-blank lines (at least one line is assumed), and −1 when
/// any finding is a syntax error.
pub fn style_score(findings: &[Finding], code: &str, findings_per_10_lines_at_worst: f64) -> f64 {
    if findings.iter().any(Finding::is_syntax_error) {
        return -1.0;
    }
    let lines = code.lines().filter(|l| !l.trim().is_empty()).count().max(1);
    let density = 10.0 * findings.len() as f64 / lines as f64;
    2.0 - 3.0 * (density / findings_per_10_lines_at_worst).min(1.0)
}

/// `C` from the largest block complexity: 2 up to `simple`, −1 from `worst`,
/// linear between; −1 for code Python cannot parse.
pub fn complexity_score(mccabe: &McCabe, simple: f64, worst: f64) -> f64 {
    let McCabe::Blocks(blocks) = mccabe else {
        return -1.0;
    };
    let cc = blocks.iter().map(|b| b.complexity).max().unwrap_or(1) as f64;
    let t = ((cc - simple) / (worst - simple)).clamp(0.0, 1.0);
    2.0 - 3.0 * t
}

#[derive(Deserialize)]
struct RuffLocation {
    row: u32,
}

#[derive(Deserialize)]
struct RuffFinding {
    code: Option<String>,
    location: RuffLocation,
    message: String,
}

/// A finding of a run over files: which file it is in.
#[derive(Deserialize)]
struct RuffFileFinding {
    filename: String,
    #[serde(flatten)]
    finding: RuffFinding,
}

/// Codes per ruff run (the command line holds their paths).
const RUFF_BATCH: usize = 512;

#[derive(Deserialize)]
struct McCabeJson {
    #[serde(default)]
    blocks: Option<Vec<Block>>,
    #[serde(default)]
    syntax_error: bool,
    #[serde(default)]
    line: Option<u32>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    failed: Option<String>,
}

/// The ruff + McCabe judge. Build it with [`StaticJudge::new`], which finds
/// both tools and checks that they work, so a missing install fails at
/// start-up with a message saying to run `scripts/setup`.
#[derive(Debug)]
pub struct StaticJudge {
    cfg: StaticJudgeConfig,
    ruff: std::path::PathBuf,
    python: std::path::PathBuf,
    timeout: Duration,
    scored: AtomicUsize,
    timeouts: AtomicUsize,
    failures: AtomicUsize,
    last_failure: Mutex<Option<String>>,
}

impl StaticJudge {
    /// Finds ruff and Python (see [`StaticJudgeConfig`]) and runs each once on
    /// a tiny program. Fails with [`RewardError::ToolMissing`] or
    /// [`RewardError::ToolBroken`].
    pub fn new(cfg: &StaticJudgeConfig) -> Result<Self, RewardError> {
        let missing = |tool: &str, key, tried: Vec<std::path::PathBuf>| RewardError::ToolMissing {
            tool: tool.to_owned(),
            key,
            tried: crate::config::tried_list(&tried),
        };
        let ruff = resolve_tool(&cfg.ruff, "ruff").map_err(|t| missing("ruff", "ruff", t))?;
        let python =
            resolve_tool(&cfg.python, "python3").map_err(|t| missing("python3", "python", t))?;
        let judge = StaticJudge {
            cfg: cfg.clone(),
            ruff,
            python,
            timeout: Duration::from_secs_f64(cfg.timeout_s),
            scored: AtomicUsize::new(0),
            timeouts: AtomicUsize::new(0),
            failures: AtomicUsize::new(0),
            last_failure: Mutex::new(None),
        };
        // Self-check: a clean program must lint clean and measure 1.
        let probe = "def f(x):\n    return x\n";
        match judge.try_ruff(probe) {
            Ok(f) if f.is_empty() => {}
            Ok(f) => return Err(judge.broken("ruff", format!("findings on a clean probe: {f:?}"))),
            Err(why) => return Err(judge.broken("ruff", why)),
        }
        match judge.try_mccabe(probe) {
            Ok(McCabe::Blocks(b)) if b.iter().all(|b| b.complexity == 1) => {}
            Ok(other) => return Err(judge.broken("python3", format!("probe gave {other:?}"))),
            Err(why) => return Err(judge.broken("python3", why)),
        }
        Ok(judge)
    }

    fn broken(&self, tool: &str, reason: String) -> RewardError {
        let path = if tool == "ruff" {
            &self.ruff
        } else {
            &self.python
        };
        RewardError::ToolBroken {
            tool: format!("{tool} ({})", path.display()),
            reason,
        }
    }

    /// ruff's findings on `code`, or `None` (counted) when ruff timed out or failed.
    pub fn ruff_findings(&self, code: &str) -> Option<Vec<Finding>> {
        self.counted(self.try_ruff(code))
    }

    /// McCabe complexity of `code`, or `None` (counted) when the script timed out or failed.
    pub fn mccabe(&self, code: &str) -> Option<McCabe> {
        self.counted(self.try_mccabe(code))
    }

    /// S for one code; `None` is no signal.
    pub fn style(&self, code: &str) -> Option<f64> {
        let findings = self.ruff_findings(code)?;
        Some(style_score(
            &findings,
            code,
            self.cfg.style_findings_per_10_lines_at_worst,
        ))
    }

    /// C for one code; `None` is no signal.
    pub fn complexity(&self, code: &str) -> Option<f64> {
        let m = self.mccabe(code)?;
        Some(complexity_score(
            &m,
            self.cfg.complexity_simple,
            self.cfg.complexity_worst,
        ))
    }

    /// The most recent failure message (ruff's stderr, a bad JSON line), for logs.
    pub fn last_failure(&self) -> Option<String> {
        self.last_failure.lock().ok().and_then(|g| g.clone())
    }

    fn counted<T>(&self, r: Result<T, String>) -> Option<T> {
        match r {
            Ok(v) => {
                self.scored.fetch_add(1, Ordering::Relaxed);
                Some(v)
            }
            Err(why) => {
                if why == TIMEOUT {
                    self.timeouts.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.failures.fetch_add(1, Ordering::Relaxed);
                }
                if let Ok(mut g) = self.last_failure.lock() {
                    *g = Some(why);
                }
                None
            }
        }
    }

    /// ruff's JSON findings on `targets` (`-` for stdin), or why it failed.
    fn run_ruff(
        &self,
        targets: &[&str],
        input: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, String> {
        let select = self.cfg.ruff_select.join(",");
        let mut args = vec![
            "check",
            "--isolated",
            "--no-cache",
            "--output-format",
            "json",
            "--select",
            &select,
        ];
        args.extend_from_slice(targets);
        let out = run_tool(&self.ruff, &args, &[], input, timeout).map_err(tool_error)?;
        // 0: no findings, 1: findings; anything else is ruff's own failure.
        if !matches!(out.code, Some(0 | 1)) {
            return Err(format!(
                "ruff exited with {}: {}",
                exit_code(out.code),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(out.stdout)
    }

    fn try_ruff(&self, code: &str) -> Result<Vec<Finding>, String> {
        let stdout = self.run_ruff(
            &["--stdin-filename", STDIN_FILENAME, "-"],
            code.as_bytes(),
            self.timeout,
        )?;
        let raw: Vec<RuffFinding> = serde_json::from_slice(&stdout)
            .map_err(|e| format!("ruff printed unreadable JSON: {e}"))?;
        Ok(raw
            .into_iter()
            .map(|f| Finding {
                code: f.code,
                line: f.location.row,
                message: f.message,
            })
            .collect())
    }

    /// ruff's findings on many codes with one ruff run over a private
    /// directory of files (the same findings as one run per code on stdin:
    /// a test checks it); when that run fails or times out, each code is
    /// checked on its own so that one pathological sample loses only its
    /// own signal.
    pub fn ruff_batch(&self, codes: &[&str]) -> Vec<Option<Vec<Finding>>> {
        if codes.len() <= 1 {
            return codes.iter().map(|c| self.ruff_findings(c)).collect();
        }
        let mut out = Vec::with_capacity(codes.len());
        for chunk in codes.chunks(RUFF_BATCH) {
            match self.try_ruff_files(chunk) {
                Ok(all) => out.extend(all.into_iter().map(|f| self.counted(Ok(f)))),
                Err(_) => out.extend(chunk.iter().map(|c| self.ruff_findings(c))),
            }
        }
        out
    }

    fn try_ruff_files(&self, codes: &[&str]) -> Result<Vec<Vec<Finding>>, String> {
        let dir = tempfile::Builder::new()
            .prefix("falcon-ruff-")
            .tempdir()
            .map_err(|e| format!("a directory for ruff's files: {e}"))?;
        let mut paths = Vec::with_capacity(codes.len());
        for (i, code) in codes.iter().enumerate() {
            let p = dir.path().join(format!("cand{i}.py"));
            std::fs::write(&p, code).map_err(|e| format!("{}: {e}", p.display()))?;
            paths.push(p.display().to_string());
        }
        let mut targets = vec!["--"];
        targets.extend(paths.iter().map(String::as_str));
        // The per-code budget covers ruff's start; a batch's files are checked
        // in parallel, so a few of those budgets cover a whole batch.
        let stdout = self.run_ruff(&targets, &[], self.timeout * 4)?;
        let raw: Vec<RuffFileFinding> = serde_json::from_slice(&stdout)
            .map_err(|e| format!("ruff printed unreadable JSON: {e}"))?;
        let mut all = vec![Vec::new(); codes.len()];
        for f in raw {
            let i = std::path::Path::new(&f.filename)
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| {
                    n.strip_prefix("cand")?
                        .strip_suffix(".py")?
                        .parse::<usize>()
                        .ok()
                })
                .filter(|&i| i < codes.len())
                .ok_or_else(|| format!("ruff reported an unknown file {:?}", f.filename))?;
            all[i].push(Finding {
                code: f.finding.code,
                line: f.finding.location.row,
                message: f.finding.message,
            });
        }
        Ok(all)
    }

    /// McCabe complexity of many codes with one interpreter start; when that
    /// run fails or times out, each code is measured on its own so that one
    /// pathological sample loses only its own signal.
    pub fn mccabe_batch(&self, codes: &[&str]) -> Vec<Option<McCabe>> {
        if codes.len() <= 1 {
            return codes.iter().map(|c| self.mccabe(c)).collect();
        }
        let input = serde_json::to_vec(codes).expect("strings serialize");
        let batch = self.run_mccabe(&["--batch"], &input).and_then(|stdout| {
            let all: Vec<McCabeJson> = serde_json::from_slice(&stdout)
                .map_err(|e| format!("mccabe script printed unreadable JSON: {e}"))?;
            if all.len() == codes.len() {
                Ok(all)
            } else {
                Err(format!("{} results for {} codes", all.len(), codes.len()))
            }
        });
        match batch {
            Ok(all) => all
                .into_iter()
                .map(|j| self.counted(McCabe::from_json(j)))
                .collect(),
            Err(_) => codes.iter().map(|c| self.mccabe(c)).collect(),
        }
    }

    fn run_mccabe(&self, extra: &[&str], input: &[u8]) -> Result<Vec<u8>, String> {
        let mut args = vec!["-I", "-S", "-c", MCCABE_SCRIPT];
        args.extend_from_slice(extra);
        let out = run_tool(&self.python, &args, &[], input, self.timeout).map_err(tool_error)?;
        if out.code != Some(0) {
            return Err(format!(
                "mccabe script exited with {}: {}",
                exit_code(out.code),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(out.stdout)
    }

    fn try_mccabe(&self, code: &str) -> Result<McCabe, String> {
        let stdout = self.run_mccabe(&[], code.as_bytes())?;
        let parsed: McCabeJson = serde_json::from_slice(&stdout)
            .map_err(|e| format!("mccabe script printed unreadable JSON: {e}"))?;
        McCabe::from_json(parsed)
    }
}

impl McCabe {
    fn from_json(parsed: McCabeJson) -> Result<McCabe, String> {
        if let Some(why) = parsed.failed {
            return Err(format!("python could not parse the code: {why}"));
        }
        if parsed.syntax_error {
            return Ok(McCabe::SyntaxError {
                line: parsed.line,
                message: parsed.message.unwrap_or_default(),
            });
        }
        parsed
            .blocks
            .map(McCabe::Blocks)
            .ok_or_else(|| "mccabe script printed no blocks".to_owned())
    }
}

const TIMEOUT: &str = "timed out";

fn tool_error(e: ToolRunError) -> String {
    match e {
        ToolRunError::Timeout => TIMEOUT.to_owned(),
        ToolRunError::Spawn(e) => format!("could not start: {e}"),
    }
}

impl Judge for StaticJudge {
    fn score(&self, aspect: Aspect, codes: &[&str]) -> Result<Vec<Option<f64>>, RewardError> {
        if aspect == Aspect::Complexity {
            let (simple, worst) = (self.cfg.complexity_simple, self.cfg.complexity_worst);
            return Ok(self
                .mccabe_batch(codes)
                .iter()
                .map(|m| m.as_ref().map(|m| complexity_score(m, simple, worst)))
                .collect());
        }
        let per = self.cfg.style_findings_per_10_lines_at_worst;
        Ok(self
            .ruff_batch(codes)
            .into_iter()
            .zip(codes)
            .map(|(f, code)| f.map(|f| style_score(&f, code, per)))
            .collect())
    }

    fn stats(&self) -> JudgeStats {
        JudgeStats {
            scored: self.scored.load(Ordering::Relaxed),
            unparseable: 0,
            timeouts: self.timeouts.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            over_budget: 0,
        }
    }
}

/// `code 2`, or `a signal` for a process that a signal ended.
fn exit_code(code: Option<i32>) -> String {
    match code {
        Some(c) => format!("code {c}"),
        None => "a signal".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    fn finding(code: &str, line: u32) -> Finding {
        Finding {
            code: Some(code.to_owned()),
            line,
            message: String::new(),
        }
    }

    /// The judge with the project's tools; a missing tool fails the test loudly.
    fn judge() -> StaticJudge {
        StaticJudge::new(&StaticJudgeConfig::default()).unwrap_or_else(|e| {
            panic!("{e}\n(the static judge tests need ruff and python3: run scripts/setup)")
        })
    }

    #[test]
    fn style_formula_by_hand() {
        let ten_lines = "x = 1\n".repeat(10);
        assert_eq!(style_score(&[], &ten_lines, 4.0), 2.0);
        // 1 finding / 10 lines: d = 1 → 2 − 3·0.25 = 1.25
        assert!(close(
            style_score(&[finding("E711", 1)], &ten_lines, 4.0),
            1.25
        ));
        // 2 findings / 20 non-blank lines (blank lines ignored): d = 1 → 1.25
        let twenty = "x = 1\n\n".repeat(20);
        let two = [finding("E711", 1), finding("F401", 3)];
        assert!(close(style_score(&two, &twenty, 4.0), 1.25));
        // d = 8 saturates at −1.
        let many: Vec<_> = (0..8).map(|i| finding("E501", i)).collect();
        assert_eq!(style_score(&many, &ten_lines, 4.0), -1.0);
        // A syntax error is −1 whatever the density.
        let syntax = Finding {
            code: Some("invalid-syntax".into()),
            line: 1,
            message: String::new(),
        };
        assert_eq!(style_score(&[syntax], &"x\n".repeat(100), 4.0), -1.0);
        // Empty code counts as one line.
        assert!(close(
            style_score(&[finding("W292", 1)], "", 40.0),
            2.0 - 3.0 * 0.25
        ));
    }

    #[test]
    fn complexity_formula_by_hand() {
        let m = |cc: &[u32]| {
            McCabe::Blocks(
                cc.iter()
                    .map(|&c| Block {
                        name: "f".into(),
                        line: 1,
                        complexity: c,
                    })
                    .collect(),
            )
        };
        assert_eq!(complexity_score(&m(&[1, 5]), 5.0, 20.0), 2.0);
        // max 10: 2 − 3·5/15 = 1.0
        assert!(close(complexity_score(&m(&[1, 10, 3]), 5.0, 20.0), 1.0));
        assert!(close(complexity_score(&m(&[15]), 5.0, 20.0), 0.0));
        assert_eq!(complexity_score(&m(&[40]), 5.0, 20.0), -1.0);
        let bad = McCabe::SyntaxError {
            line: Some(1),
            message: String::new(),
        };
        assert_eq!(complexity_score(&bad, 5.0, 20.0), -1.0);
    }

    #[test]
    fn ruff_finds_style_problems_on_real_code() {
        let j = judge();
        let clean = "def add(a, b):\n    return a + b\n";
        assert_eq!(j.ruff_findings(clean).unwrap(), vec![]);
        assert_eq!(j.style(clean), Some(2.0));
        // Five lines: unused import F401 (1), ambiguous name E741 (3), unused
        // variable F841 (3), `== None` E711 (4), statement after colon E701 (4).
        let sloppy = "import os\ndef f(x):\n  l = 1\n  if x == None: return 1\n  return x\n";
        let findings = j.ruff_findings(sloppy).unwrap();
        let mut codes: Vec<_> = findings
            .iter()
            .map(|f| (f.code.clone().unwrap(), f.line))
            .collect();
        codes.sort();
        let expected = [
            ("E701", 4),
            ("E711", 4),
            ("E741", 3),
            ("F401", 1),
            ("F841", 3),
        ];
        assert_eq!(
            codes,
            expected.map(|(c, l)| (c.to_owned(), l)).to_vec(),
            "{findings:?}"
        );
        // 5 findings / 5 lines: d = 10 ≥ 4 → −1
        assert_eq!(j.style(sloppy), Some(-1.0));
        // One finding in 10 lines: 2 − 3·(1/4) = 1.25
        let mut ten = String::from("def f(x):\n    if x == None:\n        return 0\n");
        for i in 0..7 {
            ten.push_str(&format!("    x = x + {i}\n"));
        }
        assert_eq!(ten.lines().count(), 10);
        assert_eq!(j.style(&ten), Some(1.25));
        let broken = j.ruff_findings("def f(:\n    pass\n").unwrap();
        assert!(broken.iter().any(Finding::is_syntax_error), "{broken:?}");
        assert_eq!(j.style("def f(:\n    pass\n"), Some(-1.0));
    }

    #[test]
    fn mccabe_counts_decisions_on_real_code() {
        let j = judge();
        let code = "\
def f(x):
    if x and y or z:
        return [i for i in x if i]
    for i in x:
        pass
    else:
        pass
    try:
        pass
    except A:
        pass
    except B:
        pass
    return 1 if x else 2

class K:
    def m(self):
        return lambda: a if b else c

print(1)
";
        let McCabe::Blocks(blocks) = j.mccabe(code).unwrap() else {
            panic!("parse failed")
        };
        let cc = |name: &str| blocks.iter().find(|b| b.name == name).unwrap().complexity;
        // f: 1 + if 1 + and/or 2 + comprehension (for 1, if 1) + for 1 + else 1
        //      + 2 excepts + ternary 1 = 11
        assert_eq!(cc("f"), 11);
        assert_eq!(cc("m"), 2);
        assert_eq!(cc("K"), 1);
        assert_eq!(cc("<module>"), 1);
        // max 11 → 2 − 3·6/15 = 0.8
        assert!(close(j.complexity(code).unwrap(), 0.8));
        assert_eq!(j.complexity("def f(x):\n    return x\n"), Some(2.0));
        assert!(matches!(
            j.mccabe("def f(:\n"),
            Some(McCabe::SyntaxError { line: Some(1), .. })
        ));
        assert_eq!(j.complexity("def f(:\n"), Some(-1.0));
        // The code is parsed, never run: this would create a file if executed.
        let marker = std::env::temp_dir().join("falcon-reward-never-run");
        let _ = std::fs::remove_file(&marker);
        let evil = format!(
            "open({:?}, 'w').write('ran')\n",
            marker.display().to_string()
        );
        assert!(j.complexity(&evil).is_some());
        assert!(j.style(&evil).is_some());
        assert!(!marker.exists());
    }

    #[test]
    fn batch_scores_keep_order_and_count() {
        let j = judge();
        let codes = ["def f(x):\n    return x\n", "def f(:\n", "import os\n"];
        let s = j.score(Aspect::Style, &codes).unwrap();
        // "import os": 1 finding / 1 line → −1
        assert_eq!(s, vec![Some(2.0), Some(-1.0), Some(-1.0)]);
        let c = j.score(Aspect::Complexity, &codes).unwrap();
        assert_eq!(c, vec![Some(2.0), Some(-1.0), Some(2.0)]);
        // The batch run agrees with one run per code.
        let many = [
            "def f(x):\n    return 1 if x else 2\n",
            "def f(:\n",
            "a = b or c or d\n",
        ];
        let batch = j.mccabe_batch(&many);
        let single: Vec<_> = many.iter().map(|c| j.mccabe(c)).collect();
        assert_eq!(batch, single);
        assert!(matches!(&batch[0], Some(McCabe::Blocks(b)) if b[1].complexity == 2));
        assert!(matches!(&batch[2], Some(McCabe::Blocks(b)) if b[0].complexity == 3));
        // ruff over a directory of files finds what it finds on each stdin.
        let style = [
            "import os\nx=1\n",
            "def f(:\n",
            "class bad_name:\n    pass\n",
            "def g(l):\n    if l == None:\n        return l\n",
            "x = 1\t\n\n\n",
        ];
        let batch = j.ruff_batch(&style);
        let single: Vec<_> = style.iter().map(|c| j.ruff_findings(c)).collect();
        assert_eq!(batch, single);
        assert!(batch
            .iter()
            .all(|f| f.as_ref().is_some_and(|f| !f.is_empty())));
        let stats = j.stats();
        assert_eq!(stats.scored, 22, "the start-up probes are not counted");
        assert_eq!(stats.no_signal(), 0);
    }

    #[test]
    fn timeout_gives_no_signal_and_is_counted() {
        let cfg = StaticJudgeConfig {
            timeout_s: 10.0,
            ..StaticJudgeConfig::default()
        };
        let mut j = StaticJudge::new(&cfg).expect("run scripts/setup");
        j.timeout = Duration::from_nanos(1);
        assert_eq!(j.complexity("x = 1\n"), None);
        assert_eq!(j.stats().timeouts, 1);
        // A batch that times out falls back to one run per code, each counted.
        let codes = ["x = 1\n", "y = 2\n"];
        assert_eq!(
            j.score(Aspect::Complexity, &codes).unwrap(),
            vec![None, None]
        );
        assert_eq!(j.stats().timeouts, 3);
        assert_eq!(j.ruff_batch(&codes), vec![None, None]);
        assert_eq!(j.stats().timeouts, 5);
        assert_eq!(j.stats().scored, 0);
        assert_eq!(j.last_failure().as_deref(), Some(TIMEOUT));
    }

    #[test]
    fn missing_tool_says_run_setup() {
        let cfg = StaticJudgeConfig {
            ruff: "/nonexistent/ruff".into(),
            ..StaticJudgeConfig::default()
        };
        let e = StaticJudge::new(&cfg).unwrap_err().to_string();
        assert!(e.contains("scripts/setup"), "{e}");
        assert!(e.contains("/nonexistent/ruff"), "{e}");
    }
}
