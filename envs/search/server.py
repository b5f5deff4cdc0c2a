"""Retrieval server speaking the Search-R1 API (FastAPI + uvicorn).

    python -m envs.search.server --corpus PATH|SHARED_NAME --backend bm25|dense [--host 127.0.0.1] [--port 0]

Endpoints:
- ``POST /retrieve`` with ``{"queries": [str, ...], "topk": 3, "return_scores": true}`` (a single
  ``"query": str`` is accepted too). Answer, as Search-R1's ``retrieval_server.py``:
  ``{"result": [[{"document": {"id", "title", "contents"}, "score": float}, ...], ...]}`` (one list per
  query, best first); with ``return_scores: false`` each list holds the bare document dicts.
  ``contents`` is ``'"<title>"\\n<text>'`` as in Search-R1's wiki-18 corpus.
- ``GET /health`` -> ``{"status": "ok", "backend", "corpus", "passages", "corpus_hash"}``: ``corpus`` is what
  ``--corpus`` named (a shared name with its file, or the path), ``corpus_hash`` the corpus identity
  (``Corpus.content_hash``: sha256 over the passages' (id, title, text), not over the file's bytes). Every
  ``/retrieve`` answer carries the same hash in its ``X-Corpus-Hash`` header, so a client checks each answer
  against the corpus its run names, also after the server was restarted behind it.

Bad requests get a 4xx with ``{"detail": "<what is wrong and the limit>"}``: 400 malformed JSON or JSON
nested deeper than ``max_json_depth``, 408 a body not sent within ``body_timeout_s``, 413 body/batch/query
too large, more than ``max_hits`` results (queries x topk) or an answer over ``max_response_bytes``
(checked on the passages' lengths before the answer is built, then on the encoded answer), 422 wrong field
types or topk out of range; 408 and a closed connection when a request's headers are not complete within
``header_timeout_s`` of the connection's start or of the previous answer (:func:`uvicorn_config`). Idle keep-alive
connections close after ``keep_alive_s``. After a request whose
body and answer together reach ``release_after_bytes``, the freed heap is handed back to the operating
system once the answer is sent (glibc ``malloc_trim(0)``; see ``release_memory``), and the server process
keeps one malloc arena (``--malloc-arenas``; see ``limit_malloc_arenas``), so a burst of large requests
does not leave it holding its peak memory.
``--port 0`` picks a free port; the chosen address is logged and printed as ``RETRIEVAL_SERVER_URL=...``.

Command-line faults (a corpus that is missing, a folder, not JSONL, an index instead of a corpus; a port out of
range, in use or not permitted; a bad limit) end the command with one line ``retrieval server: <problem>;
<fix>`` on stderr and exit status 2 (a wrong argument) or 1 (the port is taken or not permitted, the host is
not this machine's, the dense model cannot load), before the corpus is loaded or an index built; a damaged line
further into the corpus is reported the same way when the load reaches it.
"""
from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import functools
import json
import logging
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from starlette.background import BackgroundTask

from envs.search.retriever import BACKENDS, Retriever

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerLimits:
    """Request limits; anything above them is refused with a 4xx."""

    max_queries: int = 512  # queries per request (Search-R1 sends one batch per rollout step)
    max_query_chars: int = 4096  # characters per query
    max_topk: int = 100
    max_body_bytes: int = 4 << 20  # 4 MiB
    default_topk: int = 3
    max_json_depth: int = 400  # nesting of the request JSON (deeper: 400, not a RecursionError 500)
    max_hits: int = 4096  # queries x topk per request: bounds the answer's size and the memory it needs
    max_response_bytes: int = 16 << 20  # encoded answer (16 MiB; 4,096 hits of a ~1 KB passage are ~4.5 MiB)
    release_after_bytes: int = 1 << 20  # body + answer at least this large: hand freed heap back to the OS after it
    body_timeout_s: float = 30.0  # the whole body must arrive within this (else 408: no half-sent body stays open)
    keep_alive_s: float = 5.0  # idle keep-alive connections are closed after this (uvicorn timeout_keep_alive)
    header_timeout_s: float = 10.0  # a request's headers must be complete within this (else 408 and the close)

    def __post_init__(self) -> None:
        if min(self.max_queries, self.max_query_chars, self.max_topk, self.max_body_bytes, self.default_topk,
               self.max_json_depth, self.max_hits, self.max_response_bytes, self.release_after_bytes,
               self.body_timeout_s, self.keep_alive_s, self.header_timeout_s) <= 0:
            raise ValueError(f"all server limits must be > 0, got {self}")
        if self.default_topk > self.max_topk:
            raise ValueError(f"--topk {self.default_topk} exceeds --max-topk {self.max_topk}; lower --topk or "
                             "raise --max-topk")


