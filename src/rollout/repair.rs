//! The repairing strategies: self-repair (the model revises its own code
//! from the guiding test's error) and MemoCoder (papers/memocoder.txt §2:
//! planner, code writer, test executor on the guiding test, mentor with the
//! fixing knowledge set, repair loop, online-adaptation rounds).
//!
//! Both share one loop. Tasks go through it in chunks of
//! `batch_size / n` tasks, every step of a chunk batched into one
//! generator call; fixes learned in a chunk are retrieved from the next
//! chunk on, and the mentor rewrites its suggestions between chunks. So
//! no task ever benefits from its own fix (the paper's causal ordering).
//!
//! Where the paper is silent we chose, and say so here: self-repair's
//! first attempt is the zero-shot prompt (no test shown); MemoCoder's code
//! writer is shown every plan and picks one; a fix entry stores the first
//! failing code, its error and the code that finally passed. Where we
//! depart from it: by default (`planning = "fallback"`) the planner runs
//! only for a first answer that failed the guiding test, because plans
//! written before any code made SmolLM2-135M's answers worse
//! (docs/results/eval.md); `"first"` is the paper's order.

use std::fmt::Write as _;

use crate::config::{Planning, Rendering, StrategyConfig};
use crate::exec::{ExecReport, RewardClass};
use crate::memory::fixes::{FixEntry, FixKnowledge, FixesConfig, Mentor};
use crate::memory::render::{changed_lines, View};
use crate::model::{Completion, FinishReason};
use crate::task::Task;

use super::strategy::{
    code_of, error_message, guiding_tests, Env, Format, RolloutError, Solution, Strategy,
};
use super::{name_hint, task_prompt};

/// Which repairing strategy, with its ablation switches.
#[derive(Debug, Clone)]
pub struct RepairConfig {
    pub memocoder: bool,
    pub max_attempts: usize,
    pub plans: usize,
    pub planning: Planning,
    pub retrieval: bool,
    pub mentor: bool,
    pub fixes_shown: usize,
    pub rounds: usize,
    pub fixes: FixesConfig,
    /// How a retrieved fix is shown (`[memory] render`, `render_chars`).
    pub render: Rendering,
    pub render_chars: usize,
}

impl RepairConfig {
    /// Self-repair: attempts from `[strategy]`, nothing else.
    pub fn self_repair(s: &StrategyConfig) -> Self {
        RepairConfig {
            memocoder: false,
            max_attempts: s.max_attempts,
            plans: 0,
            planning: Planning::Off,
            retrieval: false,
            mentor: false,
            fixes_shown: 0,
            rounds: 1,
            fixes: FixesConfig::default(),
            render: Rendering::Full,
            render_chars: 0,
        }
    }

    /// MemoCoder with `[strategy]`'s switches and `[memory.fixes]`.
    pub fn memocoder(s: &StrategyConfig, fixes: &FixesConfig) -> Self {
        RepairConfig {
            memocoder: true,
            max_attempts: s.max_attempts,
            plans: s.plans,
            planning: s.planning,
            retrieval: s.retrieval,
            mentor: s.mentor,
            fixes_shown: s.fixes_shown,
            rounds: s.rounds,
            fixes: fixes.clone(),
            render: Rendering::Full,
            render_chars: 0,
        }
    }

    /// Show retrieved fixes as `render` says, in at most `chars`
    /// characters per prompt (0: no limit).
    pub fn with_render(mut self, render: Rendering, chars: usize) -> Self {
        self.render = render;
        self.render_chars = chars;
        self
    }
}

/// Counters of what the loop did, reported in results.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RepairStats {
    pub attempts: u64,
    pub repairs_tried: u64,
    pub repaired: u64,
    pub fixes_added: u64,
    pub fixes_retrieved: u64,
    /// Code-writer answers written from plans.
    #[serde(default)]
    pub planned: u64,
    pub plan_parse_failures: u64,
    pub mentor_rewrites: u64,
    pub mentor_rewrite_failures: u64,
}

/// What a [`Repair`] has learned, as a trainer checkpoints it: the fixes
/// (with their ids), the mentor and the counters.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RepairState {
    pub fixes: Vec<(u64, FixEntry)>,
    pub mentor: Mentor,
    pub stats: RepairStats,
}

