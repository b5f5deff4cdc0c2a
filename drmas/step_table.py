"""The step table: one row per agent call, the data structure the whole training step shares.

Where does a sample go? It is born as one row here when an orchestra calls an agent, gets its outcome
reward when the episode ends, its score and advantage in the trainer, and is routed to the worker group
(model) in ``wg`` for the update. Columns (n rows):

========== ============ =====================================================================
column     dtype        meaning
========== ============ =====================================================================
task       int64        task group id (the reference ``uid``): index of the task in the batch
traj       int64        trajectory id, unique within the batch (task * group_size + sample)
agent      object (str) agent name (``AgentConfig.name``)
wg         object (str) worker group = model key the agent runs on
turn       int64        orchestra turn at which the call happened (0-based)
valid      bool         the output followed the agent's format
truncated  bool         generation hit max_new_tokens
reward     float64      outcome reward R of the trajectory (team reward; set when the episode ends)
score      float64      R - c * (1 - valid): what the advantage estimator normalizes
advantage  float64      set by the trainer (NaN before)
action     object (str) what the agent's parse extracted (``Parsed.action``: a verdict word, a tagged query or
                        answer, a boxed answer; "" when invalid)
========== ============ =====================================================================

plus ragged ``prompt_ids`` / ``response_ids`` (token ids) and ``texts`` (the decoded responses).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

ARRAY_COLUMNS = ("task", "traj", "agent", "wg", "turn", "valid", "truncated", "reward", "score", "advantage", "action")
LIST_COLUMNS = ("prompt_ids", "response_ids", "texts")


@dataclass
class StepTable:
    task: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    traj: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    agent: np.ndarray = field(default_factory=lambda: np.zeros(0, object))
    wg: np.ndarray = field(default_factory=lambda: np.zeros(0, object))
    turn: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    valid: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    truncated: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    reward: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    score: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    advantage: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    action: np.ndarray | None = None
    prompt_ids: list[list[int]] = field(default_factory=list)
    response_ids: list[list[int]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.action is None:  # a table built without parses (tests, probes): no action extracted
            self.action = np.full(len(self.task), "", object)

    def __len__(self) -> int:
        return int(self.task.shape[0])

    @staticmethod
    def concat(parts: list["StepTable"]) -> "StepTable":
        if not parts:
            return StepTable()
        out = {name: np.concatenate([getattr(p, name) for p in parts]) for name in ARRAY_COLUMNS}
        out.update({name: [x for p in parts for x in getattr(p, name)] for name in LIST_COLUMNS})
        return StepTable(**out)

    def select(self, rows: np.ndarray) -> "StepTable":
        """The sub-table of ``rows`` (integer indices or a boolean mask)."""
        rows = np.flatnonzero(rows) if rows.dtype == bool else rows
        out = {name: getattr(self, name)[rows] for name in ARRAY_COLUMNS}
        out.update({name: [getattr(self, name)[i] for i in rows] for name in LIST_COLUMNS})
        return StepTable(**out)

    @property
    def response_len(self) -> np.ndarray:
        return np.fromiter((len(r) for r in self.response_ids), np.int64, len(self.response_ids))

    def assign_rewards(self, traj_reward: np.ndarray, invalid_penalty: float | dict[str, float]) -> None:
        """Team reward: every step of trajectory i gets R_i; score = R - c (1 - valid) (docs/paper.md §1), with one c
        for every agent or one per agent name (``{agent: c}``, every agent of the table present)."""
        self.reward = np.asarray(traj_reward, np.float64)[self.traj]
        if isinstance(invalid_penalty, dict):
            missing = sorted(set(self.agent) - set(invalid_penalty))
            if missing:
                raise KeyError(f"no invalid_penalty for agents {missing}")
            names, row_name = np.unique(self.agent.astype(str), return_inverse=True)
            c = np.array([invalid_penalty[n] for n in names], np.float64)[row_name]
        else:
            c = np.float64(invalid_penalty)
        self.score = self.reward - c * (~self.valid).astype(np.float64)

    def to_frame(self, with_text: bool = False):
        """A pandas view (analysis, step dumps); token ids are summarized by their lengths."""
        import pandas as pd

        frame = pd.DataFrame({name: getattr(self, name) for name in ARRAY_COLUMNS})
        frame["prompt_len"] = [len(p) for p in self.prompt_ids]
        frame["response_len"] = self.response_len
        if with_text:
            frame["text"] = self.texts
        return frame