@functools.cache
def _libc_function(name: str, argtypes: tuple[Any, ...]) -> Any:
    """A glibc function returning int (None where the C library lacks it: musl, macOS, Windows)."""
    path = ctypes.util.find_library("c")
    try:
        function = getattr(ctypes.CDLL(path), name, None) if path else None
    except OSError:
        return None
    if function is not None:
        function.argtypes, function.restype = list(argtypes), ctypes.c_int
    return function


M_ARENA_MAX = -8  # mallopt(3) parameter number in glibc's malloc.h


def limit_malloc_arenas(arenas: int) -> bool:
    """Let glibc's malloc use at most ``arenas`` arenas in this process (``mallopt(M_ARENA_MAX)``; call it
    before the request threads start); True if glibc took it.

    By default glibc gives each thread that allocates under contention its own arena (up to 8 per core),
    and ``malloc_trim`` cannot hand back the pages of those arenas that small live blocks pin: with the
    default, 16 maximum-size requests from 8 threads kept 32 MiB after ``malloc_trim(0)``, with one arena
    none. The request handlers run under the GIL, so one arena costs them no parallelism."""
    mallopt = _libc_function("mallopt", (ctypes.c_int, ctypes.c_int))
    return bool(mallopt is not None and mallopt(M_ARENA_MAX, arenas))


def release_memory() -> bool:
    """Hand the heap memory freed by a large request back to the operating system; True if glibc did it.

    CPython returns big blocks (numpy arrays, the answer's bytes) to glibc's malloc when they are freed, but
    glibc keeps freed pages inside its heaps (one arena per thread that allocated, and the request threads
    are many) for reuse, so the process's resident memory stays near its peak: 32 maximum-size requests
    left the server ~100 MiB above its start (907 MB of 980 MB before ``max_hits`` existed).
    ``malloc_trim(0)`` (glibc >= 2.8) walks every arena and returns each free page to the system
    (``MADV_DONTNEED``); it costs a few milliseconds, so the server calls it only after large requests.
    Elsewhere it does nothing and returns False."""
    trim = _libc_function("malloc_trim", (ctypes.c_size_t,))
    return bool(trim is not None and trim(0))


def answer_size_lower_bound(batch_results: list[list[dict[str, Any]]], return_scores: bool) -> int:
    """Characters the answer needs at least (passage texts, titles and ids), from strings already in memory:
    a too-large answer is refused before it is encoded."""
    per_hit = 40 if return_scores else 10
    return sum(len(doc["contents"]) + len(doc["title"]) + len(str(doc["id"])) + per_hit
               for hits in batch_results for doc in (hit["document"] for hit in hits))


def json_depth(body: bytes) -> int:
    """Deepest nesting of ``[``/``{`` in a JSON text (strings skipped), in one linear scan without recursion,
    so that a hostile ``[`` x 100k is refused before ``json.loads`` recurses into it."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


class RequestError(Exception):
    """A refused request: HTTP status and the message sent back as ``detail``."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def parse_request(body: bytes, limits: ServerLimits) -> tuple[list[str], int, bool]:
    """Validate a /retrieve body -> (queries, topk, return_scores); raises ``RequestError``."""
    if len(body) > limits.max_body_bytes:
        raise RequestError(413, f"request body exceeds the limit of {limits.max_body_bytes} bytes")
    if (depth := json_depth(body)) > limits.max_json_depth:
        raise RequestError(400, f"request JSON is nested {depth} levels deep; the limit is {limits.max_json_depth}")
    try:
        req = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise RequestError(400, f"request body is not valid JSON ({e}); send "
                                f'{{"queries": ["..."], "topk": 3, "return_scores": true}}') from None
    if not isinstance(req, dict):
        raise RequestError(422, f"request must be a JSON object, got {type(req).__name__}")
    if ("queries" in req) == ("query" in req):
        raise RequestError(422, "give exactly one of 'queries' (list of strings) or 'query' (string)")
    queries = req["queries"] if "queries" in req else [req["query"]]
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise RequestError(422, "'queries' must be a list of strings ('query' a string)")
    if not queries:
        raise RequestError(422, "'queries' is empty; send at least one query")
    if len(queries) > limits.max_queries:
        raise RequestError(413, f"{len(queries)} queries in one request; the limit is {limits.max_queries}, "
                                f"split the batch")
    longest = max(map(len, queries))
    if longest > limits.max_query_chars:
        raise RequestError(413, f"a query has {longest} characters; the limit is {limits.max_query_chars}")
    topk = req.get("topk", None)
    topk = limits.default_topk if topk is None else topk
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= limits.max_topk:
        raise RequestError(422, f"'topk' must be an integer in [1, {limits.max_topk}], got {topk!r}")
    if len(queries) * topk > limits.max_hits:
        raise RequestError(413, f"{len(queries)} queries x topk {topk} = {len(queries) * topk} results; the limit is "
                                f"{limits.max_hits} per request, split the batch or lower topk")
    return_scores = req.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise RequestError(422, f"'return_scores' must be true or false, got {return_scores!r}")
    return queries, topk, return_scores


