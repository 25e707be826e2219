//! Rollout strategies: how a task becomes answers. The prompts (zero-shot,
//! FALCON's Table 7 with retrieved long-term memory), the generation
//! parameters a run config implies, and the [`Strategy`] implementations:
//! single-shot ([`strategy::Prompted`]: zero-shot, FALCON), repairing
//! ([`repair::Repair`]: self-repair, MemoCoder) and documentation-driven
//! ([`doc_rag::DocStrategy`]: naive doc-RAG, MEMCoder and its ablations,
//! MEMCoder-Accum). `eval` runs them; every strategy talks to the model only
//! through the `Generator` trait, so the in-process policy and an
//! OpenAI-compatible server serve alike.

pub mod doc_rag;
pub mod repair;
pub mod strategy;

use std::path::Path;

pub use strategy::{Env, ReflectionRecord, RolloutError, Solution, Strategy};

use crate::config::{RunConfig, StrategyKind};

use crate::config::{GenerationConfig, MemoryConfig};
use crate::memory::long_term::{table7_prompt, Retrieved};
use crate::memory::render::View;
use crate::memory::{open_long_term, Access, LongTermMemory, MemoryError};
use crate::model::sampling::Sampler;
use crate::model::GenerationParams;
use crate::task::Task;

/// What a strategy is built for: a training rollout (its final answers
/// are learned from), or `falcon eval`.
#[derive(Clone, Copy)]
pub enum Use<'a> {
    Train,
    /// FALCON's strategy prompts from the long-term memory of `memory_run`
    /// (`[strategy] memory_run`, or `falcon eval --memory`) for `tasks`.
    Eval {
        memory_run: Option<&'a Path>,
        tasks: &'a [&'a Task],
    },
}

/// The one strategy factory: the strategy `kind` as `cfg` sets it up
/// (`[strategy]`'s settings, `[memory]`'s fixes, docs, embedder and top-k).
pub fn strategy(
    kind: StrategyKind,
    cfg: &RunConfig,
    purpose: Use,
) -> Result<Box<dyn Strategy>, RolloutError> {
    let s = &cfg.strategy;
    Ok(match kind {
        StrategyKind::ZeroShot => Box::new(strategy::Prompted::zero_shot()),
        StrategyKind::Falcon => {
            let Use::Eval { memory_run, tasks } = purpose else {
                return Err(RolloutError::Invalid(
                    "[train] strategy = \"falcon\": FALCON's prompt comes from [meta]'s long-term memory; use zero-shot with [meta] algorithm set".into(),
                ));
            };
            let Some(run) = memory_run else {
                return Err(RolloutError::Invalid(
                    "strategy falcon needs [strategy] memory_run or --memory RUN_DIR".into(),
                ));
            };
            let device = crate::model::device::device_of(cfg);
            let mut memory = open_long_term(&cfg.memory, run, device, Access::Read)?;
            let (prompts, _) = falcon_prompts(&mut memory, tasks, &cfg.memory)?;
            Box::new(strategy::Prompted::given("falcon", tasks, prompts)?)
        }
        StrategyKind::SelfRepair => {
            Box::new(repair::Repair::new(repair::RepairConfig::self_repair(s)))
        }
        StrategyKind::Memocoder => Box::new(repair::Repair::new(
            repair::RepairConfig::memocoder(s, &cfg.memory.fixes)
                .with_render(cfg.memory.render, cfg.memory.render_chars),
        )),
        k @ (StrategyKind::DocRag | StrategyKind::Memcoder | StrategyKind::MemcoderAccum) => {
            let d = doc_rag::DocStrategy::from_config(k, cfg)?;
            match purpose {
                // A long run does not need the per-task log.
                Use::Train => Box::new(d.without_log()),
                Use::Eval { .. } => Box::new(d),
            }
        }
    })
}

/// The strategy `[train] strategy` names, as the training rollout: `None`
/// for zero-shot (the trainer's own batched prompt), else a strategy whose
/// final answers the policy learns from. FALCON's Table 7 prompt belongs to
/// `[meta]`'s long-term memory, not to this switch.
pub fn training_strategy(cfg: &RunConfig) -> Result<Option<Box<dyn Strategy>>, RolloutError> {
    match cfg.train.strategy {
        StrategyKind::ZeroShot => Ok(None),
        k => strategy(k, cfg, Use::Train).map(Some),
    }
}

/// The user message for a task. MBPP-style statements do not name the
/// function the tests call, so the name is added when the prompt lacks it
/// (without showing any test).
pub fn task_prompt(instruction: &str, task: &Task) -> String {
    let mut p = format!("{instruction}\n\n{}", task.prompt.trim_end());
    if let Some(hint) = name_hint(task) {
        p.push('\n');
        p.push_str(&hint);
    }
    p
}

