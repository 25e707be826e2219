//! The rollout strategies end to end with scripted generators and the real
//! sandbox: what each prompt showed, what was retrieved, injected, learned
//! and evolved at each step, and the attempt chains evaluation reports.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use falcon_rl::config::{EvalConfig, ExecConfig, GenerationConfig, Planning, StrategyConfig};
use falcon_rl::eval::{evaluate_in_groups, evaluate_strategy, EvalSpec, Partial};
use falcon_rl::exec::{MemoCoderClass, Sandbox};
use falcon_rl::memory::fixes::FixesConfig;
use falcon_rl::memory::guidelines::{ApiDoc, MemCoderParams};
use falcon_rl::memory::HashEmbedder;
use falcon_rl::model::testing::{continued, Scripted};
use falcon_rl::model::{Completion, FinishReason, GenerationParams, Generator, ModelError};
use falcon_rl::rollout::doc_rag::{DocMode, DocSizes, DocStrategy};
use falcon_rl::rollout::repair::{Repair, RepairConfig};
use falcon_rl::rollout::{Env, Strategy};
use falcon_rl::task::Task;

fn task(id: &str, prompt: &str, entry: &str, tests: &[&str]) -> Task {
    Task {
        id: id.into(),
        prompt: prompt.into(),
        entry_point: entry.into(),
        tests: tests.iter().map(|t| t.to_string()).collect(),
        kind: Default::default(),
        canonical_solution: None,
        docs: None,
        tags: vec![],
        test_setup: None,
        prelude: None,
        extra: Default::default(),
        ..Default::default()
    }
}

fn sandbox(uid_base: u32) -> Sandbox {
    Sandbox::new(&ExecConfig {
        workers: 2,
        uid_base,
        timeout_s: 2.0,
        memory_mb: 512,
        ..ExecConfig::default()
    })
    .unwrap_or_else(|e| panic!("sandbox: {e}"))
}

/// A scripted answer as a model continuing `params.prefill` returns it: the
/// script writes the whole answer, which must start with the prefill.
fn py(code: &str) -> String {
    format!("```python\n{code}```")
}

/// An environment with batch size 1, so every task is its own chunk and
/// what one task learned is visible to the next.
fn env<'a>(
    g: &'a dyn Generator,
    r: &'a dyn Generator,
    sb: &'a Sandbox,
    gen: &'a GenerationConfig,
    eval: &'a EvalConfig,
) -> Env<'a> {
    let spec = EvalSpec {
        instruction: "Solve:",
        generation: gen,
        eval,
        seed: 1,
        prompts: None,
    };
    spec.env(g, r, sb)
}

/// The task a prompt is about, from its statement ("Write f(...").
/// Retrieved fixes show other tasks' code, so only the statement counts.
fn which(p: &str) -> &'static str {
    for f in ["add", "neg", "inc", "dec", "never"] {
        if p.contains(&format!("Write {f}(")) {
            return f;
        }
    }
    panic!("no known function in prompt:\n{p}");
}

fn memocoder_tasks() -> Vec<Task> {
    vec![
        task(
            "add",
            "Write add(a, b) returning a + b.",
            "add",
            &["assert add(1, 2) == 3", "assert add(0, 5) == 5"],
        ),
        task(
            "neg",
            "Write neg(x) returning -x.",
            "neg",
            &["assert neg(2) == -2", "assert neg(0) == 0"],
        ),
        task(
            "inc",
            "Write inc(x) returning x + 1.",
            "inc",
            &["assert inc(1) == 2", "assert inc(-1) == 0"],
        ),
        task(
            "dec",
            "Write dec(x) returning x - 1.",
            "dec",
            &["assert dec(1) == 0", "assert dec(3) == 2"],
        ),
        task(
            "never",
            "Write never(x) returning x * 3.",
            "never",
            &["assert never(1) == 3", "assert never(2) == 6"],
        ),
    ]
}

/// The code writer's answers: a wrong first attempt (a wrong result for
/// `add` and `never`, an undefined name for the rest), a right repair
/// (never for `never`).
fn memocoder_answer(p: &str) -> String {
    if p.contains(PLANNER) {
        return "Plan 1:\n1. First, do it directly.\nPlan 2:\n1. use a helper function\nPlan 3:\n1. loop over the inputs".into();
    }
    let f = which(p);
    let repair = p.contains("This solution was written earlier");
    let code = match (f, repair) {
        ("add", false) => "def add(a, b):\n    return a - b\n",
        ("add", true) => "def add(a, b):\n    return a + b\n",
        ("neg", false) => "def neg(x):\n    return -y\n",
        ("neg", true) => "def neg(x):\n    return -x\n",
        ("inc", false) => "def inc(x):\n    return x + one\n",
        ("inc", true) => "def inc(x):\n    return x + 1\n",
        ("dec", false) => "def dec(x):\n    return x - one\n",
        ("dec", true) => "def dec(x):\n    return x - 1\n",
        ("never", _) => "def never(x):\n    return x * 2\n",
        _ => unreachable!(),
    };
    py(code)
}

/// What only the planner's prompt says.
const PLANNER: &str = "different plans for solving it";

const MENTOR_ANSWER: &str =
    "1. Define every variable before the line that uses it.\n2. Spell names as in the task.";

/// MemoCoder's scripted code writer with the call's seed written into the
/// code, failing every call from `fail_from` on (to the evaluation, a
/// process killed there).
struct Seeded {
    seen: Mutex<Vec<String>>,
    calls: AtomicUsize,
    fail_from: usize,
}

impl Seeded {
    fn new(fail_from: usize) -> Self {
        Seeded {
            seen: Mutex::new(Vec::new()),
            calls: AtomicUsize::new(0),
            fail_from,
        }
    }
}

