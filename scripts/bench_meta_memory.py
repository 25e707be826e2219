#!/usr/bin/env python3
"""Peak resident memory of a meta-step against a single-level step (scripts/bench-meta-memory).

Both runs: SmolLM2-135M-Instruct fp32 on the CPU, LoRA r16 on q/k/v/o, 4 tasks of
data/easy_python.jsonl, one training step, checkpoints off the measured path. The meta run
generates G samples per task with theta, adapts 4 fast-weight sets (2 inner steps each, plus
short-term rows and long-term demonstrations) and generates G more with each theta_i; the
single-level run generates 2G per task and takes one update over all of them, so both see
the same number of samples. Peak RSS is the kernel's ru_maxrss of the child process; it
includes the model, libtorch and the tokenizer, which both runs share, so the script also
prints the peak of a run that stops after loading (the floor) and the ratio above it.
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASK_IDS = ["easy/add", "easy/is_even", "easy/reverse_string", "easy/factorial"]


def peak_of(cmd):
    # A fresh process per measurement: ru_maxrss of RUSAGE_CHILDREN is the largest child so far.
    probe = (
        "import resource,subprocess,sys;"
        "subprocess.run(sys.argv[1:],check=True,stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL);"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", probe] + cmd, check=True, capture_output=True, text=True)
    return int(out.stdout.strip()) / 1024.0  # MiB


def config(work, name, a, meta):
    group = a.group if meta else 2 * a.group
    meta_section = (
        f'[meta]\nalgorithm = "{a.algorithm}"\ninner_steps = 2\ninner_lr = 1e-3\n'
        f"short_term_samples = 2\nlong_term = true\nlong_term_demos = 1\nquery_size = {a.group}\n"
        if meta else ""
    )
    return f"""
[run]
name = "{name}"
seed = 1
output_dir = {json.dumps(os.path.join(work, "runs"))}
[model]
path = "embedded"
dtype = "fp32"
device = "cpu"
[model.lora]
enabled = true
rank = 16
alpha = 32.0
dropout = 0.0
targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
[generation]
max_new_tokens = {a.max_new_tokens}
temperature = 1.0
[tasks]
path = {json.dumps(os.path.join(work, "tasks.jsonl"))}
[reward]
judge = "static"
[memory]
embedder = "hash"
[train]
steps = 1
tasks_per_step = 4
group_size = {group}
lr = 1e-5
advantage = "group_mean"
checkpoint_every = 1
keep_last = 1
{meta_section}"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--algorithm", default="maml", choices=["maml", "fomaml", "reptile"])
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
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
        for name, meta in [("single", False), ("meta", True)]:
            cpath = os.path.join(work, f"{name}.toml")
            with open(cpath, "w") as f:
                f.write(config(work, name, a, meta))
            peaks[name] = peak_of([fb, "--threads", str(a.threads), "train", "--config", cpath])
            recs[name] = json.loads(open(os.path.join(work, "runs", name, "metrics.jsonl")).readline())
        s, m = peaks["single"], peaks["meta"]
        print(f"SmolLM2-135M fp32 CPU, LoRA r16 q/k/v/o, 4 tasks, {a.max_new_tokens} max new tokens")
        print(f"single-level step: {recs['single']['samples']} samples, {recs['single']['tokens_generated']} tokens, peak RSS {s:8.1f} MiB")
        print(f"meta step ({a.algorithm}, 2 inner steps): {recs['meta']['samples']} samples, "
              f"{recs['meta']['tokens_generated']} tokens, peak RSS {m:8.1f} MiB")
        print(f"ratio meta / single-level: {m / s:.2f}x")
        print(json.dumps({"single_mib": s, "meta_mib": m, "ratio": m / s,
                          "single": recs["single"], "meta": recs["meta"]}))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
