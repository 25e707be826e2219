#!/usr/bin/env python3
"""Print transformers' logits for token ids, as JSON: the reference side of
the export and PEFT round-trip tests.

usage: ref-logits.py MODEL_DIR IDS_JSON [--adapter PEFT_DIR] [--dtype float32|bfloat16]
IDS_JSON is a list of equal-length lists of token ids. Loads MODEL_DIR with
AutoModelForCausalLM exactly as a user would (and the adapter with
peft.PeftModel.from_pretrained), so a file that transformers or peft cannot
read fails here.
"""

import argparse
import json

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("ids_json")
    ap.add_argument("--adapter")
    ap.add_argument("--dtype", default="float32")
    a = ap.parse_args()
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=getattr(torch, a.dtype))
    if a.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, a.adapter)
    model.eval()
    ids = torch.tensor(json.loads(a.ids_json))
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    print(json.dumps({"logits": logits.tolist()}))


if __name__ == "__main__":
    main()