impl Generator for Seeded {
    fn generate(
        &self,
        prompts: &[String],
        params: &GenerationParams,
    ) -> Result<Vec<Completion>, ModelError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) >= self.fail_from {
            return Err(ModelError::Invalid("killed".into()));
        }
        let seed = params.seed.expect("evaluation calls are seeded");
        let mut seen = self.seen.lock().unwrap();
        Ok(prompts
            .iter()
            .map(|p| {
                seen.push(p.clone());
                let text = continued(&memocoder_answer(p), params)
                    .replace("```python\n", &format!("```python\n# seed {seed}\n"));
                Completion::text_only(text, FinishReason::Eos)
            })
            .collect())
    }
}

/// `[eval] checkpoint_tasks`: MemoCoder (its fixing knowledge carries from
/// group to group) evaluated two tasks at a time, killed in the second
/// group and rerun, gives the uninterrupted result: every sample, seed and
/// attempt chain, the statistics, and the very prompts (with the fixes
/// retrieved from the restored knowledge) after the restart.
#[test]
fn a_killed_grouped_evaluation_resumes_to_the_uninterrupted_result() {
    let sb = sandbox(62630);
    let mentor = Scripted::new(|_: &str| MENTOR_ANSWER.to_owned());
    let gen = GenerationConfig::default();
    let eval = EvalConfig {
        batch_size: 1,
        n: 2,
        ..EvalConfig::default()
    };
    let strategy_cfg = StrategyConfig {
        max_attempts: 3,
        ..StrategyConfig::default()
    };
    let fixes = FixesConfig::default();
    let memocoder = || Repair::new(RepairConfig::memocoder(&strategy_cfg, &fixes));
    let tasks = memocoder_tasks();
    let list: Vec<&Task> = tasks.iter().collect();

    let whole = Seeded::new(usize::MAX);
    let mut first_group_calls = 0;
    let reference = {
        let env = env(&whole, &mentor, &sb, &gen, &eval);
        evaluate_in_groups(
            &mut memocoder(),
            &env,
            &list,
            &eval,
            2,
            None,
            &mut |done, _| {
                if done == 4 && first_group_calls == 0 {
                    first_group_calls = whole.calls.load(Ordering::SeqCst);
                }
            },
        )
        .unwrap()
    };
    assert!(first_group_calls > 0);
    assert_eq!(reference.tasks.len(), 5);

    let dir = crate::common::tmpdir();
    let partial = Partial {
        dir: &dir.path().join("r.partial"),
        made_with: serde_json::json!({"run": "a"}),
    };
    // A fresh strategy and environment, as a restarted process has.
    let grouped = |g: &Seeded, partial: &Partial| {
        let env = env(g, &mentor, &sb, &gen, &eval);
        evaluate_in_groups(
            &mut memocoder(),
            &env,
            &list,
            &eval,
            2,
            Some(partial),
            &mut |_, _| {},
        )
    };
    let killed = Seeded::new(first_group_calls + 1);
    let err = grouped(&killed, &partial).unwrap_err();
    assert!(err.to_string().contains("killed"), "{err}");
    assert!(partial.dir.join("group-00000.json").is_file());
    assert!(!partial.dir.join("group-00001.json").exists());

    let rerun = Seeded::new(usize::MAX);
    let resumed = grouped(&rerun, &partial).unwrap();
    assert_eq!(resumed.tasks, reference.tasks);
    assert_eq!(resumed.strategy_stats, reference.strategy_stats);
    assert_eq!(resumed.pass_at, reference.pass_at);
    assert_eq!(resumed.transitions, reference.transitions);
    let all = whole.seen.lock().unwrap().clone();
    let after = rerun.seen.lock().unwrap().clone();
    assert!(!after.is_empty() && after.len() < all.len());
    assert_eq!(after, all[all.len() - after.len()..]);
    let seeds: Vec<&str> = resumed
        .tasks
        .iter()
        .flat_map(|t| &t.samples)
        .map(|s| s.completion.as_str())
        .collect();
    assert!(seeds.iter().all(|c| c.contains("# seed ")), "{seeds:?}");

    // What another config made is refused, not mixed in.
    let other = Partial {
        dir: partial.dir,
        made_with: serde_json::json!({"run": "b"}),
    };
    let err = grouped(&rerun, &other).unwrap_err();
    assert!(err.to_string().contains("another config"), "{err}");
}

