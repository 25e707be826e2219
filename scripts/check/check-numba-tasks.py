#!/usr/bin/env python3
"""Check the bundled numba-cuda tasks (data/numba_cuda_tasks.jsonl).

For every task and every test, a fresh Python process runs the program that
falcon runs for a test (docs/tasks.md): solution, newline, test_setup, newline,
the test snippet; exit status 0 means pass. Checked:

  * the record has our JSONL fields and kind "numba_cuda";
  * the canonical solution passes every test;
  * a do-nothing stub (the entry point returns None) fails every test, so no
    test passes vacuously (skip with --no-stub);
  * every wrong solution in the mutants file fails at least one test, and
    every task has at least one mutant.

By default the tests run in numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1);
--device runs them on the GPU instead (the variable is removed from the
environment and a CUDA device must be available).

Usage: scripts/check/check-numba-tasks.py [--tasks F] [--mutants F] [--python EXE]
       [--device] [--jobs 2] [--timeout 60] [--only SUBSTRING] [--no-stub]
Exit status: 0 if everything holds, 1 on any problem, 2 on bad usage/setup.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIELDS = {"id", "prompt", "entry_point", "tests", "kind", "canonical_solution", "docs", "tags", "test_setup"}
REQUIRED = {"id", "prompt", "entry_point", "tests"}


def program(solution, setup, test):
    return solution + "\n" + (setup or "") + "\n" + test + "\n"


def run_one(python, code, env, timeout):
    """Runs code in a fresh process in its own temp dir. Returns (passed, seconds, reason)."""
    with tempfile.TemporaryDirectory(prefix="numba-task-") as d:
        path = os.path.join(d, "prog.py")
        with open(path, "w") as f:
            f.write(code)
        t0 = time.monotonic()
        p = subprocess.Popen([python, path], cwd=d, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            return False, time.monotonic() - t0, f"timeout after {timeout}s"
        dt = time.monotonic() - t0
        if p.returncode == 0:
            return True, dt, ""
        lines = [l for l in err.decode(errors="replace").strip().splitlines() if l.strip()]
        reason = lines[-1] if lines else f"exit status {p.returncode}"
        return False, dt, reason[:120]


def validate(rec, lineno):
    errs = []
    if not isinstance(rec, dict):
        return [f"line {lineno}: not a JSON object"]
    extra = set(rec) - FIELDS
    if extra:
        errs.append(f"unknown keys {sorted(extra)}")
    for k in REQUIRED:
        if k not in rec:
            errs.append(f"missing {k}")
    if errs:
        return errs
    ep = rec["entry_point"]
    if not (isinstance(ep, str) and ep.isidentifier() and ep.isascii()):
        errs.append("entry_point is not an ASCII identifier")
    if rec.get("kind") != "numba_cuda":
        errs.append(f"kind is {rec.get('kind')!r}, expected 'numba_cuda'")
    tests = rec["tests"]
    if not (isinstance(tests, list) and tests and all(isinstance(t, str) and t.strip() for t in tests)):
        errs.append("tests must be a non-empty list of non-empty strings")
    if not isinstance(rec.get("canonical_solution"), str):
        errs.append("no canonical_solution")
    elif f"def {ep}(" not in rec["canonical_solution"]:
        errs.append("canonical_solution does not define the entry point")
    if f"def {ep}(" not in rec["prompt"]:
        errs.append("prompt does not show the entry point's signature")
    if not (isinstance(rec.get("tags", []), list) and all(isinstance(t, str) for t in rec.get("tags", []))):
        errs.append("tags must be a list of strings")
    return errs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=os.path.join(ROOT, "data", "numba_cuda_tasks.jsonl"))
    ap.add_argument("--mutants", default=None, help="default: <tasks without .jsonl>.mutants.jsonl")
    ap.add_argument("--python", default=sys.executable, help="interpreter with numba installed")
    ap.add_argument("--device", action="store_true", help="run on the GPU instead of the simulator")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per test program")
    ap.add_argument("--only", default=None, help="only tasks whose id contains this string")
    ap.add_argument("--no-stub", action="store_true", help="skip the do-nothing-stub check")
    args = ap.parse_args()
    if os.sep in args.python:  # programs run in a temporary directory: make the path absolute
        args.python = os.path.abspath(args.python)
    mpath = args.mutants or (args.tasks[:-len(".jsonl")] if args.tasks.endswith(".jsonl") else args.tasks) + ".mutants.jsonl"

    problems = []
    tasks = []
    with open(args.tasks) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            for e in validate(rec, n):
                problems.append(f"{args.tasks}:{n}: {e}")
            tasks.append(rec)
    ids = [t.get("id") for t in tasks]
    if len(set(ids)) != len(ids):
        problems.append("duplicate task ids")
    if problems:
        print("\n".join(problems))
        return 1
    mutants = {}
    with open(mpath) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            m = json.loads(line)
            if set(m) != {"id", "wrong_solution", "what_is_wrong"}:
                problems.append(f"{mpath}:{n}: keys must be id, wrong_solution, what_is_wrong")
                continue
            if m["id"] not in ids:
                problems.append(f"{mpath}:{n}: mutant for unknown task {m['id']}")
                continue
            mutants.setdefault(m["id"], []).append(m)
    if args.only:
        tasks = [t for t in tasks if args.only in t["id"]]

    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    if not args.device:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    pre = ("import numba, numpy, llvmlite; from numba import cuda; "
           "print('numba', numba.__version__, 'llvmlite', llvmlite.__version__, 'numpy', numpy.__version__, "
           "'cuda available:', cuda.is_available())")
    pr = subprocess.run([args.python, "-c", pre], env=env, capture_output=True, text=True)
    if pr.returncode != 0:
        print(f"cannot import numba with {args.python}:\n{pr.stderr.strip()}", file=sys.stderr)
        return 2
    print(f"{'device' if args.device else 'simulator'}: {pr.stdout.strip()}")
    if args.device and "cuda available: True" not in pr.stdout:
        print("--device given but numba sees no CUDA device", file=sys.stderr)
        return 2

    # Jobs: canonical and stub for every test; mutants test by test, skipped once caught.
    caught = {}          # (task id, mutant index) -> (test index, reason)
    lock = threading.Lock()
    results = {}         # (task id, variant, test index) -> (passed, secs, reason) or None if skipped

    def job(t, variant, k):
        tid = t["id"]
        if variant.startswith("mutant"):
            mi = int(variant.split(":")[1])
            with lock:
                if (tid, mi) in caught:
                    results[(tid, variant, k)] = None
                    return
            sol = mutants[tid][mi]["wrong_solution"]
        elif variant == "stub":
            sol = f"def {t['entry_point']}(*args, **kwargs):\n    return None\n"
        else:
            sol = t["canonical_solution"]
        r = run_one(args.python, program(sol, t.get("test_setup"), t["tests"][k]), env, args.timeout)
        with lock:
            results[(tid, variant, k)] = r
            if variant.startswith("mutant") and not r[0] and (tid, mi) not in caught:
                caught[(tid, mi)] = (k, r[2])

    jobs = []
    for t in tasks:
        for k in range(len(t["tests"])):
            jobs.append((t, "canonical", k))
    for t in tasks:
        for mi in range(len(mutants.get(t["id"], []))):
            for k in range(len(t["tests"])):
                jobs.append((t, f"mutant:{mi}", k))
        if not args.no_stub:
            for k in range(len(t["tests"])):
                jobs.append((t, "stub", k))
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        for fut in [ex.submit(job, *j) for j in jobs]:
            fut.result()
    wall = time.monotonic() - t0

    # Report.
    hdr = f"{'task':34} {'tests':>5} {'canon':>6} {'stub':>6} {'mutants':>8} {'max s':>6}"
    print(hdr)
    print("-" * len(hdr))
    n_runs = sum(1 for v in results.values() if v is not None)
    slowest = (0.0, "")
    for t in tasks:
        tid, nt = t["id"], len(t["tests"])
        canon = [results[(tid, "canonical", k)] for k in range(nt)]
        npass = sum(r[0] for r in canon)
        for k, r in enumerate(canon):
            if not r[0]:
                problems.append(f"{tid}: canonical fails test {k}: {r[2]}")
            if r[1] > slowest[0]:
                slowest = (r[1], f"{tid} test {k}")
        stub_s = "-"
        if not args.no_stub:
            stub = [results[(tid, "stub", k)] for k in range(nt)]
            nfail = sum(not r[0] for r in stub)
            stub_s = f"{nfail}/{nt}"
            for k, r in enumerate(stub):
                if r[0]:
                    problems.append(f"{tid}: test {k} passes for a do-nothing stub (vacuous)")
        ms = mutants.get(tid, [])
        if not ms:
            problems.append(f"{tid}: no mutant")
        ncaught = 0
        for mi, m in enumerate(ms):
            if (tid, mi) in caught:
                ncaught += 1
            else:
                problems.append(f"{tid}: mutant {mi} ({m['what_is_wrong']}) passes every test")
        ts = [r[1] for r in canon]
        print(f"{tid:34} {nt:>5} {f'{npass}/{nt}':>6} {stub_s:>6} {f'{ncaught}/{len(ms)}':>8} {max(ts):>6.2f}")
    print("-" * len(hdr))
    print("mutants (caught by test: reason):")
    for t in tasks:
        for mi, m in enumerate(mutants.get(t["id"], [])):
            c = caught.get((t["id"], mi))
            how = f"test {c[0]}: {c[1]}" if c else "NOT CAUGHT"
            print(f"  {t['id']}#{mi} {m['what_is_wrong']}\n      -> {how}")
    n_tests = sum(len(t["tests"]) for t in tasks)
    n_mut = sum(len(mutants.get(t["id"], [])) for t in tasks)
    print(f"{len(tasks)} tasks, {n_tests} tests, {n_mut} mutants; {len(caught)}/{n_mut} mutants caught; "
          f"{n_runs} programs run in {wall:.1f}s with {args.jobs} workers; "
          f"slowest canonical test {slowest[0]:.2f}s ({slowest[1]})")
    if problems:
        print(f"\n{len(problems)} problem(s):")
        print("\n".join("  " + p for p in problems))
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