CORPUS_HASH_HEADER = "X-Corpus-Hash"
"""Response header of every ``/retrieve`` answer: the ``content_hash`` of the corpus that produced it."""


def create_app(retriever: Retriever, limits: ServerLimits = ServerLimits(), corpus_label: str | None = None) -> Any:
    """FastAPI app serving ``retriever``; ``corpus_label`` is how ``/health`` names the corpus (default: the
    corpus's own name)."""
    app = FastAPI(title="drmas retrieval server (Search-R1 API)")
    app.state.limits = limits

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "backend": retriever.backend, "corpus": corpus_label or retriever.corpus.name,
                "passages": len(retriever.corpus), "corpus_hash": retriever.corpus.content_hash}  # hash memoized

    @app.post("/retrieve")
    async def retrieve(request: Request) -> Any:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limits.max_body_bytes:
            return JSONResponse({"detail": f"request body ({declared} bytes) exceeds the limit of "
                                           f"{limits.max_body_bytes} bytes"}, status_code=413)
        body = bytearray()

        async def read_body() -> None:
            async for chunk in request.stream():  # stop reading once over the limit (chunked uploads too)
                body.extend(chunk)
                if len(body) > limits.max_body_bytes:
                    break

        try:  # a half-sent body does not hold the connection
            await asyncio.wait_for(read_body(), limits.body_timeout_s)
        except asyncio.TimeoutError:
            return JSONResponse({"detail": f"request body not received within {limits.body_timeout_s} s"},
                                status_code=408, headers={"Connection": "close"})
        try:
            queries, topk, return_scores = parse_request(bytes(body), limits)
            content = await run_in_threadpool(answer, queries, topk, return_scores)
        except RequestError as e:
            return refuse(e, len(body))
        return Response(content, media_type="application/json",
                        headers={CORPUS_HASH_HEADER: retriever.corpus.content_hash},
                        background=release_after(len(body) + len(content)))  # released once sent

    def answer(queries: list[str], topk: int, return_scores: bool) -> bytes:
        """The encoded answer, or ``RequestError`` 413 when it would exceed ``max_response_bytes``."""
        results = retriever.retrieve(queries, topk).results
        too_large = (f"the answer to {len(queries)} queries x topk {topk} is {{}} bytes; the limit is "
                     f"{limits.max_response_bytes} per request (max_response_bytes), split the batch or lower topk")
        if (bound := answer_size_lower_bound(results, return_scores)) > limits.max_response_bytes:
            raise RequestError(413, too_large.format(f"over {bound}"))
        if not return_scores:
            results = [[hit["document"] for hit in hits] for hits in results]
        content = json.dumps({"result": results}, ensure_ascii=False, allow_nan=False,
                             separators=(",", ":")).encode("utf-8")  # what JSONResponse writes
        if len(content) > limits.max_response_bytes:
            raise RequestError(413, too_large.format(len(content)))
        return content

    def refuse(error: RequestError, body_bytes: int) -> JSONResponse:
        return JSONResponse({"detail": error.detail}, status_code=error.status, background=release_after(body_bytes))

    def release_after(nbytes: int) -> BackgroundTask | None:
        """Give freed memory back to the OS once a response that moved ``nbytes`` is sent (large ones only)."""
        return BackgroundTask(release_memory) if nbytes >= limits.release_after_bytes else None

    return app