/// "The function must be named `f`." when the task's prompt does not name
/// the function its tests call; for a program task, that it reads stdin
/// and prints to stdout.
pub fn name_hint(task: &Task) -> Option<String> {
    if task.kind == crate::task::TaskKind::Stdio {
        return Some(
            "Write a complete Python program that reads the input from standard input \
             and prints the answer to standard output."
                .to_owned(),
        );
    }
    (!task.entry_point.is_empty() && !task.prompt.contains(&task.entry_point))
        .then(|| format!("The function must be named `{}`.", task.entry_point))
}

/// FALCON's Table 7 prompt for `task` from what long-term memory retrieved
/// for it, rendered as `[memory] render` and `render_chars` say. Entries of
/// the task itself are left out: retrieval must never hand a task its own
/// answer.
pub fn falcon_prompt(task: &Task, hits: &[Retrieved], memory: &MemoryConfig) -> String {
    let others: Vec<Retrieved> = hits
        .iter()
        .filter(|r| r.record.task_id != task.id)
        .cloned()
        .collect();
    let mut view = View::new(memory.render, &task.entry_point, memory.render_chars);
    let mut p = table7_prompt(&task.prompt, &others, &mut view);
    if let Some(hint) = name_hint(task) {
        p.push_str(&hint);
        p.push('\n');
    }
    p
}

/// FALCON's Table 7 prompts for `tasks`, each from the `k` entries of
/// long-term memory most similar to the task; also what was retrieved, from
/// which the meta-loop draws its demonstrations. `falcon train`'s meta-loop
/// and `falcon eval`'s FALCON strategy both prompt through here.
pub fn falcon_prompts(
    memory: &mut LongTermMemory,
    tasks: &[&Task],
    cfg: &MemoryConfig,
) -> Result<(Vec<String>, Vec<Vec<Retrieved>>), MemoryError> {
    let texts: Vec<&str> = tasks.iter().map(|t| t.prompt.as_str()).collect();
    let hits = memory.retrieve(&texts, cfg.top_k)?;
    let prompts = tasks
        .iter()
        .zip(&hits)
        .map(|(t, h)| falcon_prompt(t, h, cfg))
        .collect();
    Ok((prompts, hits))
}

/// The parameters of reflections (MEMCoder's guidelines, MemoCoder's
/// mentor): greedy, at most 128 tokens, ending at the first blank line,
/// since an answer is a line or a short list and small models ramble on.
pub fn reflection_params(gen: &GenerationConfig, seed: u64) -> GenerationParams {
    let mut g = gen.clone();
    g.temperature = 0.0;
    g.top_p = 1.0;
    g.max_new_tokens = g.max_new_tokens.min(128);
    g.stop = vec!["\n\n".into()];
    g.stop_at_code_end = false;
    generation_params(&g, seed)
}

/// Chat-format generation parameters from `[generation]`, with the sampler
/// seeded by `seed` (so a step or an evaluation can be repeated exactly).
pub fn generation_params(gen: &GenerationConfig, seed: u64) -> GenerationParams {
    GenerationParams {
        max_new_tokens: gen.max_new_tokens,
        sampler: Sampler {
            temperature: gen.temperature,
            top_k: gen.top_k as i64,
            top_p: gen.top_p,
        },
        seed: Some(seed),
        stop: gen.stop.clone(),
        chat: true,
        system: None,
        ignore_eos: false,
        row_offset: 0,
        prefill: String::new(),
        stop_at_block_end: gen.stop_at_code_end,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflections_are_greedy_short_and_stop_at_a_blank_line() {
        let gen = GenerationConfig {
            max_new_tokens: 512,
            temperature: 0.8,
            ..GenerationConfig::default()
        };
        let p = reflection_params(&gen, 3);
        assert_eq!(p.sampler.temperature, 0.0);
        assert_eq!((p.max_new_tokens, p.seed), (128, Some(3)));
        assert_eq!(p.stop, ["\n\n"]);
        let short = GenerationConfig {
            max_new_tokens: 24,
            ..GenerationConfig::default()
        };
        assert_eq!(reflection_params(&short, 0).max_new_tokens, 24);
    }

    #[test]
    fn prompts_name_the_function_when_the_task_does_not() {
        let mut t = Task {
            id: "mbpp/1".into(),
            prompt: "Find the smallest n items.".into(),
            entry_point: "small_nnum".into(),
            tests: vec!["assert small_nnum([1], 1) == [1]".into()],
            kind: Default::default(),
            canonical_solution: None,
            docs: None,
            tags: vec![],
            test_setup: None,
            prelude: None,
            extra: Default::default(),
            ..Default::default()
        };
        let p = task_prompt("Solve:", &t);
        assert_eq!(
            p,
            "Solve:\n\nFind the smallest n items.\nThe function must be named `small_nnum`."
        );
        assert!(!p.contains("assert"), "no test is shown");
        t.prompt = "def small_nnum(xs, n):\n    \"\"\"...\"\"\"\n".into();
        assert!(!task_prompt("Solve:", &t).contains("must be named"));
    }
}
