#!/usr/bin/env python3
"""Long-term memory speed against the Python `faiss-cpu` package: top-10
inner-product search over N x D unit vectors drawn from a mixture of Gaussian
clusters (1M x 384 by default), single queries and batches, with faiss-cpu's
IndexFlatIP next to falcon-rl's exact index and its FAISS IVF index on the same
data, same machine, same thread count; and the insert of 10k entries with the
hash embedder and one SQLite commit. A benchmark, not a test.

    scripts/bench/run memory [--n N] [--queries N] [--batch N] [--threads N] [--nprobe N]

Needs about 4 GB of RAM and 1.6 GB of disk under /var/tmp for the shared data file.
"""
import argparse
import json
import os
import statistics
import subprocess
import time

import numpy as np


def make_data(path_data, path_q, n, d, clusters, nq, seed):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, d), dtype=np.float32)
    x = np.empty((n, d), dtype=np.float32)
    step = 100_000
    for s in range(0, n, step):
        m = min(step, n - s)
        which = rng.integers(0, clusters, m)
        x[s:s + m] = centres[which] + 0.35 * rng.standard_normal((m, d), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = x[rng.integers(0, n, nq)] + 0.1 * rng.standard_normal((nq, d), dtype=np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    x.tofile(path_data)
    q.astype(np.float32).tofile(path_q)
    return x, q.astype(np.float32)


def bench_faiss(x, q, batch, threads):
    import faiss
    faiss.omp_set_num_threads(threads)
    t = time.perf_counter()
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    build = time.perf_counter() - t
    index.search(q[:1], 10)
    single = []
    for i in range(len(q)):
        t = time.perf_counter()
        index.search(q[i:i + 1], 10)
        single.append(time.perf_counter() - t)
    t = time.perf_counter()
    for s in range(0, len(q), batch):
        index.search(q[s:s + batch], 10)
    batch_s = (time.perf_counter() - t) * batch / len(q)
    return {"build_s": build, "single_s": statistics.median(single), "batch_s": batch_s,
            "version": faiss.__version__}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--clusters", type=int, default=1000)
    ap.add_argument("--queries", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--nlist", type=int, default=1024)
    ap.add_argument("--nprobe", type=int, default=16)
    ap.add_argument("--dir", default="/var/tmp/falcon-bench-memory")
    ap.add_argument("--rust", required=True, help="the Rust side's command (prints JSON)")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    pd, pq = os.path.join(a.dir, "data.f32"), os.path.join(a.dir, "queries.f32")
    x, q = make_data(pd, pq, a.n, a.dim, a.clusters, a.queries, 0)
    py = bench_faiss(x, q, a.batch, a.threads)
    del x
    cmd = a.rust.format(data=pd, queries=pq, dim=a.dim, batch=a.batch, threads=a.threads,
                        nlist=a.nlist, nprobe=a.nprobe)
    rs = json.loads(subprocess.check_output(cmd, shell=True).decode().strip().splitlines()[-1])
    for p in (pd, pq):
        os.unlink(p)

    print("top-10 inner product, %d x %d (%d Gaussian clusters), %d queries, %d threads"
          % (a.n, a.dim, a.clusters, a.queries, a.threads))
    print("%-44s %12s %14s %12s" % ("index", "single (ms)", "batch %d (s)" % a.batch, "queries/s"))
    rows = [("faiss-cpu %s IndexFlatIP" % py["version"], py),
            ("falcon-rl exact (libtorch, CPU)", rs["exact"])]
    if "faiss_ivf" in rs:
        r = rs["faiss_ivf"]
        rows.append(("falcon-rl FAISS IVF%d nprobe %d" % (r["nlist"], r["nprobe"]), r))
    for name, r in rows:
        print("%-44s %12.2f %14.3f %12.0f" % (name, r["single_s"] * 1e3, r["batch_s"], a.batch / r["batch_s"]))
    print("ratio exact / faiss-cpu flat: single %.2fx, batch %.2fx (>1 = falcon-rl faster)"
          % (py["single_s"] / rs["exact"]["single_s"], py["batch_s"] / rs["exact"]["batch_s"]))
    if "faiss_ivf" in rs:
        r = rs["faiss_ivf"]
        print("ratio IVF / faiss-cpu flat: single %.1fx, batch %.1fx; IVF recall@10 vs exact %.3f; build %.1f s"
              % (py["single_s"] / r["single_s"], py["batch_s"] / r["batch_s"], r["recall_at_10"], r["build_s"]))
    print("insert 10k entries (hash embedder + SQLite commit + index): %.3f s (target < 2 s)" % rs["insert_10k_s"])
    print("load average %.1f on %d CPUs" % (os.getloadavg()[0], os.cpu_count()))


if __name__ == "__main__":
    main()
