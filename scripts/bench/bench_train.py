#!/usr/bin/env python3
"""Side-by-side RL step: falcon train vs TRL GRPOTrainer.

    scripts/bench/run train [--model DIR] [--prompts 4] [--generations 8] [--max-new-tokens 128]
                            [--lora-rank 16] [--steps 3] [--threads 2] [--skip-trl] [--shared-prefix on|off]
                            [--autocast off|bf16]

One RL step, side by side: `falcon train` against TRL's GRPOTrainer on the same model, prompts,
group size, max new tokens and LoRA settings (fp32, CPU, 2 threads by default). Prints each
side's median step time, the ratio, and our breakdown.

Both sides: the same N prompts (the instruction + signature + docstring of four tasks of
data/easy_python.jsonl), G samples each at temperature 1.0 (no top-k/top-p, no stop strings:
end of sequence or max new tokens), LoRA rank R / alpha 2R on q/k/v/o, dropout 0, AdamW at a
constant learning rate, group-mean advantages, no KL and no reference model, one optimizer
step per generation round, fp32 on CPU with the same thread count. Rewards run each
completion's code in a subprocess on both sides (falcon: its sandbox). The first step of each
side is warm-up and left out of the median. The sides run one after the other, so the machine
should be otherwise idle.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_generate import resolve_model  # noqa: E402  (falcon resolves/converts the model once)
from benchcfg import train_config, write_step_tasks  # noqa: E402


def falcon_side(a, model, work):
    tpath = write_step_tasks(ROOT, a.prompts, os.path.join(work, "tasks.jsonl"))
    cfg = train_config(os.path.join(work, "runs"), model, tpath, a)
    cpath = os.path.join(work, "bench.toml")
    with open(cpath, "w") as f:
        f.write(cfg)
    subprocess.run([os.environ["FALCON_BIN"], "--threads", str(a.threads), "train", "--config", cpath],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    recs = [json.loads(l) for l in open(os.path.join(work, "runs", "bench", "metrics.jsonl"))]
    return recs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-trl", action="store_true")
    ap.add_argument("--shared-prefix", choices=["on", "off"], default="on",
                    help="falcon's update runs each prompt once per group (on, the default) or once per sample")
    ap.add_argument("--autocast", choices=["off", "bf16"], default="off",
                    help="falcon's update in bf16 autocast (TRL's side stays fp32)")
    a = ap.parse_args()
    if a.steps < 2:
        sys.exit("--steps must be >= 2 (the first step is warm-up)")
    model = resolve_model(os.environ["FALCON_BIN"], a.model)
    work = tempfile.mkdtemp(prefix="falcon-bench-train-")
    try:
        recs = falcon_side(a, model, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    timed = recs[1:]
    step_s = [sum(r["seconds"].values()) for r in timed]
    ours = statistics.median(step_s)
    parts = {k: statistics.median(r["seconds"][k] for r in timed) for k in timed[0]["seconds"]}
    toks = statistics.median(r["tokens_generated"] for r in timed)
    print(f"model {model}; {a.prompts} prompts x {a.generations} samples, {a.max_new_tokens} max new tokens, "
          f"LoRA r={a.lora_rank} q/k/v/o, fp32, CPU, {a.threads} threads; median of {len(timed)} step(s) after 1 warm-up")
    print(f"falcon train (shared prefix {a.shared_prefix}, autocast {a.autocast}): {ours:7.1f} s/step  ({' '.join(f'{k} {v:.1f}' for k, v in sorted(parts.items()))}; "
          f"{toks:.0f} completion tokens/step)")
    result = {"falcon_step_s": ours, "falcon_parts_s": parts, "falcon_tokens_per_step": toks,
              "falcon_steps_s": step_s}
    if not a.skip_trl:
        out = subprocess.run(
            [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_train_trl.py"), "--model", model,
             "--prompts", str(a.prompts), "--generations", str(a.generations),
             "--max-new-tokens", str(a.max_new_tokens), "--lora-rank", str(a.lora_rank),
             "--steps", str(a.steps), "--threads", str(a.threads), "--seed", str(a.seed), "--json"],
            check=True, capture_output=True, text=True,
        ).stdout
        trl = json.loads(out.strip().splitlines()[-1])
        phases = trl.get("phase_seconds", [])[1:]
        tparts = {k: statistics.median(p[k] for p in phases) for k in phases[0]} if phases else {}
        ttoks = statistics.median(trl["completion_tokens_per_step"][1:])
        print(f"TRL {trl['trl_version']} GRPOTrainer: {trl['median_step_s']:7.1f} s/step  "
              f"({' '.join(f'{k} {v:.1f}' for k, v in sorted(tparts.items()))}; {ttoks:.0f} completion tokens/step)")
        ratio = trl["median_step_s"] / ours
        print(f"ratio TRL / falcon step time: {ratio:.2f}x")
        # Sampled lengths differ between the sides; time per completion token is the fairer view.
        print(f"seconds per completion token: falcon {ours / toks * 1000:.1f} ms, TRL {trl['median_step_s'] / ttoks * 1000:.1f} ms "
              f"(ratio {trl['median_step_s'] / ttoks / (ours / toks):.2f}x)")
        result.update({"trl": trl, "ratio": ratio})
        if "generate" in parts and "generate" in tparts:
            # Generation alone (sampled, batch N x G, ragged, finished rows dropped), per token.
            ours_g, trl_g = parts["generate"] / toks, tparts["generate"] / ttoks
            print(f"generation per completion token: falcon {ours_g * 1000:.1f} ms ({1 / ours_g:.0f} tok/s), "
                  f"TRL {trl_g * 1000:.1f} ms ({1 / trl_g:.0f} tok/s) (ratio {trl_g / ours_g:.2f}x)")
            result["generation_ratio"] = trl_g / ours_g
    print(json.dumps(result))


if __name__ == "__main__":
    main()
