"""QA and corpus loaders (shared files), the generated knowledge base and its role traces, prepare, bench."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from envs.base import Task
from envs.search import bench, generated, prepare, tasks
from envs.search.corpus import SHARED_CORPORA, load_corpus, load_paired_questions, resolve_corpus_path
from envs.search.env import SearchEnv, parse_action
from envs.search.retriever import build_retriever

# ---- generated knowledge base --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kb():
    return generated.generate_kb(generated.KBConfig(n_people=50, seed=11))


@pytest.fixture(scope="module")
def retriever(kb):
    return build_retriever(kb.corpus(), "bm25", use_cache=False)


def test_kb_is_deterministic_and_consistent(kb):
    again = generated.generate_kb(generated.KBConfig(n_people=50, seed=11))
    assert again.passages == kb.passages and again.facts == kb.facts
    other = generated.generate_kb(generated.KBConfig(n_people=50, seed=12))
    assert other.passages != kb.passages
    names = [n.lower() for kind in kb.entities.values() for n in kind]
    assert len(names) == len(set(names))  # no name is reused across or within kinds
    by_id = {p["id"]: p for p in kb.passages}
    for (subject, relation), obj in kb.facts.items():
        passage = by_id[kb.fact_passage[(subject, relation)]]
        assert passage["title"] == subject and obj in passage["text"]
    assert max(len(p["text"]) for p in kb.passages) < 80  # short, for byte-level tiny models


def test_grouped_facts_per_passage():
    kb3 = generated.generate_kb(generated.KBConfig(n_people=10, facts_per_passage=3))
    assert len(kb3.passages) < len(kb3.facts) and len({p["title"] for p in kb3.passages}) == len(kb3.passages)


def test_tasks_deterministic_answerable_and_disjoint(kb):
    a = generated.generate_tasks(kb, 100, seed=4)
    assert a == generated.generate_tasks(kb, 100, seed=4) and a != generated.generate_tasks(kb, 100, seed=5)
    for t in a:
        hops = t.meta["hops"]
        assert len(hops) == t.meta["n_hops"] in (1, 2) and t.answers == (hops[-1]["answer"],)
        assert hops[0]["subject"] in t.question and t.answers[0] not in t.question
        if len(hops) == 2:
            assert hops[1]["subject"] == hops[0]["answer"] and hops[0]["answer"] in hops[1]["query"]
    assert {t.meta["n_hops"] for t in generated.generate_tasks(kb, 30, hops=(2,))} == {2}
    train, test = generated.generate_splits(kb, 80, 40, seed=1)
    key = lambda t: (t.meta["template"], t.meta["hops"][0]["subject"])  # noqa: E731
    assert len(train) == 80 and len(test) == 40 and not {key(t) for t in train} & {key(t) for t in test}
    with pytest.raises(ValueError, match="only"):
        generated.generate_tasks(kb, 100_000)


def test_role_traces(kb, retriever):
    task_list = generated.generate_tasks(kb, 40, seed=0)
    traces = generated.build_traces(task_list, retriever)
    json.dumps(traces)  # plain data
    two_hop = next(t for t in task_list if t.meta["n_hops"] == 2)
    recs = [r for r in traces if r["task"]["task_id"] == two_hop.task_id]
    assert [r["role"] for r in recs] == ["verifier", "search", "single_agent"] * 2 + ["verifier", "answer", "single_agent"]
    verifier = [r for r in recs if r["role"] == "verifier"]
    assert [r["target"] for r in verifier] == ["<verify>no</verify>"] * 2 + ["<verify>yes</verify>"]
    final_passage = next(p["text"] for p in kb.passages if p["id"] == two_hop.meta["hops"][-1]["passage_id"])
    for r in verifier:  # "yes" exactly when the history holds the passage that states the answer
        assert (r["target"] == "<verify>yes</verify>") == (final_passage in r["context"]["history_text"])
    searches = [parse_action(r["target"]) for r in recs if r["role"] == "search"]
    assert [a.content for a in searches] == [h["query"] for h in two_hop.meta["hops"]]
    assert all(r["target"].startswith("<think>") for r in recs if r["role"] != "verifier")
    answer = next(r for r in recs if r["role"] == "answer")
    assert parse_action(answer["target"]).content == two_hop.answers[0]
    assert answer["context"]["teammates"] == {"verifier": "<verify>yes</verify>"} and answer["context"]["step"] == 2
    assert "prompt" not in answer  # structured, agents render prompts


def test_replaying_traces_in_the_env_scores_one(kb, retriever):
    """The search/answer targets of the traces solve every generated task in the real environment."""
    task_list = generated.generate_tasks(kb, 60, seed=3)
    traces = generated.build_traces(task_list, retriever)
    actions: dict[str, list[str]] = {}
    for r in traces:
        if r["role"] in ("search", "answer"):
            actions.setdefault(r["task"]["task_id"], []).append(r["target"])
    solved = [t for t in task_list if t.task_id in actions]
    assert len(solved) >= 0.95 * len(task_list)
    env = SearchEnv(retriever)
    env.reset(solved)
    total = np.zeros(len(solved))
    while not env.dones.all():
        todo = np.flatnonzero(~env.dones)
        out = env.step([actions[solved[i].task_id][env.num_turns(i)] for i in todo], todo)
        assert out.valid.all()
        total[todo] += out.rewards
    assert total.tolist() == [1.0] * len(solved)


# ---- QA loaders on the shared files ----------------------------------------------------------------


@pytest.mark.data
@pytest.mark.parametrize("name, rows", [("nq", 3610), ("triviaqa", 1000), ("popqa", 1000), ("bamboogle", 125)])
def test_test_sets_load(shared_data, name, rows):
    ts = tasks.load_test_set(name, data_dir=shared_data)
    assert len(ts) == rows and all(isinstance(t, Task) and t.source == name for t in ts)
    assert all(t.answers and t.question.endswith("?") for t in ts)
    assert len({t.task_id for t in ts}) == rows


@pytest.mark.data
@pytest.mark.parametrize("name", ["hotpotqa", "2wikimultihopqa", "musique"])
def test_multihop_variants(shared_data, name):
    sub = tasks.load_test_set(name, "sub500", data_dir=shared_data)
    full = tasks.load_test_set(name, data_dir=shared_data)
    assert len(sub) == 500 and len(full) > 500 and full[0].task_id.startswith(f"{name}-dev-")
    with pytest.raises(KeyError, match="available"):
        tasks.load_test_set(name, "sub1000", data_dir=shared_data)


@pytest.mark.data
def test_test_sampled_is_first_30_per_source(shared_data):
    sampled = tasks.load_test_sampled(data_dir=shared_data)
    assert len(sampled) == 210 and [t.source for t in sampled[::30]] == list(tasks.TEST_SETS)
    assert [t.task_id for t in sampled[:30]] == [t.task_id for t in tasks.load_test_set("nq", data_dir=shared_data)[:30]]


@pytest.mark.data
def test_train_loads(shared_data):
    train = tasks.load_train(data_dir=shared_data)
    assert len(train) > 1000 and all(t.answers for t in train)


def test_hub_rows_and_missing_datasets():
    rows = [{"question": "who is x", "golden_answers": ["a", "b"], "data_source": "nq"},
            {"id": "h1", "question": "what is y?", "reward_model": {"ground_truth": {"target": ["c"]}},
             "data_source": "hotpotqa"}]
    ts = tasks.hub_rows_to_tasks(rows, "test")
    assert [(t.task_id, t.question, t.answers, t.source) for t in ts] == [
        ("test_0", "who is x?", ("a", "b"), "nq"), ("h1", "what is y?", ("c",), "hotpotqa")]
    assert [t.source for t in tasks.first_per_source(ts * 3, 2)] == ["nq", "nq", "hotpotqa", "hotpotqa"]
    try:
        import datasets  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install datasets"):
            tasks.load_hub_split("train")


def test_missing_shared_file_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="DRMAS_SHARED_DATA"):
        tasks.load_test_set("nq", data_dir=tmp_path)


# ---- corpora and the paired multi-hop testbeds ---------------------------------------------------------


@pytest.mark.data
@pytest.mark.parametrize("name, rows", [("wiki18_sample1000", 1000), ("2wikimultihopqa", 6119),
                                        ("hotpotqa_train", 994), ("musique_train", 1890)])
def test_shared_corpora_load(shared_data, name, rows):
    corpus = load_corpus(resolve_corpus_path(name))
    assert len(corpus) == rows == len(set(corpus.ids)) and all(corpus.texts)
    assert name in SHARED_CORPORA


@pytest.mark.data
def test_paired_gold_passages(shared_data):
    hotpot, corpus = load_paired_questions("hotpotqa_train")
    assert len(hotpot) == 100 and all(g is not None for t in hotpot for g in t.meta["gold_ids"])
    titles = dict(zip(corpus.ids, corpus.titles))
    assert [titles[g] for g in hotpot[0].meta["gold_ids"]] == ["Alû", "Lilu (mythology)"]
    musique, _ = load_paired_questions("musique_train")
    gold = [t.meta["gold_ids"] for t in musique]
    # hand-checked against HippoRAG's musique_train.json (paragraph_support_idx -> corpus row)
    assert gold[0] == ["musique_train-p6", "musique_train-p10"]
    assert gold[1] == ["musique_train-p35", "musique_train-p34", "musique_train-p26", "musique_train-p36"]
    located = sum(g is not None for gs in gold for g in gs)
    assert 220 <= located <= sum(map(len, gold)) == 237


# ---- prepare and bench helpers ---------------------------------------------------------------------


def test_prepare_generated(tmp_path, monkeypatch):
    monkeypatch.setenv("DRMAS_DATA_DIR", str(tmp_path / "cache"))
    parser = argparse.ArgumentParser()
    prepare.add_arguments(parser)
    args = parser.parse_args(["--out", str(tmp_path / "out"), "--what", "generated", "--gen-people", "30",
                              "--gen-train", "40", "--gen-test", "10"])
    result = prepare.run(args)
    assert result["counts"]["generated/train"] == 40 and result["counts"]["generated/test"] == 10
    assert result["counts"]["generated/traces"] > 40
    corpus = load_corpus(result["files"]["generated/corpus"])
    assert len(corpus) == result["counts"]["generated/corpus"]
    assert list(result["indexes"]) == ["generated/seed0:bm25"]
    assert str(tmp_path / "cache") in result["indexes"]["generated/seed0:bm25"]
    test = tasks.read_tasks(result["files"]["generated/test"])
    assert len(test) == 10 and test[0].meta["hops"]


def test_prepare_generated_serves_the_kb_of_a_run_config(tmp_path, monkeypatch):
    """`--gen-kb` with a run config's env.args.kb writes the very corpus that run retrieves from in-process
    (what a retrieval server for that run must serve); bad mappings name the fields."""
    from drmas.tasks import SearchGenerated

    monkeypatch.setenv("DRMAS_DATA_DIR", str(tmp_path / "cache"))
    kb = {"n_countries": 4, "n_cities": 9, "n_companies": 7, "n_people": 40}
    parser = argparse.ArgumentParser()
    prepare.add_arguments(parser)
    args = parser.parse_args(["--out", str(tmp_path / "out"), "--what", "generated", "--gen-kb", json.dumps(kb),
                              "--gen-train", "20", "--gen-test", "5"])
    written = load_corpus(prepare.run(args)["files"]["generated/corpus"])
    expected = SearchGenerated(kb=kb, n_test=20).kb.corpus()
    assert (written.ids, written.texts) == (expected.ids, expected.texts)
    assert written.content_hash == expected.content_hash
    with pytest.raises(SystemExit):
        parser.parse_args(["--gen-kb", "{n_persons: 3}"])


@pytest.mark.parametrize("text", ["{n_people: [", "{n_people: 3", "n_people: 3: 4", "[\t"])
def test_gen_kb_with_malformed_yaml_is_one_usage_error(capsys, text):
    """Malformed YAML after `--gen-kb` is a usage error naming the flag and what to write, exit 2 (not a
    yaml ScannerError/ParserError traceback)."""
    parser = argparse.ArgumentParser(prog="prepare")
    prepare.add_arguments(parser)
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--gen-kb", text])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err
    assert "argument --gen-kb: --gen-kb is not valid YAML (" in err and "'{n_people: 500}'" in err


@pytest.mark.data
def test_prepare_shared_task_files(shared_data, tmp_path):
    parser = argparse.ArgumentParser()
    prepare.add_arguments(parser)
    result = prepare.run(parser.parse_args(["--out", str(tmp_path), "--what", "test_sampled", "train"]))
    assert result["counts"]["test_sampled"] == 210
    assert tasks.read_tasks(result["files"]["test_sampled"])[0] == tasks.load_test_sampled()[0]


def test_recall_at_k_definitions():
    retrieved = [["a", "x", "y"], ["x", "y", "z"], ["b", "c", "x"], ["q", "r", "s"]]
    gold = [["a", "b"], ["c"], ["b", "c", None], [None]]
    # q1: 1 of 2 gold in top 3 (hit); q2: 0 of 1; q3: 2 of 2 (None ignored); q4: no located gold -> skipped
    # hit = 2/3; recall = (1 + 0 + 2) / (2 + 1 + 2) = 3/5
    r = bench.recall_at_k(retrieved, gold, k=3)
    assert r == {"hit": pytest.approx(2 / 3), "recall": pytest.approx(0.6), "questions": 3, "gold": 5}
    assert bench.recall_at_k(retrieved, gold, k=1)["recall"] == pytest.approx(2 / 5)  # a, b
