//! `[run]`: a run's name, master seed and output directory.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{check_seed, Problems, Section};

/// `[run]`: identifies a run and where its files go (`<output_dir>/<name>/`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunSection {
    /// Run name; becomes a directory name under `output_dir`.
    pub name: String,
    /// Master seed from which every other seed of the run is derived.
    pub seed: u64,
    /// Parent directory of all runs.
    pub output_dir: PathBuf,
}

impl Default for RunSection {
    fn default() -> Self {
        Self {
            name: "default".to_owned(),
            seed: 0,
            output_dir: PathBuf::from("runs"),
        }
    }
}

impl RunSection {
    /// The directory this run writes to: `<output_dir>/<name>`.
    pub fn run_dir(&self) -> PathBuf {
        self.output_dir.join(&self.name)
    }
}

impl Section for RunSection {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        let name = &self.name;
        // The name is joined onto output_dir, so anything that escapes it or
        // nests directories would scatter run files.
        if name.is_empty() || name == "." || name == ".." {
            problems.push(
                &format!("{path}.name"),
                name,
                "must be a non-empty directory name (not \".\" or \"..\")",
            );
        } else if name.contains(['/', '\\']) {
            problems.push(
                &format!("{path}.name"),
                name,
                "must not contain '/' or '\\'; set output_dir for the parent directory",
            );
        }
        check_seed(&format!("{path}.seed"), self.seed, problems);
        if self.output_dir.as_os_str().is_empty() {
            problems.push(
                &format!("{path}.output_dir"),
                &self.output_dir,
                "must not be empty (default \"runs\")",
            );
        }
    }
}
