//! The bundled numba-cuda task set (data/numba_cuda_tasks.jsonl, made by
//! scripts/data/build-numba-tasks.py and checked in the simulator by
//! scripts/check/check-numba-tasks.py) loads as falcon tasks, and every mutant
//! belongs to a task.

use std::collections::HashSet;

use falcon_rl::task::{LoadOptions, TaskFormat, TaskKind, TaskSet};

use crate::common::root;

#[test]
fn numba_cuda_task_set_loads_with_at_least_30_tasks_and_mutants_for_each() {
    let path = root().join("data/numba_cuda_tasks.jsonl");
    let set = TaskSet::load(&path, TaskFormat::Jsonl, LoadOptions::default()).unwrap();
    assert!(set.len() >= 30, "{} tasks", set.len());
    assert!(set.skipped.is_empty());
    for t in set.iter() {
        assert_eq!(t.kind, TaskKind::NumbaCuda, "{}", t.id);
        assert!(t.tests.len() >= 4, "{}: {} tests", t.id, t.tests.len());
        let sol = t.canonical_solution.as_deref().unwrap_or_default();
        assert!(
            sol.contains("@cuda.jit"),
            "{}: canonical solution launches a kernel",
            t.id
        );
    }
    let ids: HashSet<&str> = set.iter().map(|t| t.id.as_str()).collect();
    let mutants =
        std::fs::read_to_string(root().join("data/numba_cuda_tasks.mutants.jsonl")).unwrap();
    let mut covered = HashSet::new();
    for (i, line) in mutants.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let id = v["id"]
            .as_str()
            .unwrap_or_else(|| panic!("mutant line {}: no id", i + 1));
        assert!(
            ids.contains(id),
            "mutant line {} names unknown task {id}",
            i + 1
        );
        assert!(v["wrong_solution"].as_str().is_some_and(|s| !s.is_empty()));
        covered.insert(id.to_string());
    }
    assert_eq!(
        covered.len(),
        ids.len(),
        "every task has at least one mutant"
    );
}
