#!/usr/bin/env python3
"""Data-parallel figures of falcon-rl on this machine, through the trainer's own process group.

A benchmark, not a test: c10d Gloo, launched by torchrun as a user would.

    scripts/bench/run dist [--repeats 5] [--sizes 1.8e6,1.5e9] [--steps 3] [--skip-steps]

1. All-reduce: torchrun starts 2 ranks of the dist_bench example, which all-reduces
   gradients of each size the way a training step does (buckets, summed) and prints the
   median time and the bandwidths (nccl-tests' definitions).
2. Step time: `falcon train` on the embedded SmolLM2 (LoRA r16, fp32, CPU), the same global
   batch (4 tasks x 4 samples, 64 new tokens), as 1 process and as 2 ranks under torchrun.
   torchrun gives each rank one thread (OMP_NUM_THREADS=1); the single process keeps
   libtorch's default (every core), so both use the whole machine. The first step is
   warm-up and left out of the median.

The sizes are a LoRA-sized gradient (r16 on SmolLM2's q/k/v/o: about 1.8M parameters) and a
1.5B-sized one, which holds 6 GB of fp32 per rank: give --sizes 1.8e6,3e8 on a small machine.
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchcfg import dist_config  # noqa: E402

TORCHRUN = os.path.join(ROOT, ".venv", "bin", "torchrun")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(n, argv, env=None):
    return [TORCHRUN, "--no-python", "--nproc-per-node", str(n),
            "--master-port", str(free_port())] + argv


def allreduce(a):
    sizes = [float(x) for x in a.sizes.split(",") if x]
    cmd = torchrun(2, [os.environ["DIST_BENCH_BIN"], "--repeats", str(a.repeats)]
                   + [str(int(s)) for s in sizes])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    rows = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    print("\n## all-reduce over c10d Gloo, 2 ranks on this machine (fp32 gradients, 25 MiB buckets)\n")
    print("| parameters | MiB | median s | min s | max s | algbw GB/s | busbw GB/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['elements']:,} | {r['mib']:.1f} | {r['median_s']:.4f} | {r['min_s']:.4f} | "
              f"{r['max_s']:.4f} | {r['algbw_gbs']:.2f} | {r['busbw_gbs']:.2f} |")


def steps_of(run_dir):
    lines = open(os.path.join(run_dir, "metrics.jsonl")).read().splitlines()
    return [json.loads(l) for l in lines]


def step_time(a):
    work = tempfile.mkdtemp(prefix="bench-dist-")
    try:
        res = {}
        for world in (1, 2):
            out = os.path.join(work, f"w{world}")
            cfg = os.path.join(work, f"w{world}.toml")
            with open(cfg, "w") as f:
                f.write(dist_config(ROOT, out, a.steps))
            argv = [os.environ["FALCON_BIN"], "train", "--config", cfg]
            cmd = argv if world == 1 else torchrun(2, argv)
            t0 = time.time()
            subprocess.run(cmd, check=True, capture_output=True, text=True)
            wall = time.time() - t0
            recs = steps_of(os.path.join(out, "dist"))
            per = [sum(r["seconds"].values()) for r in recs][1:] or [float("nan")]
            with open(os.path.join(out, "dist", "samples.jsonl")) as f:
                first = [json.loads(l)["completion"] for l in f if json.loads(l)["step"] == 0]
            res[world] = (statistics.median(per), wall, recs, first)
        print(f"\n## one RL step, same global batch (4 tasks x 4 samples, 64 new tokens), "
              f"{a.steps} steps, first left out\n")
        print("| ranks | median step s | generate | exec | update | gather | whole command s |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for w, (med, wall, recs, _) in res.items():
            parts = {k: statistics.median([r["seconds"].get(k, 0.0) for r in recs[1:]] or [0])
                     for k in ("generate", "exec", "update", "gather")}
            print(f"| {w} | {med:.2f} | {parts['generate']:.2f} | {parts['exec']:.2f} | "
                  f"{parts['update']:.2f} | {parts['gather']:.3f} | {wall:.1f} |")
        print(f"\nstep time, 1 rank / 2 ranks: {res[1][0] / res[2][0]:.2f}x "
              f"(the same cores either way on a {os.cpu_count()}-core machine)")
        # Later steps start from weights that differ in the last bits (the ranks' gradients
        # are summed in another order), which can flip a near-tied token.
        same = res[1][3] == res[2][3]
        print(f"first step's {len(res[1][3])} samples identical across world sizes: {same}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--sizes", default="1.8e6,1.5e9")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--skip-steps", action="store_true")
    a = p.parse_args()
    print(f"# bench-dist on {os.cpu_count()} cores, {socket.gethostname()}")
    allreduce(a)
    if not a.skip_steps:
        step_time(a)


if __name__ == "__main__":
    main()
