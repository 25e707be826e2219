//! Whole programs run as scripts: stdin in, stdout, stderr and the exit
//! status out. This is SandboxFusion's `run_code` model (the service speaks
//! it, and the remote backend uses it to reach real SandboxFusion servers);
//! the candidate gets the same isolation, uid and limits as a test's.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::ExecClock;

/// A program to run, as `python main.py < stdin` would run it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Script {
    pub code: String,
    #[serde(default)]
    pub stdin: String,
    /// Files written into the working directory first: relative path → base64.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Files read back afterwards (relative paths; missing ones are left out).
    #[serde(default)]
    pub fetch_files: Vec<String>,
    /// Limit in seconds; `None` = the sandbox's `[exec] timeout_s`.
    #[serde(default)]
    pub timeout_s: Option<f64>,
    /// Measured on this clock; `None` = the sandbox's `[exec] clock`.
    #[serde(default)]
    pub clock: Option<ExecClock>,
    /// A lower address-space limit than the sandbox's, MiB.
    #[serde(default)]
    pub memory_mb: Option<u64>,
}

/// How a script ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScriptStatus {
    /// It exited (any status) or was killed by a signal other than the timer.
    Finished,
    /// It ran past its limit and was stopped.
    Timeout,
}

/// What a script did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScriptRun {
    pub status: ScriptStatus,
    /// The exit status; minus the signal number when a signal killed it;
    /// `None` on timeout.
    pub return_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Wall-clock seconds the worker spent on it.
    pub seconds: f64,
    pub cpu_seconds: f64,
    /// The fetched files: relative path → base64.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
}

impl ScriptRun {
    /// Exited with status 0.
    pub fn succeeded(&self) -> bool {
        self.status == ScriptStatus::Finished && self.return_code == Some(0)
    }
}

/// A script job as the worker reads it.
#[derive(Debug, Serialize)]
pub(crate) struct ScriptJob<'a> {
    pub script: &'a str,
    pub stdin: &'a str,
    pub files: &'a BTreeMap<String, String>,
    pub fetch_files: &'a [String],
    pub timeout: f64,
    pub clock: ExecClock,
    pub wall: f64,
    pub out_cap: usize,
    /// Address-space limit in bytes (0 = the worker's own).
    #[serde(rename = "as")]
    pub address_space: u64,
}

/// The worker's reply to a script job.
#[derive(Debug, Deserialize)]
pub(crate) struct WireScriptReply {
    pub script: Option<ScriptRun>,
    /// The request itself was unusable (a file path outside the job directory).
    pub script_error: Option<String>,
    pub no_signal: Option<String>,
}

/// One program run on many stdins, as the worker reads it (program tasks).
#[derive(Debug, Serialize)]
pub(crate) struct ProgramsJob<'a> {
    pub programs: &'a str,
    pub stdins: &'a [String],
    pub timeout: f64,
    pub clock: ExecClock,
    pub wall: f64,
    pub out_cap: usize,
    #[serde(rename = "as")]
    pub address_space: u64,
}

/// The worker's reply to a programs job: one run per stdin, in order.
#[derive(Debug, Deserialize)]
pub(crate) struct WireProgramsReply {
    pub programs: Option<Vec<ScriptRun>>,
    pub script_error: Option<String>,
    pub no_signal: Option<String>,
}

/// Why a script has no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScriptError {
    /// The request cannot be run as given (the caller's to fix).
    #[error("{0}")]
    BadRequest(String),
    /// The sandbox could not run it (no signal about the program).
    #[error("{0}")]
    Sandbox(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_reply_reads_back_with_its_status_and_files() {
        let r: WireScriptReply = serde_json::from_str(
            r#"{"script":{"status":"timeout","return_code":null,"stdout":"a","stderr":"","seconds":1.5,"cpu_seconds":1.0,"files":{"o.txt":"aGk="}}}"#,
        )
        .unwrap();
        let run = r.script.unwrap();
        assert_eq!(run.status, ScriptStatus::Timeout);
        assert!(!run.succeeded());
        assert_eq!(run.files["o.txt"], "aGk=");
        let r: WireScriptReply = serde_json::from_str(r#"{"script_error":"bad path"}"#).unwrap();
        assert!(r.script.is_none() && r.script_error.as_deref() == Some("bad path"));
    }
}
