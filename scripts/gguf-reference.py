#!/usr/bin/env python3
"""transformers' own reading of a GGUF file, as the reference for falcon's GGUF path.

usage: gguf-reference.py MODEL.gguf TEXTS_JSON OUT_DIR

TEXTS_JSON is a list of strings. For each text, transformers' GGUF tokenizer
(`AutoTokenizer.from_pretrained(dir, gguf_file=...)`) gives token ids
(without special tokens added) and transformers' GGUF model
(`AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`, dequantised)
gives logits in fp32 and bf16. Writes OUT_DIR/ids.json (with the chat template rendered\nfor a fixed conversation) and
OUT_DIR/logits.safetensors (`fp32.N`, `bf16.N` for text N, [T, vocab] fp32).
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer


CHAT = [
    {"role": "system", "content": "You write Python."},
    {"role": "user", "content": "Reverse a string.\n  Keep it short."},
]


def main():
    gguf, texts_json, out = sys.argv[1:4]
    d, name = os.path.split(os.path.abspath(gguf))
    texts = json.load(open(texts_json))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    tensors = {}
    for dtype in ("fp32", "bf16"):
        tdt = torch.float32 if dtype == "fp32" else torch.bfloat16
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=tdt).eval()
        with torch.no_grad():
            for i, row in enumerate(ids):
                logits = model(input_ids=torch.tensor([row])).logits[0].float()
                tensors[f"{dtype}.{i}"] = logits.contiguous()
        del model
    os.makedirs(out, exist_ok=True)
    chat = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    json.dump({"ids": ids, "chat": chat}, open(os.path.join(out, "ids.json"), "w"))
    save_file(tensors, os.path.join(out, "logits.safetensors"))


if __name__ == "__main__":
    main()
