"""The ``local`` backend: worker groups as plain objects in this process (the CPU default and the tests)."""
from __future__ import annotations

from typing import Any

from drmas.workers.base import UpdateBatch, WorkerSpec
from drmas.workers.policy import PolicyWorker


class LocalBackend:
    """Worker groups as plain objects in this process; updates run one after another."""

    def __init__(self, specs: dict[str, WorkerSpec]):
        self.specs = specs
        self.workers = {key: PolicyWorker(spec) for key, spec in specs.items()}

    def restart(self) -> None:
        """Fresh workers (initial weights); the trainer then loads the last checkpoint into them."""
        self.workers = {key: PolicyWorker(spec) for key, spec in self.specs.items()}

    def generators(self) -> dict[str, PolicyWorker]:
        return self.workers

    def update(self, batches: dict[str, UpdateBatch], step_seed: int) -> dict[str, dict[str, Any]]:
        return {key: self.workers[key].update(batch, step_seed) for key, batch in batches.items()}

    def get_states(self) -> dict[str, dict]:
        return {key: w.get_state() for key, w in self.workers.items()}

    def set_states(self, states: dict[str, dict]) -> None:
        for key, state in states.items():
            self.workers[key].set_state(state)

    def save_models(self, folder: str) -> dict[str, str]:
        """Hugging Face checkpoints of every worker group under ``folder/<key>`` (export; not part of
        :class:`~drmas.workers.base.Backend`)."""
        return {key: w.save_model(f"{folder}/{key}") for key, w in self.workers.items()}

    def close(self) -> None:
        pass