#[test]
fn memocoder_repairs_learns_fixes_and_the_mentor_rewrites() {
    let sb = sandbox(62500);
    let g = Scripted::new(memocoder_answer);
    let mentor = Scripted::new(|p: &str| {
        assert!(p.contains("You are the mentor"), "{p}");
        MENTOR_ANSWER.to_owned()
    });
    let gen = GenerationConfig::default();
    let eval = EvalConfig {
        batch_size: 1,
        ..EvalConfig::default()
    };
    let env = env(&g, &mentor, &sb, &gen, &eval);
    let strategy_cfg = StrategyConfig {
        max_attempts: 3,
        planning: Planning::First,
        ..StrategyConfig::default()
    };
    let fixes = FixesConfig {
        rewrite_threshold: 2,
        ..FixesConfig::default()
    };
    let mut m = Repair::new(RepairConfig::memocoder(&strategy_cfg, &fixes));
    let tasks = memocoder_tasks();
    let list: Vec<&Task> = tasks.iter().collect();
    let r = evaluate_strategy(&mut m, &env, &list, &eval, &mut |_, _| {}).unwrap();

    // Four repaired, `never` failed all three attempts.
    let outcomes: Vec<&str> = r
        .tasks
        .iter()
        .map(|t| t.samples[0].outcome.as_str())
        .collect();
    assert_eq!(outcomes, ["pass", "pass", "pass", "pass", "WrongAnswer"]);
    let chains: Vec<Vec<String>> = r
        .tasks
        .iter()
        .map(|t| t.samples[0].attempts.clone())
        .collect();
    assert_eq!(chains[0], ["WrongAnswer", "pass"]);
    assert_eq!(chains[1], ["NameError", "pass"]);
    assert_eq!(chains[4], ["WrongAnswer", "WrongAnswer", "WrongAnswer"]);
    assert_eq!(r.strategy, "memocoder");
    assert!((r.pass(1).unwrap() - 0.8).abs() < 1e-12);
    let t = &r.transitions;
    let at = |l: &str| t.labels.iter().position(|x| x == l).unwrap();
    assert_eq!(t.labels[0], "pass");
    assert_eq!(t.counts[at("WrongAnswer")][at("pass")], 1);
    assert_eq!(t.counts[at("NameError")][at("pass")], 3);
    assert_eq!(t.counts[at("WrongAnswer")][at("WrongAnswer")], 2);

    // Knowledge: one fix per repaired task, holding the first failing code.
    assert_eq!(m.knowledge().len(), 4);
    let fix = m.knowledge().get(1).unwrap();
    assert!(fix.failing_code.contains("-y") && fix.fixed_code.contains("-x"));
    assert!(
        fix.error_message.contains("name 'y' is not defined"),
        "{}",
        fix.error_message
    );

    let seen = g.seen();
    let prompts_for = |f: &str, repair: bool| -> Vec<String> {
        seen.iter()
            .filter(|p| !p.contains(PLANNER))
            .filter(|p| which(p) == f && p.contains("This solution was written earlier") == repair)
            .cloned()
            .collect()
    };
    // The planner ran once per sample; its plans reached the code writer,
    // with the guiding test and never the hidden one.
    assert_eq!(seen.iter().filter(|p| p.contains(PLANNER)).count(), 5);
    let first = &prompts_for("add", false)[0];
    assert!(
        first.contains("Plan 2:\n1. use a helper function"),
        "{first}"
    );
    assert!(first.contains("assert add(1, 2) == 3") && !first.contains("assert add(0, 5)"));
    // `neg` is the first NameError: nothing to retrieve yet.
    let neg = &prompts_for("neg", true)[0];
    assert!(neg.contains("name 'y' is not defined"));
    assert!(!neg.contains("A past fix"), "{neg}");
    // `inc` retrieves `neg`'s fix (same error words) and not `add`'s.
    let inc = &prompts_for("inc", true)[0];
    assert!(
        inc.contains("A past fix") && inc.contains("return -x"),
        "{inc}"
    );
    assert!(!inc.contains("return a + b"), "{inc}");
    // Two Exception-class fixes (neg, inc) reached the threshold: the
    // mentor rewrote once, and `dec`'s repair shows the new list.
    assert_eq!(mentor.seen().len(), 1);
    assert_eq!(m.mentor().class(MemoCoderClass::Exception).version, 1);
    let dec = &prompts_for("dec", true)[0];
    assert!(
        dec.contains("Define every variable before the line"),
        "{dec}"
    );
    assert!(
        !inc.contains("Define every variable before the line"),
        "{inc}"
    );
    // The wrong-answer class still shows its built-in suggestions.
    assert!(prompts_for("never", true)[0].contains("trace the failing test's input"));
    let stats: std::collections::BTreeMap<_, _> = r.strategy_stats.clone();
    assert_eq!(stats["fixes_added"], 4.0);
    assert_eq!(stats["mentor_rewrites"], 1.0);
    // Five first attempts, one repair each for four tasks, two for `never`.
    assert_eq!(stats["attempts"], 5.0 + 4.0 + 2.0);
}

#[test]
fn memocoder_ablations_rounds_and_accumulation() {
    let sb = sandbox(62510);
    let gen = GenerationConfig::default();
    let eval = EvalConfig {
        batch_size: 1,
        ..EvalConfig::default()
    };
    let tasks = memocoder_tasks();

    // Everything off: no planner, no retrieved fix, no suggestions, no mentor.
    let g = Scripted::new(memocoder_answer);
    let mentor = Scripted::new(|_: &str| MENTOR_ANSWER.to_owned());
    let env_off = env(&g, &mentor, &sb, &gen, &eval);
    let off = StrategyConfig {
        planning: Planning::Off,
        retrieval: false,
        mentor: false,
        ..StrategyConfig::default()
    };
    let fixes = FixesConfig {
        rewrite_threshold: 1,
        ..FixesConfig::default()
    };
    let mut m = Repair::new(RepairConfig::memocoder(&off, &fixes));
    let list: Vec<&Task> = tasks.iter().collect();
    m.solve(&env_off, &list, 1, &mut |_, _| {}).unwrap();
    let seen = g.seen();
    assert!(seen.iter().all(|p| !p.contains(PLANNER)
        && !p.contains("Plans for solving")
        && !p.contains("A past fix")
        && !p.contains("Fixing suggestions")));
    assert!(mentor.seen().is_empty());
    // Fixes are still learned (the knowledge is the memory, not a prompt part).
    assert_eq!(m.knowledge().len(), 4);

    // Two online rounds: only `never` (still failing) runs again.
    let g = Scripted::new(memocoder_answer);
    let env2 = env(&g, &mentor, &sb, &gen, &eval);
    let two = StrategyConfig {
        rounds: 2,
        max_attempts: 2,
        planning: Planning::First,
        ..StrategyConfig::default()
    };
    let mut m = Repair::new(RepairConfig::memocoder(&two, &FixesConfig::default()));
    let sols = m.solve(&env2, &list, 1, &mut |_, _| {}).unwrap();
    let planner_calls = |f: &str| {
        g.seen()
            .iter()
            .filter(|p| p.contains(PLANNER) && which(p) == f)
            .count()
    };
    assert_eq!(planner_calls("never"), 2);
    assert_eq!(planner_calls("add"), 1);
    assert_eq!(sols[4][0].attempts.len(), 4);
    assert_eq!(sols[0][0].attempts, ["WrongAnswer", "pass"]);

    // Accumulate on `neg`, then solve `inc` alone: it retrieves neg's fix.
    let g = Scripted::new(memocoder_answer);
    let env3 = env(&g, &mentor, &sb, &gen, &eval);
    let first = StrategyConfig {
        planning: Planning::First,
        ..StrategyConfig::default()
    };
    let mut m = Repair::new(RepairConfig::memocoder(&first, &FixesConfig::default()));
    m.accumulate(&env3, &[&tasks[1]]).unwrap();
    assert_eq!(m.knowledge().len(), 1);
    m.solve(&env3, &[&tasks[2]], 1, &mut |_, _| {}).unwrap();
    let inc_repair = g
        .seen()
        .into_iter()
        .find(|p| p.contains("This solution was written earlier") && which(p) == "inc")
        .unwrap();
    assert!(inc_repair.contains("return -x"), "{inc_repair}");
}

