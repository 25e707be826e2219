#!/usr/bin/env python3
"""Peak resident memory of a meta-step against a single-level step.

    scripts/bench/run meta-memory [--algorithm maml|fomaml|reptile] [--group 4] [--max-new-tokens 96]

One FALCON meta-step (4 tasks, 2 inner steps, second-order MAML by default) against one
single-level step over the same number of samples (same tasks, group_size = samples per task
of the meta-step), on SmolLM2-135M, CPU, fp32.

Both runs: SmolLM2-135M-Instruct fp32 on the CPU, LoRA r16 on q/k/v/o, 4 tasks of
data/easy_python.jsonl, one training step. The meta run generates G samples per task with
theta, adapts 4 fast-weight sets (2 inner steps each on those samples plus short-term rows,
and long-term demonstrations with --long-term) and generates G more with each theta_i; the
single-level run generates 2G per task and takes one update over all of them, so both see
the same number of samples. Peak RSS is the child's VmHWM; it includes the model, libtorch
and the tokenizer, which both runs share. A run that passes --limit-gib is stopped and
reported as such.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchcfg import meta_memory_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASK_IDS = ["easy/add", "easy/is_even", "easy/reverse_string", "easy/factorial"]


def peak_of(cmd, limit_gib):
    """Run `cmd`; return its peak RSS in MiB (VmHWM), or None if it passed `limit_gib` and was
    stopped (so that a run that would exhaust the machine reports that instead of taking the
    machine down)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak, over = 0, False
    status = f"/proc/{proc.pid}/status"
    while proc.poll() is None:
        try:
            with open(status) as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
        except OSError:
            pass
        if peak > limit_gib * 1024 * 1024:
            proc.kill()
            over = True
        time.sleep(0.05)
    err = proc.stderr.read()
    if over:
        return None
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    return peak / 1024.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--algorithm", default="maml", choices=["maml", "fomaml", "reptile"])
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--long-term", action="store_true",
                    help="Table 7 prompts in the meta run (longer sequences than the single-level run's)")
    ap.add_argument("--limit-gib", type=float, default=16.0, help="stop a run whose RSS passes this")
    ap.add_argument("--meta-micro-batch", type=int, default=0,
                    help="[train] micro_batch of the meta run (its inner, query and Hessian-vector passes)")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="falcon-bench-meta-memory-")
    try:
        by_id = {}
        with open(os.path.join(ROOT, "data", "easy_python.jsonl")) as f:
            for line in f:
                t = json.loads(line)
                by_id[t["id"]] = t
        with open(os.path.join(work, "tasks.jsonl"), "w") as f:
            for i in TASK_IDS:
                f.write(json.dumps(by_id[i]) + "\n")
        fb = os.environ["FALCON_BIN"]
        peaks, recs = {}, {}
        # The single-level update in one pass (micro_batch 0, the default) and in micro-batches
        # of one task's worth of samples, which is what the meta-step's passes hold.
        runs = [("single", False, 0), ("single-mb", False, 2 * a.group), ("meta", True, a.meta_micro_batch)]
        for name, meta, mb in runs:
            cpath = os.path.join(work, f"{name}.toml")
            with open(cpath, "w") as f:
                f.write(meta_memory_config(work, name, a, meta, mb))
            peaks[name] = peak_of([fb, "--threads", str(a.threads), "train", "--config", cpath], a.limit_gib)
            if peaks[name] is None:
                print(f"{name}: stopped, peak RSS above {a.limit_gib} GiB")
                peaks[name] = float("nan")
                recs[name] = {"samples": "?", "tokens_generated": "?"}
                continue
            recs[name] = json.loads(open(os.path.join(work, "runs", name, "metrics.jsonl")).readline())
        s, smb, m = peaks["single"], peaks["single-mb"], peaks["meta"]
        print(f"SmolLM2-135M fp32 CPU, LoRA r16 q/k/v/o, 4 tasks, {a.max_new_tokens} max new tokens, "
              f"meta prompts: {'Table 7 (long-term memory)' if a.long_term else 'zero-shot, as the single-level run'}")
        print(f"single-level step: {recs['single']['samples']} samples, {recs['single']['tokens_generated']} tokens, peak RSS {s:8.1f} MiB")
        print(f"single-level step, micro_batch {2 * a.group}: {recs['single-mb']['samples']} samples, "
              f"{recs['single-mb']['tokens_generated']} tokens, peak RSS {smb:8.1f} MiB")
        print(f"meta step ({a.algorithm}, 2 inner steps, micro_batch {a.meta_micro_batch}): {recs['meta']['samples']} samples, "
              f"{recs['meta']['tokens_generated']} tokens, peak RSS {m:8.1f} MiB")
        print(f"ratio meta / single-level: {m / s:.2f}x; against micro-batches: {m / smb:.2f}x")
        print(json.dumps({"single_mib": s, "single_mb_mib": smb, "meta_mib": m, "ratio": m / s,
                          "single": recs["single"], "meta": recs["meta"]}))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