/// Self-repair or MemoCoder, with the knowledge MemoCoder accumulates.
pub struct Repair {
    cfg: RepairConfig,
    knowledge: FixKnowledge,
    mentor: Mentor,
    pub stats: RepairStats,
}

/// One sample slot while it is being solved.
struct Slot {
    task: usize,
    completion: Completion,
    attempts: Vec<String>,
    /// The first failing attempt of the current round: (code, report).
    first_failure: Option<(String, ExecReport)>,
    last: Option<(String, ExecReport)>,
    solved: bool,
}

impl Repair {
    pub fn new(cfg: RepairConfig) -> Self {
        Repair {
            cfg,
            knowledge: FixKnowledge::new(),
            mentor: Mentor::default(),
            stats: RepairStats::default(),
        }
    }

    /// Everything learned so far (see [`RepairState`]).
    pub fn state(&self) -> RepairState {
        RepairState {
            fixes: self
                .knowledge
                .entries()
                .map(|(id, e)| (id, e.clone()))
                .collect(),
            mentor: self.mentor.clone(),
            stats: self.stats.clone(),
        }
    }

    /// Continue from a saved [`RepairState`].
    pub fn restore(&mut self, state: RepairState) -> Result<(), RolloutError> {
        let records = state
            .fixes
            .into_iter()
            .map(|(id, e)| (FixKnowledge::record_key(id), e))
            .collect();
        self.knowledge = FixKnowledge::from_records(records)
            .map_err(|e| RolloutError::Invalid(format!("saved fixing knowledge: {e}")))?;
        self.mentor = state.mentor;
        self.stats = state.stats;
        Ok(())
    }

    pub fn knowledge(&self) -> &FixKnowledge {
        &self.knowledge
    }

    pub fn mentor(&self) -> &Mentor {
        &self.mentor
    }

    /// Run `tasks` through the loop only to grow the fixing knowledge and
    /// the mentor's suggestions (MemoCoder's accumulation phase, §3.1); the
    /// answers are dropped.
    pub fn accumulate(&mut self, env: &Env, tasks: &[&Task]) -> Result<(), RolloutError> {
        self.solve(env, tasks, 1, &mut |_, _| {})?;
        Ok(())
    }

    fn planner_prompt(&self, task: &Task) -> String {
        let mut p = format!(
            "Here is a programming problem.\n\n{}\n",
            task.prompt.trim_end()
        );
        if let Some(h) = name_hint(task) {
            let _ = writeln!(p, "{h}");
        }
        let _ = write!(
            p,
            "\nA test the solution must pass:\n```python\n{}\n```\n\nWrite {} different plans for solving it, \
             each a few short numbered steps in plain words. Do not write any code. \
             Start each plan with a line \"Plan N:\".",
            task.shown_test(0),
            self.cfg.plans
        );
        p
    }

    fn first_prompt(&self, env: &Env, task: &Task, plans: &str) -> String {
        if !self.cfg.memocoder {
            return task_prompt(env.instruction, task);
        }
        let mut p = format!("{}\n", task_prompt(env.instruction, task));
        let _ = write!(
            p,
            "\nThe solution must pass this test:\n```python\n{}\n```\n",
            task.shown_test(0)
        );
        if !plans.is_empty() {
            let _ = write!(
                p,
                "\nPlans for solving it:\n{}\n\nChoose the plan you find best and implement it.",
                plans.trim()
            );
        }
        p
    }

