//! The device memory a run will hold, checked against the device's free
//! memory when training starts on CUDA, so a run that cannot fit stops at
//! once with each part's size instead of an out-of-memory error an hour in.
//!
//! Counted: the model's weights, the trainable weights' gradients and
//! optimizer state, the short-term buffer and the device vector index of
//! meta-RL runs, and the share of the GPU that the sandbox's numba-cuda
//! candidates may take (`[exec] cuda_memory_fraction` × workers). Not
//! counted: activations, which depend on the batch and are the headroom.

use tch::{Device, Kind};

use super::{Recipe, TrainError};
use crate::config::{CudaMode, EmbedderKind, IndexKind, OptimizerKind, RunConfig};
use crate::model::Policy;
use crate::task::{TaskKind, TaskSet};

/// One part of the budget.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub name: &'static str,
    pub bytes: u64,
}

fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / 1048576.0)
}

/// The parts a run holds on its device (`total`: the device's memory, for
/// the numba share).
pub fn parts(
    cfg: &RunConfig,
    recipe: Recipe,
    policy: &Policy,
    tasks: &TaskSet,
    workers: usize,
    total: u64,
) -> Vec<Part> {
    let size = |k: Kind| k.elt_size_in_bytes() as u64;
    let (mut weights, mut trainable) = (0u64, 0u64);
    for (_, t) in policy.vs.variables() {
        let b = t.numel() as u64 * size(t.kind());
        weights += b;
        if t.requires_grad() {
            trainable += b;
        }
    }
    // A gradient per trainable weight, and AdamW's two moments.
    let optimizer = match cfg.train.optimizer {
        OptimizerKind::Adamw => 3 * trainable,
        OptimizerKind::Sgd => trainable,
    };
    let mut out = vec![
        Part {
            name: "model weights",
            bytes: weights,
        },
        Part {
            name: "gradients and optimizer state",
            bytes: optimizer,
        },
    ];
    if let Recipe::Meta(_) = recipe {
        let m = &cfg.memory;
        // token ids (8), mask (1), rewards, log-probs, advantages (4 each),
        // scored (1) per token; `passed` per row.
        let row = 22 * m.short_term_max_len as u64 + 1;
        out.push(Part {
            name: "short-term buffer",
            bytes: row * m.short_term_capacity as u64,
        });
        if m.index == IndexKind::Exact {
            let dim = match m.embedder {
                EmbedderKind::Minilm => 384,
                EmbedderKind::Hash => m.hash_dim as u64,
                EmbedderKind::Policy => policy.model.config.hidden_size as u64,
            };
            // Every evaluated sample of the run becomes an entry.
            let t = &cfg.train;
            let q = if cfg.meta.query_size == 0 {
                t.group_size
            } else {
                cfg.meta.query_size
            };
            let entries = t.steps * (t.tasks_per_step * t.group_size.max(q)) as u64;
            out.push(Part {
                name: "device vector index (the run's entries, f32)",
                bytes: entries * dim * 4,
            });
        }
    }
    let numba = tasks.iter().any(|t| t.kind == TaskKind::NumbaCuda);
    if numba && cfg.exec.cuda != CudaMode::Sim {
        out.push(Part {
            name: "numba-cuda candidates ([exec] cuda_memory_fraction x workers)",
            bytes: (cfg.exec.cuda_memory_fraction * workers as f64 * total as f64) as u64,
        });
    }
    out
}

/// Refuse a run whose parts do not fit in `free` bytes of device `device`.
pub fn check_fits(parts: &[Part], free: u64, total: u64, device: &str) -> Result<(), TrainError> {
    let need: u64 = parts.iter().map(|p| p.bytes).sum();
    if need <= free {
        return Ok(());
    }
    let lines: Vec<String> = parts
        .iter()
        .map(|p| format!("  {:>10}  {}", mib(p.bytes), p.name))
        .collect();
    Err(TrainError::Invalid(format!(
        "the run does not fit on {device}: it needs {} before activations, and {} of {} is free:\n{}\n\
         use a smaller model or dtype (bf16), LoRA, fewer sandbox workers or a smaller \
         [exec] cuda_memory_fraction, or a smaller [memory] short_term_capacity",
        mib(need),
        mib(free),
        mib(total),
        lines.join("\n")
    )))
}

