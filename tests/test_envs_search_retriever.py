"""In-process retrievers: BM25 and dense results, on-disk index cache, model integrity check, corpora."""
from __future__ import annotations

import json

import numpy as np
import pytest

from envs.search.corpus import Corpus, load_corpus, write_jsonl
from envs.search.generated import KBConfig, generate_kb, generate_tasks
from envs.search.retriever import (MINILM_SHA256, ModelIntegrityError, build_retriever, default_model_dir,
                                   verify_model_dir)


@pytest.fixture(scope="module")
def kb():
    return generate_kb(KBConfig(n_people=30, n_cities=10, n_companies=10, seed=5))


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def dense(kb, cache_root):
    return build_retriever(kb.corpus(), "dense", cache_root=cache_root)


def _gold_top1_rate(retriever, tasks) -> float:
    batch = retriever.retrieve([t.meta["hops"][0]["query"] for t in tasks], topk=3)
    return np.mean([t.meta["hops"][0]["passage_id"] in {h["document"]["id"] for h in hits}
                    for t, hits in zip(tasks, batch.results)])


def test_bm25_finds_gold_passages(kb, cache_root):
    retriever = build_retriever(kb.corpus(), "bm25", cache_root=cache_root)
    tasks = generate_tasks(kb, 60, hops=(1,), seed=0)
    assert _gold_top1_rate(retriever, tasks) == 1.0
    batch = retriever.retrieve(["who was born", "founded"], topk=5)
    assert batch.ok and [len(r) for r in batch.results] == [5, 5]
    scores = [h["score"] for h in batch.results[0]]
    assert scores == sorted(scores, reverse=True)
    assert set(batch.results[0][0]["document"]) == {"id", "title", "contents"}
    assert len(retriever.retrieve(["x"], topk=10_000).results[0]) == len(kb.passages)  # clamped to corpus size
    assert retriever.retrieve([], topk=3).results == []


def test_bm25_cache_roundtrip(kb, tmp_path):
    first = build_retriever(kb.corpus(), "bm25", cache_root=tmp_path)
    cache = first.index.cache_dir
    assert cache.parent == tmp_path / "search" / "index" and cache.name.endswith("-bm25")
    assert cache.name.startswith(kb.corpus().content_hash[:16])
    assert sorted(p.name for p in cache.parent.iterdir()) == [cache.name]  # no temp folders left behind
    second = build_retriever(kb.corpus(), "bm25", cache_root=tmp_path)
    queries = ["born in", "works for Corp", "founded 1900"]
    assert first.retrieve(queries).results == second.retrieve(queries).results


def test_dense_finds_gold_and_caches(kb, dense, cache_root):
    tasks = generate_tasks(kb, 30, hops=(1,), seed=0)
    assert _gold_top1_rate(dense, tasks) >= 0.9
    hits = dense.retrieve([kb.passages[7]["text"]], topk=3).results[0]
    assert hits[0]["document"]["id"] == kb.passages[7]["id"] and hits[0]["score"] == pytest.approx(1.0, abs=0.2)
    cache = dense.index.cache_dir
    assert cache.name.endswith(f"-dense-{MINILM_SHA256[:12]}")
    meta = json.loads((cache / "meta.json").read_text())
    assert meta["model_sha256"] == MINILM_SHA256 and meta["n"] == len(kb.passages)
    again = build_retriever(kb.corpus(), "dense", cache_root=cache_root)  # loads embeddings.npy
    queries = [t.question for t in tasks[:5]]
    assert dense.retrieve(queries).results == again.retrieve(queries).results


def test_model_sha256_is_checked(tmp_path):
    assert verify_model_dir(default_model_dir()) == MINILM_SHA256
    tampered = tmp_path / "model"
    tampered.mkdir()
    (tampered / "model.safetensors").write_bytes(b"not the weights")
    with pytest.raises(ModelIntegrityError, match="sha256 .* != expected .*pip install --force-reinstall"):
        verify_model_dir(tampered)
    with pytest.raises(ModelIntegrityError):
        build_retriever(Corpus(("a",), ("A",), ("text",)), "dense", model_dir=tampered, use_cache=False)
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        verify_model_dir(tmp_path / "missing")


def test_unknown_backend():
    with pytest.raises(ValueError, match="choose one of"):
        build_retriever(Corpus(("a",), ("A",), ("text",)), "tfidf")


def test_corpus_schemas_and_hash(tmp_path):
    path = write_jsonl([{"id": "1", "title": "A", "text": "alpha"}, {"id": "2", "contents": '"B"\nbeta'}],
                       tmp_path / "c.jsonl")
    corpus = load_corpus(path)
    assert corpus.titles == ("A", "B") and corpus.texts == ("alpha", "beta")
    assert corpus.document(1) == {"id": "2", "title": "B", "contents": '"B"\nbeta'}
    same = Corpus(("1", "2"), ("A", "B"), ("alpha", "beta"))
    other = Corpus(("1", "2"), ("A", "B"), ("alpha", "gamma"))
    assert corpus.content_hash == same.content_hash != other.content_hash
    with pytest.raises(ValueError, match="neither 'text' nor 'contents'"):
        Corpus.from_records([{"id": "1", "title": "x"}])
    with pytest.raises(ValueError, match="empty"):
        Corpus((), (), ())
    with pytest.raises(FileNotFoundError, match="shared names"):
        load_corpus(tmp_path / "nope.jsonl")
