"""Passage corpora: loading, hashing, and the shared closed-corpus multi-hop testbeds.

A corpus file is jsonl with one passage per line: ``{"id", "title", "text", "source"}`` (the unified
schema of ``shared/data/README.md``). Search-R1's wiki-18 format ``{"id", "contents"}`` with
``contents = '"Title"\\ntext'`` is read too.

Documents returned by retrievers follow Search-R1: ``{"id", "title", "contents"}`` where
``contents = '"<title>"\\n<text>'`` (the wiki-18 layout, so Search-R1 clients that split the title off the
first line of ``contents`` work unchanged).
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from drmas.io import JsonlDamaged
from drmas.io import read_jsonl as _read_jsonl
from drmas.io import write_jsonl as _write_jsonl
from envs.base import Task
from envs.paths import shared_data_dir
from envs.search.reward import normalize_answer

logger = logging.getLogger(__name__)

_POSSESSIVE = re.compile(r"['\u2019]s\b")

# Shared corpora (relative to shared_data_dir()); see shared/data/README.md.
SHARED_CORPORA: dict[str, str] = {
    "wiki18_sample1000": "corpus/flashrag_wiki18_sample1000.jsonl",
    "2wikimultihopqa": "corpus/hipporag_2wikimultihopqa_corpus.jsonl",
    "hotpotqa_train": "corpus/hipporag_hotpotqa_train/corpus.jsonl",
    "musique_train": "corpus/hipporag_musique_train/corpus.jsonl",
}
# The two corpora that come paired with 100 multi-hop questions each.
PAIRED_QUESTIONS: dict[str, str] = {
    "hotpotqa_train": "corpus/hipporag_hotpotqa_train/questions.jsonl",
    "musique_train": "corpus/hipporag_musique_train/questions.jsonl",
}


@dataclass(frozen=True)
class Corpus:
    """Column-oriented passages (row i = passage i)."""

    ids: tuple[str, ...]
    titles: tuple[str, ...]
    texts: tuple[str, ...]
    name: str = ""
    _hash: list[str] = field(default_factory=list, compare=False, repr=False)  # memo for content_hash

    def __post_init__(self) -> None:
        if not (len(self.ids) == len(self.titles) == len(self.texts)):
            raise ValueError(f"corpus columns differ in length: ids={len(self.ids)}, titles={len(self.titles)}, "
                             f"texts={len(self.texts)}")
        if len(self.ids) == 0:
            raise ValueError(f"corpus {self.name!r} is empty; give a jsonl file with at least one passage")

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def content_hash(self) -> str:
        """The corpus identity: sha256 (hex) over the passages as read, not over the file's bytes. Each passage
        ``i`` in file order contributes the UTF-8 bytes of ``json.dumps([id, title, text], ensure_ascii=False)``
        followed by ``\\n`` (``id``, ``title``, ``text`` as :meth:`from_records` reads them, so a Search-R1
        ``{"id", "contents"}`` file and its unified-schema twin hash alike; blank lines, key order, extra keys
        and JSON spacing do not count). The index-cache key, and what a retrieval server reports as
        ``corpus_hash`` (``GET /health``) and in the ``X-Corpus-Hash`` header of each answer."""
        if not self._hash:
            h = hashlib.sha256()
            for row in zip(self.ids, self.titles, self.texts):
                h.update(json.dumps(row, ensure_ascii=False).encode())
                h.update(b"\n")
            self._hash.append(h.hexdigest())
        return self._hash[0]

    def identity(self, name: str, fix: str) -> "CorpusIdentity":
        """This corpus as the one a run expects a retrieval server to serve (see :class:`CorpusIdentity`)."""
        return CorpusIdentity(name=name, content_hash=self.content_hash, passages=len(self), fix=fix)

    def index_texts(self) -> list[str]:
        """Text that the indexes see: title, newline, passage text."""
        return [f"{t}\n{x}" for t, x in zip(self.titles, self.texts)]

    def document(self, i: int) -> dict[str, str]:
        """Search-R1 document dict of passage ``i``."""
        return {"id": self.ids[i], "title": self.titles[i], "contents": f'"{self.titles[i]}"\n{self.texts[i]}'}

    @classmethod
    def from_records(cls, records: Iterable[dict[str, Any]], name: str = "") -> "Corpus":
        """Build from dicts in the unified schema (or Search-R1's ``{"id", "contents"}``)."""
        ids, titles, texts = [], [], []
        for n, rec in enumerate(records):
            if "text" in rec:
                title, text = rec.get("title", ""), rec["text"]
            elif "contents" in rec:  # Search-R1 wiki-18: '"Title"\ntext'
                head, _, text = rec["contents"].partition("\n")
                title = head.strip().strip('"')
            else:
                raise ValueError(f"passage {n} of corpus {name!r} has neither 'text' nor 'contents' "
                                 f"(keys: {sorted(rec)}); expected {{'id','title','text'}}")
            ids.append(str(rec.get("id", n)))
            titles.append(str(title))
            texts.append(str(text))
        return cls(tuple(ids), tuple(titles), tuple(texts), name=name)


@dataclass(frozen=True)
class CorpusIdentity:
    """The corpus a run expects its retrieval server to serve: ``name`` (how the config names it),
    ``content_hash`` (:attr:`Corpus.content_hash`), ``passages`` (None when only the hash is known) and
    ``fix`` (what the user should do when a server serves another corpus)."""

    name: str
    content_hash: str
    passages: int | None = None
    fix: str = "start the retrieval server on this corpus or point the run at a server that serves it"

    def describe(self) -> str:
        """``<name> (sha256 <hash>, <n> passages)``."""
        size = f", {self.passages} passages" if self.passages is not None else ""
        return f"{self.name} (sha256 {self.content_hash}{size})"


class CorpusMismatch(RuntimeError):
    """A retrieval server serves another corpus than the run's (or does not say which it serves): its answers
    would score every question 0. Never retried and never turned into a failed search: the run stops."""


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a jsonl file, by the project's one rule (:func:`drmas.io.read_jsonl`: blank lines skipped,
    a torn last line dropped with a warning, any other bad line an error naming the file and line)."""
    return _read_jsonl(path)


def load_corpus(path: str | Path) -> Corpus:
    """Load a jsonl corpus file (see module docstring for the accepted schemas). A line that is not JSON, other
    than a torn last one, raises ``JsonlDamaged`` naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {path} not found; give a jsonl path or one of the shared names "
                                f"{sorted(SHARED_CORPORA)} (see envs.search.corpus.resolve_corpus_path)")
    try:
        rows = read_jsonl(path)
    except JsonlDamaged as exc:  # drmas.io's message speaks of run records; say what to do with a corpus
        where = str(exc).split(" and not the last line")[0]
        raise JsonlDamaged(f"{where}: the corpus file is damaged; restore it or write it again") from None
    return Corpus.from_records(rows, name=path.stem)


