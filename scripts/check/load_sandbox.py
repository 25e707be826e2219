#!/usr/bin/env python3
"""Bounded load test of `falcon sandbox serve` on loopback (see scripts/check/load-sandbox).

N runs through /run_code from C concurrent clients (threads, each with its own
HTTP connection), a fixed mix of programs that pass, fail, time out and crash.
Every run prints its own id, so each answer is matched to its request: a run
whose answer is missing, repeated, or not what its program must give is an
error. The server's resident memory (its process and its sandbox workers) is
sampled while it runs. Prints latency p50/p99, runs/s, the outcome counts and
the memory at each tenth of the run, as a table and one JSON line; exits
non-zero when a result was lost, duplicated or wrong, or memory grew by more
than --max-growth-mb from the second tenth of the runs on.
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time

import requests

KINDS = {
    # kind: (program with {id}, expected run status, expected return code, share)
    "pass": ("print({id})", "Finished", 0, 70),
    "fail": ("print({id})\nassert {id} < 0, 'wrong'", "Finished", 1, 15),
    "crash": ("print({id}, flush=True)\nimport os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", "Finished", -11, 10),
    "timeout": ("print({id}, flush=True)\nwhile True:\n    pass", "TimeLimitExceeded", None, 5),
}


def plan(n):
    order = [k for k, v in KINDS.items() for _ in range(v[3])]
    return [(i, order[i % len(order)]) for i in range(n)]


def tree_rss_kb(pid):
    """Resident memory of `pid` and all its descendants, KiB."""
    children = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open("/proc/%s/stat" % p) as f:
                    st = f.read()
                ppid = int(st[st.rfind(")") + 2:].split()[1])
                children.setdefault(ppid, []).append(int(p))
            except (OSError, ValueError, IndexError):
                pass
    total, stack = 0, [pid]
    while stack:
        q = stack.pop()
        try:
            with open("/proc/%d/status" % q) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
        stack.extend(children.get(q, []))
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--pid", type=int, required=True, help="the server's pid (memory)")
    ap.add_argument("--runs", type=int, default=10000)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=0.3, help="run_timeout of every run, seconds")
    ap.add_argument("--max-growth-mb", type=float, default=64.0)
    args = ap.parse_args()

    work = plan(args.runs)
    next_i = [0]
    lock = threading.Lock()
    answers = {}  # id -> list of (kind, status, rc, stdout)
    latencies = []
    errors = []
    http_codes = {}

    def client():
        s = requests.Session()
        while True:
            with lock:
                if next_i[0] >= len(work):
                    return
                i, kind = work[next_i[0]]
                next_i[0] += 1
            body = {"code": KINDS[kind][0].format(id=i), "language": "python", "run_timeout": args.timeout}
            t0 = time.perf_counter()
            for attempt in range(20):
                try:
                    r = s.post(args.url + "/run_code", json=body, timeout=60)
                except requests.RequestException as e:
                    with lock:
                        errors.append("run %d: %s" % (i, e))
                    break
                with lock:
                    http_codes[r.status_code] = http_codes.get(r.status_code, 0) + 1
                if r.status_code == 503:  # at capacity: the client's to retry
                    time.sleep(0.05 * (attempt + 1))
                    continue
                if r.status_code != 200:
                    with lock:
                        errors.append("run %d: HTTP %d %s" % (i, r.status_code, r.text[:200]))
                    break
                v = r.json()
                rr = v.get("run_result") or {}
                with lock:
                    latencies.append(time.perf_counter() - t0)
                    answers.setdefault(int(i), []).append(
                        (kind, v.get("status"), rr.get("status"), rr.get("return_code"), (rr.get("stdout") or "").strip()))
                break

    mem = []
    done = threading.Event()

    def sampler():
        while not done.is_set():
            with lock:
                k = len(latencies)
            mem.append((k, tree_rss_kb(args.pid)))
            done.wait(0.5)

    # Warm-up, not counted: every worker started (a pool warms its slots in
    # the background), so the memory baseline is the warm server's.
    workers = requests.get(args.url + "/health", timeout=10).json().get("workers", 1)
    warm = [threading.Thread(target=lambda: requests.post(
        args.url + "/run_code", json={"code": "print(0)", "language": "python"}, timeout=120))
        for _ in range(4 * workers)]
    for t in warm:
        t.start()
    for t in warm:
        t.join()

    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    ms = threading.Thread(target=sampler)
    t0 = time.perf_counter()
    ms.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    done.set()
    ms.join()
    mem.append((len(latencies), tree_rss_kb(args.pid)))

    outcomes = {}
    for i, kind in work:
        got = answers.get(i, [])
        if len(got) != 1:
            errors.append("run %d (%s): %d answers" % (i, kind, len(got)))
            continue
        _, status, run_status, rc, out = got[0]
        want_status, want_rc = KINDS[kind][1], KINDS[kind][2]
        label = "%s/%s" % (run_status, rc)
        outcomes[label] = outcomes.get(label, 0) + 1
        if status == "SandboxError":
            errors.append("run %d (%s): SandboxError" % (i, kind))
        elif run_status != want_status or (want_rc is not None and rc != want_rc) or out != str(i):
            errors.append("run %d (%s): got %s rc=%s stdout=%r" % (i, kind, run_status, rc, out[:40]))

    lat = sorted(latencies)
    p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan")
    # Memory at each tenth of the runs; growth is measured from the second
    # tenth on: during the first, 64 connection threads first exist at once
    # (stacks, allocator arenas) and the workers warm up.
    tenths = []
    for k in range(1, 11):
        target = k * args.runs // 10
        cands = [m for (n, m) in mem if n <= target]
        tenths.append(cands[-1] if cands else mem[0][1])
    growth_mb = (max(tenths[2:]) - tenths[1]) / 1024.0
    print("| runs | clients | wall s | runs/s | p50 ms | p99 ms | max ms | lost or duplicated or wrong |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print("| %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %d |" % (
        args.runs, args.clients, wall, len(lat) / wall, p(0.5) * 1e3, p(0.99) * 1e3, (lat[-1] if lat else 0) * 1e3, len(errors)))
    print("outcomes: " + ", ".join("%s %d" % kv for kv in sorted(outcomes.items())))
    print("HTTP: " + ", ".join("%s %d" % kv for kv in sorted(http_codes.items())))
    print("server + workers RSS at each tenth (MiB): " + " ".join("%.0f" % (m / 1024.0) for m in tenths)
          + "; growth from the second tenth on %.1f MiB" % growth_mb)
    print(json.dumps({"runs": args.runs, "clients": args.clients, "wall_s": wall, "runs_per_s": len(lat) / wall,
                      "p50_ms": p(0.5) * 1e3, "p99_ms": p(0.99) * 1e3, "errors": len(errors), "outcomes": outcomes,
                      "http": http_codes, "rss_mib_tenths": [m / 1024.0 for m in tenths], "growth_mib": growth_mb}))
    for e in errors[:20]:
        print("ERROR " + e, file=sys.stderr)
    if errors or growth_mb > args.max_growth_mb:
        sys.exit(1)


if __name__ == "__main__":
    main()