    fn repair_prompt(&mut self, env: &Env, task: &Task, code: &str, report: &ExecReport) -> String {
        let err = error_message(report);
        let mut p = format!("{}\n", task_prompt(env.instruction, task));
        let _ = write!(
            p,
            "\nThis solution was written earlier:\n```python\n{}\n```\n\nIt fails this test:\n```python\n{}\n```\nwith this error:\n{}\n",
            code.trim_end(),
            task.shown_test(0),
            err
        );
        if self.cfg.memocoder {
            let class = report.error_kind.map(|k| k.memocoder_class());
            if self.cfg.retrieval && self.cfg.fixes_shown > 0 {
                let hits = self.knowledge.retrieve(&err, self.cfg.fixes.top_k);
                self.stats.fixes_retrieved += hits.len() as u64;
                let mut view = View::new(self.cfg.render, &task.entry_point, self.cfg.render_chars);
                for h in hits.iter().take(self.cfg.fixes_shown) {
                    let Some(shown) = view.take(render_fix(&view, h.entry)) else {
                        break;
                    };
                    p.push_str(&shown);
                }
            }
            if let (true, Some(c)) = (self.cfg.mentor, class) {
                let _ = write!(
                    p,
                    "\nFixing suggestions for this kind of error:\n{}",
                    self.mentor.suggestion_text(c)
                );
            }
        }
        p.push_str("\nWrite the corrected, complete solution in one ```python block.");
        p
    }

    /// Run one round (first attempt and repairs) for the slots in `which`.
    /// Every prompt is built from `guides` (each task with only its guiding
    /// test), never from the tasks themselves. `round` counts from 0.
    fn round(
        &mut self,
        env: &Env,
        guides: &[Task],
        slots: &mut [Slot],
        which: &[usize],
        round: usize,
    ) -> Result<(), RolloutError> {
        for &s in which {
            slots[s].first_failure = None;
        }
        let planning = if self.cfg.memocoder {
            self.cfg.planning
        } else {
            Planning::Off
        };
        // A fallback planner plans from the second round on: the samples
        // there already failed an answer written without plans.
        let plan_first =
            planning == Planning::First || (planning == Planning::Fallback && round > 0);
        let mut attempts = 1;
        if plan_first {
            self.planned_attempt(env, guides, slots, which)?;
        } else {
            let prompts: Vec<String> = which
                .iter()
                .map(|&s| {
                    let task = &guides[slots[s].task];
                    if planning == Planning::Fallback {
                        task_prompt(env.instruction, task)
                    } else {
                        self.first_prompt(env, task, "")
                    }
                })
                .collect();
            let comps = env.generate(&prompts)?;
            self.record(env, guides, slots, which, comps);
            if planning == Planning::Fallback && self.cfg.max_attempts > 1 {
                let failing = unsolved(slots, which);
                if !failing.is_empty() {
                    self.planned_attempt(env, guides, slots, &failing)?;
                }
                attempts += 1;
            }
        }

        for _ in attempts..self.cfg.max_attempts {
            let failing = unsolved(slots, which);
            if failing.is_empty() {
                break;
            }
            let prompts: Vec<String> = failing
                .iter()
                .map(|&s| {
                    let (code, report) = slots[s].last.clone().expect("an attempt ran");
                    self.repair_prompt(env, &guides[slots[s].task], &code, &report)
                })
                .collect();
            self.stats.repairs_tried += failing.len() as u64;
            let comps = env.generate(&prompts)?;
            self.record(env, guides, slots, &failing, comps);
        }
        Ok(())
    }

    /// The planner writes plans for the slots in `which`, then the code
    /// writer answers from them (with the guiding test).
    fn planned_attempt(
        &mut self,
        env: &Env,
        guides: &[Task],
        slots: &mut [Slot],
        which: &[usize],
    ) -> Result<(), RolloutError> {
        let prompts: Vec<String> = which
            .iter()
            // A task whose tests are one program (HumanEval's `check`)
            // would show the planner the very test it is scored on.
            .map(|&s| self.planner_prompt(&guides[slots[s].task]))
            .collect();
        // The answer starts as the format asks, so that a small model
        // writes steps in words instead of code (docs/results/eval.md).
        let format = Format {
            prefill: PLAN_PREFILL,
            max_new_tokens: PLAN_TOKENS,
            stop: Vec::new(),
            reflector: false,
        };
        let plans: Vec<String> = env
            .structured(&prompts, &format)?
            .into_iter()
            .map(|c| {
                let (plans, ok) = parse_plans(&c.text, self.cfg.plans);
                if !ok {
                    self.stats.plan_parse_failures += 1;
                }
                plans
            })
            .collect();
        let prompts: Vec<String> = which
            .iter()
            .zip(&plans)
            .map(|(&s, p)| self.first_prompt(env, &guides[slots[s].task], p))
            .collect();
        self.stats.planned += which.len() as u64;
        let comps = env.generate(&prompts)?;
        self.record(env, guides, slots, which, comps);
        Ok(())
    }

