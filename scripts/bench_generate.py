#!/usr/bin/env python3
"""Side-by-side decode throughput: falcon vs transformers (see scripts/bench-generate).

Both sides load the same HF directory, use the same dtype, device, batch,
thread count and prompt, decode greedily for exactly N new tokens, and are
timed around generation only (model load excluded, one warm-up run each),
the two sides alternating run by run.
Prints one row per (dtype, batch) and the ratio falcon / transformers.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PROMPT = "def quicksort(xs):\n    \"\"\"Sort a list of integers in ascending order.\"\"\"\n"


def falcon_tps(bin_, model, dtype, batch, tokens, threads, device):
    cmd = [
        bin_, "--threads", str(threads), "generate", "--model", model, "--dtype", dtype,
        "--device", device, "--max-new-tokens", str(tokens), "--ignore-eos", "--json",
        "--repeat", str(batch), "--prompt", PROMPT,
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    summary = json.loads(out.strip().splitlines()[-1])["summary"]
    assert summary["new_tokens"] == batch * tokens, summary
    return summary["tokens_per_second"]


def resolve_model(bin_, spec):
    if os.path.isdir(spec):
        return spec
    # Let falcon resolve (and, for the embedded GGUF, convert) it once; then both sides
    # load the same HF directory.
    out = subprocess.run(
        [bin_, "generate", "--model", spec, "--max-new-tokens", "1", "--prompt", "x"],
        check=True, capture_output=True, text=True,
    ).stderr
    for line in out.splitlines():
        if line.startswith("falcon: loaded "):
            return line[len("falcon: loaded "):].split(" (")[0]
    sys.exit(f"could not resolve model {spec}: {out}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(a.threads)
    bin_ = os.environ.get("FALCON_BIN", "target/release/falcon")
    model_dir = resolve_model(bin_, a.model)
    tok = AutoTokenizer.from_pretrained(model_dir)
    dev = "cuda" if a.device.startswith("cuda") else "cpu"
    print(f"model: {model_dir}\ndevice: {a.device}, threads: {a.threads}, new tokens: {a.tokens}, "
          f"greedy, repeats: {a.repeats} (median)\n")
    print(f"{'dtype':6} {'batch':>5} {'falcon tok/s':>13} {'transformers tok/s':>19} {'ratio':>7}")
    rows = []
    for dtype in a.dtypes.split(","):
        tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=tdtype).to(dev).eval()
        for batch in [int(b) for b in a.batches.split(",")]:
            enc = tok([PROMPT] * batch, return_tensors="pt").to(dev)

            def hf_once():
                if dev == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                with torch.no_grad():
                    out = model.generate(**enc, max_new_tokens=a.tokens, min_new_tokens=a.tokens,
                                         do_sample=False, pad_token_id=tok.eos_token_id)
                if dev == "cuda":
                    torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                assert out.shape[1] - enc["input_ids"].shape[1] == a.tokens
                return batch * a.tokens / dt

            hf_once()  # warm-ups
            falcon_tps(bin_, model_dir, dtype, batch, a.tokens, a.threads, a.device)
            # Interleaved, so that a noisy neighbour slows both sides alike.
            hf_runs, our_runs = [], []
            for _ in range(a.repeats):
                hf_runs.append(hf_once())
                our_runs.append(falcon_tps(bin_, model_dir, dtype, batch, a.tokens, a.threads,
                                           a.device))
            hf, ours = statistics.median(hf_runs), statistics.median(our_runs)
            rows.append((dtype, batch, ours, hf))
            print(f"{dtype:6} {batch:>5} {ours:>13.1f} {hf:>19.1f} {ours / hf:>6.2f}x", flush=True)
        del model


if __name__ == "__main__":
    main()
