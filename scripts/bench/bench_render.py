"""Memory renderings and structured answers at SmolLM2-135M (issue 42).

Greedy, one sample per task, 256 new tokens, the code block's end as the
stop and cut-off answers trimmed to their complete statements (docs/eval.md).
Arms (`NAME bench strategy render tasks`):

  he-zs            HumanEval  zero-shot
  he-falcon-full   HumanEval  FALCON Table 7, the papers' rendering
  he-falcon-brief  HumanEval  FALCON Table 7, no foreign code
  he-falcon-renamed HumanEval FALCON Table 7, foreign functions renamed
  he-memo-brief    HumanEval  MemoCoder, fixes shown as changed lines (first 80)
  he-sr            HumanEval  self-repair (first 80)
  mbpp-zs, mbpp-falcon-brief  MBPP (sanitized, first 100): zero-shot, FALCON brief
  he-memo-full     HumanEval  MemoCoder with the papers' fix rendering (first 80)
  he-memo-noplan   HumanEval  MemoCoder `brief` without its planner (first 80)
  he-sr-all, he-memo-fallback  HumanEval (164): self-repair; MemoCoder `brief`
                   with the planner as a fallback (the default since it was measured)
  mbpp-sr, mbpp-memo-fallback, mbpp-memo  MBPP (first 100): self-repair;
                   MemoCoder `brief`, planner as a fallback and first (the paper's order)
  nd-docrag        NdonnxEval doc-RAG (first 50 tasks, as a stream)
  nd-memcoder      NdonnxEval MEMCoder (same tasks)
  nd-memcoder-brief  NdonnxEval MEMCoder, past tasks and snippets `brief`

FALCON prompting retrieves from the long-term memory of `--falcon-memory`
(a run directory). By default that is the memory the committed rows used,
imported from results/bench-render/falcon-memory-c8.jsonl.gz: 236 entries
of an 8-step FOMAML run of bench-learning's arm c config from the base
model (results/bench-render/falcon-memory-c8.toml; `falcon train --config`
it to make a new one).

MemoCoder arms pin `[strategy] planning`: "first" for `memocoder` (the
order the first rows ran with), "off" for `-noplan`, "fallback" for
`-fallback`, so that a changed default never changes a kept arm.

Each arm is one `falcon eval` in groups of 20 tasks: killed, it continues
where it stopped when rerun. Finished arms are kept in results/bench-render/
and are not rerun. `--table` prints pass@1, exec@1, McNemar on tasks against
zero-shot (doc-RAG on NdonnxEval) and against the old n = 10 rows of
results/bench-strategies (their first samples), and the per-cause counts:
NameErrors whose answer never defines the task's function, SyntaxErrors cut
off at the token limit, and what each strategy's memory did.

  scripts/bench/run render [--only he-zs,...] [--falcon-memory RUN_DIR] [--table]
"""
import argparse
import collections
import gzip
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_strategies as bs  # noqa: E402
from benchcfg import copy_atomic, render_config  # noqa: E402

ROOT = bs.ROOT
OUT = os.path.join(ROOT, "runs", "bench-render")
KEPT = os.path.join(ROOT, "results", "bench-render")
DEFAULT_MEMORY = os.path.join(OUT, "falcon-memory")

