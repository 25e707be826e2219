//! `falcon config check|show`: the validation every command runs, on its
//! own; and the resolved config with every default written out.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Subcommand, ValueEnum};

use super::{usage, SetArgs};
use falcon_rl::config::{ConfigError, Job, RunConfig};

#[derive(Subcommand)]
pub enum ConfigCmd {
    /// Parse and validate for a command (default `train`), including the
    /// files it reads; print every problem with its key path.
    Check {
        file: PathBuf,
        /// The command the config is for: train, sft or eval.
        #[arg(long = "for", value_enum, default_value_t = JobArg::Train)]
        job: JobArg,
        #[command(flatten)]
        set: SetArgs,
    },
    /// Print the resolved configuration, defaults included.
    Show {
        file: PathBuf,
        #[command(flatten)]
        set: SetArgs,
    },
}

/// `--for`.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum JobArg {
    Train,
    Sft,
    Eval,
}

impl JobArg {
    pub fn job(self) -> Job {
        match self {
            JobArg::Train => Job::Train,
            JobArg::Sft => Job::Sft,
            JobArg::Eval => Job::Eval,
        }
    }
}

pub fn run(cmd: ConfigCmd) -> Result<()> {
    match cmd {
        ConfigCmd::Check { file, job, set } => {
            let job = job.job();
            match RunConfig::load_for_with(&file, &set.set, job) {
                Ok(cfg) => {
                    let problems = falcon_rl::reward::custom::check_all(&cfg.reward.custom);
                    if !problems.is_empty() {
                        let list: Vec<String> =
                            problems.iter().map(|p| format!("  {p}")).collect();
                        return Err(usage(format!(
                            "{}: the config is valid but its reward terms are not usable:\n{}",
                            file.display(),
                            list.join("\n")
                        )));
                    }
                    println!("{}: ok for `falcon {}`", file.display(), job.name());
                    Ok(())
                }
                Err(e @ ConfigError::Invalid { .. }) => Err(usage(format!(
                    "{}: {e}\n(checked for `falcon {}`; --for train, sft or eval checks for another command)",
                    file.display(),
                    job.name()
                ))),
                Err(e) => Err(usage(e)),
            }
        }
        ConfigCmd::Show { file, set } => {
            let cfg = RunConfig::from_file_with(&file, &set.set).map_err(usage)?;
            cfg.validate().map_err(usage)?;
            print!("{}", cfg.to_toml_string()?);
            Ok(())
        }
    }
}
