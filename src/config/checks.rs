//! The rules that span sections, the rules of each [`Job`], and the files a
//! job reads. Each pushes every problem it finds, so one run of
//! `falcon config check` lists them all.

use std::path::Path;

use super::{Job, MetaAlgorithm, MetaPrompt, Problems, RunConfig, StrategyKind};

/// Rules between sections, whatever the config is for.
pub(super) fn cross_section(c: &RunConfig, problems: &mut Problems) {
    for (key, kind) in [
        ("train.strategy", c.train.strategy),
        ("strategy.kind", c.strategy.kind),
    ] {
        if kind.reads_docs() && c.memory.api_docs.is_none() {
            problems.push(
                key,
                kind.name(),
                "documentation strategies need the library's API docs: set [memory] api_docs",
            );
        }
    }
    let meta = c.meta.algorithm != MetaAlgorithm::Off;
    // A strategy writes its own prompts; silently dropping the Table 7
    // prompt that [meta] asks for would make the run something else.
    if c.train.strategy != StrategyKind::ZeroShot
        && meta
        && c.meta.long_term
        && c.meta.prompt == MetaPrompt::Table7
    {
        problems.push(
            "meta.prompt",
            "table7",
            "[train] strategy writes its own prompts, so the Table 7 prompt would go unused: set [meta] prompt = \"zero-shot\" (long-term memory still records samples and supplies demonstrations) or [train] strategy = \"zero-shot\"",
        );
    }
    if meta && !c.model.lora.enabled {
        problems.push(
            "meta.algorithm",
            c.meta.algorithm.name(),
            "meta-RL adapts fast LoRA weights: set [model.lora] enabled = true, or [meta] algorithm = \"off\" for the single-level loop",
        );
    }
    if c.train.loss.kl > 0.0 && !c.model.lora.enabled {
        problems.push(
            "train.loss.kl",
            c.train.loss.kl,
            "the KL reference is the base model with the adapters switched off, so it needs [model.lora] enabled = true (a frozen full copy is not supported); or set kl = 0",
        );
    }
}

/// Rules of one job.
pub(super) fn job_rules(c: &RunConfig, job: Job, problems: &mut Problems) {
    if job.trains() && c.tasks.path.is_none() {
        problems.push_rule(
            "tasks.path",
            &format!(
                "`falcon {}` trains on a task file: set [tasks] path (data/easy_python.jsonl is bundled)",
                job.name()
            ),
        );
    }
    let t = &c.train;
    let evaluates = match job {
        Job::Eval => true,
        Job::Train | Job::Sft => t.eval_before || t.eval_after || t.eval_every > 0,
    };
    if evaluates && c.eval.path.is_none() && c.tasks.path.is_none() {
        problems.push_rule(
            "eval.path",
            &format!(
                "`falcon {}` evaluates{}, but neither [eval] path nor [tasks] path names a task file",
                job.name(),
                if job == Job::Eval {
                    ""
                } else {
                    " ([train] eval_before / eval_after / eval_every)"
                }
            ),
        );
    }
    match job {
        Job::Train => {
            // The policy changes every step: the judge must be a model of its own.
            let judged = c.reward.style.computed() || c.reward.complexity.computed();
            if c.reward.judge == super::JudgeKind::Lm && judged {
                if c.reward.lm_judge.model.trim().is_empty() {
                    problems.push(
                        "reward.lm_judge.model",
                        "",
                        "`falcon train` with judge = \"lm\" needs a judge model of its own (the policy changes every step): \
                         a local HF directory, a .gguf file, a cached repo id or \"embedded\"",
                    );
                } else if let Err(why) = super::locate_model(&c.reward.lm_judge.model) {
                    problems.push_rule("reward.lm_judge.model", &why);
                }
            }
            if c.rollout.engine == super::EngineKind::Vllm {
                // Meta-RL's fast weights θ_i are served as adapters.
                if c.meta.algorithm != MetaAlgorithm::Off && !c.model.lora.enabled {
                    problems.push(
                        "rollout.engine",
                        "vllm",
                        "meta-RL with the vLLM engine serves each task's fast weights as a LoRA adapter: enable [model.lora]",
                    );
                }
                if c.rollout.vllm.overlap
                    && (c.meta.algorithm != MetaAlgorithm::Off
                        || c.train.strategy != super::StrategyKind::ZeroShot)
                {
                    problems.push(
                        "rollout.vllm.overlap",
                        true,
                        "overlap pipelines single-level RL with zero-shot rollouts only: remove [meta] algorithm / [train] strategy, or overlap",
                    );
                }
                // Full weights reach a server only through vLLM's dev-mode
                // `reload_weights`, which falcon turns on for its own server.
                if !c.model.lora.enabled && !c.rollout.vllm.managed() {
                    problems.push(
                        "rollout.vllm.urls",
                        &c.rollout.vllm.urls,
                        "full fine-tuning syncs weights through a managed server only: enable [model.lora] or leave urls empty",
                    );
                }
            }
        }
        Job::Sft => {
            if c.rollout.engine == super::EngineKind::Vllm {
                problems.push(
                    "rollout.engine",
                    "vllm",
                    "`falcon sft` generates nothing to train on; remove [rollout] engine (its evaluations run natively)",
                );
            }
            if c.meta.algorithm != MetaAlgorithm::Off {
                problems.push(
                    "meta.algorithm",
                    c.meta.algorithm.name(),
                    "`falcon sft` trains on reference solutions, not with the meta-loop: remove [meta] from the SFT config, or run `falcon train`",
                );
            }
        }
        Job::Eval => {
            if c.strategy.kind == StrategyKind::Falcon && c.strategy.memory_run.is_none() {
                problems.push_rule(
                    "strategy.memory_run",
                    "strategy \"falcon\" retrieves from a run's long-term memory: set [strategy] memory_run = \"runs/NAME\" (or pass --memory runs/NAME)",
                );
            }
        }
    }
}