/// The check at the start of training: on CUDA, read the device's free
/// memory and refuse what cannot fit; elsewhere nothing to do.
pub fn check(
    cfg: &RunConfig,
    recipe: Recipe,
    policy: &Policy,
    tasks: &TaskSet,
    workers: usize,
) -> Result<(), TrainError> {
    let Device::Cuda(i) = policy.device() else {
        return Ok(());
    };
    let (free, total) = crate::kernels::device::memory(i)
        .map_err(|source| TrainError::DeviceMemory { device: i, source })?;
    let parts = parts(cfg, recipe, policy, tasks, workers, total as u64);
    // The weights are already on the device: they are in use, not free.
    let resident = parts.first().map_or(0, |p| p.bytes);
    check_fits(
        &parts,
        free as u64 + resident,
        total as u64,
        &format!("cuda:{i}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MetaAlgorithm;

    #[test]
    fn parts_follow_the_model_the_recipe_and_the_tasks() {
        let dir = tempfile::tempdir().unwrap();
        let policy = crate::model::testing::tiny_lora_policy(dir.path());
        let (mut all, mut lora) = (0u64, 0u64);
        for (n, t) in policy.vs.variables() {
            all += t.numel() as u64 * 4;
            if n.contains("lora_") {
                lora += t.numel() as u64 * 4;
            }
        }
        assert!(lora > 0);
        let task: crate::task::Task = serde_json::from_value(serde_json::json!({
            "id": "n/1", "prompt": "p", "entry_point": "f", "tests": ["assert True"],
            "kind": "numba_cuda"
        }))
        .unwrap();
        let tasks = TaskSet {
            tasks: vec![task],
            skipped: vec![],
        };
        let mut cfg = RunConfig::default();
        cfg.memory.embedder = EmbedderKind::Hash;
        cfg.memory.hash_dim = 32;
        cfg.exec.cuda_memory_fraction = 0.1;
        let total = 1u64 << 30;
        let rl = parts(&cfg, Recipe::Rl, &policy, &tasks, 2, total);
        let bytes = |ps: &[Part], name: &str| {
            ps.iter()
                .find(|p| p.name.starts_with(name))
                .map(|p| p.bytes)
        };
        assert_eq!(bytes(&rl, "model weights"), Some(all));
        assert_eq!(bytes(&rl, "gradients"), Some(3 * lora));
        assert_eq!(bytes(&rl, "short-term"), None);
        assert_eq!(bytes(&rl, "numba-cuda"), Some((0.2 * total as f64) as u64));
        let meta = parts(
            &cfg,
            Recipe::Meta(MetaAlgorithm::Fomaml),
            &policy,
            &tasks,
            2,
            total,
        );
        let m = &cfg.memory;
        assert_eq!(
            bytes(&meta, "short-term"),
            Some((22 * m.short_term_max_len as u64 + 1) * m.short_term_capacity as u64)
        );
        assert!(bytes(&meta, "device vector index").unwrap() > 0);
        cfg.exec.cuda = CudaMode::Sim;
        let sim = parts(&cfg, Recipe::Rl, &policy, &tasks, 2, total);
        assert_eq!(bytes(&sim, "numba-cuda"), None);
    }

    #[test]
    fn a_run_that_does_not_fit_names_every_part() {
        let parts = vec![
            Part {
                name: "model weights",
                bytes: 3 << 30,
            },
            Part {
                name: "short-term buffer",
                bytes: 1 << 30,
            },
        ];
        assert!(check_fits(&parts, 5 << 30, 8 << 30, "cuda:0").is_ok());
        let e = check_fits(&parts, 3 << 30, 8 << 30, "cuda:0")
            .unwrap_err()
            .to_string();
        assert!(e.contains("4096 MiB"), "{e}");
        assert!(e.contains("3072 MiB  model weights"), "{e}");
        assert!(e.contains("1024 MiB  short-term buffer"), "{e}");
        assert!(e.contains("of 8192 MiB is free"), "{e}");
    }
}
