#!/usr/bin/env python3
"""What a custom reward term costs: the main job's FALCON step (configs/demo.toml) without a
custom term, with one trivial Python term (TRL signature) and with one HTTP term on loopback
(examples/rewards/openrlhf_server.py), run one after another on this machine.

    scripts/bench/run custom-reward [--steps 3] [--arms none,python,http]

Each arm trains --steps meta-steps from the SFT stage's checkpoint (runs/demo-sft/step-20 when
it exists, else from the embedded model). The custom terms are log_only, so every arm draws the
same samples and takes the same updates: the arms differ only in the term's work. Printed per
arm: the mean step time, the mean time inside the custom term (the step's `custom_reward`
phase), and the overhead against the arm without a term. Goal: at most 3 % for the Python term.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FALCON = os.environ.get("FALCON_BIN", os.path.join(ROOT, "target", "release", "falcon"))

TRIVIAL = "def trivial(completions, **kwargs):\n    return [0.0 for _ in completions]\n"


def config(work, arm, steps, port):
    with open(os.path.join(ROOT, "configs", "demo.toml")) as f:
        text = f.read()
    text = re.sub(r'(?m)^name = "demo"$', 'name = "bench-%s"' % arm, text, count=1)
    text = re.sub(r'(?m)^output_dir = "runs"$', 'output_dir = %s' % json.dumps(os.path.join(work, "runs")), text, count=1)
    text = re.sub(r"(?m)^steps = \d+$", "steps = %d" % steps, text, count=1)
    text = re.sub(r"(?m)^eval_(before|after) = true$", r"eval_\1 = false", text)
    text = re.sub(r"(?m)^checkpoint_every = \d+$", "checkpoint_every = %d" % steps, text, count=1)
    init = os.path.join(ROOT, "runs", "demo-sft", "step-20")
    if not os.path.isdir(init):
        text = re.sub(r'(?m)^init_from = .*$', "", text)
    if arm == "python":
        text += '\n[[reward.custom]]\nname = "trivial"\nkind = "python"\npath = %s\nmode = "log_only"\n' % json.dumps(
            os.path.join(work, "trivial.py"))
    elif arm == "http":
        text += '\n[[reward.custom]]\nname = "judge"\nkind = "http"\nurls = ["http://127.0.0.1:%d/get_reward"]\nmode = "log_only"\n' % port
    path = os.path.join(work, "%s.toml" % arm)
    with open(path, "w") as f:
        f.write(text)
    return path


def step_times(work, arm):
    rows = []
    with open(os.path.join(work, "runs", "bench-%s" % arm, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            rows.append((sum(r["seconds"].values()), r["seconds"].get("custom_reward", 0.0)))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--arms", default="none,python,http")
    a = ap.parse_args()
    arms = a.arms.split(",")
    work = tempfile.mkdtemp(prefix="falcon-bench-custom-reward-")
    server = None
    try:
        with open(os.path.join(work, "trivial.py"), "w") as f:
            f.write(TRIVIAL)
        port = 0
        if "http" in arms:
            server = subprocess.Popen(
                [sys.executable, os.path.join(ROOT, "examples", "rewards", "openrlhf_server.py"), "--port", "0"],
                stdout=subprocess.PIPE, text=True)
            port = int(server.stdout.readline().strip().rsplit(":", 1)[1])
        results = {}
        for arm in arms:
            cfg = config(work, arm, a.steps, port)
            t0 = time.time()
            p = subprocess.run([FALCON, "train", "--config", cfg], cwd=ROOT, capture_output=True, text=True)
            if p.returncode:
                sys.exit("%s arm failed:\n%s" % (arm, p.stderr[-3000:]))
            rows = step_times(work, arm)
            results[arm] = rows
            print("%-6s %d steps in %.0f s" % (arm, len(rows), time.time() - t0), file=sys.stderr)
        base = results.get("none")
        base_mean = sum(r[0] for r in base) / len(base) if base else None
        print("arm     step s (mean)   in the term s (mean)   overhead vs none")
        for arm, rows in results.items():
            mean = sum(r[0] for r in rows) / len(rows)
            term = sum(r[1] for r in rows) / len(rows)
            over = "" if base_mean is None or arm == "none" else "%+.2f %% (step), %.2f %% (term / step)" % (
                100 * (mean / base_mean - 1), 100 * term / base_mean)
            print("%-7s %14.2f %22.4f   %s" % (arm, mean, term, over))
    finally:
        if server:
            server.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
