"""Tools prove who they are: a retrieval server must serve the corpus the run's config names.

Checked before step 0 (``TaskSource.check_tools``, which ``drmas train``/``drmas eval`` call before any work) and
again after a reconnect (every answer carries the server's corpus hash; after a failed attempt ``/health`` is
asked again). Also: the retrieval server's command line reports user faults (missing corpus, a folder, a file
that is not a corpus JSONL, an index instead of a corpus, a port out of range or in use) as one line and a
non-zero exit, before it loads anything. Real servers throughout (``ServerThread`` or ``python -m
envs.search.server``) over small generated corpora.
"""
from __future__ import annotations

import gzip
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from envs.search.corpus import CorpusMismatch, load_corpus, write_jsonl
from envs.search.env import SEARCH_FAILED_OBSERVATION
from envs.search.generated import KBConfig, generate_kb
from envs.search.retriever import build_retriever
from envs.search.server import ServerThread, create_app

ROOT = Path(__file__).resolve().parents[1]
SEARCH = str(ROOT / "experiments/configs/cpu/search_base.yaml")
SMALL_KB = {"n_people": 12, "n_cities": 4, "n_companies": 4, "n_countries": 2}
OTHER_KB = {**SMALL_KB, "seed": 5}  # same sizes, other entities: another corpus


def _retriever(kb_args: dict, tmp: Path):
    """An in-process BM25 retriever over the generated KB, read back from its JSONL file as the CLI reads it."""
    path = tmp / f"kb_seed{kb_args.get('seed', 0)}.jsonl"
    corpus = load_corpus(write_jsonl(generate_kb(KBConfig(**kb_args)).passages, path))
    return build_retriever(corpus, "bm25", use_cache=False)


def _source(url: str, **kb_overrides):
    from drmas.tasks import make_task_source

    return make_task_source("search_generated", kb={**SMALL_KB, **kb_overrides}, n_test=5, server_url=url)


# ================================================================================== before step 0
def _search_run(tmp: Path, *extra: str) -> list[str]:
    """``drmas train`` arguments of a 3-step search run from the shipped nano base (no SFT warm-up)."""
    return ["train", SEARCH, "name=r", f"out_dir={tmp}/runs", "train.steps=3", "train.batch_tasks=2",
            "train.group_size=2", "train.eval_tasks=4", "train.eval_samples=1", "train.save_every=1", *extra,
            "--no-progress"]


def test_a_search_run_whose_server_serves_another_corpus_stops_before_step_0(tmp_path, capsys):
    """A live server over another knowledge base answers every query; the run must not end DONE with rewards and
    scores of 0, but exit 1 with one ``drmas:`` line naming the URL, the server's corpus and hash, the config's
    knowledge base and hash, and how to serve it; no records."""
    from drmas.cli import main

    retriever = _retriever(OTHER_KB, tmp_path)
    with ServerThread(create_app(retriever, corpus_label="other.jsonl")) as url:
        code = main(_search_run(tmp_path, f"env.args.server_url={url}"))
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("drmas: ", "  "))]
    assert code == 1 and len(err) == 1, err
    line = err[0]
    assert f"retrieval server {url} serves other.jsonl (sha256 {retriever.corpus.content_hash}, " in line
    kb = generate_kb(KBConfig(**yaml.safe_load(Path(SEARCH).read_text())["env"]["args"]["kb"]))
    assert f"the run needs the generated knowledge base of env.args.kb (seed 0) (sha256 {kb.corpus().content_hash}, " \
           f"{len(kb.passages)} passages)" in line
    assert "python -m envs.search.server --corpus data_cache/search_cpu/generated/seed0/corpus.jsonl" in line
    assert "or point env.args.server_url at a server that serves it" in line and line.endswith("nothing was trained")
    run = tmp_path / "runs" / "r"
    assert not (run / "metrics.jsonl").exists() and not (run / "DONE").exists()