ARMS = [
    ("he-zs", "humaneval", "zero-shot", "full", 164),
    ("he-falcon-full", "humaneval", "falcon", "full", 164),
    ("he-falcon-brief", "humaneval", "falcon", "brief", 164),
    ("he-falcon-renamed", "humaneval", "falcon", "renamed", 164),
    ("nd-memcoder", "ndonnx", "memcoder", "full", 50),
    ("nd-docrag", "ndonnx", "doc-rag", "full", 50),
    # The repairing arms take about 4x zero-shot's time: the first 80 tasks.
    ("he-memo-brief", "humaneval", "memocoder", "brief", 80),
    ("he-sr", "humaneval", "self-repair", "full", 80),
    ("mbpp-zs", "mbpp", "zero-shot", "full", 100),
    ("mbpp-falcon-brief", "mbpp", "falcon", "brief", 100),
    ("he-memo-full", "humaneval", "memocoder", "full", 80),
    # MemoCoder without its planner (`planning = false`): is it the plans that cost?
    ("he-memo-noplan", "humaneval", "memocoder-noplan", "brief", 80),
    # The planner only for answers that failed the guiding test, on every task,
    # against self-repair on every task.
    ("he-sr-all", "humaneval", "self-repair", "full", 164),
    ("he-memo-fallback", "humaneval", "memocoder-fallback", "brief", 164),
    ("mbpp-sr", "mbpp", "self-repair", "full", 100),
    ("mbpp-memo-fallback", "mbpp", "memocoder-fallback", "brief", 100),
    ("mbpp-memo", "mbpp", "memocoder", "brief", 100),
    # MEMCoder with past tasks as words and snippets as their API calls.
    ("nd-memcoder-brief", "ndonnx", "memcoder", "brief", 50),
]
# `[strategy] planning` of each MemoCoder arm, and the kind it runs.
PLANNING = {"memocoder": "first", "memocoder-noplan": "off", "memocoder-fallback": "fallback"}
OLD = {"humaneval": "humaneval", "ndonnx": "ndonnx", "mbpp": "mbpp"}


def kind(strategy):
    """The `[strategy] kind` an arm's strategy runs."""
    return "memocoder" if strategy in PLANNING else strategy


def config(name, bench, strategy, render, tasks, args):
    """The TOML of one arm."""
    path, fmt, _ = bs.task_source(bench, argparse.Namespace(he_tasks=164, mbpp_tasks=100,
                                                             ndonnx_tasks=tasks))
    return render_config(name, strategy, render, (path, fmt, tasks), OUT, bs.VENV_PY, kind(strategy),
                         planning=PLANNING.get(strategy),
                         api_docs=bs.ndonnx_docs() if bench == "ndonnx" else None,
                         memory_run=args.falcon_memory)


def falcon_memory(args, falcon_bin):
    """The FALCON memory run directory, imported from the kept export when
    it is the default one and has no database yet."""
    db = os.path.join(args.falcon_memory, "memory.sqlite")
    if os.path.exists(db) or args.falcon_memory != DEFAULT_MEMORY:
        return
    export = os.path.join(KEPT, "falcon-memory-c8.jsonl.gz")
    os.makedirs(args.falcon_memory, exist_ok=True)
    plain = os.path.join(OUT, "falcon-memory-c8.jsonl")
    with gzip.open(export, "rt") as f, open(plain, "w") as g:
        g.write(f.read())
    subprocess.run([falcon_bin, "memory", "import", args.falcon_memory, "--in", plain], check=True)