def resolve_corpus_path(name_or_path: str | Path) -> Path:
    """A shared corpus name (``SHARED_CORPORA``) or a path -> the file path."""
    if str(name_or_path) in SHARED_CORPORA:
        return shared_data_dir() / SHARED_CORPORA[str(name_or_path)]
    return Path(name_or_path)


PASSAGE_KEYS = "one passage object per line, {\"id\", \"title\", \"text\"} or Search-R1's {\"id\", \"contents\"}"
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "a gzip-compressed file; decompress it first (gunzip)"),
    (b"PAR1", "a parquet file; convert it to JSONL first"),
    (b"\x93NUMPY", "a numpy array (embeddings?), not a corpus"),
    (b"PK\x03\x04", "a zip archive; unpack the corpus JSONL from it first"),
    (b"SQLite format 3", "an SQLite database, not a corpus"),
)
_FAISS_FOURCC = (b"IxF", b"IxH", b"IxP", b"IxI", b"IxS", b"IHN", b"IwF", b"IwP", b"IwQ", b"IwS", b"IvF", b"IPQ")


def corpus_file_problem(given: str, path: Path, head_bytes: int = 1 << 16) -> str | None:
    """What is wrong with ``path`` as a corpus file (``given``: what the user typed, a path or a shared name),
    with the fix; None when it exists and its first passage parses. Reads at most the first line (and the
    first ``head_bytes`` bytes), so it costs nothing before the corpus is loaded."""
    shared = given in SHARED_CORPORA
    if not path.exists():
        if shared:
            return (f"shared corpus {given!r} is not at {path}; set DRMAS_SHARED_DATA to the shared/data folder "
                    "that holds it, or give a corpus JSONL path")
        return (f"corpus file {path} not found; give a corpus JSONL path or one of the shared names "
                f"{sorted(SHARED_CORPORA)}")
    if path.is_dir():
        if (path / "params.index.json").is_file():
            return (f"{path} is a BM25 index folder, not a corpus; give the corpus JSONL it was built from "
                    "(the server builds and caches its own index)")
        inside = sorted(p.name for p in path.glob("*.jsonl"))[:3]
        hint = f" (it holds {', '.join(inside)})" if inside else ""
        return f"{path} is a folder, not a corpus file; give the corpus JSONL file{hint}"
    if not path.is_file():
        return f"{path} is not a regular file; give a corpus JSONL file"
    try:
        with open(path, "rb") as fh:
            head = fh.read(head_bytes)
    except OSError as exc:
        return f"corpus file {path} cannot be read ({exc.strerror or exc}); fix its permissions or give another file"
    return corpus_head_problem(path, head, whole_file=len(head) < head_bytes)