def test_a_server_over_the_configs_corpus_passes_and_another_is_refused_by_check_tools(tmp_path):
    """The task source's check before step 0: the knowledge base's own corpus (written to JSONL and read back, as
    ``python -m envs.search.server`` does) passes; another one raises ToolUnavailable naming both hashes."""
    from drmas.tasks import ToolUnavailable

    right = _retriever(SMALL_KB, tmp_path)
    with ServerThread(create_app(right)) as url:
        source = _source(url)
        source.check_tools()  # no exception
        assert source.retriever.retrieve(["born"]).ok
    wrong = _retriever(OTHER_KB, tmp_path)
    with ServerThread(create_app(wrong)) as url:
        with pytest.raises(ToolUnavailable) as info:
            _source(url).check_tools()
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"env.args.server_url: retrieval server {url} serves ")
    assert wrong.corpus.content_hash in message and right.corpus.content_hash in message


class _PlainServer:
    """A stdlib server speaking Search-R1's ``POST /retrieve`` without the ``X-Corpus-Hash`` header (as Search-R1's
    own ``retrieval_server.py`` or an older drmas server): one passage per query. ``health``: what ``GET /health``
    answers (None: 404, the server cannot say which corpus it serves)."""

    def __init__(self, health: dict | None = None, port: int = 0):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                n = len(json.loads(self.rfile.read(int(self.headers["Content-Length"])))["queries"])
                doc = {"document": {"id": "0", "title": "T", "contents": '"T"\nsome text'}, "score": 1.0}
                self._send(200, json.dumps({"result": [[doc]] * n}).encode())

            def do_GET(self):
                if health is None:
                    self._send(404, b'{"detail": "Not Found"}')
                else:
                    self._send(200, json.dumps(health).encode())

            def _send(self, status, body):
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_server_that_does_not_say_which_corpus_it_serves_is_refused():
    """A server without ``/health`` (Search-R1's API only) answers queries, but cannot prove its corpus: refused
    before step 0, naming the URL, the corpus the run needs and the fix."""
    from drmas.tasks import ToolUnavailable

    server = _PlainServer(health=None)
    try:
        with pytest.raises(ToolUnavailable) as info:
            _source(server.url).check_tools()
    finally:
        server.close()
    assert f"retrieval server {server.url} does not say which corpus it serves" in str(info.value)
    assert "the generated knowledge base of env.args.kb (seed 0)" in str(info.value)


def _dataset_files(tmp: Path, kb) -> dict:
    from envs.search.generated import generate_tasks
    from envs.search.tasks import write_tasks

    tasks = generate_tasks(kb, 4, hops=(1,), seed=0)
    return {"train": str(write_tasks(tasks, tmp / "train.jsonl")),
            "test": {"kb": str(write_tasks(tasks, tmp / "test.jsonl"))}}


def test_search_dataset_checks_env_args_corpus_or_corpus_hash(tmp_path, caplog):
    """``search_dataset``: ``env.args.corpus`` (a JSONL path, hashed as the server hashes it) and
    ``env.args.corpus_hash`` are checked against the server; without either a warning says what the server
    serves and that it is not checked."""
    from drmas.tasks import ToolUnavailable, make_task_source

    kb = generate_kb(KBConfig(**SMALL_KB))
    right_file = write_jsonl(kb.passages, tmp_path / "right.jsonl")
    wrong = _retriever(OTHER_KB, tmp_path)
    files = _dataset_files(tmp_path, kb)
    with ServerThread(create_app(wrong, corpus_label="wrong.jsonl")) as url:
        def check(**args):
            make_task_source("search_dataset", **files, server_url=url, **args).check_tools()

        with pytest.raises(ToolUnavailable) as info:
            check(corpus=str(right_file))
        assert (f"serves wrong.jsonl (sha256 {wrong.corpus.content_hash}, {len(wrong.corpus)} passages), but the run "
                f"needs env.args.corpus = {right_file} (sha256 {kb.corpus().content_hash}, {len(kb.passages)} "
                f"passages): start the server on it (python -m envs.search.server --corpus {right_file})"
                ) in str(info.value)
        with pytest.raises(ToolUnavailable, match="the run needs env.args.corpus_hash"):
            check(corpus_hash=kb.corpus().content_hash)
        check(corpus_hash=wrong.corpus.content_hash)  # the hash the server reports: passes
        with caplog.at_level(logging.WARNING, logger="drmas.tasks"):
            check()
        assert "env.args.corpus is not set, so the corpus of the retrieval server" in caplog.text
        assert "wrong.jsonl" in caplog.text
        with pytest.raises(ToolUnavailable, match=r"env.args.corpus: corpus file .*missing.jsonl not found"):
            check(corpus=str(tmp_path / "missing.jsonl"))