/// The fallback planner's code writer: the plain (zero-shot) answer is
/// right only for `add`; the answer from plans only for `neg`; a repair
/// for `inc` and `dec`; nothing for `never`.
fn fallback_answer(p: &str) -> String {
    if p.contains(PLANNER) {
        return "Plan 1:\n1. First, read the statement.\n2. return the expression it names".into();
    }
    let f = which(p);
    let planned = p.contains("Plans for solving");
    let repair = p.contains("This solution was written earlier");
    let right = match f {
        "add" => !planned && !repair,
        "neg" => planned,
        "inc" | "dec" => repair,
        _ => false,
    };
    let body = match (f, right) {
        ("add", true) => "a + b",
        ("add", false) => "a - b",
        ("neg", true) => "-x",
        ("inc", true) => "x + 1",
        ("dec", true) => "x - 1",
        ("never", _) => "x * 2",
        _ => "x + one",
    };
    let args = if f == "add" { "a, b" } else { "x" };
    py(&format!("def {f}({args}):\n    return {body}\n"))
}

#[test]
fn fallback_planning_plans_only_after_a_failed_zero_shot_answer() {
    let sb = sandbox(62560);
    let gen = GenerationConfig::default();
    let eval = EvalConfig {
        batch_size: 1,
        ..EvalConfig::default()
    };
    let tasks = memocoder_tasks();
    let list: Vec<&Task> = tasks.iter().collect();
    let mentor = Scripted::new(|_: &str| MENTOR_ANSWER.to_owned());
    assert_eq!(StrategyConfig::default().planning, Planning::Fallback);

    let g = Scripted::new(fallback_answer);
    let env1 = env(&g, &mentor, &sb, &gen, &eval);
    let mut m = Repair::new(RepairConfig::memocoder(
        &StrategyConfig::default(),
        &FixesConfig::default(),
    ));
    let r = evaluate_strategy(&mut m, &env1, &list, &eval, &mut |_, _| {}).unwrap();
    let chains: Vec<Vec<String>> = r
        .tasks
        .iter()
        .map(|t| t.samples[0].attempts.clone())
        .collect();
    assert_eq!(chains[0], ["pass"]);
    assert_eq!(chains[1], ["NameError", "pass"]);
    assert_eq!(chains[2], ["NameError", "NameError", "pass"]);
    assert_eq!(chains[4], ["WrongAnswer", "WrongAnswer", "WrongAnswer"]);
    let seen = g.seen();
    // No plans for `add`, whose zero-shot answer passed; one plan each for the rest.
    let planned: Vec<&str> = seen
        .iter()
        .filter(|p| p.contains(PLANNER))
        .map(|p| which(p))
        .collect();
    assert_eq!(planned, ["neg", "inc", "dec", "never"]);
    let stats = &r.strategy_stats;
    assert_eq!(stats["planned"], 4.0);
    assert_eq!(stats["repairs_tried"], 3.0);
    // The answer written from plans that passed is a fix like a repair.
    assert_eq!(m.knowledge().len(), 3);
    assert!(m.knowledge().get(0).unwrap().fixed_code.contains("-x"));

    // The first prompts are self-repair's zero-shot prompts, word for word.
    let firsts: Vec<&String> = seen
        .iter()
        .filter(|p| {
            !p.contains(PLANNER)
                && !p.contains("Plans for solving")
                && !p.contains("This solution was written earlier")
        })
        .collect();
    assert_eq!(firsts.len(), 5);
    let zs = Scripted::new(fallback_answer);
    let never = Scripted::new(|p: &str| panic!("self-repair has no reflector: {p}"));
    let env_sr = env(&zs, &never, &sb, &gen, &eval);
    let mut sr = Repair::new(RepairConfig::self_repair(&StrategyConfig::default()));
    sr.solve(&env_sr, &list, 1, &mut |_, _| {}).unwrap();
    let sr_firsts: Vec<String> = zs
        .seen()
        .into_iter()
        .filter(|p| !p.contains("This solution was written earlier"))
        .collect();
    assert_eq!(firsts, sr_firsts.iter().collect::<Vec<_>>());
    // The answer from plans sees the plans and the guiding test only.
    let neg = seen
        .iter()
        .find(|p| p.contains("Plans for solving") && which(p) == "neg")
        .unwrap();
    assert!(neg.contains("2. return the expression it names"), "{neg}");
    assert!(neg.contains("assert neg(2) == -2") && !neg.contains("assert neg(0) == 0"));

    // A second round plans at once: its samples already failed a plain answer.
    let g = Scripted::new(fallback_answer);
    let env2 = env(&g, &mentor, &sb, &gen, &eval);
    let two = StrategyConfig {
        rounds: 2,
        max_attempts: 2,
        ..StrategyConfig::default()
    };
    let mut m = Repair::new(RepairConfig::memocoder(&two, &FixesConfig::default()));
    let sols = m.solve(&env2, &list, 1, &mut |_, _| {}).unwrap();
    let never_prompts: Vec<String> = g
        .seen()
        .into_iter()
        .filter(|p| which(p) == "never")
        .collect();
    let kinds: Vec<&str> = never_prompts
        .iter()
        .map(|p| {
            if p.contains(PLANNER) {
                "planner"
            } else if p.contains("Plans for solving") {
                "planned"
            } else if p.contains("This solution was written earlier") {
                "repair"
            } else {
                "plain"
            }
        })
        .collect();
    assert_eq!(
        kinds,
        ["plain", "planner", "planned", "planner", "planned", "repair"]
    );
    assert_eq!(sols[4][0].attempts.len(), 4);
}

