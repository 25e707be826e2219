#!/usr/bin/env python3
"""The learning benchmark of FALCON's meta-RL: does FALCON learn?

Five arms at the same wall-clock training budget and seeds, on the held-out split of the
bundled easy Python tasks, with SmolLM2-135M-Instruct on the CPU:
  a  the SFT checkpoint (the start of every other arm)
  b  single-level policy gradient, unit-test reward only
  c  full FALCON: meta-RL + every reward + both memories
  d  FALCON without long-term memory
  e  FALCON without the meta-loop (inner_steps = 0: same memories and rewards)
  f  (opt-in: --arms f) FALCON with zero-shot prompts: long-term memory kept for the
     demonstrations, no Table 7 prompt
  g  (opt-in: --arms g) c with `[memory] render = "brief"` (no foreign code in the Table 7
     prompt); a-f are pinned to render = "full", the rendering they were run with
Held-out pass@1 / pass@5 (n samples per task, unbiased estimator), McNemar's exact test
(first sample per task) and the sign test (each task's share of passing samples) between c
and each other arm, per-step training curves and held-out pass@1 at --evals points of each
trained arm's budget. --extra FILE also evaluates every arm's final weights on a second
held-out set (e.g. data/easy_python_heldout2.jsonl, 100 tasks) and on both sets joined.
Arms that finished are not rerun, and an interrupted arm resumes from its last checkpoint
with what is left of its budget, so a long run can span sessions; results go to
runs/bench-learning/. Each finished arm's summary, final evaluation and config are also kept
in results/<name of --out>/, which is committed: an arm kept there is not rerun, and other
arms are compared with it.
The tables go to summary.md (--versus c) or summary-vs-ARM.md (any other --versus).

    scripts/bench/run learning [--minutes 60] [--steps 0] [--n 10] [--arms abcde] [--algorithm fomaml]
                               [--lr 1e-4] [--evals 4] [--versus c] [--out runs/bench-learning] [--extra FILE]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

from benchcfg import LEARNING_HELDOUT, copy_atomic, learning_config, learning_extra_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "runs", "bench-learning")
SFT = os.path.join(ROOT, "runs", "demo-sft", "step-20")
# Finished arms are also kept here, committed: runs/ is git-ignored and does not
# outlive the machine, and McNemar against an arm needs its per-task results.
RESULTS = os.path.join(ROOT, "results")

# The fine-grained loss's weight. At 1.0 it is unbounded below and collapsed an arm to
# pass@1 0 within 10 steps (docs/results/train.md, "What we measured"); 0.1 keeps it a nudge.
FINE = 0.1

ARMS = {
    "a": ("initial (SFT)", None),
    "b": ("PG, unit tests only", dict(meta="off", rewards="tests", fine=0.0, sl=0.0, long_term=True, inner=1)),
    "c": ("FALCON", dict(meta=None, rewards="all", fine=FINE, sl=0.1, long_term=True, inner=1)),
    "d": ("FALCON without long-term memory", dict(meta=None, rewards="all", fine=FINE, sl=0.1, long_term=False, inner=1)),
    "e": ("FALCON without the meta-loop", dict(meta="fomaml", rewards="all", fine=FINE, sl=0.1, long_term=True, inner=0)),
    # Not in the list, so not run by default: c with zero-shot prompts. Long-term
    # memory still records and supplies demonstrations; the Table 7 prompt is what a 135M
    # model copies from (docs/results/train.md).
    "f": ("FALCON, zero-shot prompts", dict(meta=None, rewards="all", fine=FINE, sl=0.1, long_term=True, inner=1,
                                            prompt="zero-shot")),
    # c with the memory rendering that won on HumanEval (docs/results/eval.md, "Memory at 135M"):
    # past tasks as statement, outcome and first error, no foreign code. c-f keep the
    # papers' full rendering they were run with.
    "g": ("FALCON, brief memory rendering", dict(meta=None, rewards="all", fine=FINE, sl=0.1, long_term=True, inner=1,
                                                 render="brief")),
}


# Training steps per minute of each arm on 2 CPU cores (the 15-minute runs of
# docs/results/train.md), only to space the held-out evaluations of --evals over the budget.
STEPS_PER_MINUTE = {"b": 2.4, "c": 0.6, "d": 0.93, "e": 1.13, "f": 0.6, "g": 0.6}


def eval_every(arm, a):
    """Steps between held-out evaluations during training (0: only the final one)."""
    if a.evals <= 1:
        return 0
    steps = a.steps or a.minutes * STEPS_PER_MINUTE.get(arm, 1.0)
    return max(1, round(steps / a.evals))


def config(arm, a, spec):
    return learning_config(arm, a, spec, OUT, SFT, eval_every(arm, a) if spec else 0)


def falcon(*args, **kw):
    return subprocess.run([os.environ["FALCON_BIN"], *args], check=True, **kw)


def kept_dir():
    """results/<name of --out>/: where finished arms are kept."""
    return os.path.join(RESULTS, os.path.basename(OUT))


def result_of(arm):
    """A finished arm: from this run's directory, else from the kept results."""
    done = os.path.join(OUT, f"bench-learning-{arm}", "done.json")
    if os.path.exists(done):
        return json.load(open(done))
    kept = os.path.join(kept_dir(), f"{arm}.json")
    if not os.path.exists(kept):
        return None
    r = json.load(open(kept))
    r["eval"] = os.path.join(kept_dir(), r["eval"])
    print(f"arm {arm}: kept result {os.path.relpath(kept, ROOT)} (not rerun)", file=sys.stderr)
    return r


