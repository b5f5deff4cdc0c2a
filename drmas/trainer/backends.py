"""Execution backends for worker groups: ``local`` (in-process, the CPU default and the tests) and
``ray`` (each worker group a Ray actor, all placed in one placement group: the paper's shared resource
pool). Both expose the same four operations, so the trainer does not know which one runs.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from drmas.workers.policy import PolicyWorker, UpdateBatch, WorkerSpec

logger = logging.getLogger(__name__)


class LocalBackend:
    """Worker groups as plain objects in this process; updates run one after another."""

    def __init__(self, specs: dict[str, WorkerSpec]):
        self.workers = {key: PolicyWorker(spec) for key, spec in specs.items()}

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
        return {key: w.save_model(f"{folder}/{key}") for key, w in self.workers.items()}

    def close(self) -> None:
        pass


class _RayGenerator:
    """Adapter: ``generate`` on a Ray actor, blocking (the orchestra's calls are sequential)."""

    def __init__(self, actor):
        self.actor = actor

    def generate(self, prompts, sampling, seed=None):
        import ray

        return ray.get(self.actor.generate.remote(prompts, sampling, seed))


class RayBackend:
    """One Ray actor per worker group, all in one placement group (shared resource pool). On a CPU
    machine each actor gets a fractional CPU bundle (2 cores hold several models); on GPUs a bundle
    per model with ``num_gpus``. Updates of different worker groups run in parallel."""

    def __init__(self, specs: dict[str, WorkerSpec], cpus_per_worker: float | None = None):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not ray.is_initialized():
            ray.init(num_cpus=None, include_dashboard=False, log_to_driver=True, ignore_reinit_error=True,
                     configure_logging=False)
        total = float(ray.cluster_resources().get("CPU", 1.0))
        cpus = cpus_per_worker or max(0.1, min(1.0, total / max(len(specs), 1) * 0.9))
        self.pg = placement_group([{"CPU": cpus} for _ in specs], strategy="PACK")
        ray.get(self.pg.ready(), timeout=120)
        actor_cls = ray.remote(PolicyWorker)
        self.actors = {}
        for i, (key, spec) in enumerate(specs.items()):
            options = dict(num_cpus=cpus, scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=i))
            self.actors[key] = actor_cls.options(**options).remote(spec)
        logger.info("ray backend: %d worker groups in one placement group (%.2f CPU each)", len(specs), cpus)

    def generators(self) -> dict[str, _RayGenerator]:
        return {key: _RayGenerator(actor) for key, actor in self.actors.items()}

    def _all(self, call: Callable[[str, Any], Any]) -> dict[str, Any]:
        """Start ``call(key, actor)`` on every worker group at once, then wait for all of them."""
        import ray

        refs = {key: call(key, actor) for key, actor in self.actors.items()}
        try:
            return dict(zip(refs, ray.get(list(refs.values()))))
        except ray.exceptions.RayActorError as exc:
            raise RuntimeError(f"a worker-group actor died during the step ({exc}); the run stops here and "
                               "resumes from its last checkpoint when started again") from exc

    def update(self, batches: dict[str, UpdateBatch], step_seed: int) -> dict[str, dict[str, Any]]:
        return self._all(lambda key, actor: actor.update.remote(batches[key], step_seed))

    def get_states(self) -> dict[str, dict]:
        return self._all(lambda key, actor: actor.get_state.remote())

    def set_states(self, states: dict[str, dict]) -> None:
        import ray

        ray.get([self.actors[key].set_state.remote(state) for key, state in states.items()])

    def save_models(self, folder: str) -> dict[str, str]:
        import ray

        return dict(zip(self.actors, ray.get([a.save_model.remote(f"{folder}/{k}") for k, a in self.actors.items()])))

    def close(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self.actors.values():
            ray.kill(actor)
        remove_placement_group(self.pg)


BACKENDS: dict[str, Callable[[dict[str, WorkerSpec]], Any]] = {"local": LocalBackend, "ray": RayBackend}


def make_backend(name: str, specs: dict[str, WorkerSpec]):
    if name not in BACKENDS:
        raise KeyError(f"unknown backend {name!r}; available: {sorted(BACKENDS)}")
    return BACKENDS[name](specs)
