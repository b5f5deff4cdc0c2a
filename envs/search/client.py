"""HTTP client for a Search-R1 style retrieval server, built to never hang and never raise.

    client = RetrievalClient("http://127.0.0.1:8000", timeout_s=5, max_retries=2)
    batch = client.retrieve(queries, topk=3)       # RetrievalBatch; batch.error is set on failure

Each attempt waits at most ``timeout_s`` to connect and for the response headers, and the body must be
complete ``timeout_s`` after the request started (checked while it streams in; one blocked read can add
up to ``timeout_s``), so an attempt lasts under ``2 * timeout_s``. Connection errors, timeouts, 5xx
answers and malformed bodies are retried ``max_retries`` times with exponential backoff
(``backoff_s * 2**(attempt-1)``); a 4xx answer is not retried (the request itself is wrong). A call thus
returns within ``(max_retries + 1) * 2 * timeout_s + backoff_s * (2**max_retries - 1)`` seconds.

With ``expected`` (the :class:`~envs.search.corpus.CorpusIdentity` of the corpus the run names) the server must
prove it serves that corpus: :meth:`RetrievalClient.check` compares ``GET /health``'s ``corpus_hash``; every
answer's ``X-Corpus-Hash`` header is compared too, and after a failed attempt (the server died, restarted, or
another took its port) the first answer that comes back without that header is followed by a new ``/health``
check. A server that serves another corpus, or does not say which, raises
:class:`~envs.search.corpus.CorpusMismatch` (the one exception to "never raise": its answers would silently
score every question 0).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Sequence

import requests
import urllib3

from envs.search.corpus import CorpusIdentity, CorpusMismatch
from envs.search.retriever import RetrievalBatch

logger = logging.getLogger(__name__)


class _Retryable(Exception):
    pass


def _check_results(payload: Any, n_queries: int) -> list[list[dict[str, Any]]]:
    """Validate the ``{"result": [[{"document": {...}, "score": s}, ...], ...]}`` shape."""
    if not isinstance(payload, dict) or not isinstance(payload.get("result"), list):
        raise _Retryable(f"response has no 'result' list (got {type(payload).__name__})")
    results = payload["result"]
    if len(results) != n_queries:
        raise _Retryable(f"response has {len(results)} result lists for {n_queries} queries")
    for hits in results:
        if not isinstance(hits, list) or not all(
                isinstance(h, dict) and isinstance(h.get("document"), dict)
                and isinstance(h["document"].get("contents"), str) for h in hits):
            raise _Retryable("a result list is not [{'document': {'contents': str, ...}, 'score': float}, ...]")
    return results


CORPUS_HASH_HEADER = "X-Corpus-Hash"  # envs.search.server.CORPUS_HASH_HEADER (the server needs fastapi, this not)


def served_corpus(health: dict[str, Any]) -> str:
    """How a server's ``/health`` answer names its corpus: ``<corpus> (sha256 <hash>, <n> passages)``."""
    size = f", {health['passages']} passages" if isinstance(health.get("passages"), int) else ""
    return f"{health.get('corpus') or 'an unnamed corpus'} (sha256 {health.get('corpus_hash')}{size})"


def identity_problem(base_url: str, expected: CorpusIdentity, health: dict[str, Any] | None,
                     answer_hash: str | None = None) -> str | None:
    """One line saying why the server at ``base_url`` is not the one serving ``expected``, or None when its
    ``/health`` answer (``health``; None: it gave none) and, if given, an answer's ``X-Corpus-Hash``
    (``answer_hash``) both name ``expected.content_hash``."""
    if not isinstance(health, dict) or not isinstance(health.get("corpus_hash"), str):
        seen = f"answered with corpus hash {answer_hash}, " if answer_hash else ""
        return (f"retrieval server {base_url} {seen}does not say which corpus it serves (GET {base_url}/health gave "
                f"no corpus_hash), so it cannot be checked against {expected.describe()}: {expected.fix} (python -m "
                f"envs.search.server reports its corpus)")
    served = health["corpus_hash"]
    if answer_hash is not None and answer_hash != served:  # the answer came from another corpus than /health names
        return (f"retrieval server {base_url} answered from corpus sha256 {answer_hash} while its /health names "
                f"{served_corpus(health)}; the run needs {expected.describe()}: {expected.fix}")
    if served != expected.content_hash:
        return (f"retrieval server {base_url} serves {served_corpus(health)}, but the run needs "
                f"{expected.describe()}: {expected.fix}")
    return None