# ================================================================================== after a reconnect
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_restarted_on_another_corpus_is_refused_after_the_reconnect(tmp_path):
    """Mid-run, the server dies (searches fail and are counted, as before) and another one over another corpus
    comes up on the same port: the next search raises CorpusMismatch naming both corpora (rather than feeding the
    other corpus's passages to the agents). A restart over the same corpus goes on as before."""
    from envs.search.generated import generate_tasks

    port = _free_port()
    right, wrong = _retriever(SMALL_KB, tmp_path), _retriever(OTHER_KB, tmp_path)
    source = None
    with ServerThread(create_app(right), port=port) as url:
        source = _source(url)
        source.check_tools()
        env = source.make_env()
        tasks = generate_tasks(source.kb, 2, hops=(1,), seed=1)
        env.reset(tasks)
        out = env.step([f"<search>{t.meta['hops'][0]['query']}</search>" for t in tasks])
        assert all(info["obs_valid"] for info in out.infos)
    source.retriever.backoff_s = 0.05  # the down phase: fail fast
    env.reset(tasks)
    out = env.step(["<search>who</search>"] * 2)  # nothing listens: a failed search, not an exception
    assert out.observations == [SEARCH_FAILED_OBSERVATION] * 2
    with ServerThread(create_app(wrong, corpus_label="other.jsonl"), port=port):
        with pytest.raises(CorpusMismatch) as info:
            env.step(["<search>who</search>"] * 2)
    message = str(info.value)
    assert "\n" not in message
    assert f"retrieval server {url} serves other.jsonl (sha256 {wrong.corpus.content_hash}" in message
    assert f"the run needs the generated knowledge base of env.args.kb (seed 0) (sha256 {right.corpus.content_hash}" \
        in message
    with ServerThread(create_app(right), port=port):  # the same corpus again: the run goes on
        env.reset(tasks)
        out = env.step([f"<search>{t.meta['hops'][0]['query']}</search>" for t in tasks])
        assert all(info["obs_valid"] for info in out.infos)


def test_a_server_without_the_answer_header_is_asked_again_after_a_reconnect():
    """A server whose answers carry no X-Corpus-Hash (an older drmas server) is checked through ``/health`` on
    the first answer after a failed attempt: one restarted over another corpus raises CorpusMismatch."""
    from envs.search.client import RetrievalClient
    from drmas.tasks import generated_kb_identity

    expected = generated_kb_identity(generate_kb(KBConfig(**SMALL_KB)))
    other = generate_kb(KBConfig(**OTHER_KB)).corpus()
    port = _free_port()
    server = _PlainServer({"corpus": "right.jsonl", "corpus_hash": expected.content_hash}, port=port)
    client = RetrievalClient(server.url, expected=expected, timeout_s=2, max_retries=0)
    try:
        client.check()
        assert client.retrieve(["born"]).ok
    finally:
        server.close()
    assert not client.retrieve(["born"]).ok  # nothing listens: a failed attempt
    server = _PlainServer({"corpus": "other.jsonl", "corpus_hash": other.content_hash, "passages": len(other)},
                          port=port)
    try:
        with pytest.raises(CorpusMismatch, match=f"serves other.jsonl \\(sha256 {other.content_hash}, "):
            client.retrieve(["born"])
    finally:
        server.close()