/// The files `job` will read must be there, so that a missing one is
/// reported before a model loads, naming the key that points at it.
pub(super) fn files(c: &RunConfig, job: Job, problems: &mut Problems) {
    let mut file = |key: &str, path: &Path, what: &str| {
        if !path.is_file() {
            problems.push_rule(key, &format!("{}: no such file ({what})", path.display()));
        }
    };
    let eval_reads_tasks = job == Job::Eval && c.eval.path.is_none();
    if let Some(p) = &c.tasks.path {
        if job.trains() || eval_reads_tasks {
            file("tasks.path", p, "the task file");
        }
    }
    if let Some(p) = &c.eval.path {
        file("eval.path", p, "the held-out task file");
    }
    if let Some(p) = &c.memory.api_docs {
        file("memory.api_docs", p, "the library's API docs");
    }
    if job == Job::Eval {
        if let Some(p) = &c.strategy.accumulate_on {
            file(
                "strategy.accumulate_on",
                p,
                "MemoCoder's accumulation tasks",
            );
        }
        if let Some(run) = &c.strategy.memory_run {
            let db = run.join(file_names::MEMORY_DB);
            if !db.is_file() {
                problems.push_rule(
                    "strategy.memory_run",
                    &format!(
                        "{}: no memory database there (a `falcon train` run with [meta] long_term = true writes {})",
                        run.display(),
                        file_names::MEMORY_DB
                    ),
                );
            }
        }
    }
    if job.trains() {
        if let Some(init) = &c.train.init_from {
            if !init.join(file_names::MANIFEST).is_file() {
                problems.push_rule(
                    "train.init_from",
                    &format!(
                        "{}: no checkpoint there (a checkpoint directory holds {}); run the stage that writes it first (the main job's SFT stage: `falcon sft --config configs/demo-sft.toml`), or remove init_from",
                        init.display(),
                        file_names::MANIFEST
                    ),
                );
            }
        }
    }
    if let Err(tried) = super::locate_tool(&c.exec.python, "python") {
        problems.push_rule(
            "exec.python",
            &format!(
                "\"{}\": no Python interpreter found (looked at {}); run scripts/setup, which provisions the project's virtualenv, or name an interpreter",
                c.exec.python,
                shorten(&tried)
            ),
        );
    }
    let judges = c.reward.judge == super::JudgeKind::Static
        && (c.reward.style.computed() || c.reward.complexity.computed());
    if judges {
        let sj = &c.reward.static_judge;
        for (key, setting, name) in [
            ("ruff", &sj.ruff, "ruff"),
            ("python", &sj.python, "python3"),
        ] {
            if let Err(tried) = super::locate_tool(setting, name) {
                problems.push_rule(
                    &format!("reward.static_judge.{key}"),
                    &format!(
                        "\"{setting}\": {name} not found (looked at {}); run scripts/setup, which installs it, or give its path",
                        shorten(&tried)
                    ),
                );
            }
        }
    }
    if let Err(why) = super::locate_model(&c.model.path) {
        problems.push_rule("model.path", &why);
    }
    if c.memory.embedder == super::EmbedderKind::Minilm && !c.memory.minilm_dir.trim().is_empty() {
        let dir = Path::new(&c.memory.minilm_dir);
        if !dir.is_dir() {
            problems.push_rule(
                "memory.minilm_dir",
                &format!("{}: no such directory", dir.display()),
            );
        }
    }
}

/// The first places tried, for a message that stays readable.
fn shorten(tried: &[std::path::PathBuf]) -> String {
    let mut s: Vec<String> = tried
        .iter()
        .take(4)
        .map(|p| p.display().to_string())
        .collect();
    if tried.len() > 4 {
        s.push(format!("{} more", tried.len() - 4));
    }
    s.join(", ")
}

/// Names of run-directory files that `run_dir` defines, repeated here
/// because config sits below it; a test in `run_dir` keeps them equal.
pub mod file_names {
    /// The memory database of a run directory.
    pub const MEMORY_DB: &str = "memory.sqlite";
    /// The manifest of a checkpoint directory.
    pub const MANIFEST: &str = "manifest.json";
}