def corpus_head_problem(path: Path, head: bytes, whole_file: bool) -> str | None:
    """What is wrong with a corpus file whose first bytes are ``head`` (``whole_file``: they are all of it), see
    :func:`corpus_file_problem`. A first passage cut off by the end of ``head`` is left to the full load."""
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return f"{path} is {what}; give a corpus JSONL ({PASSAGE_KEYS})"
    if head[:3] in _FAISS_FOURCC or (path.suffix == ".index" and b"\0" in head):
        return (f"{path} is a faiss index, not a corpus; give the corpus JSONL the index was built over (the server "
                "builds and caches its own index from it)")
    if b"\0" in head:
        return f"{path} is a binary file, not a corpus JSONL; give a text file with {PASSAGE_KEYS}"
    text = head.decode("utf-8", errors="replace")  # as drmas.io.read_jsonl_lines decodes it
    if not text.strip():
        return f"corpus file {path} is empty; give a JSONL file with {PASSAGE_KEYS}"
    lines = text.split("\n")
    first_no, first = next((n, line) for n, line in enumerate(lines, 1) if line.strip())
    complete = whole_file or first_no < len(lines)  # the first passage ends inside the head
    try:
        row = json.loads(first)
    except ValueError as exc:
        if not complete and first.lstrip().startswith("{"):
            return None  # a passage longer than the head: the full load checks it
        return (f"{path}, line {first_no}: not JSON ({str(exc)[:80]}); a corpus is JSONL, {PASSAGE_KEYS}")
    if isinstance(row, list):
        return (f"{path} starts with a JSON list: a corpus is JSONL, {PASSAGE_KEYS} (convert a JSON array with "
                "one object per line)")
    if not isinstance(row, dict):
        return f"{path}, line {first_no}: a JSON {type(row).__name__}, not a passage; a corpus is JSONL, {PASSAGE_KEYS}"
    if "text" not in row and "contents" not in row:
        return (f"{path}, line {first_no}: a JSON object with neither 'text' nor 'contents' (keys: "
                f"{sorted(row)[:8]}), not a passage; give a corpus JSONL, {PASSAGE_KEYS}")
    return None


