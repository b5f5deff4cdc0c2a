"""Outcome-dependent agent invocation: retrieval misses in the search environment, SFT traces with
retries and wrong verdicts, per-agent invalid-action penalties."""
from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from drmas.config import load_config
from drmas.step_table import StepTable
from envs.search import generated
from envs.search.env import SearchEnv
from envs.search.retriever import build_retriever


@pytest.fixture(scope="module")
def kb():
    return generated.generate_kb(generated.KBConfig(n_people=60, seed=3))


@pytest.fixture(scope="module")
def retriever(kb):
    return build_retriever(kb.corpus(), "bm25", use_cache=False)


def _one_hop(kb, n):
    return generated.generate_tasks(kb, n, hops=(1,), seed=2)


def test_misses_happen_at_the_configured_rate_and_lack_the_gold_passage(kb, retriever):
    tasks = _one_hop(kb, 150)
    env = SearchEnv(retriever, miss_rate=0.4)
    env.reset(tasks, seed=7)
    out = env.step([f"<search>{t.meta['hops'][0]['query']}</search>" for t in tasks])
    missed = np.array([i["missed"] for i in out.infos])
    assert 0.3 < missed.mean() < 0.5
    # a hit shows the gold fact's sentence, a miss (ranks 4-6) does not
    facts = [generated.RELATIONS[t.meta["hops"][0]["relation"]][0].format(s=t.meta["hops"][0]["subject"],
                                                                         o=t.meta["hops"][0]["answer"]) for t in tasks]
    shown = np.array([f in obs for f, obs in zip(facts, out.observations)])
    assert shown[~missed].mean() > 0.95 and shown[missed].mean() < 0.05


def test_misses_are_reproducible_per_seed_and_vary_across_seeds(kb, retriever):
    tasks = _one_hop(kb, 50)
    actions = [f"<search>{t.meta['hops'][0]['query']}</search>" for t in tasks]

    def draw(seed):
        env = SearchEnv(retriever, miss_rate=0.5)
        env.reset(tasks, seed=seed)
        return [i["missed"] for i in env.step(actions).infos]

    assert draw(1) == draw(1) and draw(1) != draw(2)
    env = SearchEnv(retriever)  # miss_rate 0: no randomness, always the top k
    env.reset(tasks, seed=1)
    assert not any(i["missed"] for i in env.step(actions).infos)
    with pytest.raises(ValueError, match="miss_rate"):
        SearchEnv(retriever, miss_rate=1.0)


def test_ideal_traces_are_unchanged_without_noise(kb, retriever):
    """TraceNoise() gives the ideal episode: per n-hop task n+1 verifier records (n no, then yes), n searches, 1 answer."""
    tasks = generated.generate_tasks(kb, 40, seed=1)
    recs = generated.build_traces(tasks, retriever)
    by_task = Counter((r["task"]["task_id"], r["role"]) for r in recs)
    for t in tasks:
        n = t.meta["n_hops"]
        if by_task[(t.task_id, "verifier")] == 0:
            continue  # skipped (a gold passage out of the top k)
        assert by_task[(t.task_id, "verifier")] == n + 1 and by_task[(t.task_id, "search")] == n
        assert by_task[(t.task_id, "answer")] == 1


def test_noisy_traces_teach_retries_budget_ends_and_wrong_verdicts(kb, retriever):
    tasks = generated.generate_tasks(kb, 300, seed=1)
    noise = generated.TraceNoise(miss_rate=0.5, verdict_noise=0.1, max_turns=4, seed=0)
    recs = generated.build_traces(tasks, retriever, noise=noise)
    assert recs == generated.build_traces(tasks, retriever, noise=noise)  # deterministic
    searches = Counter(r["task"]["task_id"] for r in recs if r["role"] == "search")
    answered = {r["task"]["task_id"] for r in recs if r["role"] == "answer"}
    hops = {t.task_id: t.meta["n_hops"] for t in tasks}
    retried = [tid for tid, n in searches.items() if n > hops[tid]]
    assert len(retried) > 30  # a missed search is asked again
    assert all(n <= noise.max_turns - 1 for n in searches.values())  # no search on the last turn
    unanswered = [tid for tid in searches if tid not in answered]
    assert unanswered  # budget used up (or a wrong verdict ended the episode)
    verdicts = [r for r in recs if r["role"] == "verifier"]
    # a verdict is right iff yes <=> the history holds the last hop's fact
    task_of = {t.task_id: t for t in tasks}

    def right(r):
        t = task_of[r["task"]["task_id"]]
        hop = t.meta["hops"][-1]
        fact = generated.RELATIONS[hop["relation"]][0].format(s=hop["subject"], o=hop["answer"])
        return ("yes" in r["target"]) == (fact in r["context"]["history_text"])

    wrong = 1 - np.mean([right(r) for r in verdicts])
    assert 0.04 < wrong < 0.16
    # every search query in a trace targets the first hop the history lacks
    for r in recs:
        if r["role"] == "search":
            t = task_of[r["task"]["task_id"]]
            assert any(f"<search>{hop['query']}</search>" in r["target"] for hop in t.meta["hops"])