#[test]
fn self_repair_starts_zero_shot_and_sees_only_the_guiding_test() {
    let sb = sandbox(62520);
    let g = Scripted::new(memocoder_answer);
    let never = Scripted::new(|p: &str| panic!("self-repair has no reflector: {p}"));
    let gen = GenerationConfig::default();
    let eval = EvalConfig {
        n: 2,
        k: vec![1, 2],
        temperature: 0.8,
        batch_size: 4,
        ..EvalConfig::default()
    };
    let env = env(&g, &never, &sb, &gen, &eval);
    let tasks = memocoder_tasks();
    let list: Vec<&Task> = tasks.iter().collect();
    let mut s = Repair::new(RepairConfig::self_repair(&StrategyConfig::default()));
    let r = evaluate_strategy(&mut s, &env, &list, &eval, &mut |_, _| {}).unwrap();
    assert_eq!(r.strategy, "self-repair");
    assert_eq!(r.tasks[0].samples.len(), 2);
    assert_eq!(r.tasks[1].samples[1].attempts, ["NameError", "pass"]);
    assert_eq!(r.tasks[4].passed, 0);
    let seen = g.seen();
    let firsts: Vec<&String> = seen
        .iter()
        .filter(|p| !p.contains("This solution was written earlier"))
        .collect();
    assert_eq!(firsts.len(), 10);
    assert!(
        firsts.iter().all(|p| !p.contains("assert")),
        "first attempts are zero-shot"
    );
    for p in seen
        .iter()
        .filter(|p| p.contains("This solution was written earlier"))
    {
        assert!(!p.contains("A past fix") && !p.contains("Fixing suggestions"));
        // The second (hidden) test of each task is never shown.
        for t in &tasks {
            assert!(!p.contains(&t.tests[1]), "{p}");
        }
    }
    assert!(!r.strategy_stats.contains_key("fixes_added"));
}

fn math_docs() -> Vec<ApiDoc> {
    let doc = |name: &str, sig: &str, desc: &str| ApiDoc {
        name: name.into(),
        signature: sig.into(),
        description: desc.into(),
        source: None,
    };
    vec![
        doc(
            "math.gcd",
            "gcd(a, b)",
            "Greatest common divisor of the integers a and b.",
        ),
        doc("math.sqrt", "sqrt(x)", "Square root of x as a float."),
        doc(
            "math.prod",
            "prod(xs)",
            "Product of the elements of an iterable.",
        ),
    ]
}

fn stream_tasks() -> Vec<Task> {
    vec![
        task(
            "gcd2",
            "Return the greatest common divisor of a and b.",
            "g2",
            &["assert g2(4, 6) == 2"],
        ),
        task(
            "gcd3",
            "Return the greatest common divisor of a, b and c.",
            "g3",
            &["assert g3(6, 9, 4) == 1", "assert g3(4, 6, 10) == 2"],
        ),
        task(
            "isqrt",
            "Return the square root of x rounded down to an integer.",
            "isq",
            &["assert isq(10) == 3"],
        ),
    ]
}

/// Writer: a right gcd2, a gcd3 that forgets c, a right isq.
fn stream_answer(p: &str) -> String {
    let req = p
        .split("## Requirement")
        .nth(1)
        .expect("a MEMCoder context");
    let code = if req.contains("a and b") {
        "import math\ndef g2(a, b):\n    return math.gcd(a, b)\n"
    } else if req.contains("a, b and c") {
        "import math\ndef g3(a, b, c):\n    return math.gcd(a, b)\n"
    } else {
        "import math\ndef isq(x):\n    return int(math.sqrt(x))\n"
    };
    py(code)
}

/// Reflector: one task guideline per task; for `math.gcd` ADD a new
/// guideline each time, for `math.sqrt` DISCARD.
fn stream_reflection(p: &str) -> String {
    if p.contains("record a reusable lesson") {
        return "GUIDELINE: chain gcd calls for more than two numbers".into();
    }
    if p.contains("API `math.gcd`") {
        let n = p.matches("(weight").count();
        return format!("GUIDELINE: gcd lesson {}\nACTION: ADD", n + 1);
    }
    assert!(p.contains("API `math.sqrt`"), "{p}");
    "GUIDELINE: sqrt returns a float\nACTION: DISCARD".into()
}