class RetrievalClient:
    """Batched ``POST /retrieve`` with timeouts and bounded retries; returns ``RetrievalBatch``."""

    def __init__(self, url: str, topk: int = 3, timeout_s: float = 10.0, max_retries: int = 2,
                 backoff_s: float = 0.5, max_batch: int = 256, expected: CorpusIdentity | None = None):
        """``expected``: the corpus the server must serve (None: not checked), see the module docstring."""
        if timeout_s <= 0 or max_retries < 0 or backoff_s < 0 or max_batch < 1:
            raise ValueError(f"need timeout_s > 0, max_retries >= 0, backoff_s >= 0, max_batch >= 1; got "
                             f"{timeout_s}, {max_retries}, {backoff_s}, {max_batch}")
        url = url.rstrip("/")
        self.url = url if url.endswith("/retrieve") else url + "/retrieve"
        self.base_url = self.url[: -len("/retrieve")]
        self.expected = expected
        self._reverify = False  # an attempt failed since the last check: verify the corpus on the next answer
        self.topk, self.timeout_s, self.max_retries = topk, timeout_s, max_retries
        self.backoff_s, self.max_batch = backoff_s, max_batch
        self._local = threading.local()  # one requests.Session per thread
        self._count_lock = threading.Lock()
        self.calls = 0  # queries asked (counters since the client was built; the trainer logs their increments)
        self.failures = 0  # queries whose retrieval failed after every retry
        self.last_error = ""

    @property
    def _session(self) -> requests.Session:
        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
        return self._local.session

    def _post_once(self, payload: dict[str, Any]) -> tuple[Any, str | None]:
        """One attempt under a hard deadline -> (decoded answer, its ``X-Corpus-Hash`` header or None); raises
        ``_Retryable`` or ``ValueError`` (4xx, not retried)."""
        deadline = time.monotonic() + self.timeout_s
        try:
            with self._session.post(self.url, json=payload, timeout=self.timeout_s, stream=True) as resp:
                body = bytearray()
                # read1: whatever one socket read returns. iter_content(n) waits until n bytes came in, so a
                # server trickling its body (a byte per 0.2 s) held a call for minutes past the deadline.
                while chunk := resp.raw.read1(65536, decode_content=True):
                    body += chunk
                    if time.monotonic() > deadline:
                        raise _Retryable(f"response body not complete after {self.timeout_s}s")
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as e:  # read1 raises urllib3's own
            raise _Retryable(f"{type(e).__name__}: {e}") from e
        if 400 <= resp.status_code < 500:
            raise ValueError(f"HTTP {resp.status_code}: {body[:300].decode('utf-8', 'replace')}")
        if resp.status_code != 200:
            raise _Retryable(f"HTTP {resp.status_code}: {body[:300].decode('utf-8', 'replace')}")
        try:
            return json.loads(body), resp.headers.get(CORPUS_HASH_HEADER)
        except ValueError as e:
            raise _Retryable(f"malformed JSON in response: {e}") from e

    def _verify_answer(self, answer_hash: str | None) -> None:
        """Raise ``CorpusMismatch`` unless an answer came from the expected corpus: its ``X-Corpus-Hash`` header
        names another hash, or, for the first answer without that header after a failed attempt, ``/health``
        names another corpus. When that ``/health`` does not answer, the answer is not used (``_Retryable``)."""
        expected = self.expected
        if expected is None:
            return
        if answer_hash is not None:
            if answer_hash != expected.content_hash:  # identity_problem is never None here: the hashes differ
                raise CorpusMismatch(str(identity_problem(self.base_url, expected, self.health(), answer_hash)))
            self._reverify = False  # the answer itself proved its corpus
        elif self._reverify:  # the server went away and something answers again: is it the same corpus?
            health = self.health()
            if health is None:
                raise _Retryable(f"after a reconnect, GET {self.base_url}/health did not answer, so the corpus of "
                                 "the answer cannot be confirmed")
            if problem := identity_problem(self.base_url, expected, health):
                raise CorpusMismatch(problem)
            self._reverify = False

    def _retrieve_chunk(self, queries: list[str], topk: int) -> RetrievalBatch:
        payload = {"queries": queries, "topk": topk, "return_scores": True}
        error = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                answer, answer_hash = self._post_once(payload)
                self._verify_answer(answer_hash)
                return RetrievalBatch(_check_results(answer, len(queries)))
            except CorpusMismatch:
                raise
            except ValueError as e:  # 4xx: retrying cannot help
                error = f"retrieval request rejected by {self.url}: {e}"
                break
            except _Retryable as e:
                self._reverify = self.expected is not None
                error = f"retrieval failed after {attempt + 1} attempt(s) at {self.url}: {e}"
                logger.warning("%s", error)
            except Exception as e:  # noqa: BLE001 -- the contract is: never raise to the caller
                error = f"unexpected client error at {self.url}: {type(e).__name__}: {e}"
                logger.warning("%s", error)
        return RetrievalBatch.failed(len(queries), error)

    def retrieve(self, queries: Sequence[str], topk: int | None = None) -> RetrievalBatch:
        """Top-k documents per query; on failure ``error`` is set and every result list is empty.
        Batches larger than ``max_batch`` are sent in chunks (all fail if one chunk fails)."""
        queries, topk = [str(q) for q in queries], self.topk if topk is None else topk
        batch = self._retrieve_all(queries, topk)
        with self._count_lock:
            self.calls += len(queries)
            if not batch.ok:
                self.failures += len(queries)
                self.last_error = batch.error or "retrieval failed"
        return batch

    def _retrieve_all(self, queries: list[str], topk: int) -> RetrievalBatch:
        results: list[list[dict[str, Any]]] = []
        for start in range(0, len(queries), self.max_batch):
            chunk = self._retrieve_chunk(queries[start:start + self.max_batch], topk)
            if not chunk.ok:
                return RetrievalBatch.failed(len(queries), chunk.error or "retrieval failed")
            results.extend(chunk.results)
        return RetrievalBatch(results)

    def check(self) -> None:
        """One query through the whole path (connect, retrieve, answer shape), with the retry policy; raises
        ``ConnectionError`` naming the URL when it fails, then (with ``expected``) :meth:`verify_identity`.
        Not counted in ``calls``/``failures``."""
        batch = self._retrieve_all(["service check"], 1)
        if not batch.ok:
            raise ConnectionError(f"retrieval service {self.url} does not answer: {batch.error}")
        if self.expected is not None:
            self.verify_identity()

    def verify_identity(self) -> None:
        """Ask ``GET /health`` which corpus the server serves; raise ``CorpusMismatch`` (one line naming both
        corpora, their hashes, the URL and the fix) unless it is ``expected``."""
        if self.expected is None:
            return
        if problem := identity_problem(self.base_url, self.expected, self.health()):
            raise CorpusMismatch(problem)
        self._reverify = False

    def health(self) -> dict[str, Any] | None:
        """``GET /health`` as a dict, or ``None`` when the server does not answer (or not with an object)."""
        try:
            resp = self._session.get(self.base_url + "/health", timeout=self.timeout_s)
            answer = resp.json() if resp.status_code == 200 else None
        except (requests.RequestException, ValueError):
            return None
        return answer if isinstance(answer, dict) else None