def test_search_source_passes_the_knobs_and_validates_them():
    from drmas.tasks import make_task_source

    src = make_task_source("search_generated", miss_rate=0.3, traces={"miss_rate": 0.2, "verdict_noise": 0.05})
    assert src.make_env().miss_rate == 0.3 and src.trace_noise.miss_rate == 0.2
    with pytest.raises(ValueError, match="unknown keys"):
        make_task_source("search_generated", traces={"miss": 0.2})
    with pytest.raises(ValueError, match="miss_rate"):
        make_task_source("search_generated", miss_rate=1.5)


def test_per_agent_invalid_penalty():
    cfg = load_config("experiments/configs/cpu/search_base.yaml",
                      ["agents.search.invalid_penalty=0.5", "algo.invalid_penalty=0.01"])
    c = cfg.invalid_penalties()
    assert c == {"verifier": 0.01, "search": 0.5, "answer": 0.01}
    assert cfg.effective_agents()["search"]["invalid_penalty"] == 0.5
    t = StepTable(task=np.zeros(4, np.int64), traj=np.array([0, 0, 1, 1]),
                  agent=np.array(["verifier", "search", "search", "answer"], object), wg=np.zeros(4, object),
                  turn=np.zeros(4, np.int64), valid=np.array([False, False, True, False]),
                  truncated=np.zeros(4, bool))
    t.assign_rewards(np.array([1.0, 0.0]), c)
    np.testing.assert_allclose(t.score, [1.0 - 0.01, 1.0 - 0.5, 0.0, -0.01])
    t.assign_rewards(np.array([1.0, 0.0]), 0.1)
    np.testing.assert_allclose(t.score, [0.9, 0.9, 0.0, -0.1])
    with pytest.raises(KeyError, match="answer"):
        t.assign_rewards(np.array([1.0, 0.0]), {"verifier": 0.1, "search": 0.1})


def test_shipped_bases_match_their_record():
    """results/sft holds the SFT'd base checkpoints the CPU grid starts from; bases.json records how each was
    made and the sha256 of every file, so a changed or damaged base is noticed."""
    import hashlib
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "results" / "sft"
    record = json.loads((root / "bases.json").read_text())
    assert set(record["bases"]) == {"math/base_tiny", "search/base_nano", "search/base_tiny"}
    for name, base in record["bases"].items():
        for fname, digest in base["files_sha256"].items():
            assert hashlib.sha256((root / name / fname).read_bytes()).hexdigest() == digest, f"{name}/{fname}"
        assert base["sft"]["steps"] > 0 and base["roles"]
        assert base["build_hash"] == json.loads((root / name / "manifest.sha256.json").read_text())["built_by"]["hash"]


def test_a_short_rebuild_of_a_base_is_deterministic(tmp_path):
    """`run_all.sh --rebuild-bases` rebuilds the bases with the warm-up: the same config gives byte-identical
    tokenizer and weights (a short SFT of the search base, twice)."""
    from drmas.trainer.warmup import warmup

    def build(tag):
        paths = [f"models.{m}.path={tmp_path}/{tag}/base_nano" for m in ("verifier_model", "search_model", "answer_model")]
        cfg = load_config("experiments/configs/cpu/search_base.yaml",
                          [*paths, f"sft.tokenizer_dir={tmp_path}/{tag}/tokenizer", "sft.traces=40", "sft.steps=3"])
        warmup(cfg, progress=False)
        return tmp_path / tag

    a, b = build("a"), build("b")
    for rel in ("tokenizer/tokenizer.json", "base_nano/model.safetensors", "base_nano/config.json"):
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel

    # the record run_all.sh --rebuild-bases writes afterwards (results/sft/bases.json) holds both builds' hashes
    from experiments.record_bases import main as record_bases
    assert record_bases(["--root", str(tmp_path), "--built", "test build"]) == 0
    record = json.loads((tmp_path / "bases.json").read_text())
    assert set(record["bases"]) == {"a/base_nano", "b/base_nano"}
    entry_a, entry_b = record["bases"]["a/base_nano"], record["bases"]["b/base_nano"]
    assert entry_a["files_sha256"] == entry_b["files_sha256"] and entry_a["build_hash"] == entry_b["build_hash"]
    assert entry_a["sft"]["steps"] == 3 and entry_a["trace_args"]["traces"]["verifier_think"] is True
    assert record["tokenizers_sha256"]["a/tokenizer"] == record["tokenizers_sha256"]["b/tokenizer"]
    with pytest.raises(SystemExit, match="no base at"):
        record_bases(["c/base_nano", "--root", str(tmp_path), "--built", "x"])