def test_a_run_whose_server_is_replaced_by_one_over_another_corpus_stops_at_the_next_step(tmp_path, monkeypatch):
    """A training run: step 0 searches the right corpus; before step 1 its server is replaced, on the same port,
    by one over another corpus. Step 1 raises CorpusMismatch (rather than training on the other corpus's passages,
    rewards 0, to DONE): step 0's record only, no DONE."""
    from drmas.config import load_config
    from drmas.trainer.trainer import Trainer

    kb_args = yaml.safe_load(Path(SEARCH).read_text())["env"]["args"]["kb"]
    port = _free_port()
    servers = {"now": ServerThread(create_app(_retriever(kb_args, tmp_path)), port=port)}
    url = servers["now"].start()
    real = Trainer.train_step

    def replace_server_before_step_1(self, step):
        if step == 1:
            servers["now"].stop()
            servers["now"] = ServerThread(create_app(_retriever(OTHER_KB, tmp_path), corpus_label="other.jsonl"),
                                          port=port)
            servers["now"].start()
        return real(self, step)

    monkeypatch.setattr(Trainer, "train_step", replace_server_before_step_1)
    cfg = load_config(SEARCH, _search_run(tmp_path, f"env.args.server_url={url}", "train.evaluate=false",
                                          "train.steps=2", "train.save_every=0")[2:-1])
    trainer = Trainer(cfg)
    try:
        with pytest.raises(CorpusMismatch, match=f"retrieval server {url} serves other.jsonl .* but the run needs the "
                                                 "generated knowledge base of env.args.kb"):
            trainer.train(progress=False)
    finally:
        trainer.close()
        servers["now"].stop()
    from drmas.io import read_jsonl

    assert [r["step"] for r in read_jsonl(cfg.run_dir / "metrics.jsonl")] == [0]
    assert not (cfg.run_dir / "DONE").exists()


def test_every_answer_is_checked_even_without_a_failed_attempt(tmp_path):
    """A server swapped between two calls with no failed attempt in between (the client's next connection goes
    to the new one): its answer's X-Corpus-Hash differs, so the call raises CorpusMismatch; the SFT traces
    (drawn through the same client) and any other caller see the same."""
    from envs.search.client import RetrievalClient
    from drmas.tasks import generated_kb_identity

    right, wrong = _retriever(SMALL_KB, tmp_path), _retriever(OTHER_KB, tmp_path)
    expected = generated_kb_identity(generate_kb(KBConfig(**SMALL_KB)))
    with ServerThread(create_app(wrong)) as url:
        client = RetrievalClient(url, expected=expected, timeout_s=5)
        with pytest.raises(CorpusMismatch, match=f"serves .*sha256 {wrong.corpus.content_hash}"):
            client.retrieve(["born"])
        assert client.failures == 0  # not a tool failure to be retried or tolerated
        assert RetrievalClient(url, timeout_s=5).retrieve(["born"]).ok  # no expected corpus: not checked
    with ServerThread(create_app(right)) as url:
        assert RetrievalClient(url, expected=expected, timeout_s=5).retrieve(["born"]).ok


# ================================================================================== the server's command line
def _server_main(argv: list[str], capsys) -> tuple[int, list[str]]:
    from envs.search.server import main

    code = main(argv)
    return code, capsys.readouterr().err.splitlines()


def _corpus(tmp: Path) -> Path:
    return write_jsonl(generate_kb(KBConfig(**SMALL_KB)).passages, tmp / "corpus.jsonl")