def run(arms, args, falcon_bin):
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(KEPT, exist_ok=True)
    if any(a[2] == "falcon" and not os.path.exists(os.path.join(KEPT, a[0] + ".json")) for a in arms):
        falcon_memory(args, falcon_bin)
    for name, bench, strategy, render, tasks in arms:
        kept = os.path.join(KEPT, name + ".json")
        if os.path.exists(kept):
            print(f"[bench] {name}: kept in {kept}, not rerun", file=sys.stderr)
            continue
        cfg = os.path.join(OUT, name + ".toml")
        with open(cfg, "w") as f:
            f.write(config(name, bench, strategy, render, tasks, args))
        out = os.path.join(OUT, name + ".json")
        partial = os.path.join(OUT, name + ".partial")
        again = ["--resume"] if os.path.isdir(partial) else ["--overwrite"] if os.path.exists(out) else []
        print(f"[bench] {name}: falcon eval --config {cfg}", file=sys.stderr, flush=True)
        t0 = time.time()
        rc = subprocess.call([falcon_bin, "eval", "--config", cfg, "--out", out, *again])
        if rc != 0:
            sys.exit(f"[bench] {name}: falcon eval exited with {rc}; rerun to continue from its groups")
        print(f"[bench] {name}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        copy_atomic(out, kept)


def entry_points(bench):
    if bench != "humaneval":
        return None
    with open(bs.humaneval_file()) as f:
        return {t["task_id"]: t["entry_point"] for t in map(json.loads, f)}


def causes(r, entries):
    """Per-cause counts of one result."""
    samples = [s for t in r["tasks"] for s in t["samples"]]
    out = collections.Counter(s["outcome"] for s in samples)
    cells = [f"NameError {out['NameError']}"]
    if entries:
        missing = sum(1 for t in r["tasks"] for s in t["samples"]
                      if s["outcome"] == "NameError" and entries[t["id"]] not in bs.defined(s["completion"]))
        cells[-1] += f" ({missing} never define the task's function)"
    syntax = [s for s in samples if s["outcome"] == "SyntaxError"]
    cut = sum(1 for s in syntax if (s["finish"] == "length" if "finish" in s else bs.cut_off(s)))
    cells.append(f"SyntaxError {len(syntax)} ({cut} cut off)")
    length = sum(1 for s in samples if s.get("finish") == "length")
    if any("finish" in s for s in samples):
        cells.append(f"{length} answers ran to the token limit")
    return ", ".join(cells)


def mcnemar_vs(r, base):
    mine, theirs = bs.first_pass(r), bs.first_pass(base)
    shared = [k for k in mine if k in theirs]
    b = sum(1 for k in shared if mine[k] and not theirs[k])
    c = sum(1 for k in shared if not mine[k] and theirs[k])
    return f"{b} / {c}, p = {bs.mcnemar(b, c):.3f}"


def table(arms, args):
    res = {}
    for name, *_ in arms:
        for d in (KEPT, OUT):
            p = os.path.join(d, name + ".json")
            if os.path.exists(p):
                res[name] = json.load(open(p))
                break
    print("| arm | strategy | render | tasks | pass@1 | exec@1 | seconds | McNemar vs baseline (only this / only baseline) "
          "| McNemar vs self-repair | McNemar vs the old row's first samples | causes | memory |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, bench, strategy, render, _ in arms:
        r = res.get(name)
        if not r:
            continue
        base_name = {"ndonnx": "nd-docrag", "mbpp": "mbpp-zs"}.get(bench, "he-zs")
        base = res.get(base_name)
        vs = mcnemar_vs(r, base) + f" ({base_name})" if base and base_name != name else ""
        # Self-repair on every task where it ran on every task, else the kept first 80.
        sr_name = next((n for n in {"humaneval": ["he-sr-all", "he-sr"], "mbpp": ["mbpp-sr"]}.get(bench, [])
                        if n in res), None)
        vs_sr = (mcnemar_vs(r, res[sr_name]) + f" ({sr_name})"
                 if kind(strategy) == "memocoder" and sr_name else "")
        old_path = os.path.join(bs.KEPT, f"{OLD[bench]}-{kind(strategy)}.json")
        vs_old = mcnemar_vs(r, json.load(open(old_path))) if os.path.exists(old_path) else "-"
        stats = ", ".join(f"{k} {v:g}" for k, v in sorted(r.get("strategy_stats", {}).items()))
        print(f"| {name} | {strategy} | {render} | {len(r['tasks'])} | {r['pass_at']['1']:.3f} | "
              f"{r['exec_at']['1']:.3f} | {r['seconds']:.0f} | {vs} | {vs_sr} | {vs_old} | "
              f"{causes(r, entry_points(bench))} | {stats} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--falcon-memory", default=DEFAULT_MEMORY,
                    help="a run directory with memory.sqlite (default: the kept memory, imported)")
    ap.add_argument("--only", default="", help="comma-separated arm names (default: all)")
    ap.add_argument("--table", action="store_true", help="print the table of the finished arms; run nothing")
    args = ap.parse_args()
    arms = ARMS
    if args.only:
        wanted = set(args.only.split(","))
        arms = [a for a in ARMS if a[0] in wanted]
    if not args.table:
        falcon_bin = os.environ.get("FALCON_BIN", os.path.join(ROOT, "target", "release", "falcon"))
        run(arms, args, falcon_bin)
    table(arms, args)


if __name__ == "__main__":
    main()