fn doc_strategy(mode: DocMode) -> DocStrategy {
    DocStrategy::new(
        mode,
        DocSizes {
            k_doc: 1,
            k_task: 1,
        },
        math_docs(),
        MemCoderParams::default(),
        Box::new(HashEmbedder::new(256).unwrap()),
    )
    .unwrap()
}

#[test]
fn memcoder_stream_retrieves_injects_and_evolves_at_each_step() {
    let sb = sandbox(62530);
    let g = Scripted::new(stream_answer);
    let refl = Scripted::new(stream_reflection);
    let gen = GenerationConfig::default();
    let eval = EvalConfig::default();
    let env = env(&g, &refl, &sb, &gen, &eval);
    let mut s = doc_strategy(DocMode::Memcoder {
        task_memory: true,
        api_memory: true,
    });
    let tasks = stream_tasks();
    let list: Vec<&Task> = tasks.iter().collect();
    let r = evaluate_strategy(&mut s, &env, &list, &eval, &mut |_, _| {}).unwrap();
    let passed: Vec<bool> = r.tasks.iter().map(|t| t.samples[0].passed).collect();
    assert_eq!(passed, [true, false, true]);
    assert_eq!(r.strategy, "memcoder");

    let log = &s.log;
    // Step 1: empty memory; the doc hit is gcd; nothing injected; gcd gets guideline 1.
    assert_eq!(log[0].candidate_apis, ["math.gcd"]);
    assert!(log[0].similar.is_empty() && log[0].injected_guidelines.is_empty());
    assert_eq!(log[0].added_guidelines, [("math.gcd".to_string(), 1)]);
    assert!(log[0].reweighted.is_empty());
    // Step 2: task 1 retrieved with its code and task guideline; gcd's
    // guideline 1 injected; the failure lowers its weight; guideline 2 added.
    assert_eq!(log[1].similar, [tasks[0].prompt.clone()]);
    assert_eq!(log[1].injected_guidelines, [1]);
    let p = &log[1].prompt;
    assert!(
        p.contains("return math.gcd(a, b)") && p.contains("Guideline: chain gcd calls"),
        "{p}"
    );
    assert!(p.contains("- gcd lesson 1"), "{p}");
    assert_eq!(log[1].reweighted, [1]);
    assert_eq!(log[1].added_guidelines, [("math.gcd".to_string(), 2)]);
    let gcd = s.memory().api("math.gcd").unwrap();
    let w = |id: u64| gcd.guidelines.iter().find(|g| g.id == id).unwrap().weight;
    assert!(
        w(1) < w(2),
        "the failure lowered guideline 1 below the new one"
    );
    // Step 3: the sqrt doc hit plus gcd from the similar task's APIs; gcd's
    // guidelines injected best weight first; success raises both; sqrt's
    // candidate is discarded.
    assert_eq!(log[2].candidate_apis[0], "math.sqrt");
    assert!(log[2].candidate_apis.contains(&"math.gcd".to_string()));
    assert_eq!(log[2].injected_guidelines, [2, 1]);
    assert_eq!(log[2].reweighted, [1, 2]);
    assert!(log[2].added_guidelines.is_empty());
    let st = s.memory().stats();
    assert_eq!((st.added, st.discarded, st.task_guidelines), (2, 1, 3));
    assert_eq!(s.memory().tasks().len(), 3);
    // One task prompt per task, one API prompt per used API.
    assert_eq!(refl.seen().len(), 3 + 3);
    // Each task's first sample carries the reflector's answers and what
    // became of them, so a refused answer can be read in the results.
    let fate = |t: usize| -> Vec<(&str, &str)> {
        r.tasks[t].samples[0]
            .reflections
            .iter()
            .map(|x| (x.target.as_str(), x.result.as_str()))
            .collect()
    };
    assert_eq!(fate(0), [("task", "guideline"), ("math.gcd", "add #1")]);
    assert_eq!(fate(1), [("task", "guideline"), ("math.gcd", "add #2")]);
    assert_eq!(fate(2), [("task", "guideline"), ("math.sqrt", "discard")]);
    assert!(r.tasks[2].samples[0].reflections[1]
        .answer
        .contains("ACTION: DISCARD"));
    assert!(r
        .tasks
        .iter()
        .all(|t| t.samples[1..].iter().all(|s| s.reflections.is_empty())));
    let line = serde_json::to_string(&r.tasks[0]).unwrap();
    assert!(line.contains("\"reflections\""), "{line}");
}

