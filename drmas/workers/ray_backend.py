"""The ``ray`` backend: each worker group a Ray actor (:class:`~drmas.workers.policy.PolicyWorker`), all in
one placement group (the paper's shared resource pool). Ray is imported only when this backend is built."""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Callable

from drmas.devices import resolve_device
from drmas.plugins import load_plugins, loaded_plugins
from drmas.rollout.base import Generation, SamplingParams
from drmas.workers.base import ray_get
from drmas.workers.base import UpdateBatch, WorkerSpec
from drmas.workers.policy import PolicyWorker

logger = logging.getLogger(__name__)


class _RayGenerator:
    """Adapter: ``generate`` on a Ray actor, blocking (the orchestra's calls are sequential)."""

    def __init__(self, actor, key: str):
        self.actor, self.key = actor, key

    def generate(self, prompts: list[str], sampling: SamplingParams, seed: int | None = None) -> Generation:
        return ray_get(self.key, self.actor.generate.remote(prompts, sampling, seed))


class _PolicyActor(PolicyWorker):
    """A worker group's :class:`PolicyWorker` in its Ray actor: it imports the run's plug-ins (the targets the
    driver loaded, :func:`drmas.plugins.loaded_plugins`) before it builds the worker, so a plug-in's engines and
    classes are known in the actor too."""

    def __init__(self, spec: WorkerSpec, plugins: tuple[str, ...]):
        load_plugins(plugins)
        super().__init__(spec)


class RayBackend:
    """One Ray actor per worker group, all in one placement group (shared resource pool). On a CPU
    machine each actor gets a fractional CPU bundle (2 cores hold several models); with ``train.device``
    on CUDA, the worker groups share one GPU (a 1/n GPU bundle each; Ray makes that GPU the actor's
    ``cuda``). Updates of different worker groups run in parallel."""

    def __init__(self, specs: dict[str, WorkerSpec], cpus_per_worker: float | None = None):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not ray.is_initialized():
            ray.init(num_cpus=None, include_dashboard=False, log_to_driver=True, ignore_reinit_error=True,
                     configure_logging=False)
        total = float(ray.cluster_resources().get("CPU", 1.0))
        cpus = cpus_per_worker or max(0.1, min(1.0, total / max(len(specs), 1) * 0.9))
        on_gpu = any(resolve_device(spec.device).type == "cuda" for spec in specs.values())
        gpus = 1.0 / len(specs) if on_gpu else 0.0
        if on_gpu:  # Ray hides the other GPUs from an actor: its share is its "cuda"
            specs = {key: replace(spec, device="cuda") for key, spec in specs.items()}
        self.pg = placement_group([{"CPU": cpus, **({"GPU": gpus} if gpus else {})} for _ in specs], strategy="PACK")
        ray.get(self.pg.ready(), timeout=120)
        actor_cls = ray.remote(_PolicyActor)
        self.specs, self.plugins = specs, loaded_plugins()
        self._new_actor = {key: actor_cls.options(num_cpus=cpus, num_gpus=gpus, scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=self.pg, placement_group_bundle_index=i)).remote for i, key in enumerate(specs)}
        self.actors = {key: self._new_actor[key](spec, self.plugins) for key, spec in specs.items()}
        logger.info("ray backend: %d worker groups in one placement group (%.2f CPU each)", len(specs), cpus)

    def restart(self) -> None:
        """Replace every actor by a fresh one (initial weights, same placement-group bundle); the trainer
        then loads the last checkpoint. The survivors are replaced too: they may hold part of a failed step."""
        import ray

        for actor in self.actors.values():
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 -- already dead
                pass
        self.actors = {key: self._new_actor[key](spec, self.plugins) for key, spec in self.specs.items()}
        logger.warning("ray backend: replaced the actors of %s", sorted(self.actors))

    def generators(self) -> dict[str, _RayGenerator]:
        return {key: _RayGenerator(actor, key) for key, actor in self.actors.items()}

    def _all(self, call: Callable[[str, Any], Any]) -> dict[str, Any]:
        """Start ``call(key, actor)`` on every worker group at once, then wait for all of them; a dead
        actor raises ``WorkerDied`` naming its worker group."""
        refs = {key: call(key, actor) for key, actor in self.actors.items()}
        return {key: ray_get(key, ref) for key, ref in refs.items()}

    def update(self, batches: dict[str, UpdateBatch], step_seed: int) -> dict[str, dict[str, Any]]:
        return self._all(lambda key, actor: actor.update.remote(batches[key], step_seed))

    def get_states(self) -> dict[str, dict]:
        return self._all(lambda key, actor: actor.get_state.remote())

    def set_states(self, states: dict[str, dict]) -> None:
        refs = {key: self.actors[key].set_state.remote(state) for key, state in states.items()}
        for key, ref in refs.items():
            ray_get(key, ref)

    def save_models(self, folder: str) -> dict[str, str]:
        return self._all(lambda key, actor: actor.save_model.remote(f"{folder}/{key}"))

    def close(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self.actors.values():
            ray.kill(actor)
        remove_placement_group(self.pg)
