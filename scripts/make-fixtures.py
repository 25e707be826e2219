#!/usr/bin/env python3
"""Make the tiny reference checkpoints the model tests compare against.

For each of Qwen2 and Llama this builds a tiny random model with transformers
(deterministic weights; odd sizes: GQA ratio 3, head_dim 10, vocab 131),
saves it as an HF directory under tests/fixtures/, and writes `reference.json`:
fp32 and bf16 logits for a fixed batch, greedy continuations for a batch and
for a ragged (left-padded) batch, all computed by transformers itself.

The Llama checkpoint is written sharded (model.safetensors.index.json) with
tied embeddings and llama3 RoPE scaling; the Qwen2 one is a single file with
an untied lm_head. Rerun with: .venv/bin/python scripts/make-fixtures.py
"""

import json
import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "fixtures")
NEW_TOKENS = 12

COMMON = dict(
    vocab_size=131,
    hidden_size=60,
    intermediate_size=84,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,  # GQA ratio 3
    head_dim=10,  # not a power of two
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

MODELS = {
    "tiny-qwen2": (
        Qwen2ForCausalLM,
        Qwen2Config(**COMMON, tie_word_embeddings=False, rope_theta=50000.0),
        None,
    ),
    "tiny-llama": (
        LlamaForCausalLM,
        LlamaConfig(
            **COMMON,
            tie_word_embeddings=True,
            rope_theta=10000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
        "100KB",  # small shard size: forces a sharded checkpoint
    ),
}

BATCH = [[5, 17, 99, 3, 64, 21, 8], [120, 7, 7, 45, 90, 33, 12]]
RAGGED = [[5, 17, 99, 3, 64, 21, 8], [44, 9, 130]]


def init_weights(model, seed):
    # Std 0.02 leaves logits nearly flat, so greedy ties would be decided by
    # rounding; larger weights give clear margins.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))


def greedy(model, prompts):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[:, width:].tolist()


def min_margin(logits):
    top2 = logits.float().topk(2, dim=-1).values
    return float((top2[..., 0] - top2[..., 1]).min())


def main():
    torch.manual_seed(0)
    for i, (name, (cls, cfg, shard)) in enumerate(MODELS.items()):
        model = cls(cfg).eval()
        init_weights(model, seed=1234 + i)
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            os.remove(os.path.join(d, f))
        kwargs = {"max_shard_size": shard} if shard else {}
        model.save_pretrained(d, safe_serialization=True, **kwargs)
        ids = torch.tensor(BATCH)
        with torch.no_grad():
            logits32 = model(ids).logits
            bf = cls.from_pretrained(d, dtype=torch.bfloat16).eval()
            logits16 = bf(ids).logits.float()
        ref = {
            "model_type": cfg.model_type,
            "input_ids": BATCH,
            "logits_fp32": logits32.tolist(),
            "logits_bf16": logits16.tolist(),
            "greedy": {"prompts": BATCH, "tokens": greedy(model, BATCH)},
            "greedy_ragged": {"prompts": RAGGED, "tokens": greedy(model, RAGGED)},
            "min_top2_margin_fp32": min_margin(logits32),
            "transformers": __import__("transformers").__version__,
            "torch": torch.__version__,
        }
        with open(os.path.join(d, "reference.json"), "w") as f:
            json.dump(ref, f)
        files = sorted(os.listdir(d))
        print(f"{name}: {files} margin={ref['min_top2_margin_fp32']:.4f}", file=sys.stderr)


if __name__ == "__main__":
    main()