/// A trainer checkpoints MEMCoder (and Accum) between steps: a strategy
/// restored from the state after two tasks solves the third exactly as the
/// one that never stopped (same similar task, same injected guidelines,
/// same prompt, same evolution).
#[test]
fn memcoder_and_accum_state_round_trips() {
    let sb = sandbox(62550);
    let gen = GenerationConfig::default();
    let eval = EvalConfig::default();
    let tasks = stream_tasks();
    let list: Vec<&Task> = tasks.iter().collect();
    for mode in [
        DocMode::Memcoder {
            task_memory: true,
            api_memory: true,
        },
        DocMode::Accum { capacity: 1 },
    ] {
        let g = Scripted::new(stream_answer);
        let refl = Scripted::new(stream_reflection);
        let env = env(&g, &refl, &sb, &gen, &eval);
        let mut straight = doc_strategy(mode);
        straight.solve(&env, &list[..2], 1, &mut |_, _| {}).unwrap();
        let state = straight
            .save_state()
            .unwrap()
            .expect("MEMCoder keeps state");
        // Through text, as the checkpoint file holds it.
        let state: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
        let mut restored = doc_strategy(mode);
        restored.load_state(state).unwrap();
        straight.solve(&env, &list[2..], 1, &mut |_, _| {}).unwrap();
        restored.solve(&env, &list[2..], 1, &mut |_, _| {}).unwrap();
        let (a, b) = (&straight.log[2], &restored.log[0]);
        assert!(
            !a.similar.is_empty(),
            "{mode:?}: the third task sees a past one"
        );
        assert_eq!(a, b, "{mode:?}");
        assert_eq!(
            straight.save_state().unwrap(),
            restored.save_state().unwrap(),
            "{mode:?}"
        );
    }
    // Doc-RAG learns nothing, and a state from other docs is refused.
    assert_eq!(doc_strategy(DocMode::Rag).save_state().unwrap(), None);
    let mut other = doc_strategy(DocMode::Memcoder {
        task_memory: true,
        api_memory: true,
    });
    let mut state = other.save_state().unwrap().unwrap();
    state["memory"]["apis"] = serde_json::json!({});
    let err = other.load_state(state).unwrap_err().to_string();
    assert!(err.contains("other API docs"), "{err}");
}

#[test]
fn doc_rag_accum_and_memcoder_ablations_show_only_their_memory() {
    let sb = sandbox(62540);
    let gen = GenerationConfig::default();
    let eval = EvalConfig::default();
    let tasks = stream_tasks();
    let list: Vec<&Task> = tasks.iter().collect();
    let run = |mode: DocMode| {
        let g = Scripted::new(stream_answer);
        let refl = Scripted::new(stream_reflection);
        let env = env(&g, &refl, &sb, &gen, &eval);
        let mut s = doc_strategy(mode);
        s.solve(&env, &list, 1, &mut |_, _| {}).unwrap();
        (g.seen(), refl.seen(), s.name())
    };

    let (prompts, refl, name) = run(DocMode::Rag);
    assert_eq!(name, "doc-rag");
    assert!(refl.is_empty());
    assert!(prompts[0].contains("Signature: gcd(a, b)"));
    assert!(prompts
        .iter()
        .all(|p| !p.contains("Similar past tasks") && !p.contains("Usage guidelines")));

    let (prompts, refl, name) = run(DocMode::Accum { capacity: 1 });
    assert_eq!(name, "memcoder-accum");
    assert!(refl.is_empty(), "Accum has no reflector");
    // Capacity 1: the third task sees only the second's raw trajectory.
    assert!(prompts[2].contains("return math.gcd(a, b)\n") && prompts[2].contains("def g3"));
    assert!(!prompts[2].contains("def g2"));
    assert!(prompts
        .iter()
        .all(|p| !p.contains("Guideline:") && !p.contains("Usage guidelines")));

    let (prompts, refl, name) = run(DocMode::Memcoder {
        task_memory: false,
        api_memory: true,
    });
    assert_eq!(name, "memcoder-no-task-memory");
    assert!(prompts.iter().all(|p| !p.contains("Similar past tasks")));
    assert!(prompts[1].contains("- gcd lesson 1"));
    assert!(refl.iter().all(|p| !p.contains("record a reusable lesson")));

    let (prompts, refl, name) = run(DocMode::Memcoder {
        task_memory: true,
        api_memory: false,
    });
    assert_eq!(name, "memcoder-no-api-memory");
    assert!(prompts[1].contains("Similar past tasks"));
    assert!(prompts
        .iter()
        .all(|p| !p.contains("Usage guidelines") && !p.contains("Example of successful use")));
    assert!(refl.iter().all(|p| p.contains("record a reusable lesson")));
}

#[test]
fn single_program_tests_are_never_shown_the_prompt_example_guides_instead() {
    use falcon_rl::rollout::strategy::guiding_tests;
    let sb = sandbox(62550);
    let check = "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(5) == 6\n\ncheck(inc)\n";
    let mut he = task(
        "he/0",
        "def inc(x):\n    \"\"\"\n    >>> inc(1)\n    2\n    \"\"\"\n",
        "inc",
        &[check],
    );
    he.canonical_solution = Some(format!("{}    return x + 1\n", he.prompt));
    // The docstring's example is wrong: the reference fails it, so it is not used.
    let mut wrong = he.clone();
    wrong.prompt = wrong.prompt.replace("    2\n", "    3\n");
    let mbpp = task(
        "mbpp/1",
        "Write inc(x).",
        "inc",
        &["assert inc(1) == 2", "assert inc(2) == 3"],
    );
    let g = guiding_tests(&sb, &[&he, &wrong, &mbpp]);
    assert_eq!(g[0].tests, ["assert (inc(1)) == (2)"]);
    assert_eq!(g[1].tests, ["assert callable(inc)"]);
    assert_eq!(g[2].tests, ["assert inc(1) == 2"]);

    // No MemoCoder prompt (planner, code writer, repair) shows the scored
    // program: the planner and the first attempt once did.
    let gen_ = Scripted::new(|p: &str| {
        if p.contains(PLANNER) {
            "Plan 1:\n1. First, add one to x.".to_owned()
        } else {
            "```python\ndef inc(x):\n    return x + one\n```".to_owned()
        }
    });
    let mentor = Scripted::new(|_: &str| MENTOR_ANSWER.to_owned());
    let gen = GenerationConfig::default();
    let eval = EvalConfig {
        batch_size: 1,
        ..EvalConfig::default()
    };
    let env = env(&gen_, &mentor, &sb, &gen, &eval);
    let cfg = StrategyConfig {
        max_attempts: 2,
        planning: Planning::First,
        ..StrategyConfig::default()
    };
    let mut m = Repair::new(RepairConfig::memocoder(&cfg, &FixesConfig::default()));
    evaluate_strategy(&mut m, &env, &[&he], &eval, &mut |_, _| {}).unwrap();
    let seen = gen_.seen();
    assert!(seen.iter().any(|p| p.contains(PLANNER)));
    assert!(seen
        .iter()
        .any(|p| p.contains("This solution was written earlier")));
    for p in &seen {
        assert!(
            !p.contains("candidate(5)") && !p.contains("def check"),
            "{p}"
        );
        if !p.contains(PLANNER) && !p.contains("This solution was written earlier") {
            assert!(
                p.contains("assert (inc(1)) == (2)"),
                "the first attempt sees the guide: {p}"
            );
        }
    }
}

