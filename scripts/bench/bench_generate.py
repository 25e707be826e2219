#!/usr/bin/env python3
"""Side-by-side decode throughput: falcon vs transformers.

    scripts/bench/run generate [--model DIR] [--dtypes fp32,bf16] [--batches 1,8] [--tokens 128]
                               [--threads 2] [--repeats 3] [--device cpu]
                               [--ragged N [--ragged-max 1024]]

Defaults: the embedded SmolLM2-135M-Instruct (dequantised to fp32 from its GGUF), CPU, 2
threads, greedy, 128 new tokens (EOS ignored on both sides), batch 1 and 8, fp32 and bf16.

Both sides load the same HF directory, use the same dtype, device, batch,
thread count and prompt, decode greedily for exactly N new tokens, and are
timed around generation only (model load excluded, one warm-up run each),
the two sides alternating run by run. transformers runs in this process with the OpenMP
wait policy of its environment (libgomp's default spins; `OMP_WAIT_POLICY=PASSIVE` for
falcon's; scripts/bench/run sets it unless the variable is set), and the header says which.
Prints one row per (dtype, batch): medians with min-max and the ratio falcon / transformers,
the load average, and decode at batch 1 as a share of the machine's memory roofline (weight
bytes per token x tokens/s against a large copy on the same threads).

With --ragged N, a second table times one batch of N prompts of different lengths (evenly
spread from --ragged-max/8 to --ragged-max tokens, the shape of a repair round's prompts) with
--tokens new tokens each: transformers pads them all to the longest, falcon prefills them in
chunks of similar length. Prompt processing dominates there, so the table gives seconds per
batch and the speed ratio transformers seconds / falcon seconds: e.g.
`scripts/bench/run generate --batches '' --dtypes fp32 --ragged 16 --tokens 16`.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

PROMPT = "def quicksort(xs):\n    \"\"\"Sort a list of integers in ascending order.\"\"\"\n"


def falcon_summary(bin_, model, dtype, tokens, threads, device, prompt_args, rows):
    """One `falcon generate` run; its summary line, checked to hold rows x tokens new tokens."""
    cmd = [
        bin_, "--threads", str(threads), "generate", "--model", model, "--dtype", dtype,
        "--device", device, "--max-new-tokens", str(tokens), "--ignore-eos", "--json",
    ] + prompt_args
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    summary = json.loads(out.strip().splitlines()[-1])["summary"]
    assert summary["new_tokens"] == rows * tokens, summary
    return summary


def falcon_tps(bin_, model, dtype, batch, tokens, threads, device):
    return falcon_summary(bin_, model, dtype, tokens, threads, device,
                          ["--repeat", str(batch), "--prompt", PROMPT], batch)["tokens_per_second"]


def falcon_seconds(bin_, model, dtype, prompts, tokens, threads, device):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write("".join(json.dumps(p) + "\n" for p in prompts))
    try:
        return falcon_summary(bin_, model, dtype, tokens, threads, device,
                              ["--prompts-file", f.name], len(prompts))["seconds"]
    finally:
        os.unlink(f.name)


RUNS = {}  # (side, key) -> every run's figure, for the min-max columns


def interleaved(repeats, hf_once, ours_once, key=None):
    """Medians of `repeats` runs of each side, alternating, so that a noisy neighbour slows
    both sides alike: (transformers, falcon)."""
    hf_runs, our_runs = [], []
    for _ in range(repeats):
        hf_runs.append(hf_once())
        our_runs.append(ours_once())
    if key is not None:
        RUNS[("hf", key)], RUNS[("ours", key)] = hf_runs, our_runs
    return statistics.median(hf_runs), statistics.median(our_runs)


def spread(side, key):
    r = RUNS.get((side, key), [])
    return f"{min(r):.1f}-{max(r):.1f}" if r else "-"


def copy_bandwidth(threads, mb=512, repeats=5):
    """Bytes moved per second (read + write) by a large tensor copy on `threads` threads: the
    memory roofline decode at batch 1 is measured against."""
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(mb * 1024 * 1024 // 4, dtype=torch.float32)
    y = torch.empty_like(x)
    y.copy_(x)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        y.copy_(x)
        times.append(time.perf_counter() - t0)
    return 2 * x.numel() * 4 / statistics.median(times)


def loadavg():
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


def hf_model(model_dir, dtype, dev):
    import torch
    from transformers import AutoModelForCausalLM

    tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=tdtype).to(dev).eval()


def hf_seconds(model, enc, tokens, pad_token_id, dev):
    """Seconds for one greedy transformers `generate` of exactly `tokens` new tokens per row."""
    import torch

    if dev == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=tokens, min_new_tokens=tokens,
                             do_sample=False, pad_token_id=pad_token_id)
    if dev == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    assert out.shape[1] - enc["input_ids"].shape[1] == tokens
    return dt


def ragged_prompts(tok, n, longest):
    """n prompts of evenly spread token counts, cut from one synthetic module (deterministic)."""
    text = "".join(f"def step_{i}(xs, k={i}):\n    \"\"\"Shift every item by {i}.\"\"\"\n"
                   f"    return [x + k for x in xs if x % {i % 7 + 2}]\n\n" for i in range(4 * longest))
    ids = tok(text, add_special_tokens=False)["input_ids"]
    lo = max(longest // 8, 1)
    lens = [lo + (longest - lo) * i // max(n - 1, 1) for i in range(n)]
    # Shuffled deterministically: a rollout's prompts do not arrive sorted.
    random.Random(0).shuffle(lens)
    return [tok.decode(ids[:l]) for l in lens]


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
    ap.add_argument("--ragged", type=int, default=0, help="prompts in the ragged batch (0: skip)")
    ap.add_argument("--ragged-max", type=int, default=1024, help="longest ragged prompt, tokens")
    a = ap.parse_args()

    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(a.threads)
    bin_ = os.environ.get("FALCON_BIN", "target/release/falcon")
    model_dir = resolve_model(bin_, a.model)
    tok = AutoTokenizer.from_pretrained(model_dir)
    dev = "cuda" if a.device.startswith("cuda") else "cpu"
    print(f"model: {model_dir}\ndevice: {a.device}, threads: {a.threads}, new tokens: {a.tokens}, "
          f"greedy, repeats: {a.repeats} (median, min-max), load average {loadavg()}")
    # transformers runs in this process, so its OpenMP threads wait the way this process's
    # environment says: spinning by default, which decodes about 1.7x faster on an idle CPU
    # than passive (fp32 batch 1: 30.4 vs 17.5 tok/s). falcon always runs passive.
    print(f"transformers' OpenMP wait policy: {os.environ.get('OMP_WAIT_POLICY') or 'default (spins)'}"
          f"; falcon: passive\n")
    rows = []
    batches = [int(b) for b in a.batches.split(",") if b]
    if batches:
        print(f"{'dtype':6} {'batch':>5} {'falcon tok/s':>13} {'(min-max)':>11} "
              f"{'transformers tok/s':>19} {'(min-max)':>11} {'ratio':>7}")
    weight_bytes = {}
    for dtype in a.dtypes.split(",") if batches else []:
        model = hf_model(model_dir, dtype, dev)
        for batch in batches:
            enc = tok([PROMPT] * batch, return_tensors="pt").to(dev)

            def hf_once():
                return batch * a.tokens / hf_seconds(model, enc, a.tokens, tok.eos_token_id, dev)

            hf_once()  # warm-ups
            falcon_tps(bin_, model_dir, dtype, batch, a.tokens, a.threads, a.device)
            key = (dtype, batch)
            hf, ours = interleaved(a.repeats, hf_once, lambda: falcon_tps(
                bin_, model_dir, dtype, batch, a.tokens, a.threads, a.device), key)
            rows.append((dtype, batch, ours, hf))
            print(f"{dtype:6} {batch:>5} {ours:>13.1f} {spread('ours', key):>11} {hf:>19.1f} "
                  f"{spread('hf', key):>11} {ours / hf:>6.2f}x", flush=True)
        weight_bytes[dtype] = sum(p.numel() * p.element_size() for p in model.parameters())
        del model
    if dev == "cpu" and any(b == 1 for _, b, _, _ in rows):
        # Decode at batch 1 reads every weight once per token: bytes per token x tokens/s
        # against what a large copy moves on the same threads.
        bw = copy_bandwidth(a.threads)
        print(f"\nmemory roofline: a {512} MB copy moves {bw / 1e9:.1f} GB/s (read + write), "
              f"{a.threads} threads; load average {loadavg()}")
        print(f"{'dtype':6} {'weights MB':>10} {'falcon % of roofline':>21} {'transformers %':>15}")
        for dtype, batch, ours, hf in rows:
            if batch == 1:
                wb = weight_bytes[dtype]
                print(f"{dtype:6} {wb / 1e6:>10.0f} {100 * wb * ours / bw:>20.1f}% "
                      f"{100 * wb * hf / bw:>14.1f}%")
    if a.ragged:
        ragged(a, bin_, model_dir, tok, dev)


def ragged(a, bin_, model_dir, tok, dev):
    prompts = ragged_prompts(tok, a.ragged, a.ragged_max)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    enc = tok(prompts, return_tensors="pt", padding=True).to(dev)
    real = int(enc["attention_mask"].sum())
    padded = enc["attention_mask"].numel()
    print(f"\nragged batch: {a.ragged} prompts, {real} prompt tokens ({padded} padded), "
          f"{a.tokens} new tokens each")
    print(f"{'dtype':6} {'falcon s':>9} {'transformers s':>15} {'speed ratio':>12}")
    for dtype in a.dtypes.split(","):
        model = hf_model(model_dir, dtype, dev)

        def hf_once():
            return hf_seconds(model, enc, a.tokens, tok.pad_token_id, dev)

        # A cheap warm-up (one short row): transformers' first generate pays one-off set-up.
        hf_seconds(model, tok([PROMPT], return_tensors="pt").to(dev), 1, tok.pad_token_id, dev)
        hf, ours = interleaved(a.repeats, hf_once, lambda: falcon_seconds(
            bin_, model_dir, dtype, prompts, a.tokens, a.threads, a.device))
        print(f"{dtype:6} {ours:>9.1f} {hf:>15.1f} {hf / ours:>11.2f}x", flush=True)
        del model


if __name__ == "__main__":
    main()
