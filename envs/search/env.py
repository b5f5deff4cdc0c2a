"""Multi-turn search environment (Search-R1 tool protocol, Dr. MAS search system; docs/paper.md §4).

Each episode is one question. An action is the text an agent wrote; the environment reads its tags:

- ``<search>query</search>`` -> top-k passages come back as the observation
  ``<information>Doc 1(Title: "...") text\\nDoc 2(...) ...</information>`` (Search-R1's format). Not done,
  unless this turn used up the budget: then done with reward 0 (and nothing is retrieved).
- ``<answer>text</answer>`` -> done; reward = exact match (SQuAD normalization) against any gold answer;
  ``infos`` also carry ``em`` and ``f1``.
- anything else is *invalid*; ``infos[j]["parse_error"]`` is one of ``no_tag``, ``both_tags``
  (search and answer), ``unclosed``, ``nested``, ``multiple`` (two pairs), ``unbalanced`` (stray or
  reversed tag), ``empty`` (blank content), ``query_too_long``. An invalid action gets ``valid=False``,
  spends its turn, returns an empty observation, and the episode goes on (done with reward 0 when the
  budget is gone).

Text outside the tag pair (e.g. ``<think>...</think>``) is allowed. Every step spends one turn of the
``max_turns`` budget (default 4, as the paper). All queries of one ``step`` call are retrieved in one
batched call. A failed retrieval (server down, ...) keeps the action valid but returns
``SEARCH_FAILED_OBSERVATION`` with ``infos[j]["obs_valid"] = False`` and the error in
``infos[j]["retrieval_error"]`` (the trainer may mask such steps). A retrieval server that serves another
corpus than the run's (``envs.search.corpus.CorpusMismatch``) is no such failure: it propagates. Misuse
(acting on a finished episode, an index out of range, repeated indices) raises ``ValueError``: that is a bug
in the caller, not text.

Retrieval misses (``miss_rate`` > 0): each search, with probability ``miss_rate``, returns the passages ranked
k+1..2k instead of the top k -- the relevant passages fell below the cut-off, as when a real retriever ranks
another entity first. The episode's history then lacks the fact, the Verifier should ask again, and the retry
(a new draw) may hit. This is the knob that makes how often agents act depend on the outcome (docs/mechanism.md).
The draws come from ``numpy.random.default_rng(seed)``, seeded at each ``reset`` (the rollout seed), so a
batch's misses are reproducible; with ``miss_rate = 0`` the environment has no randomness.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from envs.base import Env, StepOutput, Task, register_env
from envs.search.corpus import CorpusMismatch
from envs.search.retriever import RetrievalBatch, SearchBackend
from envs.search.reward import exact_match, f1_score

logger = logging.getLogger(__name__)

SEARCH_FAILED_OBSERVATION = "<information>No results: the search engine is unavailable.</information>"
_TAG = re.compile(r"<(/?)(search|answer)>")


@dataclass(frozen=True)
class Action:
    """A parsed action: ``kind`` is "search", "answer" or "invalid" (then ``error`` says why)."""

    kind: str
    content: str = ""
    error: str = ""


def parse_action(text: str, max_query_chars: int = 1024) -> Action:
    """Parse one action text; never raises. Valid iff the text holds exactly one opening and one closing
    tag of the same kind (search or answer), in that order, with non-blank content."""
    if not isinstance(text, str):
        return Action("invalid", error="not_text")
    tags = [(m.group(1) == "/", m.group(2), m.start(), m.end()) for m in _TAG.finditer(text)]
    if not tags:
        return Action("invalid", error="no_tag")
    if len({name for _, name, _, _ in tags}) > 1:
        return Action("invalid", error="both_tags")
    closes = [is_close for is_close, _, _, _ in tags]
    if len(tags) != 2 or closes != [False, True]:
        if closes == [False]:
            error = "unclosed"
        elif closes[:2] == [False, False]:
            error = "nested"
        elif len(tags) > 2 and closes.count(False) == closes.count(True):
            error = "multiple"
        else:
            error = "unbalanced"  # a closing tag before its opening one, or a stray extra tag
        return Action("invalid", error=error)
    (_, kind, _, open_end), (_, _, close_start, _) = tags
    content = text[open_end:close_start].strip()
    if not content:
        return Action("invalid", error="empty")
    if kind == "search" and len(content) > max_query_chars:
        return Action("invalid", error="query_too_long")
    return Action(kind, content)


def format_information(hits: Sequence[dict[str, Any]]) -> str:
    """Search-R1's rendering of retrieved documents: ``Doc i(Title: <first line>) <rest>`` per line,
    wrapped in ``<information>...</information>``."""
    lines = []
    for n, hit in enumerate(hits, 1):
        title, _, text = hit["document"]["contents"].partition("\n")
        lines.append(f"Doc {n}(Title: {title}) {text}")
    return "<information>" + "\n".join(lines).strip() + "</information>"


def render_history(turns: Sequence[dict[str, Any]]) -> str:
    """History text for prompts: ``<search>q</search>\n<information>...</information>`` per search turn
    (and ``<answer>a</answer>`` once answered), joined by newlines; invalid turns add nothing.
    ``turns`` are dicts with ``kind`` and ``query``/``observation`` or ``answer`` (``SearchEnv.turns``)."""
    parts = []
    for t in turns:
        if t["kind"] == "search":
            parts.append(f"<search>{t['query']}</search>" + (f"\n{t['observation']}" if t.get("observation") else ""))
        elif t["kind"] == "answer":
            parts.append(f"<answer>{t['answer']}</answer>")
    return "\n".join(parts)


@register_env("search")
class SearchEnv(Env):
    """Batched multi-turn search episodes over a ``SearchBackend`` (in-process ``Retriever`` or HTTP
    ``RetrievalClient``). See the module docstring for the action protocol."""

    name = "search"

    def __init__(self, retriever: SearchBackend, max_turns: int = 4, topk: int = 3, max_query_chars: int = 1024,
                 seed: int = 0, miss_rate: float = 0.0):
        if max_turns < 1 or topk < 1 or max_query_chars < 1:
            raise ValueError(f"need max_turns, topk, max_query_chars >= 1; got {max_turns}, {topk}, {max_query_chars}")
        if not 0.0 <= miss_rate < 1.0:
            raise ValueError(f"miss_rate must be in [0, 1), got {miss_rate}")
        self.retriever, self.max_turns, self.topk = retriever, max_turns, topk
        self.max_query_chars, self.seed, self.miss_rate = max_query_chars, seed, miss_rate
        self._rng = np.random.default_rng(seed)
        self.tasks: list[Task] = []
        self._turns: list[list[dict[str, Any]]] = []
        self._done = np.zeros(0, dtype=bool)

    # ---- episode state -------------------------------------------------------------------------------

    def reset(self, tasks: Sequence[Task], seed: int | None = None) -> list[str]:
        """Start one episode per task; the initial observation is the question. ``seed`` (default: the
        constructor's) seeds the retrieval misses of these episodes."""
        self._rng = np.random.default_rng(self.seed if seed is None else seed)
        self.tasks = list(tasks)
        self._turns = [[] for _ in self.tasks]
        self._done = np.zeros(len(self.tasks), dtype=bool)
        return [t.question for t in self.tasks]

    @property
    def dones(self) -> np.ndarray:
        """bool [n_episodes] (a copy)."""
        return self._done.copy()

    def num_turns(self, i: int) -> int:
        return len(self._turns[i])

    def turns(self, i: int) -> list[dict[str, Any]]:
        """Structured history of episode ``i``: one dict per turn with keys ``turn, action, kind, query,
        answer, observation, valid`` (copies)."""
        return [dict(t) for t in self._turns[i]]

    def history(self, i: int) -> str:
        """History text of episode ``i`` for prompts (see ``render_history``)."""
        return render_history(self._turns[i])

    # ---- acting ----------------------------------------------------------------------------------------

    def _check_idx(self, actions: Sequence[str], idx: Sequence[int] | np.ndarray | None) -> np.ndarray:
        idx_arr = np.arange(len(self.tasks)) if idx is None else np.asarray(idx, dtype=np.int64).reshape(-1)
        if len(actions) != len(idx_arr):
            raise ValueError(f"got {len(actions)} actions for {len(idx_arr)} episode indices")
        if len(idx_arr) and (idx_arr.min() < 0 or idx_arr.max() >= len(self.tasks)):
            raise ValueError(f"episode index out of range [0, {len(self.tasks)}): {idx_arr.tolist()}")
        if len(np.unique(idx_arr)) != len(idx_arr):
            raise ValueError(f"repeated episode indices in one step: {idx_arr.tolist()}")
        if self._done[idx_arr].any():
            raise ValueError(f"episodes {idx_arr[self._done[idx_arr]].tolist()} are already done; "
                             f"act only on episodes with dones == False (see env.dones)")
        return idx_arr

    def _search(self, queries: list[str]) -> tuple[RetrievalBatch, np.ndarray]:
        """One batched retrieval; returns the batch (top k per query, or ranks k+1..2k for a missed query)
        and the bool mask of missed queries (one ``miss_rate`` draw per query, in order)."""
        missed = self._rng.random(len(queries)) < self.miss_rate if self.miss_rate > 0 else np.zeros(len(queries), bool)
        if not queries:
            return RetrievalBatch([]), missed
        try:
            depth = 2 * self.topk if missed.any() else self.topk
            batch = self.retriever.retrieve(queries, depth)
            if len(batch.results) != len(queries):
                raise ValueError(f"retriever returned {len(batch.results)} result lists for {len(queries)} queries")
            if depth > self.topk and batch.ok:
                k = self.topk
                batch = RetrievalBatch([hits[k:2 * k] if m else hits[:k] for hits, m in zip(batch.results, missed)])
            return batch, missed
        except CorpusMismatch:  # a server over another corpus: its answers would score 0, so the run stops
            raise
        except Exception as e:  # noqa: BLE001 -- a failing tool must not kill the rollout
            logger.warning("retrieval raised %s: %s", type(e).__name__, e)
            return RetrievalBatch.failed(len(queries), f"{type(e).__name__}: {e}"), missed

    def step(self, actions: Sequence[str], idx: Sequence[int] | np.ndarray | None = None) -> StepOutput:
        """Apply ``actions[j]`` to episode ``idx[j]`` (default: all); one batched retrieval call."""
        idx_arr = self._check_idx(actions, idx)
        n = len(idx_arr)
        parsed = [parse_action(a, self.max_query_chars) for a in actions]
        turn_no = np.array([len(self._turns[i]) + 1 for i in idx_arr], dtype=np.int64)
        last_turn = turn_no >= self.max_turns
        to_search = [j for j in range(n) if parsed[j].kind == "search" and not last_turn[j]]
        batch, missed = self._search([parsed[j].content for j in to_search])
        hits_of = dict(zip(to_search, batch.results))
        missed_of = dict(zip(to_search, missed.tolist()))

        observations, infos = [""] * n, []
        rewards, dones = np.zeros(n, np.float32), last_turn.copy()
        valid = np.array([p.kind != "invalid" for p in parsed], dtype=bool)
        for j, (i, act) in enumerate(zip(idx_arr.tolist(), parsed)):
            task = self.tasks[i]
            info: dict[str, Any] = {"action": act.kind, "turn": int(turn_no[j]), "parse_error": act.error,
                                    "budget_exhausted": bool(last_turn[j] and act.kind != "answer")}
            if act.kind == "answer":
                dones[j] = True
                rewards[j] = exact_match(act.content, task.answers)
                info["em"] = float(rewards[j])
                info["f1"] = f1_score(act.content, task.answers)
                info["answer"] = act.content
            elif j in hits_of:
                info["query"] = act.content
                info["obs_valid"] = batch.ok
                info["missed"] = bool(missed_of[j])
                if batch.ok:
                    observations[j] = format_information(hits_of[j])
                else:
                    observations[j] = SEARCH_FAILED_OBSERVATION
                    info["retrieval_error"] = batch.error
            elif act.kind == "search":
                info["query"] = act.content
            infos.append(info)
            self._turns[i].append({"turn": int(turn_no[j]), "action": actions[j], "kind": act.kind,
                                   "query": act.content if act.kind == "search" else "",
                                   "answer": act.content if act.kind == "answer" else "",
                                   "observation": observations[j], "valid": bool(valid[j])})
        self._done[idx_arr] = dones
        return StepOutput(observations, rewards, dones, valid, infos)