def keep(done, config_text):
    """Copies a finished arm's summary, final evaluation and config to kept_dir()."""
    d = kept_dir()
    os.makedirs(d, exist_ok=True)
    arm = done["arm"]
    shutil.copyfile(done["eval"], os.path.join(d, f"{arm}-eval.json"))
    with open(os.path.join(d, f"{arm}.toml"), "w") as f:
        f.write(config_text)
    tmp = os.path.join(d, f".{arm}.json.tmp")
    with open(tmp, "w") as f:
        json.dump({**done, "eval": f"{arm}-eval.json"}, f, indent=1)
    os.replace(tmp, os.path.join(d, f"{arm}.json"))


def run_arm(arm, a):
    label, spec = ARMS[arm]
    d = os.path.join(OUT, f"bench-learning-{arm}")
    os.makedirs(d, exist_ok=True)
    cpath = os.path.join(d, "bench.toml")
    text = config(arm, a, spec)
    with open(cpath, "w") as f:
        f.write(text)
    t0 = time.time()
    if spec is None:
        out = os.path.join(d, "eval.json")
        falcon("eval", "--config", cpath, "--checkpoint", SFT, "--out", out, "--overwrite")
        steps, curve = 0, []
    else:
        # An arm killed part-way resumes from its last checkpoint (one killed
        # before its first starts over); the budget ([train] max_minutes)
        # counts over resumes, so it still gets no more.
        falcon("train", "--config", cpath, "--resume")
        metrics = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
        steps = len(metrics)
        curve = [round(m["pass_rate"], 3) for m in metrics]
        out = os.path.join(d, "eval", f"step-{steps}.json")
    res = json.load(open(out))
    done = {"arm": arm, "label": label, "steps": steps, "wall_s": time.time() - t0, "eval": out,
            "pass_at": res["pass_at"], "exec_at": res["exec_at"], "train_pass_rate": curve,
            "heldout_pass1": heldout_curve(d) if spec else []}
    with open(os.path.join(d, "done.json"), "w") as f:
        json.dump(done, f)
    keep(done, text)
    return done


def heldout_curve(d):
    """[(step, held-out pass@1)] from the arm's eval/step-N.json files."""
    points = []
    for n in os.listdir(os.path.join(d, "eval")):
        m = re.fullmatch(r"step-(\d+)\.json", n)
        if m:
            points.append((int(m.group(1)), json.load(open(os.path.join(d, "eval", n)))["pass_at"]["1"]))
    return sorted(points)


def compare(x, y):
    """`falcon eval compare x y` as two cells: McNemar on the first sample per task, and
    the sign test on each task's share of passing samples ("only/higher in x / in y, p")."""
    out = falcon("eval", "compare", x, y, capture_output=True, text=True).stdout
    cells = []
    for pat in (r"only by A (\d+), only by B (\d+), exact p = ([0-9.]+)",
                r"higher in A (\d+), higher in B (\d+), exact p = ([0-9.]+)"):
        m = re.search(pat, out)
        cells.append(f"{m.group(1)} / {m.group(2)}, p = {float(m.group(3)):.3f}" if m else "?")
    return cells


def final_weights(arm, r):
    """The weights an arm ended with: the SFT start for a, else its last checkpoint under
    OUT, which must be the step its result was taken at (None when this machine lacks it)."""
    if ARMS[arm][1] is None:
        return SFT
    ck = os.path.join(OUT, f"bench-learning-{arm}", f"step-{r['steps']}")
    return ck if os.path.isdir(ck) else None


