"""Search environment: action parsing (incl. a fuzz test), episode flow, batching, failures."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envs.base import Task, make_env
from envs.search.env import SEARCH_FAILED_OBSERVATION, SearchEnv, format_information, parse_action
from envs.search.generated import KBConfig, generate_kb, generate_tasks
from envs.search.retriever import RetrievalBatch, build_retriever


@pytest.fixture(scope="module")
def kb():
    return generate_kb(KBConfig(n_people=40, seed=3))


@pytest.fixture(scope="module")
def retriever(kb):
    return build_retriever(kb.corpus(), "bm25", use_cache=False)


class CountingBackend:
    """Wraps a backend and records every call (to check batching)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def retrieve(self, queries, topk=3):
        self.calls.append(list(queries))
        return self.inner.retrieve(queries, topk)


class FailingBackend:
    def __init__(self, raise_error: bool):
        self.raise_error = raise_error

    def retrieve(self, queries, topk=3):
        if self.raise_error:
            raise ConnectionError("boom")
        return RetrievalBatch.failed(len(queries), "server down")


TASK = Task("t0", "Where was X born?", ("Paris", "Paris, France"), "test")


# ---- parsing ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, kind, content, error", [
    ("<search>who is x</search>", "search", "who is x", ""),
    ("<think>hmm</think>\n<search> who is x </search>", "search", "who is x", ""),
    ("<think>ok</think><answer>Paris</answer>", "answer", "Paris", ""),
    ("<answer>Paris</answer> trailing words", "answer", "Paris", ""),
    ("Paris", "invalid", "", "no_tag"),
    ("", "invalid", "", "no_tag"),
    ("<Search>x</Search>", "invalid", "", "no_tag"),  # tags are case-sensitive, as Search-R1
    ("<search>x</search><answer>y</answer>", "invalid", "", "both_tags"),
    ("<answer>a <search>q</search></answer>", "invalid", "", "both_tags"),
    ("<search>   </search>", "invalid", "", "empty"),
    ("<answer></answer>", "invalid", "", "empty"),
    ("<search>who is x", "invalid", "", "unclosed"),
    ("<search><search>q</search></search>", "invalid", "", "nested"),
    ("<search>a</search><search>b</search>", "invalid", "", "multiple"),
    ("</search>q<search>", "invalid", "", "unbalanced"),
    ("q</answer>", "invalid", "", "unbalanced"),
    ("<search>a</search></search>", "invalid", "", "unbalanced"),
    ("<search>" + "x" * 2000 + "</search>", "invalid", "", "query_too_long"),
])
def test_parse_action(text, kind, content, error):
    act = parse_action(text)
    assert (act.kind, act.content, act.error) == (kind, content, error)


def test_parse_action_non_string():
    assert parse_action(None).error == "not_text"  # type: ignore[arg-type]


_PIECES = st.sampled_from(["<search>", "</search>", "<answer>", "</answer>", "<think>", "</think>", "<information>",
                           "Paris", " ", "\n", "x", "<", ">", "/"])
_ACTION_TEXT = st.one_of(st.text(max_size=80), st.lists(_PIECES, max_size=12).map("".join))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(_ACTION_TEXT, min_size=1, max_size=6))
def test_fuzz_arbitrary_text_never_raises(retriever, texts):
    env = SearchEnv(retriever, max_turns=3)
    env.reset([TASK])
    for text in texts:
        act = parse_action(text)
        assert act.kind in ("search", "answer", "invalid")
        assert (act.kind == "invalid") == bool(act.error)
        if act.kind != "invalid":
            assert act.content and act.content == act.content.strip()
        out = env.step([text])
        assert out.valid[0] == (act.kind != "invalid")
        assert out.rewards[0] in (0.0, 1.0) and out.rewards.dtype == np.float32
        if out.dones[0]:
            break
    assert env.num_turns(0) <= 3


# ---- episodes --------------------------------------------------------------------------------------

def test_format_information_is_search_r1():
    hits = [{"document": {"id": "1", "title": "A", "contents": '"A"\nText a.'}, "score": 1.0},
            {"document": {"id": "2", "title": "B", "contents": '"B"\nText b.'}, "score": 0.5}]
    assert format_information(hits) == '<information>Doc 1(Title: "A") Text a.\nDoc 2(Title: "B") Text b.</information>'