def write_jsonl(rows: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """Write rows (passages, tasks, traces) as jsonl atomically (:func:`drmas.io.write_jsonl`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_jsonl(path, list(rows))
    return path


# --------------------------------------------------------------------------------------------------
# Paired multi-hop questions with their gold supporting passages
# --------------------------------------------------------------------------------------------------

def load_paired_questions(name: str, corpus: Corpus | None = None) -> tuple[list[Task], Corpus]:
    """The 100 questions of a paired shared testbed and its corpus; ``task.meta["gold_ids"]`` lists the
    corpus ids of the gold supporting passages (one entry per hop, ``None`` where not located).

    - ``hotpotqa_train``: gold = the passages whose title is a ``supporting_facts`` title (titles are
      unique in that corpus, so this is exact).
    - ``musique_train``: reconstructed, see ``musique_gold_ids``.
    """
    if name not in PAIRED_QUESTIONS:
        raise KeyError(f"unknown paired testbed {name!r}; choose one of {sorted(PAIRED_QUESTIONS)}")
    corpus = corpus or load_corpus(resolve_corpus_path(name))
    rows = read_jsonl(shared_data_dir() / PAIRED_QUESTIONS[name])
    if name == "hotpotqa_train":
        gold = hotpotqa_gold_ids(rows, corpus)
    else:
        gold = musique_gold_ids(rows, corpus)
    tasks = [Task(task_id=r["id"], question=r["question"], answers=tuple(r["golden_answers"]), source=r["source"],
                  meta={**r.get("meta", {}), "gold_ids": g}) for r, g in zip(rows, gold)]
    return tasks, corpus


def hotpotqa_gold_ids(rows: Sequence[dict[str, Any]], corpus: Corpus) -> list[list[str | None]]:
    """Per question, the corpus id of each distinct supporting-fact title (``None`` if absent)."""
    by_title = {t: i for i, t in zip(corpus.ids, corpus.titles)}
    out = []
    for r in rows:
        titles = list(dict.fromkeys(t for t, _ in r["meta"]["supporting_facts"]))
        out.append([by_title.get(t) for t in titles])
    return out


def musique_gold_ids(rows: Sequence[dict[str, Any]], corpus: Corpus, max_dups: int = 12) -> list[list[str | None]]:
    """Reconstruct the gold passage of every MuSiQue hop (``None`` where it cannot be located).

    The shared questions file keeps ``paragraph_support_idx`` (an index into the question's own 20
    paragraphs) but not the paragraphs. The corpus is the union of those paragraphs, question by question,
    with exact duplicates of earlier paragraphs dropped (checked against HippoRAG's source file). So
    question q owns a contiguous block of ``20 - d_q`` passages, and its paragraph i sits in
    ``[start_q + i - d_q, start_q + i]``. A dynamic program over questions picks the block sizes (their sum
    is fixed by the corpus size) that let the most hops find a passage containing the hop's answer inside
    that window, preferring fewer dropped duplicates on ties; a hop's gold passage is the first
    answer-bearing passage of its window. Hops whose answer is in no window (the gold paragraph was itself
    a duplicate of an earlier one, or the answer is paraphrased) get ``None``. On the shared file this
    locates 229 of 237 hops and matches the source on the questions checked by hand.
    """
    n_paras, n_docs = 20, len(corpus)
    total_dups = n_paras * len(rows) - n_docs  # so question q starts in [20q - total_dups, 20q]
    # possessives dropped first, so that "Hall's" still contains the answer "Hall" on word boundaries
    texts = [f" {normalize_answer(_POSSESSIVE.sub('', x))} " for x in corpus.index_texts()]
    hops = [[(h["paragraph_support_idx"], f" {normalize_answer(h['answer'])} ")
             for h in r["meta"]["question_decomposition"]] for r in rows]
    # answer_at[q][h]: positions (in the range question q can occupy) whose text contains hop h's answer
    answer_at = []
    for q, q_hops in enumerate(hops):
        lo, hi = max(0, n_paras * q - total_dups), min(n_docs, n_paras * (q + 1))
        answer_at.append([{p for p in range(lo, hi) if a.strip() and a in texts[p]} for _, a in q_hops])

    def locate(start: int, dups: int, q: int) -> list[int | None]:
        end = start + n_paras - dups  # exclusive
        return [next((p for p in range(max(start, start + i - dups), min(start + i, end - 1) + 1)
                      if p in answer_at[q][h]), None) for h, (i, _) in enumerate(hops[q])]

    best: dict[int, tuple[float, list[int]]] = {0: (0.0, [])}  # start of question q -> (score, d_0..d_{q-1})
    for q in range(len(rows)):
        nxt: dict[int, tuple[float, list[int]]] = {}
        for start, (score, dups_so_far) in best.items():
            for dups in range(max_dups):
                new_start = start + n_paras - dups
                if new_start > n_docs:
                    continue
                hits = sum(p is not None for p in locate(start, dups, q))
                cand = (score + hits - 1e-3 * dups, dups_so_far + [dups])
                if new_start not in nxt or cand[0] > nxt[new_start][0]:
                    nxt[new_start] = cand
        best = nxt
    if total_dups < 0 or n_docs not in best:
        raise ValueError(f"could not align {len(rows)} MuSiQue questions with the {n_docs}-passage corpus; "
                         f"is it the union of their paragraphs (shared/data/corpus/hipporag_musique_train)?")
    out, start = [], 0
    for q, dups in enumerate(best[n_docs][1]):
        out.append([None if p is None else corpus.ids[p] for p in locate(start, dups, q)])
        start += n_paras - dups
    located = sum(g is not None for gs in out for g in gs)
    logger.info("musique gold passages: located %d of %d hops", located, sum(map(len, out)))
    return out