#[test]
fn numba_cuda_scores_say_they_come_from_the_simulator() {
    use falcon_rl::config::{CudaMode, TaskFormat};
    use falcon_rl::rollout::strategy::Prompted;
    use falcon_rl::task::{LoadOptions, TaskSet};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let set = TaskSet::load(
        &root.join("data/numba_cuda_tasks.jsonl"),
        TaskFormat::Jsonl,
        LoadOptions::default(),
    )
    .unwrap();
    let t = &set.tasks[0];
    let sb = Sandbox::new(&ExecConfig {
        cuda: CudaMode::Sim,
        python: root.join(".venv/bin/python").display().to_string(),
        uid_base: 62570,
        timeout_s: 30.0,
        ..ExecConfig::default()
    })
    .unwrap();
    let answer = py(t.canonical_solution.as_deref().unwrap());
    let g = Scripted::new(move |_: &str| answer.clone());
    let gen = GenerationConfig::default();
    let eval = EvalConfig::default();
    let env = env(&g, &g, &sb, &gen, &eval);
    let r = evaluate_strategy(
        &mut Prompted::zero_shot(),
        &env,
        &[t],
        &eval,
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(r.cuda.as_deref(), Some("simulator"));
    assert_eq!(r.tasks[0].passed, 1);
    let plain = memocoder_tasks();
    let g = Scripted::new(memocoder_answer);
    let env = crate::strategies::env(&g, &g, &sb, &gen, &eval);
    let r = evaluate_strategy(
        &mut Prompted::zero_shot(),
        &env,
        &[&plain[0]],
        &eval,
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(r.cuda, None);
}

/// `falcon eval --config` with `[strategy]`: the CLI wires each kind to its
/// strategy, writes the result and one line per task, and refuses a
/// documentation strategy without docs (exit 2, naming the key).
#[test]
fn falcon_eval_runs_a_strategy_from_the_config() {
    let dir = crate::common::tmpdir();
    crate::train::setup(dir.path());
    let cfg_path = dir.path().join("eval.toml");
    let write = |kind: falcon_rl::config::StrategyKind| {
        let mut cfg = crate::train::config(dir.path(), 1, 62590);
        cfg.strategy.kind = kind;
        cfg.strategy.max_attempts = 2;
        cfg.eval.n = 2;
        cfg.eval.k = vec![1, 2];
        cfg.eval.temperature = 0.8;
        std::fs::write(&cfg_path, toml::to_string(&cfg).unwrap()).unwrap();
    };
    let falcon = |out: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_falcon"))
            .args(["eval", "--config", cfg_path.to_str().unwrap(), "--out"])
            .arg(out)
            .output()
            .unwrap()
    };
    write(falcon_rl::config::StrategyKind::SelfRepair);
    let out = dir.path().join("r.json");
    let o = falcon(&out);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("strategy self-repair on 3 tasks x 2 samples"),
        "{err}"
    );
    let r = falcon_rl::eval::EvalResult::load(&out).unwrap();
    assert_eq!(r.strategy, "self-repair");
    assert_eq!(r.tasks.len(), 3);
    assert!(r
        .tasks
        .iter()
        .flat_map(|t| &t.samples)
        .all(|s| (1..=2).contains(&s.attempts.len())));
    assert!(r.strategy_stats["attempts"] >= 6.0);
    let lines = std::fs::read_to_string(dir.path().join("r.tasks.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 3);

    // Two tasks at a time: the groups are kept until the result is written.
    let mut cfg: falcon_rl::config::RunConfig =
        toml::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg.eval.checkpoint_tasks = 2;
    std::fs::write(&cfg_path, toml::to_string(&cfg).unwrap()).unwrap();
    let o = falcon(&dir.path().join("g.json"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let g = falcon_rl::eval::EvalResult::load(&dir.path().join("g.json")).unwrap();
    assert_eq!(g.tasks.len(), 3);
    assert!(!dir.path().join("g.partial").exists());
    // A partial evaluation left by something else is refused, and kept.
    std::fs::create_dir(dir.path().join("s.partial")).unwrap();
    let stale = dir.path().join("s.partial/manifest.json");
    std::fs::write(&stale, r#"{"made_with": {}, "group_tasks": 2, "tasks": 3}"#).unwrap();
    let o = falcon(&dir.path().join("s.json"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.code() == Some(2) && err.contains("--resume"),
        "without --resume it is not touched: {err}"
    );
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_falcon"))
        .args([
            "eval",
            "--config",
            cfg_path.to_str().unwrap(),
            "--resume",
            "--out",
        ])
        .arg(dir.path().join("s.json"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("another config"),
        "{err}"
    );
    assert!(stale.is_file());

    write(falcon_rl::config::StrategyKind::Memcoder);
    let o = falcon(&dir.path().join("m.json"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("[memory] api_docs"), "{err}");
}