def test_two_hop_episode_reaches_reward_one(kb, retriever):
    task = next(t for t in generate_tasks(kb, 50, hops=(2,), seed=1))
    env = make_env("search", retriever=retriever)
    assert env.reset([task]) == [task.question]
    hop1, hop2 = task.meta["hops"]
    out = env.step([f"<think>first</think><search>{hop1['query']}</search>"])
    assert out.valid.tolist() == [True] and out.dones.tolist() == [False] and out.rewards.tolist() == [0.0]
    assert out.observations[0].startswith("<information>Doc 1(Title: ") and hop1["answer"] in out.observations[0]
    out = env.step([f"<search>{hop2['query']}</search>"])
    assert hop2["answer"] in out.observations[0]
    out = env.step([f"<think>done</think><answer> {task.answers[0].upper()} </answer>"])
    assert out.dones.tolist() == [True] and out.rewards.tolist() == [1.0]
    assert out.infos[0]["em"] == 1.0 and out.infos[0]["f1"] == 1.0 and out.observations == [""]
    history = env.history(0)
    assert history.startswith(f"<search>{hop1['query']}</search>\n<information>Doc 1(Title: ")
    assert history.endswith(f"<answer>{task.answers[0].upper()}</answer>")
    assert [t["kind"] for t in env.turns(0)] == ["search", "search", "answer"]


def test_wrong_answer_scores_zero_with_partial_f1(retriever):
    env = SearchEnv(retriever)
    env.reset([TASK])
    out = env.step(["<answer>Paris, Texas</answer>"])
    assert out.rewards.tolist() == [0.0] and out.dones.tolist() == [True]
    assert 0.0 < out.infos[0]["f1"] < 1.0


def test_turn_budget_ends_episode_with_zero_reward(retriever):
    backend = CountingBackend(retriever)
    env = SearchEnv(backend, max_turns=4)
    env.reset([TASK])
    for turn in range(1, 4):
        out = env.step(["<search>Paris</search>"] if turn != 2 else ["no tags here"])  # invalid turns count too
        assert not out.dones[0] and out.valid[0] == (turn != 2)
        if turn == 2:
            assert out.observations[0] == ""
        else:
            assert out.observations[0].startswith("<information>")
    out = env.step(["<search>Paris</search>"])
    assert out.dones.tolist() == [True] and out.rewards.tolist() == [0.0]
    assert out.infos[0]["budget_exhausted"] and out.observations == [""]
    assert len(backend.calls) == 2  # the last-turn search is not retrieved; the invalid turn retrieves nothing
    with pytest.raises(ValueError, match="already done"):
        env.step(["<answer>Paris</answer>"])


def test_answer_on_last_turn_still_scores(retriever):
    env = SearchEnv(retriever, max_turns=1)
    env.reset([TASK])
    out = env.step(["<answer>paris</answer>"])
    assert out.rewards.tolist() == [1.0] and not out.infos[0]["budget_exhausted"]


def test_retrieval_is_batched_across_episodes(kb, retriever):
    tasks = generate_tasks(kb, 4, hops=(1,), seed=0)
    backend = CountingBackend(retriever)
    env = SearchEnv(backend)
    env.reset(tasks)
    actions = [f"<search>{t.meta['hops'][0]['query']}</search>" for t in tasks[:3]] + ["<answer>x</answer>"]
    out = env.step(actions)
    assert len(backend.calls) == 1 and backend.calls[0] == [t.meta["hops"][0]["query"] for t in tasks[:3]]
    assert out.dones.tolist() == [False, False, False, True]
    # act on a subset, in a different order
    out = env.step(["<answer>a</answer>", "<search>q</search>"], idx=[2, 0])
    assert out.dones.tolist() == [True, False] and env.dones.tolist() == [False, False, True, True]
    assert env.num_turns(0) == 2 and env.num_turns(1) == 1


def test_misuse_raises(retriever):
    env = SearchEnv(retriever)
    env.reset([TASK, TASK])
    with pytest.raises(ValueError, match="out of range"):
        env.step(["<answer>x</answer>"], idx=[5])
    with pytest.raises(ValueError, match="repeated"):
        env.step(["a", "b"], idx=[0, 0])
    with pytest.raises(ValueError, match="2 actions for 1"):
        env.step(["a", "b"], idx=[0])


@pytest.mark.parametrize("raise_error", [False, True])
def test_failed_retrieval_gives_invalid_observation_not_an_exception(raise_error):
    env = SearchEnv(FailingBackend(raise_error))
    env.reset([TASK])
    out = env.step(["<search>anything</search>"])
    assert out.valid.tolist() == [True] and out.dones.tolist() == [False]
    assert out.observations == [SEARCH_FAILED_OBSERVATION]
    assert out.infos[0]["obs_valid"] is False and out.infos[0]["retrieval_error"]


def test_deterministic(kb, retriever):
    tasks = generate_tasks(kb, 5, seed=2)
    actions = ["<search>born</search>", "garbage", "<answer>x</answer>", "<search>founded</search>", "<search></search>"]
    outs = []
    for _ in range(2):
        env = SearchEnv(retriever, seed=0)
        env.reset(tasks)
        out = env.step(actions)
        outs.append((out.observations, out.rewards.tolist(), out.valid.tolist(), out.infos, [env.history(i) for i in range(5)]))
    assert outs[0] == outs[1]