def reserve_port(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A TCP socket bound to ``(host, port)`` but not listening yet: the port is taken (``port=0`` -> a free
    one; read it from ``getsockname()``) while connections to it are still refused. Raises ``OSError``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket (``port=0`` -> a free port; read it from ``getsockname()``)."""
    sock = reserve_port(host, port)
    sock.listen(128)
    return sock


def port_problem(port: int) -> str | None:
    """What is wrong with ``--port`` before any socket is made (None: it is in range)."""
    if not 0 <= port <= 65535:
        return f"--port {port} is out of range; give a port in 0-65535 (0 picks a free one)"
    return None


def bind_problem(host: str, port: int, exc: OSError) -> str:
    """One line for a ``bind``/``listen`` that failed: the address, the cause and the fix."""
    import errno

    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (f"{where} is already in use (another retrieval server?); stop that process, give another --port, "
                "or --port 0 for a free one")
    if exc.errno == errno.EACCES:
        return f"{where}: permission denied (ports below 1024 need root); give a --port of 1024 or above, or 0"
    if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
        return f"--host {host} is not an address of this machine ({exc.strerror or exc}); give 127.0.0.1 or 0.0.0.0"
    return f"cannot bind {where} ({exc.strerror or exc}); give another --host/--port"


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def uvicorn_config(app: Any, log_level: str) -> Any:
    """uvicorn's config for an app of :func:`create_app`, with its :class:`ServerLimits`: idle keep-alive
    connections close after ``keep_alive_s``, and a request whose headers do not finish within ``header_timeout_s``
    gets 408 and the connection is closed (uvicorn itself waits for them forever, so a client that never finishes its
    headers would hold a connection and its memory for good)."""
    import uvicorn

    limits = getattr(app.state, "limits", ServerLimits())
    return uvicorn.Config(app, log_level=log_level, lifespan="off", timeout_keep_alive=int(limits.keep_alive_s),
                          http=_header_deadline_protocol(limits.header_timeout_s))


def _header_deadline_protocol(header_timeout_s: float) -> type:
    """uvicorn's h11 protocol with a deadline for each request's headers: from the connection's start, and again
    from each answer; a request whose headers are complete by then is served as usual (its body has
    ``body_timeout_s``)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    detail = json.dumps({"detail": f"request headers not received within {header_timeout_s} s"}).encode()
    answer = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
              b"content-length: " + str(len(detail)).encode() + b"\r\n\r\n" + detail)

    class HeaderDeadlineProtocol(H11Protocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_header_deadline()

        def on_response_complete(self) -> None:
            self._arm_header_deadline()  # for the next request: one that starts at once (pipelined) disarms it
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._header_deadline.cancel()
            super().connection_lost(exc)

        def _arm_header_deadline(self) -> None:
            if getattr(self, "_header_deadline", None) is not None:
                self._header_deadline.cancel()
            self._header_deadline = self.loop.call_later(header_timeout_s, self._headers_overdue, self.cycle)

        def _headers_overdue(self, cycle: Any) -> None:
            if self.cycle is cycle and not self.transport.is_closing():  # no request began since the deadline was set
                self.transport.write(answer)
                self.transport.close()

    return HeaderDeadlineProtocol


class ServerThread:
    """Run an app with uvicorn in a background thread (tests, in-process trainers).

        with ServerThread(create_app(retriever)) as url: ...
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, startup_timeout_s: float = 30.0):
        import uvicorn

        self.sock = bind_socket(host, port)
        self.url = _url(self.sock)
        self.server = uvicorn.Server(uvicorn_config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.startup_timeout_s = startup_timeout_s

    def start(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"uvicorn did not start on {self.url} within {self.startup_timeout_s}s")
            time.sleep(0.01)
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", required=True,
                        help="corpus jsonl ({id,title,text} or Search-R1 {id,contents}) or a shared corpus name")
    parser.add_argument("--backend", choices=BACKENDS, default="bm25")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--topk", type=int, default=3, help="default topk when a request gives none")
    parser.add_argument("--max-topk", type=int, default=ServerLimits.max_topk, help="largest topk a request may ask")
    parser.add_argument("--max-queries", type=int, default=ServerLimits.max_queries)
    parser.add_argument("--max-query-chars", type=int, default=ServerLimits.max_query_chars)
    parser.add_argument("--max-hits", type=int, default=ServerLimits.max_hits, help="queries x topk per request")
    parser.add_argument("--max-response-bytes", type=int, default=ServerLimits.max_response_bytes,
                        help="largest encoded answer; a larger one is refused with 413")
    parser.add_argument("--malloc-arenas", type=int, default=1,
                        help="glibc malloc arenas of the server process (0: glibc's default of 8 per core); one "
                             "lets the memory of large requests go back to the system afterwards")
    parser.add_argument("--no-cache", action="store_true", help="rebuild the index, do not read or write the cache")
    parser.add_argument("--log-level", default="info")


class UsageProblem(Exception):
    """A command-line fault: printed as one ``retrieval server: ...`` line, the command exits with ``code``."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def check_arguments(args: argparse.Namespace) -> tuple[ServerLimits, Path]:
    """Everything about the flags that can be checked without loading the corpus -> (limits, corpus file);
    raises :class:`UsageProblem`."""
    from envs.search.corpus import corpus_file_problem, resolve_corpus_path

    try:
        limits = ServerLimits(max_queries=args.max_queries, max_query_chars=args.max_query_chars,
                              max_topk=args.max_topk, max_hits=args.max_hits, default_topk=args.topk,
                              max_response_bytes=args.max_response_bytes)
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None
    if args.malloc_arenas < 0:
        raise UsageProblem(f"--malloc-arenas must be >= 0, got {args.malloc_arenas}")
    if problem := port_problem(args.port):
        raise UsageProblem(problem)
    path = resolve_corpus_path(args.corpus)
    if problem := corpus_file_problem(args.corpus, path):
        raise UsageProblem(problem)
    return limits, path


def corpus_label(given: str, path: Path) -> str:
    """How ``/health`` names the corpus: the path, or a shared name with its file."""
    return given if Path(given) == path else f"{given} ({path})"


def load_retriever(path: Path, backend: str, use_cache: bool) -> Retriever:
    """Load the corpus and build (or read) its index; a corpus or model that cannot be used raises
    :class:`UsageProblem` naming the file."""
    from envs.search.corpus import load_corpus
    from envs.search.retriever import ModelIntegrityError, build_retriever

    try:
        corpus = load_corpus(path)
    except ValueError as exc:  # a damaged line (JsonlDamaged), an empty corpus, a row that is no passage
        raise UsageProblem(f"corpus {path} cannot be used: {exc}") from None
    try:
        return build_retriever(corpus, backend, use_cache=use_cache)
    except (ImportError, FileNotFoundError, ModelIntegrityError) as exc:  # the dense model's package or weights
        raise UsageProblem(f"the {backend} backend cannot start: {exc}", code=1) from None


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one ``retrieval server: ...`` line (no usage block), exit 2."""

    def error(self, message: str) -> Any:
        self.exit(2, f"retrieval server: {message}; see --help\n")


def main(argv: list[str] | None = None) -> int:
    """Serve until stopped; a command-line fault prints one line and returns 2 (or 1), see the module docstring."""
    parser = OneLineParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return serve(args)
    except UsageProblem as exc:
        print(f"retrieval server: {exc}", file=sys.stderr, flush=True)
        return exc.code


def serve(args: argparse.Namespace) -> int:
    """Check the flags and the corpus file, take the port, load the corpus and index, then serve."""
    import uvicorn

    limits, path = check_arguments(args)  # nothing loaded yet: a bad flag or file costs nothing
    try:
        sock = reserve_port(args.host, args.port)  # before the index is built: a taken port costs nothing either
    except OSError as exc:
        raise UsageProblem(bind_problem(args.host, args.port, exc), code=1) from None
    with sock:
        logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        if args.malloc_arenas and not limit_malloc_arenas(args.malloc_arenas):
            logger.info("no glibc mallopt here: --malloc-arenas has no effect")
        logging.getLogger("bm25s").setLevel(logging.WARNING)
        retriever = load_retriever(path, args.backend, use_cache=not args.no_cache)
        try:
            sock.listen(128)
        except OSError as exc:  # another process bound the same port meanwhile and listens on it
            raise UsageProblem(bind_problem(args.host, sock.getsockname()[1], exc), code=1) from None
        url = _url(sock)
        logger.info("retrieval server (%s, corpus %s: %d passages, sha256 %s) listening on %s", args.backend,
                    corpus_label(args.corpus, path), len(retriever.corpus), retriever.corpus.content_hash, url)
        print(f"RETRIEVAL_SERVER_URL={url}", flush=True)
        uvicorn.Server(uvicorn_config(create_app(retriever, limits, corpus_label(args.corpus, path)),
                                      log_level=args.log_level.lower())).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