def extra_eval(arm, r, path):
    """The arm's final weights evaluated on every task of the file `path` (a second
    held-out set), kept as <arm>-<stem>.json; None when the weights are not here."""
    stem = os.path.splitext(os.path.basename(path))[0]
    kept = os.path.join(kept_dir(), f"{arm}-{stem}.json")
    if os.path.exists(kept):
        return kept
    weights = final_weights(arm, r)
    if weights is None:
        print(f"arm {arm}: its final checkpoint is not on this machine; not evaluated on {path}",
              file=sys.stderr)
        return None
    run = os.path.join(OUT, f"bench-learning-{arm}")
    src = os.path.join(run, "bench.toml")
    text = open(src if os.path.exists(src) else os.path.join(kept_dir(), f"{arm}.toml")).read()
    # Not in the run directory itself: `falcon report RUN` would draw it among the arm's
    # own held-out evaluations.
    d = os.path.join(run, "extra")
    text = learning_extra_config(text, path)
    if text is None:
        sys.exit(f"arm {arm}: its config has no {LEARNING_HELDOUT!r} to point at {path}")
    os.makedirs(d, exist_ok=True)
    cpath = os.path.join(d, f"{stem}.toml")
    with open(cpath, "w") as f:
        f.write(text)
    out = os.path.join(d, f"{stem}.json")
    print(f"arm {arm}: {weights} on {path}", file=sys.stderr)
    falcon("eval", "--config", cpath, "--checkpoint", weights, "--out", out, "--overwrite")
    os.makedirs(kept_dir(), exist_ok=True)
    copy_atomic(out, kept)
    return kept


def merge(paths, out):
    """One result file over the union of the tasks of `paths` (pass@k and exec@k are means
    over tasks, so they are re-weighted by task count), for `falcon eval compare`."""
    rs = [json.load(open(p)) for p in paths]
    tasks = [t for r in rs for t in r["tasks"]]
    assert len({t["id"] for t in tasks}) == len(tasks), f"task ids overlap in {paths}"
    mean = lambda key, k: sum(r[key][k] * len(r["tasks"]) for r in rs) / len(tasks)
    outcomes = {}
    for r in rs:
        for kind, c in r["outcomes"].items():
            outcomes[kind] = outcomes.get(kind, 0) + c
    m = {**rs[0], "tasks": tasks, "outcomes": outcomes, "seconds": sum(r["seconds"] for r in rs),
         "pass_at": {k: mean("pass_at", k) for k in rs[0]["pass_at"]},
         "exec_at": {k: mean("exec_at", k) for k in rs[0]["exec_at"]}}
    with open(out, "w") as f:
        json.dump(m, f)


