#!/usr/bin/env python3
"""Check a GGUF -> Hugging Face conversion made by falcon-rl against transformers' own GGUF loader.

    check-gguf.py MODEL.gguf CONVERTED_DIR

Compares, with transformers' `from_pretrained(..., gguf_file=...)` as the reference:
  1. every tensor of the converted model.safetensors (max abs difference per tensor kind),
  2. the config values a model run depends on,
  3. logits of the converted model and the GGUF-loaded model on a few prompts,
  4. token ids of the converted tokenizer (through transformers and through the bare
     `tokenizers` library, which is what the Rust side uses) on code-heavy text, plus the
     rendered chat template.
Prints the comparison and exits non-zero on any mismatch.
"""

import argparse
import json
import os
import re
import sys

try:
    import torch
except ImportError as e:  # the PyPI torch wheel links CUDA libraries even for CPU use
    sys.exit(f"check-gguf: cannot import torch ({e}). The torch wheel needs its nvidia-* CUDA "
             "library wheels (cudnn, cublas, cusparse, cufft, curand, cufile, nccl, nvshmem, "
             "cusparselt, nvjitlink) installed or on LD_LIBRARY_PATH, even on a CPU-only host.")
from safetensors.torch import load_file
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

CODE_SAMPLE = '''<|im_start|>system
You write Python.<|im_end|>
<|im_start|>user
Fix this:<|im_end|>
<|im_start|>assistant
def fib(n: int) -> int:
    """Return the n-th Fibonacci number (0, 1, 1, 2, 3, 5, ...)."""
    if n < 2:
        return n
\ta, b = 0, 1
    for _ in range(n - 1):
        a, b = b, a + b  # 12345 + 67890 = 80235
    return b


class Café:
    π = 3.14159265358979
    emoji = "🚀✨ naïve — “quotes” 日本語 Ωmega"

    def __repr__(self):
        return f"Café(π={self.π!r}, {len('日本語')=})"

if __name__ == "__main__":
    print([fib(i) for i in range(10)], 0x1F, 1e-5, 1_000_000)
    x = {'k': [1,2,3]}\r\n    y = x['k'][::-1]   \n\n\n   trailing   
<|im_end|><|endoftext|><repo_name>falcon<file_sep>main.py'''

PROMPTS = [
    "def quicksort(arr):",
    "<|im_start|>user\nWrite a function that reverses a string.<|im_end|>\n<|im_start|>assistant\n",
    "The capital of France is",
]

CONFIG_KEYS = [
    "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_parameters", "max_position_embeddings",
    "vocab_size", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id",
    "attention_bias", "hidden_act",
]