    /// Execute each slot's new completion on its guiding test and update it;
    /// a repair that made a failing slot pass becomes a fix.
    fn record(
        &mut self,
        env: &Env,
        guides: &[Task],
        slots: &mut [Slot],
        which: &[usize],
        comps: Vec<Completion>,
    ) {
        let codes: Vec<String> = comps.iter().map(|c| code_of(c).to_owned()).collect();
        let jobs: Vec<(&Task, &str)> = which
            .iter()
            .zip(&codes)
            .map(|(&s, c)| (&guides[slots[s].task], c.as_str()))
            .collect();
        let reports = env.sandbox.run_batch(&jobs);
        self.stats.attempts += which.len() as u64;
        for (((&s, c), code), report) in which.iter().zip(comps).zip(codes).zip(reports) {
            let slot = &mut slots[s];
            slot.completion = c;
            slot.attempts.push(report.outcome_label());
            slot.solved = report.outcome == Some(RewardClass::Pass);
            if slot.solved {
                if let Some((failing, bad)) = slot.first_failure.take() {
                    self.stats.repaired += 1;
                    if self.cfg.memocoder {
                        self.learn(&guides[slot.task], failing, &bad, code.clone());
                    }
                }
            } else if slot.first_failure.is_none() && report.outcome.is_some() {
                slot.first_failure = Some((code.clone(), report.clone()));
            }
            slot.last = Some((code, report));
        }
    }

    fn learn(&mut self, task: &Task, failing_code: String, report: &ExecReport, fixed: String) {
        let Some(kind) = report.error_kind else {
            return;
        };
        let entry = FixEntry {
            error_kind: kind,
            error_message: error_message(report),
            failing_code,
            fixed_code: fixed,
            task: task.prompt.clone(),
        };
        let id = self.knowledge.add(entry.clone());
        self.mentor.note_fix(id, &entry);
        self.stats.fixes_added += 1;
    }

    /// The mentor rewrites the suggestions of every class with enough new
    /// fixes (§2.2.4); an unparseable answer leaves the class as it was.
    fn mentor_rewrites(&mut self, env: &Env) -> Result<(), RolloutError> {
        if !(self.cfg.memocoder && self.cfg.mentor) {
            return Ok(());
        }
        let requests: Vec<_> = self
            .mentor
            .due(&self.cfg.fixes)
            .into_iter()
            .filter_map(|c| {
                self.mentor
                    .rewrite_request(c, &self.knowledge, &self.cfg.fixes)
            })
            .collect();
        if requests.is_empty() {
            return Ok(());
        }
        let prompts: Vec<String> = requests.iter().map(|r| r.prompt.clone()).collect();
        // The list starts as asked and ends before an item too many.
        let format = Format {
            prefill: "1.",
            max_new_tokens: 160,
            stop: vec![format!("\n{}.", self.cfg.fixes.max_suggestions + 1)],
            reflector: true,
        };
        let answers = env.structured(&prompts, &format)?;
        for (r, a) in requests.iter().zip(answers) {
            match self
                .mentor
                .apply_rewrite(r, &complete_lines(&a), &self.cfg.fixes)
            {
                Ok(_) => self.stats.mentor_rewrites += 1,
                Err(_) => self.stats.mentor_rewrite_failures += 1,
            }
        }
        Ok(())
    }
}

impl Strategy for Repair {
    fn name(&self) -> String {
        if self.cfg.memocoder {
            "memocoder"
        } else {
            "self-repair"
        }
        .into()
    }