# ------------------------------------------------------------------ the rollout probe (experiments/probe_search.py)
def test_probe_classifies_each_trajectory_by_outcome():
    from experiments.probe_search import classify

    answered = np.array([True, True, True, False, False])
    informed = np.array([True, True, False, False, True])
    reward = np.array([1.0, 0.0, 0.0, 0.0, 0.0])
    assert classify(answered, informed, reward).tolist() == ["S", "W", "U", "E", "E"]


def test_probe_runs_on_the_shipped_search_base(tmp_path):
    from experiments.probe_search import OUTCOMES, main

    if not Path("results/sft/search/base_nano/config.json").exists():
        pytest.skip("the shipped search base results/sft/search/base_nano is absent")
    out = tmp_path / "probe.json"
    assert main(["experiments/configs/cpu/search_base.yaml", "train.batch_tasks=2", "train.group_size=4",
                 "--steps", "1", "--grad-samples", "2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["trajectories"] == 8
    assert abs(sum(result["outcomes"][c] for c in OUTCOMES) - 1) < 1e-6
    assert all(v["mean"] >= 0 and v["max"] >= v["mean"] for v in result["factors"].values())
    assert all(v["mean"] is None or v["mean"] > 0 for v in result["answer_grad_norm"].values())
    assert set(result["distinct_responses"]) <= {"verifier", "search", "answer"}
    assert all(0 < v["mean"] <= 1 and v["groups"] >= 1 for v in result["distinct_responses"].values())
    for agent, v in result["class_aware"].items():
        assert 0 < v["pairs_distinct"] <= 1
        assert {"equal/trajectory_grpo", "measured/pooled_grpo", "exact/trajectory_grpo"} <= set(v), agent


def test_probe_class_gradient_sums_are_the_gradient_of_the_classes():
    """With one fixed vector per (prompt, response) class, ``exact`` is ||Σ_i A_i z_i||² over the rows and
    ``measured`` is Σ_c S_c² ||z_c||²; the two agree when the class vectors are orthogonal."""
    from drmas.algos import compute_advantages, step_classes
    from experiments.probe_search import ESTIMATORS_PROBED, class_gradient_sums

    rng = np.random.default_rng(0)
    n = 40
    task = np.repeat(np.arange(4), 10)
    table = StepTable(task=task, traj=task * 10 + rng.integers(0, 5, n), agent=np.array(["s"] * n, object),
                      score=rng.choice([0.0, 1.0], n), prompt_ids=[[1]] * n,
                      response_ids=[[int(r)] for r in rng.integers(0, 3, n)])
    classes = step_classes(table.task, table.agent, table.prompt_ids, table.response_ids)
    for basis in (rng.standard_normal((classes.max() + 1, 7)), np.eye(classes.max() + 1) * 2.0):
        vec = torch.as_tensor(basis[classes])
        rows = np.flatnonzero(table.task < 3)
        got = class_gradient_sums(table, classes, rows, lambda r: vec[r].clone())
        for est in ESTIMATORS_PROBED:
            a = compute_advantages(table.score, table.task, table.agent, table.traj, estimator=est, ddof=0, eps=0.0,
                                   singleton="zero").advantages.double()
            want = float((a[rows, None] * vec[rows]).sum(0).pow(2).sum())
            assert got[est][1] == pytest.approx(want, rel=1e-9, abs=1e-12)
            if basis.shape[0] == basis.shape[1]:  # orthogonal class vectors: measured = exact
                assert got[est][0] == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_a_thinking_verifier_states_the_need_then_the_fact_or_its_absence(kb, retriever):
    from drmas.agents.roles import parse_verdict

    tasks = generated.generate_tasks(kb, 200, seed=1)
    noise = generated.TraceNoise(miss_rate=0.5, verdict_noise=0.0, verifier_think=True, max_turns=4, seed=0)
    recs = generated.build_traces(tasks, retriever, noise=noise)
    plain = generated.build_traces(tasks, retriever, noise=generated.TraceNoise(miss_rate=0.5, max_turns=4, seed=0))
    assert [r["role"] for r in recs] == [r["role"] for r in plain]  # the same episodes, only the targets differ
    task_of = {t.task_id: t for t in tasks}
    verdicts = [r for r in recs if r["role"] == "verifier"]
    assert {"yes", "no"} == {parse_verdict(r["target"], ("yes", "no")).action for r in verdicts}
    for r in verdicts:
        t = task_of[r["task"]["task_id"]]
        think = r["target"][len("<think>"):r["target"].index("</think>")]
        assert r["target"].startswith("<think>") and "I need to find" in think
        if parse_verdict(r["target"], ("yes", "no")).action == "yes":
            hop = t.meta["hops"][-1]
            assert think.endswith(generated.RELATIONS[hop["relation"]][0].format(s=hop["subject"], o=hop["answer"]))
        else:
            assert think.endswith("It is not in the passages.")
