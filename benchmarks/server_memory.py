"""Memory of the retrieval server under legal maximum-size requests: RSS before, at peak and afterwards.

    python benchmarks/server_memory.py [--corpus PATH|SHARED_NAME] [--backend bm25] [--requests 32]
                                       [--concurrency 8] [--shape queries|topk] [--out results/bench/server_memory.json]

The server runs as a subprocess (``python -m envs.search.server --port 0``, default limits) on the generated
knowledge base of the CPU default (or ``--corpus``). ``--requests`` requests of the largest size the server
accepts are sent from ``--concurrency`` client threads:

- ``--shape queries``: ``max_queries`` queries of ``max_query_chars`` characters each (words drawn from the
  corpus, so every query matches many passages), ``topk = max_hits // max_queries``, ``return_scores``;
- ``--shape topk``: ``max_hits // max_topk`` such queries with ``topk = max_topk``.

Reported: the server's resident set size (psutil, MiB) before the first request, the largest value seen
while they run (sampled every 20 ms), and 2 s after the last answer; the statuses; the size of the answers.
The pass criteria: every request answered 200, and the RSS kept afterwards within ``--max-kept-mib`` of the
RSS before (exit 1 otherwise). The figures go to stdout and, atomically, to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

from benchmarks.load_test_server import generated_corpus, start_server  # noqa: E402
from drmas.io import atomic_write_json  # noqa: E402
from envs.search.server import ServerLimits  # noqa: E402

MIB = 1 << 20


def max_size_body(words: list[str], shape: str, limits: ServerLimits = ServerLimits(), seed: int = 0) -> bytes:
    """A legal request body of the largest size the default limits allow (see the module docstring)."""
    rng = np.random.default_rng(seed)
    n = limits.max_queries if shape == "queries" else limits.max_hits // limits.max_topk
    topk = limits.max_hits // n
    queries = []
    for _ in range(n):
        text = ""
        while True:
            word = words[rng.integers(len(words))]
            if len(text) + len(word) + 1 > limits.max_query_chars:
                break
            text += word + " "
        queries.append(text.strip())
    return json.dumps({"queries": queries, "topk": topk, "return_scores": True}).encode()


def measure(url: str, pid: int, body: bytes, n_requests: int, concurrency: int,
            settle_s: float = 2.0) -> dict[str, Any]:
    proc = psutil.Process(pid)
    before = proc.memory_info().rss
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                peak[0] = max(peak[0], proc.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    def send(_: int) -> tuple[int, int]:
        resp = requests.post(url + "/retrieve", data=body, headers={"Content-Type": "application/json"}, timeout=300)
        return resp.status_code, len(resp.content)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        answers = list(pool.map(send, range(n_requests)))
    wall = time.perf_counter() - t0
    time.sleep(settle_s)
    done.set()
    sampler.join()
    after = proc.memory_info().rss
    statuses: dict[str, int] = {}
    for status, _ in answers:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    return {"requests": n_requests, "concurrency": concurrency, "seconds": wall, "statuses": statuses,
            "request_bytes": len(body), "answer_bytes_max": max(size for _, size in answers),
            "rss_before_mib": before / MIB, "rss_peak_mib": peak[0] / MIB, "rss_after_mib": after / MIB}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default=None, help="corpus file or shared corpus name (default: generated KB)")
    parser.add_argument("--backend", default="bm25")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--shape", choices=["queries", "topk"], default="queries")
    parser.add_argument("--server-args", default="", help="more server flags, e.g. '--malloc-arenas 0'")
    parser.add_argument("--max-kept-mib", type=float, default=100.0,
                        help="fail when the RSS 2 s after the last answer exceeds the RSS before by more")
    parser.add_argument("--out", default=str(ROOT / "results" / "bench" / "server_memory.json"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from envs.search.corpus import load_corpus, resolve_corpus_path

    with tempfile.TemporaryDirectory() as tmp:
        corpus = generated_corpus(Path(tmp))[0] if args.corpus is None else args.corpus
        texts = load_corpus(resolve_corpus_path(corpus)).texts
        words = sorted({w for t in texts[:2000] for w in t.split() if w.isalpha()})
        body = max_size_body(words, args.shape)
        proc, url = start_server(corpus, args.backend, extra_args=args.server_args.split())
        try:
            requests.post(url + "/retrieve", json={"queries": [words[0]]}, timeout=60)  # warm up
            time.sleep(1.0)
            report = measure(url, proc.pid, body, args.requests, args.concurrency)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    report.update({"corpus": args.corpus or "generated_kb", "backend": args.backend, "shape": args.shape,
                   "server_args": args.server_args,
                   "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]})
    atomic_write_json(Path(args.out), report, indent=2)
    kept = report["rss_after_mib"] - report["rss_before_mib"]
    ok = report["statuses"] == {"200": args.requests} and kept <= args.max_kept_mib
    print(f"{args.requests} requests of {report['request_bytes'] / MIB:.2f} MiB ({args.shape}, answers up to "
          f"{report['answer_bytes_max'] / MIB:.2f} MiB) from {args.concurrency} threads in {report['seconds']:.1f}s, "
          f"statuses {report['statuses']}: server RSS {report['rss_before_mib']:.0f} MiB before, "
          f"{report['rss_peak_mib']:.0f} MiB at peak, {report['rss_after_mib']:.0f} MiB after ({kept:+.0f} MiB kept) "
          f"-> {args.out}{'' if ok else '  FAIL'}")
    if not ok:
        raise SystemExit(1)
    return report


if __name__ == "__main__":
    main()