    fn solve(
        &mut self,
        env: &Env,
        tasks: &[&Task],
        n: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Vec<Vec<Solution>>, RolloutError> {
        if let Some(t) = tasks.iter().find(|t| t.tests.is_empty()) {
            return Err(RolloutError::Invalid(format!(
                "task {}: no test to guide repairs",
                t.id
            )));
        }
        let guides = guiding_tests(env.sandbox, tasks);
        let mut slots: Vec<Slot> = (0..tasks.len())
            .flat_map(|t| std::iter::repeat_n(t, n))
            .map(|task| Slot {
                task,
                completion: Completion::text_only("", FinishReason::Length),
                attempts: Vec::new(),
                first_failure: None,
                last: None,
                solved: false,
            })
            .collect();
        let total = slots.len() * self.cfg.rounds;
        let chunk_tasks = (env.batch_size / n.max(1)).max(1);
        let mut done = 0;
        for round in 0..self.cfg.rounds {
            for first in (0..tasks.len()).step_by(chunk_tasks) {
                let which: Vec<usize> = (first * n..((first + chunk_tasks).min(tasks.len())) * n)
                    .filter(|&s| round == 0 || !slots[s].solved)
                    .collect();
                if !which.is_empty() {
                    self.round(env, &guides, &mut slots, &which, round)?;
                    self.mentor_rewrites(env)?;
                }
                done += ((first + chunk_tasks).min(tasks.len()) - first) * n;
                progress(done, total);
            }
            if slots.iter().all(|s| s.solved) {
                progress(total, total);
                break;
            }
        }
        let mut out: Vec<Vec<Solution>> = (0..tasks.len()).map(|_| Vec::with_capacity(n)).collect();
        for s in slots {
            out[s.task].push(Solution {
                completion: s.completion,
                attempts: s.attempts,
                report: None,
                reflections: Vec::new(),
            });
        }
        Ok(out)
    }

    fn stats(&self) -> Vec<(String, f64)> {
        let s = &self.stats;
        let mut v = vec![
            ("attempts", s.attempts),
            ("repairs_tried", s.repairs_tried),
            ("repaired", s.repaired),
        ];
        if self.cfg.memocoder {
            v.extend([
                ("fixes_added", s.fixes_added),
                ("fixes_known", self.knowledge.len() as u64),
                ("fixes_retrieved", s.fixes_retrieved),
                ("planned", s.planned),
                ("plan_parse_failures", s.plan_parse_failures),
                ("mentor_rewrites", s.mentor_rewrites),
                ("mentor_rewrite_failures", s.mentor_rewrite_failures),
            ]);
        }
        v.into_iter()
            .map(|(k, x)| (k.to_owned(), x as f64))
            .collect()
    }

    fn save_state(&self) -> Result<Option<serde_json::Value>, RolloutError> {
        serde_json::to_value(self.state())
            .map(Some)
            .map_err(|e| RolloutError::Invalid(format!("repair state: {e}")))
    }

    fn load_state(&mut self, state: serde_json::Value) -> Result<(), RolloutError> {
        let state: RepairState = serde_json::from_value(state)
            .map_err(|e| RolloutError::Invalid(format!("repair state: {e}")))?;
        self.restore(state)
    }
}

/// The slots of `which` whose code still fails the guiding test.
fn unsolved(slots: &[Slot], which: &[usize]) -> Vec<usize> {
    which
        .iter()
        .copied()
        .filter(|&s| !slots[s].solved)
        .collect()
}

/// How the planner's answer starts: the first plan's header and step.
pub const PLAN_PREFILL: &str = "Plan 1:\n1. First,";

/// Tokens a planner answer may take (plans in words are short).
const PLAN_TOKENS: usize = 192;

/// The planner's answer as the code writer sees it: up to `max` plans,
/// each starting at a "Plan N:" (or "Solution N:") line, keeping only the
/// plans in words: a plan with code in it (a fence or a `def`)
/// or with fewer than three words is dropped. When no plan is left the
/// whole answer is used as one plan and `false` says the format was
/// missed.
pub fn parse_plans(answer: &str, max: usize) -> (String, bool) {
    let mut plans: Vec<String> = Vec::new();
    for line in answer.lines() {
        let t = line.trim_start().trim_start_matches(['#', '*', ' ']);
        let is_head = ["Plan", "Solution"].iter().any(|w| {
            t.strip_prefix(w)
                .map(|r| {
                    let r = r.trim_start();
                    let digits = r.chars().take_while(char::is_ascii_digit).count();
                    digits > 0 && r[digits..].trim_start_matches('*').starts_with([':', '.'])
                })
                .unwrap_or(false)
        });
        if is_head {
            plans.push(String::new());
        }
        if let Some(p) = plans.last_mut() {
            p.push_str(line.trim_end());
            p.push('\n');
        }
    }
    plans.retain(|p| {
        let body = p.split_once('\n').map_or("", |(_, b)| b);
        let code = ["```", "def "].iter().any(|c| body.contains(c));
        !code && body.split_whitespace().count() >= 3
    });
    if plans.is_empty() {
        return (answer.trim().to_owned(), false);
    }
    plans.truncate(max);
    (plans.concat().trim().to_owned(), true)
}

/// One retrieved fix in a repair prompt: its error, then the failing and
/// fixed code whole (`full`, `renamed`: with the fix's functions renamed to
/// the task's entry point) or only the lines it changed (`brief`).
fn render_fix(view: &View, fix: &FixEntry) -> String {
    let defs = format!("{}\n{}", fix.failing_code, fix.fixed_code);
    let err = view.rename_from(&defs, fix.error_message.trim());
    match view.rendering {
        Rendering::Brief => {
            let mut changed = changed_lines(
                &view.renamed(&fix.failing_code),
                &view.renamed(&fix.fixed_code),
                FIX_LINES,
            );
            if changed.is_empty() {
                changed = "(no line changed)".into();
            }
            format!("\nA past fix of a similar error ({err}) changed these lines:\n{changed}\n")
        }
        Rendering::Full | Rendering::Renamed => {
            let code = |c: &str| match view.rendering {
                Rendering::Renamed => clip(&view.renamed(c), 1200),
                _ => clip(c, 1200),
            };
            format!(
                "\nA past fix of a similar error ({err}):\nBefore:\n```python\n{}\n```\nAfter:\n```python\n{}\n```\n",
                code(&fix.failing_code),
                code(&fix.fixed_code)
            )
        }
    }
}

/// Changed lines a `brief` fix shows at most.
const FIX_LINES: usize = 6;

/// An answer's text without the line the token limit cut.
fn complete_lines(c: &Completion) -> String {
    match c.text.rsplit_once('\n') {
        Some((whole, _)) if c.cut_off() => whole.to_owned(),
        _ => c.text.clone(),
    }
}

/// A fix's code cut for a repair prompt.
fn clip(s: &str, max: usize) -> String {
    match s.chars().nth(max) {
        None => s.trim_end().to_owned(),
        Some(_) => crate::text::clip(s, max, "\n# ... [cut]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_split_at_their_headers_and_fall_back_to_the_whole_answer() {
        let a = "Sure!\nPlan 1: sort.\n1. sort the list\n**Plan 2:** hash it\nput each in a set\n### Solution 3. brute force\ntry every pair\nPlan 4: extra\nmore steps here";
        let (p, ok) = parse_plans(a, 3);
        assert!(ok);
        assert!(
            p.starts_with("Plan 1: sort.\n1. sort the list\n**Plan 2:** hash it"),
            "{p}"
        );
        assert!(
            p.contains("Solution 3. brute force") && !p.contains("Plan 4") && !p.contains("Sure")
        );
        let (p, ok) = parse_plans("just do it\n", 3);
        assert!(!ok);
        assert_eq!(p, "just do it");
        // "Planning:" is not a header.
        assert!(!parse_plans("Planning: x y z", 3).1);
    }

    #[test]
    fn plans_with_code_or_without_words_do_not_count() {
        // What SmolLM2-135M wrote before the prefill: headers, code.
        let a = "Plan 1:\n\nPlan 2:\n\nPlan 3:\n```python\ndef f(x):\n    return x\n```";
        assert!(!parse_plans(a, 3).1);
        let a = format!("{PLAN_PREFILL} define f.\n2. return x\nPlan 2:\n1. def f(x): return x");
        let (p, ok) = parse_plans(&a, 3);
        assert!(ok);
        assert_eq!(p, "Plan 1:\n1. First, define f.\n2. return x");
    }
}
