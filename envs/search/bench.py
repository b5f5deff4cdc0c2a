"""Retrieval benchmarks on the shared corpora: latency, recall@k of gold passages, HTTP load test.

    python -m envs.search.bench [--topk 3] [--threads 8] [--requests 50] [--no-dense]

Definitions (paired testbeds hotpotqa_train / musique_train, 100 questions each, the question text is the
query, one retrieval, no multi-hop search):
- ``hit@k``: fraction of questions with at least one gold supporting passage in the top k.
- ``recall@k``: fraction of all gold passages (summed over questions, distinct per question) in the top k.
Gold passages: HotpotQA = passages titled by a supporting fact (exact); MuSiQue = one per hop,
reconstructed (``corpus.musique_gold_ids``); hops whose passage could not be located are left out of both
the numerator and the denominator.
Latency: ``batch`` = wall time of one call with all 100 questions / 100; ``single`` = median and p99 of 100
one-query calls (in process, index warm). Load test: a server subprocess on hotpotqa_train, ``--threads``
client threads each send ``--requests`` one-query requests over loopback HTTP (the client's full path:
JSON, validation); reports requests/s and p50/p99 latency per request.
"""
from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import numpy as np

from envs.paths import REPO_ROOT
from envs.search.client import RetrievalClient
from envs.search.corpus import SHARED_CORPORA, load_corpus, load_paired_questions, resolve_corpus_path
from envs.search.retriever import Retriever, build_retriever


def recall_at_k(retrieved: Sequence[Sequence[str]], gold: Sequence[Sequence[str | None]], k: int) -> dict[str, float]:
    """``hit@k`` and ``recall@k`` (see module docstring) of ranked id lists against gold id lists (``None``
    entries = unlocated gold, ignored; questions without any located gold are skipped)."""
    hits, found, total, questions = 0, 0, 0, 0
    for ranked, golds in zip(retrieved, gold):
        golds_set = {g for g in golds if g is not None}
        if not golds_set:
            continue
        top = set(ranked[:k])
        questions += 1
        hits += bool(golds_set & top)
        found += len(golds_set & top)
        total += len(golds_set)
    return {"hit": hits / max(questions, 1), "recall": found / max(total, 1), "questions": questions, "gold": total}


def latency(retriever: Retriever, queries: Sequence[str], topk: int) -> dict[str, float]:
    """Per-query latency in ms: one batched call, and single-query calls (median, p99)."""
    retriever.search(queries[:2], topk)  # warm up
    t0 = time.perf_counter()
    retriever.search(queries, topk)
    batch_ms = (time.perf_counter() - t0) * 1e3 / len(queries)
    single = []
    for q in queries:
        t0 = time.perf_counter()
        retriever.search([q], topk)
        single.append((time.perf_counter() - t0) * 1e3)
    return {"batch_ms": batch_ms, "single_p50_ms": float(np.median(single)),
            "single_p99_ms": float(np.percentile(single, 99))}


def load_test(corpus: str, backend: str, queries: Sequence[str], threads: int, requests_per_thread: int,
              topk: int) -> dict[str, float]:
    """Bounded concurrent load over loopback HTTP against a server subprocess (its own interpreter, so the
    client threads do not share its GIL): ``threads`` x ``requests_per_thread`` one-query requests."""
    proc = subprocess.Popen([sys.executable, "-m", "envs.search.server", "--corpus", corpus, "--backend", backend,
                             "--port", "0", "--log-level", "warning"], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("RETRIEVAL_SERVER_URL="):
            raise RuntimeError(f"retrieval server for {corpus}/{backend} did not start (exit code {proc.poll()})")
        client = RetrievalClient(line.strip().split("=", 1)[1], timeout_s=30, max_retries=0)

        def worker(w: int) -> tuple[list[float], int]:
            times, errors = [], 0
            for r in range(requests_per_thread):
                t0 = time.perf_counter()
                errors += not client.retrieve([queries[(w * requests_per_thread + r) % len(queries)]], topk).ok
                times.append((time.perf_counter() - t0) * 1e3)
            return times, errors

        client.retrieve(queries[:1], topk)  # warm up
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(worker, range(threads)))
        wall = time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    times = np.concatenate([t for t, _ in results])
    return {"requests": len(times), "errors": sum(e for _, e in results), "req_per_s": len(times) / wall,
            "p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99))}


def run(topk: int = 3, threads: int = 8, requests_per_thread: int = 50, dense: bool = True) -> dict[str, Any]:
    """All measurements as a nested dict (see module docstring)."""
    paired = {name: load_paired_questions(name) for name in ("hotpotqa_train", "musique_train")}
    probe = [t.question for t in paired["hotpotqa_train"][0]]
    report: dict[str, Any] = {"latency": {}, "recall": {}, "load": {}}
    backends = ("bm25", "dense") if dense else ("bm25",)
    for backend in backends:
        for name in SHARED_CORPORA:
            if backend == "dense" and name not in paired:
                continue  # dense only on the paired corpora (embedding is ~50 passages/s on 2 cores)
            tasks, corpus = paired[name] if name in paired else ([], load_corpus(resolve_corpus_path(name)))
            t0 = time.perf_counter()
            retriever = build_retriever(corpus, backend)
            build_s = time.perf_counter() - t0
            queries = [t.question for t in tasks] or probe
            report["latency"][f"{backend}/{name}"] = {"passages": len(corpus), "build_or_load_s": build_s,
                                                      **latency(retriever, queries, topk)}
            if tasks:
                batch = retriever.retrieve(queries, topk)
                ranked = [[h["document"]["id"] for h in hits] for hits in batch.results]
                report["recall"][f"{backend}/{name}"] = recall_at_k(ranked, [t.meta["gold_ids"] for t in tasks], topk)
            if name == "hotpotqa_train":
                report["load"][backend] = load_test(name, backend, queries, threads, requests_per_thread, topk)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--requests", type=int, default=50, help="requests per thread in the load test")
    parser.add_argument("--no-dense", action="store_true", help="skip the dense backend (first run embeds ~3k passages)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("bm25s").setLevel(logging.WARNING)
    report = run(args.topk, args.threads, args.requests, dense=not args.no_dense)
    print(f"retrieval latency per query (ms; topk={args.topk})")
    print(f"  {'backend/corpus':32s} {'passages':>8s} {'build/load s':>12s} {'batch':>7s} {'single p50':>10s} {'p99':>7s}")
    for key, r in report["latency"].items():
        print(f"  {key:32s} {r['passages']:8d} {r['build_or_load_s']:12.2f} {r['batch_ms']:7.2f} "
              f"{r['single_p50_ms']:10.2f} {r['single_p99_ms']:7.2f}")
    print(f"gold passages in top {args.topk} (question text as the query)")
    for key, r in report["recall"].items():
        print(f"  {key:32s} hit@{args.topk} {r['hit']:.3f}  recall@{args.topk} {r['recall']:.3f}  "
              f"({r['questions']} questions, {r['gold']} gold passages)")
    print(f"HTTP load test on loopback ({args.threads} threads x {args.requests} one-query requests, hotpotqa_train)")
    for backend, r in report["load"].items():
        print(f"  {backend:8s} {r['req_per_s']:8.1f} req/s  p50 {r['p50_ms']:.1f} ms  p99 {r['p99_ms']:.1f} ms  "
              f"errors {r['errors']}/{r['requests']}")


if __name__ == "__main__":
    main()