def test_the_server_cli_reports_a_missing_corpus_in_one_line_without_a_traceback(tmp_path):
    """``python -m envs.search.server --corpus missing.jsonl`` ends in one line and exit 2, not in a
    FileNotFoundError traceback from ``load_corpus`` (a real process: stderr holds nothing else)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DRMAS_DATA_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "envs.search.server", "--corpus", str(tmp_path / "missing.jsonl"),
                           "--port", "0"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"retrieval server: corpus file {tmp_path / 'missing.jsonl'} not found; give a corpus JSONL "
                           "path or one of the shared names ['2wikimultihopqa', 'hotpotqa_train', 'musique_train', "
                           "'wiki18_sample1000']\n")


def _make(tmp: Path, name: str, content: bytes | dict[str, str]) -> Path:
    """``tmp/name``: a file holding ``content`` (bytes), or a folder holding the files of ``content`` (a dict)."""
    path = tmp / name
    if isinstance(content, dict):
        path.mkdir()
        for inner, text in content.items():
            (path / inner).write_text(text)
    else:
        path.write_bytes(content)
    return path


CORPUS_FAULTS = [  # (what, file name, its content or a folder's files, a text the line holds)
    ("a folder", "dir", {}, "is a folder, not a corpus file"),
    ("a BM25 index folder", "idx", {"params.index.json": "{}"}, "is a BM25 index folder, not a corpus"),
    ("a faiss index", "e5_Flat.index", b"IxFI\x00\x03\x00\x00" + b"\x00" * 64, "is a faiss index"),
    ("a binary file", "blob.bin", bytes(range(256)), "is a binary file, not a corpus JSONL"),
    ("garbage text", "notes.txt", b"hello world\nsecond line\n", "line 1: not JSON"),
    ("a JSON array", "c.json", b'[{"id": 1, "text": "x"}]\n', "starts with a JSON list"),
    ("rows that are no passages", "qa.jsonl", b'{"question": "q", "answer": "a"}\n', "neither 'text' nor 'contents'"),
    ("a gzip file", "c.jsonl.gz", gzip.compress(b'{"id": 1, "text": "x"}\n'), "gzip-compressed"),
    ("an empty file", "empty.jsonl", b"", "is empty"),
    ("a damaged line after a good one", "bad.jsonl", b'{"id": 1, "text": "x"}\n{oops\n{"id": 2, "text": "y"}\n',
     "line 2: not a JSON record"),
]


@pytest.mark.parametrize("what, name, content, says", CORPUS_FAULTS, ids=[c[0] for c in CORPUS_FAULTS])
def test_the_server_cli_reports_a_wrong_corpus_file_kind_in_one_line(tmp_path, capsys, monkeypatch, what, name, content,
                                                                     says):
    """``--corpus`` naming a folder, an index, a binary or non-JSONL file, rows that are not passages: one line
    ``retrieval server: <problem>; <fix>`` and exit 2, and no index is built."""
    monkeypatch.setenv("DRMAS_DATA_DIR", str(tmp_path / "cache"))
    path = _make(tmp_path, name, content)
    code, err = _server_main(["--corpus", str(path), "--port", "0"], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("retrieval server: ") and str(path) in err[0] and says in err[0], err
    assert not (tmp_path / "cache" / "search").exists()


@pytest.mark.parametrize("port", [70000, -1])
def test_the_server_cli_reports_a_port_out_of_range_before_loading(tmp_path, capsys, port):
    """``--port 70000`` is refused in one line and exit 2 before the corpus is loaded or the index built, not
    with an OverflowError traceback from ``bind`` (the corpus named does not even exist)."""
    code, err = _server_main(["--corpus", str(tmp_path / "never-loaded.jsonl"), "--port", str(port)], capsys)
    assert code == 2 and err == [f"retrieval server: --port {port} is out of range; give a port in 0-65535 (0 picks "
                                 "a free one)"]


def test_the_server_cli_reports_a_port_that_is_no_number_in_one_line(capsys):
    """argparse's own errors (``--port abc``) are one line as well, not a usage block."""
    from envs.search.server import main

    with pytest.raises(SystemExit) as info:
        main(["--corpus", "never-loaded.jsonl", "--port", "abc"])
    assert info.value.code == 2
    assert capsys.readouterr().err == "retrieval server: argument --port: invalid int value: 'abc'; see --help\n"


def test_the_server_cli_reports_a_port_in_use_before_building_the_index(tmp_path, capsys, monkeypatch):
    """A port another process listens on: one line naming the address and the fix, exit 1, and no index built
    (not an ``Address already in use`` traceback after building the index)."""
    monkeypatch.setenv("DRMAS_DATA_DIR", str(tmp_path / "cache"))
    corpus = _corpus(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code, err = _server_main(["--corpus", str(corpus), "--port", str(port)], capsys)
    assert code == 1 and err == [f"retrieval server: 127.0.0.1:{port} is already in use (another retrieval server?); "
                                 "stop that process, give another --port, or --port 0 for a free one"]
    assert not (tmp_path / "cache" / "search").exists()


def test_the_server_cli_reports_a_host_that_is_not_here(tmp_path, capsys):
    code, err = _server_main(["--corpus", str(_corpus(tmp_path)), "--host", "no-such-host.invalid", "--port", "0"],
                             capsys)
    assert code == 1 and len(err) == 1 and err[0].startswith("retrieval server: --host no-such-host.invalid is not an "
                                                             "address of this machine"), err
