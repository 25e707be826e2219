//! `[strategy]`: the rollout strategy `falcon eval` (and `[train]
//! strategy`) uses, and each strategy's settings (docs/eval.md).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{GeneratorSource, Problems, Section};

/// The rollout strategies of `rollout` (see docs/eval.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StrategyKind {
    /// One prompt: the instruction and the task.
    #[default]
    ZeroShot,
    /// FALCON's Table 7 prompt from a run's long-term memory
    /// (`[strategy] memory_run` or `falcon eval --memory`).
    Falcon,
    /// The top `[memory] k_doc` API docs by embedding similarity, then the task.
    DocRag,
    /// Zero-shot, then up to `max_attempts - 1` revisions from the guiding
    /// test's error.
    SelfRepair,
    /// MemoCoder: planner, code writer, guiding test, mentor, repair loop.
    Memocoder,
    /// MEMCoder: guidelines from task- and API-level memory, evolved after
    /// every task of the stream.
    Memcoder,
    /// MEMCoder-Accum: raw trajectories kept first-in-first-out, no reflector.
    MemcoderAccum,
}

impl StrategyKind {
    /// The name a config file uses (`"memcoder-accum"`).
    pub fn name(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    /// Doc-RAG, MEMCoder and MEMCoder-Accum: they need `[memory] api_docs`.
    pub fn reads_docs(self) -> bool {
        matches!(
            self,
            StrategyKind::DocRag | StrategyKind::Memcoder | StrategyKind::MemcoderAccum
        )
    }
}

/// MemoCoder's planner (`[strategy] planning`): `"first"` plans before the
/// code writer's first answer (the paper, §2.2.1); `"fallback"` lets the
/// code writer answer the task alone first, as zero-shot does, and plans
/// only for an answer that fails the guiding test, whose next attempt is
/// written from the plans; `"off"` never plans (the paper's ablation).
/// `true` and `false` read as `"first"` and `"off"`, the values of the
/// boolean switch this replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Planning {
    First,
    Fallback,
    Off,
}

impl<'de> Deserialize<'de> for Planning {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Planning;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(r#""first", "fallback" or "off" (or true / false)"#)
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Planning, E> {
                Ok(if v { Planning::First } else { Planning::Off })
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Planning, E> {
                match v {
                    "first" => Ok(Planning::First),
                    "fallback" => Ok(Planning::Fallback),
                    "off" => Ok(Planning::Off),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(v), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `[strategy]`: which strategy and its knobs. Defaults follow the papers
/// where they say (MemoCoder: 3 plans, 10 retrieved fixes in
/// `[memory.fixes]`), except MemoCoder's planner, which runs as a fallback
/// (measured, docs/results/eval.md); attempt counts are kept small for CPU runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StrategyConfig {
    pub kind: StrategyKind,
    /// Self-repair / MemoCoder: attempts per sample, the first included.
    pub max_attempts: usize,
    /// MemoCoder: plans the planner writes.
    pub plans: usize,
    /// MemoCoder: when the planner runs (see [`Planning`]).
    pub planning: Planning,
    /// MemoCoder ablations: the fixes retrieved into repair prompts, the
    /// mentor's suggestions and rewrites.
    pub retrieval: bool,
    pub mentor: bool,
    /// MemoCoder: retrieved fixes shown in a repair prompt (small models
    /// have short contexts; retrieval still ranks `[memory.fixes] top_k`).
    pub fixes_shown: usize,
    /// MemoCoder's online adaptation: rounds over the samples whose code
    /// still fails the guiding test (1 = a single pass).
    pub rounds: usize,
    /// MemoCoder: accumulate fixing knowledge on this task file first
    /// (format by extension), then evaluate with what was learned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accumulate_on: Option<PathBuf>,
    /// At most this many accumulation tasks (file order); 0 = all.
    pub accumulate_max_tasks: usize,
    /// MEMCoder ablations: task-level memory (similar past tasks with their
    /// guidelines) and API-level memory (snippets and weighted guidelines).
    pub task_memory: bool,
    pub api_memory: bool,
    /// MEMCoder-Accum: trajectories kept (oldest dropped first).
    pub accum_capacity: usize,
    /// FALCON: the run directory whose `memory.sqlite` is retrieved from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_run: Option<PathBuf>,
    /// `[strategy.generator]`: who writes the answers in `falcon eval`:
    /// `kind = "policy"` (the `[model]` or checkpoint) or `kind = "openai"`
    /// with `base_url`, `model`, `api_key_env`.
    pub generator: GeneratorSource,
}

impl Default for StrategyConfig {
    fn default() -> Self {
        StrategyConfig {
            kind: StrategyKind::ZeroShot,
            max_attempts: 3,
            plans: 3,
            planning: Planning::Fallback,
            retrieval: true,
            mentor: true,
            fixes_shown: 3,
            rounds: 1,
            accumulate_on: None,
            accumulate_max_tasks: 0,
            task_memory: true,
            api_memory: true,
            accum_capacity: 50,
            memory_run: None,
            generator: GeneratorSource::Policy,
        }
    }
}

impl Section for StrategyConfig {
    fn validate_into(&self, path: &str, problems: &mut Problems) {
        for (key, v) in [
            ("max_attempts", self.max_attempts),
            ("plans", self.plans),
            ("rounds", self.rounds),
            ("accum_capacity", self.accum_capacity),
        ] {
            if v == 0 {
                problems.push(&format!("{path}.{key}"), v, "must be >= 1");
            }
        }
        self.generator
            .validate_into(&format!("{path}.generator"), problems);
        if self.kind == StrategyKind::MemcoderAccum && !(self.task_memory && self.api_memory) {
            problems.push(
                &format!("{path}.kind"),
                "memcoder-accum",
                "task_memory / api_memory ablate `memcoder`; Accum has neither",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planning(value: &str) -> Result<Planning, String> {
        toml::from_str::<StrategyConfig>(&format!("planning = {value}"))
            .map(|s| s.planning)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn planning_reads_names_and_the_old_booleans() {
        assert_eq!(StrategyConfig::default().planning, Planning::Fallback);
        assert_eq!(planning(r#""first""#), Ok(Planning::First));
        assert_eq!(planning(r#""fallback""#), Ok(Planning::Fallback));
        assert_eq!(planning(r#""off""#), Ok(Planning::Off));
        assert_eq!(planning("true"), Ok(Planning::First));
        assert_eq!(planning("false"), Ok(Planning::Off));
        let e = planning(r#""Fallback""#).unwrap_err();
        assert!(e.contains(r#""first", "fallback" or "off""#), "{e}");
        assert!(planning("3").is_err());
        // Saved configs (run directories) write the name back.
        let s = StrategyConfig {
            planning: Planning::Fallback,
            ..StrategyConfig::default()
        };
        let text = toml::to_string(&s).unwrap();
        assert!(text.contains(r#"planning = "fallback""#), "{text}");
        assert_eq!(toml::from_str::<StrategyConfig>(&text).unwrap(), s);
    }
}