def kind(name: str) -> str:
    return re.sub(r"\.\d+\.", ".N.", name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("converted")
    ap.add_argument("--logits-atol", type=float, default=None,
                    help="max abs logit difference allowed (default 1e-3 for float32, 0.5 otherwise)")
    args = ap.parse_args()
    gguf_dir, gguf_name = os.path.split(os.path.abspath(args.gguf))
    failures = []
    torch.manual_seed(0)

    ref = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32).eval()
    ours = AutoModelForCausalLM.from_pretrained(args.converted, dtype=torch.float32).eval()

    # 1. tensors
    stored = load_file(os.path.join(args.converted, "model.safetensors"))
    ref_sd = ref.state_dict()
    tied = bool(ref.config.tie_word_embeddings)
    expected = {k for k in ref_sd if not (tied and k == "lm_head.weight")}
    if set(stored) != expected:
        failures.append(f"tensor names differ: missing {sorted(expected - set(stored))[:5]}, "
                        f"extra {sorted(set(stored) - expected)[:5]}")
    dtypes = {t.dtype for t in stored.values()}
    per_kind = {}
    exact = True
    for name in sorted(expected & set(stored)):
        a, b = ref_sd[name], stored[name]
        if tuple(a.shape) != tuple(b.shape):
            failures.append(f"{name}: shape {tuple(b.shape)} != reference {tuple(a.shape)}")
            continue
        diff = (a - b.float()).abs().max().item()
        # A reduced-precision file must hold exactly the reference rounded to that dtype.
        if not torch.equal(a.to(b.dtype), b):
            exact = False
            failures.append(f"{name}: differs from the reference rounded to {b.dtype} (max abs {diff:.3g})")
        per_kind[kind(name)] = max(per_kind.get(kind(name), 0.0), diff)
    print(f"tensors: {len(stored)} stored as {sorted(str(d) for d in dtypes)}; "
          f"{'bit-exact' if exact else 'NOT exact'} vs the reference (cast to the stored dtype)")
    for k, v in sorted(per_kind.items()):
        print(f"  max |diff| {v:.3g}  {k}")

    # 2. config
    for key in CONFIG_KEYS:
        a, b = getattr(ref.config, key, None), getattr(ours.config, key, None)
        if a != b:
            failures.append(f"config.{key}: {b!r} != reference {a!r}")
    print("config: compared", ", ".join(CONFIG_KEYS))

    # 3. logits
    ref_tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    our_tok = AutoTokenizer.from_pretrained(args.converted)
    stored_dtype = next(iter(dtypes)) if len(dtypes) == 1 else None
    atol = args.logits_atol
    if atol is None:
        atol = 1e-3 if stored_dtype == torch.float32 else 0.5
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = ref_tok(prompt, return_tensors="pt").input_ids
            la, lb = ref(ids).logits, ours(ids).logits
            d = (la - lb).abs().max().item()
            same_top = torch.equal(la.argmax(-1), lb.argmax(-1))
            print(f"logits: max |diff| {d:.3g}, argmax equal {same_top}, {ids.shape[1]} tokens: {prompt[:40]!r}")
            if d > atol:
                failures.append(f"logits differ by {d:.3g} > {atol} on {prompt[:40]!r}")

    # 4. tokenizer
    raw = Tokenizer.from_file(os.path.join(args.converted, "tokenizer.json"))
    samples = {"code sample": CODE_SAMPLE, "digits": "x = 1234567890 + 3.14e-10", "spaces": "  a\n\n  b  "}
    for label, text in samples.items():
        for special in (True, False):
            a = ref_tok(text, add_special_tokens=special).input_ids
            b = our_tok(text, add_special_tokens=special).input_ids
            c = raw.encode(text, add_special_tokens=special).ids
            ok = a == b == c
            print(f"token ids ({label}, add_special_tokens={special}): {len(a)} tokens, "
                  f"{'identical' if ok else 'DIFFERENT'} (transformers GGUF / ours via transformers / ours via tokenizers)")
            if not ok:
                first = next((i for i, (x, y, z) in enumerate(zip(a, b, c)) if not x == y == z), min(len(a), len(b), len(c)))
                failures.append(f"token ids differ on {label} at position {first}: "
                                f"{a[first:first + 5]} / {b[first:first + 5]} / {c[first:first + 5]}")
        if ref_tok.decode(ref_tok(text).input_ids) != our_tok.decode(our_tok(text).input_ids):
            failures.append(f"decoded text differs on {label}")
    for attr in ("bos_token", "eos_token", "pad_token", "unk_token", "chat_template"):
        if getattr(ref_tok, attr) != getattr(our_tok, attr):
            failures.append(f"tokenizer.{attr}: {getattr(our_tok, attr)!r} != reference {getattr(ref_tok, attr)!r}")
    if ref_tok.chat_template:
        msgs = [{"role": "user", "content": "Write hello world in Python."}]
        a = ref_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        b = our_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        print(f"chat template: {'identical' if a == b else 'DIFFERENT'} rendering")
        if a != b:
            failures.append("chat template renders differently")

    gen_path = os.path.join(args.converted, "generation_config.json")
    gen = json.load(open(gen_path)) if os.path.exists(gen_path) else {}
    for key in ("bos_token_id", "eos_token_id"):
        if gen.get(key) != getattr(ref.config, key, None):
            failures.append(f"generation_config.{key}: {gen.get(key)!r} != {getattr(ref.config, key, None)!r}")

    if failures:
        print(f"FAILED: {len(failures)} mismatch(es)")
        for f in failures[:50]:
            print("  -", f)
        return 1
    print("OK: conversion matches transformers' GGUF loading")
    return 0


if __name__ == "__main__":
    sys.exit(main())
