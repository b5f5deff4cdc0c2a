"""Load test of the retrieval server: bounded concurrency, a share of bad requests, health afterwards.

    python benchmarks/load_test_server.py [--concurrency 8] [--requests 100] [--bad-fraction 0.1]
                                          [--corpus PATH|SHARED_NAME] [--backend bm25] [--out results/bench/server_load.json]

The server runs as a subprocess (``python -m envs.search.server --port 0``, its own interpreter, so the
client threads do not share its GIL) on the generated knowledge base of the CPU default (or ``--corpus``).
``--concurrency`` client threads each send ``--requests`` requests over loopback HTTP, one at a time: a
one-query ``/retrieve`` whose query is a generated question (the trainer's request shape), or, with
probability ``--bad-fraction``, a bad one (malformed JSON or a body over the size limit). Reported:
requests/s over the whole run, p50/p99 latency of the good requests, how many good requests failed (any
status but 200, or no answer within ``--timeout``), how many bad ones were refused with a 4xx, and whether
``/health`` still answers afterwards. The figures go to stdout and, atomically (write then rename), to
``--out``. Absolute numbers depend on the machine and its load; the pass criteria are 0 failed good
requests, every bad request refused with a 4xx, and a healthy server at the end.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import select
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

from drmas.io import atomic_write_json  # noqa: E402
from envs.search.server import ServerLimits  # noqa: E402

logger = logging.getLogger("load_test_server")


def start_server(corpus: str, backend: str, startup_timeout_s: float = 120.0,
                 extra_args: Sequence[str] = ()) -> tuple[subprocess.Popen, str]:
    """A retrieval server subprocess on a free loopback port (``extra_args``: more server flags); returns
    (process, url)."""
    proc = subprocess.Popen([sys.executable, "-m", "envs.search.server", "--corpus", corpus, "--backend", backend,
                             "--port", "0", "--log-level", "warning", *extra_args], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    ready, _, _ = select.select([proc.stdout], [], [], startup_timeout_s)  # the server prints its address first
    line = proc.stdout.readline() if ready and proc.stdout else ""
    if not line.startswith("RETRIEVAL_SERVER_URL="):
        proc.kill()
        raise RuntimeError(f"retrieval server on {corpus} ({backend}) did not start within {startup_timeout_s}s "
                           f"(exit code {proc.poll()})")
    return proc, line.strip().split("=", 1)[1]


def bad_body(kind: str, limits: ServerLimits = ServerLimits()) -> bytes:
    """A request body the server must refuse with a 4xx: ``malformed`` JSON or ``oversized`` (> limit)."""
    if kind == "malformed":
        return b'{"queries": ["unclosed'
    return json.dumps({"queries": ["x"], "pad": "x" * (limits.max_body_bytes + 1)}).encode()


def run_load(url: str, queries: Sequence[str], concurrency: int, requests_per_worker: int, bad_fraction: float,
             timeout_s: float = 30.0, seed: int = 0) -> dict[str, Any]:
    """``concurrency`` threads x ``requests_per_worker`` requests against ``url``; returns the figures."""
    if concurrency < 1 or requests_per_worker < 1 or not 0 <= bad_fraction < 1 or not queries:
        raise ValueError("need concurrency >= 1, requests >= 1, 0 <= bad_fraction < 1 and at least one query")
    retrieve = url.rstrip("/") + "/retrieve"

    def worker(w: int) -> dict[str, Any]:
        rng = np.random.default_rng([seed, w])
        session = requests.Session()
        out: dict[str, Any] = {"good_ms": [], "good_failed": 0, "bad_sent": 0, "bad_refused": 0, "statuses": {}}
        for r in range(requests_per_worker):
            bad = rng.random() < bad_fraction
            if bad:
                body = bad_body("malformed" if rng.random() < 0.5 else "oversized")
            else:
                body = json.dumps({"queries": [queries[(w * requests_per_worker + r) % len(queries)]], "topk": 3,
                                   "return_scores": True}).encode()
            t0 = time.perf_counter()
            try:
                resp = session.post(retrieve, data=body, headers={"Content-Type": "application/json"}, timeout=timeout_s)
                status = resp.status_code
                ok = status == 200 and len(resp.json()["result"]) == 1
            except (requests.RequestException, ValueError, KeyError, TypeError):
                status, ok = -1, False
            ms = (time.perf_counter() - t0) * 1e3
            out["statuses"][status] = out["statuses"].get(status, 0) + 1
            if bad:
                out["bad_sent"] += 1
                out["bad_refused"] += int(400 <= status < 500)
            elif ok:
                out["good_ms"].append(ms)
            else:
                out["good_failed"] += 1
        return out

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        parts = list(pool.map(worker, range(concurrency)))
    wall = time.perf_counter() - t0
    good_ms = np.array([t for p in parts for t in p["good_ms"]])
    statuses: dict[str, int] = {}
    for p in parts:
        for status, n in p["statuses"].items():
            statuses[str(status)] = statuses.get(str(status), 0) + n
    try:
        healthy = requests.get(url.rstrip("/") + "/health", timeout=timeout_s).json().get("status") == "ok"
    except (requests.RequestException, ValueError):
        healthy = False
    total = concurrency * requests_per_worker
    return {"concurrency": concurrency, "requests": total, "seconds": wall, "req_per_s": total / wall,
            "good_requests": int(good_ms.size) + sum(p["good_failed"] for p in parts),
            "good_failed": sum(p["good_failed"] for p in parts),
            "p50_ms": float(np.percentile(good_ms, 50)) if good_ms.size else float("nan"),
            "p99_ms": float(np.percentile(good_ms, 99)) if good_ms.size else float("nan"),
            "bad_sent": sum(p["bad_sent"] for p in parts), "bad_refused_4xx": sum(p["bad_refused"] for p in parts),
            "statuses": statuses, "healthy_after": healthy}


def generated_corpus(folder: Path) -> tuple[str, list[str]]:
    """The CPU default's generated knowledge base as a corpus file, and its questions as queries."""
    from envs.search.corpus import write_jsonl
    from envs.search.generated import KBConfig, generate_kb, generate_tasks

    kb = generate_kb(KBConfig())
    path = write_jsonl(kb.passages, folder / "generated_kb.jsonl")
    return str(path), [t.question for t in generate_tasks(kb, 200, seed=0)]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=8, help="client threads (requests in flight at most)")
    parser.add_argument("--requests", type=int, default=100, help="requests per client thread")
    parser.add_argument("--bad-fraction", type=float, default=0.1, help="share of malformed / oversized requests")
    parser.add_argument("--corpus", default=None, help="corpus file or shared corpus name (default: generated KB)")
    parser.add_argument("--backend", default="bm25")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds a request may take before it fails")
    parser.add_argument("--out", default=str(ROOT / "results" / "bench" / "server_load.json"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        corpus, queries = generated_corpus(Path(tmp)) if args.corpus is None else (args.corpus, None)
        if queries is None:
            from envs.search.corpus import load_corpus, resolve_corpus_path

            queries = list(load_corpus(resolve_corpus_path(args.corpus)).titles[:200])  # titles as queries
        proc, url = start_server(corpus, args.backend)
        try:
            requests.post(url + "/retrieve", json={"queries": queries[:1]}, timeout=args.timeout)  # warm up
            report = run_load(url, queries, args.concurrency, args.requests, args.bad_fraction, args.timeout)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    report.update({"corpus": args.corpus or "generated_kb", "backend": args.backend,
                   "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]})
    atomic_write_json(Path(args.out), report, indent=2)
    print(f"{report['requests']} requests ({report['bad_sent']} bad) from {args.concurrency} threads in "
          f"{report['seconds']:.1f}s: {report['req_per_s']:.1f} requests/s, p50 {report['p50_ms']:.1f} ms, "
          f"p99 {report['p99_ms']:.1f} ms; good failed {report['good_failed']}, bad refused with 4xx "
          f"{report['bad_refused_4xx']}/{report['bad_sent']}, healthy after: {report['healthy_after']} -> {args.out}")
    return report


if __name__ == "__main__":
    main()