def table(title, v, evals, steps):
    """Markdown rows of final pass@k per arm, each compared with arm v."""
    lines = [title, "", f"| arm | | steps | pass@1 | pass@5 | exec@1 | vs {v}: only {v} / only arm, McNemar p "
             f"| vs {v}: higher in {v} / in arm, sign test p |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm, path in evals.items():
        r = json.load(open(path))
        cells = compare(evals[v], path) if arm != v and v in evals else ["", ""]
        # The label of ARMS, not the one an arm was kept with, so renames reach kept arms.
        lines.append(f"| {arm} | {ARMS[arm][0]} | {steps[arm]} | {r['pass_at']['1']:.3f} | "
                     f"{r['pass_at']['5']:.3f} | {r['exec_at']['1']:.3f} | {cells[0]} | {cells[1]} |")
    return lines


def main():
    global OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=60.0, help="training budget per arm (0: none)")
    ap.add_argument("--steps", type=int, default=0,
                    help="train every arm for exactly this many steps (with --minutes 0: a step-matched "
                         "comparison that other work on the machine does not distort)")
    ap.add_argument("--n", type=int, default=10, help="held-out samples per task")
    ap.add_argument("--arms", default="abcde")
    ap.add_argument("--algorithm", default="fomaml", choices=["maml", "fomaml", "reptile"])
    ap.add_argument("--inner-lr", type=float, default=1.0)
    # 5e-4 (the default before the 60-minute run) collapsed the single-level arm to
    # gibberish after ~110 steps; 1e-4 drifted far less in 15 minutes (docs/results/train.md).
    ap.add_argument("--lr", type=float, default=1e-4, help="[train] lr (the outer rate β in meta arms)")
    ap.add_argument("--evals", type=int, default=4,
                    help="held-out evaluations per trained arm, spread over its budget (the last at the end)")
    ap.add_argument("--out", default=OUT, help="results directory (finished arms there are not rerun)")
    ap.add_argument("--versus", default="c", help="the arm every other arm is compared with (McNemar)")
    ap.add_argument("--extra", help="a second held-out task file: every arm's final weights are also "
                    "evaluated on all its tasks (kept as <arm>-<stem>.json), alone and joined with the first set")
    a = ap.parse_args()
    OUT = os.path.abspath(a.out)
    if a.n < 5:
        sys.exit("--n must be >= 5 (pass@5)")
    if a.steps <= 0 and a.minutes <= 0:
        sys.exit("give a budget: --minutes > 0 or --steps > 0")
    if not os.path.isdir(SFT):
        print("SFT stage first: falcon sft --config configs/demo-sft.toml --resume", file=sys.stderr)
        falcon("sft", "--config", os.path.join(ROOT, "configs", "demo-sft.toml"), "--resume")
    v = a.versus
    results = {}
    for arm in a.arms:
        results[arm] = result_of(arm)
        if results[arm] is None:
            budget = f"{a.steps} steps" if a.steps else f"{a.minutes} min budget"
            print(f"arm {arm}: {ARMS[arm][0]} ({budget})", file=sys.stderr)
            results[arm] = run_arm(arm, a)
    steps = {arm: r["steps"] for arm, r in results.items()}
    lines = table(f"Held-out easy Python tasks (20), n = {a.n} samples per task at T = 0.8, "
                  f"training budget {f'{a.steps} steps' if a.steps else ''}{' or ' if a.steps and a.minutes else ''}"
                  f"{f'{a.minutes} min' if a.minutes else ''} per arm on this machine, lr {a.lr}, meta = {a.algorithm}",
                  v, {arm: r["eval"] for arm, r in results.items()}, steps)
    if a.extra:
        extra = {arm: extra_eval(arm, r, a.extra) for arm, r in results.items()}
        extra = {arm: p for arm, p in extra.items() if p}
        n2 = len(json.load(open(next(iter(extra.values()))))["tasks"]) if extra else 0
        lines += [""] + table(f"Second held-out set ({os.path.relpath(os.path.abspath(a.extra), ROOT)}, {n2} tasks "
                              f"never trained on), the same final weights", v, extra, steps)
        both_dir = os.path.join(OUT, "evals-both")
        os.makedirs(both_dir, exist_ok=True)
        both = {}
        for arm, p in extra.items():
            both[arm] = os.path.join(both_dir, f"{arm}.json")
            merge([results[arm]["eval"], p], both[arm])
        if both:
            lines += [""] + table(f"Both held-out sets ({20 + n2} tasks)", v, both, steps)
    lines += ["", "Training pass rate per step (samples generated that step):"]
    for arm, r in results.items():
        if r["train_pass_rate"]:
            lines.append(f"- {arm}: {' '.join(f'{x:.2f}' for x in r['train_pass_rate'])}")
    lines += ["", "Held-out pass@1 during training (step: pass@1):"]
    for arm, r in results.items():
        if r.get("heldout_pass1"):
            lines.append(f"- {arm}: {', '.join(f'{s}: {p:.3f}' for s, p in r['heldout_pass1'])}")
    text = "\n".join(lines)
    print(text)
    # One summary per reference arm, so a table against the SFT start does not replace c's.
    name = "summary.md" if v == "c" else f"summary-vs-{v}.md"
    for d in (OUT, kept_dir()):
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "w") as f:
            f.write(text + "\n")
    # Plots: held-out pass@k bars of every arm side by side (from copies of their final
    # evaluations, named by arm), and each trained arm's own curves.
    evals = os.path.join(OUT, "evals")
    os.makedirs(evals, exist_ok=True)
    for arm, r in results.items():
        shutil.copyfile(r["eval"], os.path.join(evals, f"{arm}-{re.sub(r'[^A-Za-z0-9]+', '-', ARMS[arm][0]).strip('-')}.json"))
    falcon("report", evals, "--out", os.path.join(OUT, "report"))
    for arm, r in results.items():
        # A kept arm from an earlier machine has no run directory to draw.
        if r["steps"] and os.path.isdir(os.path.join(OUT, f"bench-learning-{arm}")):
            falcon("report", os.path.join(OUT, f"bench-learning-{arm}"))
    print(f"plots: {os.path.join(OUT, 'report', 'index.html')} and "
          f"{os.path.join(OUT, 'bench-learning-*', 'report', 'index.html')}")


if __name__ == "__main__":
    main()
