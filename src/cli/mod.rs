//! The subcommands of `falcon`, one file each: parse the arguments, call
//! the library, print. What several share is here: the usage error (exit
//! code 2), the model and sampling flags, and the progress line of long
//! jobs.

pub mod ablate;
pub mod chat;
pub mod config;
pub mod convert;
pub mod eval;
pub mod exec;
pub mod export;
pub mod generate;
pub mod info;
pub mod kernels;
pub mod memory;
pub mod report;
pub mod sandbox;
pub mod score;
pub mod tasks;
pub mod train;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;

use falcon_rl::model::hub;
use falcon_rl::model::sampling::Sampler;
use falcon_rl::model::{Dtype, GenerationParams, ModelSpec, Policy};

/// An error that is the user's to fix (exit code 2), not a failure of ours.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// An error and its causes as one line, each cause only when it adds
/// something: many errors repeat their cause's text in their own message,
/// and a report must not say "No such file or directory" twice.
pub fn report(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// The error as the user's to fix.
pub fn usage(e: impl std::fmt::Display) -> anyhow::Error {
    UsageError(e.to_string()).into()
}

/// `--set KEY=VALUE` (repeatable), for every command that reads a run
/// config: applied to the file's keys before the one config check.
#[derive(Args, Clone, Debug, Default)]
pub struct SetArgs {
    /// Override a config key, e.g. `--set train.lr=1e-5 --set
    /// model.path=Qwen/Qwen2.5-Coder-1.5B` (a TOML value, or a plain
    /// string); recorded in the run's config.toml.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = falcon_rl::config::parse_set)]
    pub set: Vec<falcon_rl::config::Override>,
}

/// `--allow-unlocked`, for every command that writes a run directory.
#[derive(Args, Clone, Copy, Debug, Default)]
pub struct LockArgs {
    /// Go on without the run directory's writer lock where its filesystem
    /// cannot lock (some network filesystems); nothing then keeps a second
    /// writer out.
    #[arg(long)]
    pub allow_unlocked: bool,
}

/// Hold the writer lock `dir/name` for as long as the result lives: a
/// second writer is refused (exit code 2) naming the first. Where the
/// filesystem cannot lock, refused too unless `--allow-unlocked`.
pub fn hold_lock(
    dir: &std::path::Path,
    name: &str,
    args: LockArgs,
) -> Result<Option<falcon_rl::fsutil::lock::DirLock>> {
    use falcon_rl::fsutil::lock::{lock, LockError, Unlockable};
    let unlockable = if args.allow_unlocked {
        Unlockable::Proceed
    } else {
        Unlockable::Refuse
    };
    match lock(dir, name, unlockable) {
        Ok(Some(l)) => Ok(Some(l)),
        Ok(None) => {
            eprintln!(
                "falcon: warning: {} cannot be locked on this filesystem; going on without the \
                 lock (--allow-unlocked): make sure that nothing else writes it",
                dir.display()
            );
            Ok(None)
        }
        Err(LockError::Io(e)) => Err(e.into()),
        Err(e) => Err(usage(e)),
    }
}

/// `--model`, `--dtype`, `--device`, `--adapter`.
#[derive(Args, Clone)]
pub struct ModelArgs {
    /// Local HF directory, .gguf file, HF repo id in the local cache, or `embedded`.
    #[arg(long, default_value = hub::EMBEDDED)]
    pub model: String,
    /// fp32, bf16 or fp16.
    #[arg(long, default_value = "fp32")]
    pub dtype: String,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// A PEFT LoRA adapter directory to attach.
    #[arg(long)]
    pub adapter: Option<PathBuf>,
}

impl ModelArgs {
    pub fn dtype(&self) -> Result<Dtype> {
        self.dtype.parse().map_err(usage)
    }

    /// Load the model the flags name, saying what was loaded on stderr.
    pub fn load(&self) -> Result<Policy> {
        let dtype = self.dtype()?;
        open_policy(&ModelSpec {
            model: &self.model,
            dtype,
            device: &self.device,
            adapter: self.adapter.as_deref(),
        })
    }
}

/// Load a policy, saying what was loaded on stderr.
pub fn open_policy(spec: &ModelSpec) -> Result<Policy> {
    let opened = falcon_rl::model::open(spec).map_err(|e| match e {
        // A model that is not where the user said is theirs to fix.
        falcon_rl::model::ModelError::NotFound(_) => usage(e),
        e => e.into(),
    })?;
    eprintln!("falcon: {}", opened.describe(spec.dtype));
    Ok(opened.policy)
}

/// The sampling flags of `generate` and `chat`.
#[derive(Args, Clone)]
pub struct SamplingArgs {
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// 0 = off.
    #[arg(long, default_value_t = 0)]
    pub top_k: i64,
    /// 1 = off.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop when this string appears (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// System message (chat mode).
    #[arg(long)]
    pub system: Option<String>,
    /// Start of the assistant's answer; the model continues it (the output
    /// shows only the continuation).
    #[arg(long, default_value = "")]
    pub prefill: String,
    /// Stop where the answer's first ```python block closes.
    #[arg(long)]
    pub stop_at_block_end: bool,
    /// Do not stop at end-of-sequence tokens (fixed-length benchmarks).
    #[arg(long)]
    pub ignore_eos: bool,
}

impl SamplingArgs {
    pub fn params(&self, chat: bool) -> Result<GenerationParams> {
        if self.temperature < 0.0 {
            bail!(UsageError(format!(
                "--temperature {}: must be >= 0",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            bail!(UsageError(format!(
                "--top-p {}: must be in (0, 1]",
                self.top_p
            )));
        }
        if self.top_k < 0 {
            bail!(UsageError(format!("--top-k {}: must be >= 0", self.top_k)));
        }
        Ok(GenerationParams {
            max_new_tokens: self.max_new_tokens,
            sampler: Sampler {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
            },
            seed: Some(self.seed),
            stop: self.stop.clone(),
            chat,
            system: self.system.clone(),
            ignore_eos: self.ignore_eos,
            row_offset: 0,
            prefill: self.prefill.clone(),
            stop_at_block_end: self.stop_at_block_end,
        })
    }
}

/// Progress of a long job on stderr: a bar on a terminal; otherwise (the
/// log of an unattended run, where a bar draws nothing) a line at most once
/// a minute, so an hour-long evaluation is not silent.
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    len: u64,
    unit: &'static str,
    start: Instant,
    last: Instant,
    /// Work already done when this process began (a resumed evaluation's
    /// finished groups): the rate, and so the eta, counts only what is
    /// done here.
    base: Option<u64>,
}

impl Progress {
    const LINE_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

    pub fn new(len: u64, unit: &'static str) -> Self {
        use std::io::IsTerminal;
        let bar = std::io::stderr().is_terminal().then(|| {
            indicatif::ProgressBar::new(len).with_style(
                indicatif::ProgressStyle::with_template(&format!(
                    "{{pos}}/{{len}} {unit} {{bar:30}} eta {{eta}}"
                ))
                .expect("static template"),
            )
        });
        let now = Instant::now();
        Progress {
            bar,
            len,
            unit,
            start: now,
            last: now,
            base: None,
        }
    }

    /// A message above the bar (or on its own line).
    pub fn println(&self, m: &str) {
        match &self.bar {
            Some(b) => b.println(format!("falcon: {m}")),
            None => eprintln!("falcon: {m}"),
        }
    }

    pub fn set_len(&mut self, len: u64) {
        self.len = len;
        if let Some(b) = &self.bar {
            b.set_length(len);
        }
    }

    pub fn set(&mut self, done: u64) {
        let base = *self.base.get_or_insert(done);
        if let Some(b) = &self.bar {
            b.set_position(done);
            if done == base {
                b.reset_eta();
            }
            return;
        }
        if done == 0 || done >= self.len || self.last.elapsed() < Self::LINE_EVERY {
            return;
        }
        self.last = Instant::now();
        let secs = self.start.elapsed().as_secs_f64();
        let Some(eta) = eta_secs(secs, base, done, self.len) else {
            return;
        };
        eprintln!(
            "falcon: {done}/{} {} ({:.0}%) in {}, eta {}",
            self.len,
            self.unit,
            100.0 * done as f64 / self.len.max(1) as f64,
            minutes(secs),
            minutes(eta)
        );
    }

    pub fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}

/// Seconds left at the rate of the work done since `base`, in `secs`.
fn eta_secs(secs: f64, base: u64, done: u64, len: u64) -> Option<f64> {
    let here = done.checked_sub(base).filter(|&d| d > 0)?;
    Some(secs * len.saturating_sub(done) as f64 / here as f64)
}

/// `1h02m`, `12m05s` or `42s`.
pub fn minutes(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, _) => format!("{h}h{m:02}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::{eta_secs, minutes, report};

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        #[derive(Debug, thiserror::Error)]
        #[error("runs/x/manifest.json: {0}")]
        struct Outer(#[source] std::io::Error);
        let io = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let e = anyhow::Error::new(Outer(io())).context("loading checkpoint runs/x");
        let r = report(&e);
        assert_eq!(r.matches(&io().to_string()).count(), 1, "{r}");
        assert!(
            r.starts_with("loading checkpoint runs/x: runs/x/manifest.json: "),
            "{r}"
        );
    }

    #[test]
    fn durations_read_like_a_clock() {
        assert_eq!(minutes(42.4), "42s");
        assert_eq!(minutes(725.0), "12m05s");
        assert_eq!(minutes(3725.0), "1h02m");
        assert_eq!(minutes(-3.0), "0s");
    }

    #[test]
    fn a_resumed_job_counts_only_its_own_rate() {
        // 600 of 1640 were done before this process; 60 more took 60 s.
        assert_eq!(eta_secs(60.0, 600, 660, 1640), Some(980.0));
        assert_eq!(eta_secs(60.0, 0, 60, 1640), Some(1580.0));
        assert_eq!(eta_secs(60.0, 600, 600, 1640), None);
    }
}
