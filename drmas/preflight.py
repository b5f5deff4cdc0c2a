"""Checks a command makes before any work starts (after ``load_config``, before data, SFT or a run folder).

``load_config`` accepts partial configs (they are composed with overrides), so what only a command that is
about to run needs is checked here: an empty ``agents`` list, and folders the command will write that it
cannot (a path under a regular file, a read-only folder). Each problem is one line naming the key; all
of them are raised together as one :class:`~drmas.config.ConfigError`.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from drmas.config import ConfigError, RunConfig


def unwritable(path: str | Path) -> str | None:
    """Why a folder ``path`` (existing or to be created) cannot be written, or None. Creates nothing that
    stays: it probes its nearest existing ancestor with a temporary file."""
    path = Path(path).absolute()
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is a file, not a folder"
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        return f"cannot write in {probe} ({exc.strerror or exc})"
    return None


def writes_of(cfg: RunConfig, train: bool) -> dict[str, str]:
    """Config key -> folder the command writes: the run folder (RL), the tokenizer and every base
    checkpoint the SFT warm-up may build."""
    out = {"sft.tokenizer_dir": cfg.sft.tokenizer_dir}
    out.update({f"models.{k}.path": m.path for k, m in cfg.models.items() if m.preset and m.path})
    if train:
        out["out_dir"] = str(cfg.run_dir)
    return out


ROW_BYTES = 512
"""Lower bound of the memory one agent call of one trajectory holds in a rollout (its step-table row: the
prompt and response token ids, the response text, per-row arrays): CPython lists of a few dozen ints and a
string already take more. A lower bound, so an estimate above the limit is a run that cannot fit."""
TRACE_BYTES = 512
"""Lower bound of one SFT trace record in memory (a task, a context and a target text)."""
STEP_RECORD_BYTES = 400
"""Lower bound of one ``metrics.jsonl`` line (every step logs reward, score, per-agent and timing keys)."""
MEMORY_SHARE = 0.5
"""A batch may hold at most this share of the memory available when the run starts (psutil)."""


def _bytes(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB"


SHAPE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "tie_word_embeddings")
"""The fields of a checkpoint's ``config.json`` that fix the shapes of its weights (:func:`model_shapes`)."""


def _checkpoint_config(path: str | None) -> dict | None:
    """The ``config.json`` of the checkpoint folder ``path`` (None: no such file, e.g. a hub id not downloaded)."""
    import json

    try:
        data = json.loads((Path(path) / "config.json").read_text()) if path else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def model_shapes(cfg: RunConfig) -> dict[str, dict]:
    """Model key -> the :data:`SHAPE_KEYS` of the checkpoint it loads (``models.<key>.path``'s ``config.json``, the
    folder every worker builds its model from); models whose checkpoint is not there yet are left out. A run's
    ``manifest.json`` records it, and ``drmas eval`` compares it before a checkpoint is loaded
    (:func:`shape_problems`)."""
    out = {}
    for key, m in cfg.models.items():
        data = _checkpoint_config(m.path)
        if data is not None:
            out[key] = {k: data.get(k) for k in SHAPE_KEYS}
    return out


def shape_problems(cfg: RunConfig, recorded: dict[str, dict]) -> list[str]:
    """One line per model whose checkpoint (:func:`model_shapes`) differs in shape from the one the run trained
    (``recorded``: the run folder's record): its weights would not fit the run's checkpoint."""
    out = []
    for key, now in model_shapes(cfg).items():
        then = recorded.get(key)
        if not isinstance(then, dict):
            continue
        differ = [f"{k} {then.get(k)!r} -> {now.get(k)!r}" for k in SHAPE_KEYS if then.get(k) != now.get(k)]
        if differ:
            out.append(f"  models.{key}.path = {cfg.models[key].path!r}: a model of another size than the run's "
                       f"checkpoint ({', '.join(differ)}); fix: evaluate with the models the run was trained with "
                       "(drop the override of models.*, or restore that base)")
    return out


def _context_length(cfg: RunConfig, key: str) -> int | None:
    """The longest prompt + response model ``key`` is made for: its preset's ``max_position_embeddings``, or
    the checkpoint's ``config.json`` (None: unknown, e.g. a hub id not downloaded)."""
    from drmas.models.factory import MODEL_PRESETS

    m = cfg.models[key]
    if m.preset in MODEL_PRESETS:
        return MODEL_PRESETS[m.preset].max_position_embeddings
    try:
        return int((_checkpoint_config(m.path) or {})["max_position_embeddings"])
    except (ValueError, KeyError, TypeError):
        return None


def _memory_problem(keys: str, estimate: float, formula: str, available: int) -> list[str]:
    """The line of an estimate above :data:`MEMORY_SHARE` of the ``available`` memory (else none)."""
    limit = MEMORY_SHARE * available
    if estimate <= limit:
        return []
    return [f"  {keys}: {formula} = {_bytes(estimate)} (estimate, a lower bound) in memory; the limit is "
            f"{MEMORY_SHARE:g} x the {_bytes(available)} available = {_bytes(limit)}; fix: lower them"]


def _evaluation_memory(cfg: RunConfig, available: int) -> list[str]:
    """The evaluation's rollout: eval_tasks x eval_samples x benchmarks x agents x ROW_BYTES (benchmarks: the number
    of ``env.args.test`` files, else 1), against :func:`_memory_problem`'s limit."""
    t = cfg.train
    agents = max(1, len(cfg.agents))
    tests = cfg.env.args.get("test")
    sets = len(tests) if isinstance(tests, dict) and tests else 1
    estimate = t.eval_tasks * t.eval_samples * sets * agents * ROW_BYTES
    return _memory_problem("train.eval_tasks, train.eval_samples", estimate,
                           f"{t.eval_tasks} tasks x {t.eval_samples} samples x {sets} benchmark(s) x {agents} agents x "
                           f"{ROW_BYTES} B", available)


def _available_memory() -> int:
    import psutil

    return psutil.virtual_memory().available


def size_problems(cfg: RunConfig, train: bool = True, available: int | None = None,
                  free_disk: int | None = None) -> list[str]:
    """Sizes that cannot fit, each a line naming the keys, the estimate and the limit (docs/reliability.md §7):

    - rollout:    batch_tasks x group_size x agents x ROW_BYTES     <= MEMORY_SHARE x available memory
    - evaluation: eval_tasks x eval_samples x benchmarks x agents x ROW_BYTES (same limit; benchmarks: the
      number of ``env.args.test`` files, else 1)
    - SFT traces: sft.traces x TRACE_BYTES                          <= MEMORY_SHARE x available memory
    - records:    train.steps x STEP_RECORD_BYTES                   <= free disk space of out_dir
    - every agent's max_new_tokens (and rollout.max_prompt_tokens)  <= its model's context length

    Every estimate is a lower bound (responses may stop early, prompts grow with the history), so a run
    refused here cannot fit; one accepted may still need more."""
    import shutil

    available = _available_memory() if available is None else available
    agents = max(1, len(cfg.agents))
    t = cfg.train
    out = []
    if train:
        out += _memory_problem("train.batch_tasks, train.group_size", t.batch_tasks * t.group_size * agents * ROW_BYTES,
                               f"{t.batch_tasks} tasks x {t.group_size} trajectories x {agents} agents x {ROW_BYTES} B",
                               available)
        if t.evaluate:
            out += _evaluation_memory(cfg, available)
        if free_disk is None:
            probe = Path(cfg.out_dir).absolute()
            while not probe.exists():
                probe = probe.parent
            free_disk = shutil.disk_usage(probe).free
        if t.steps * STEP_RECORD_BYTES > free_disk:
            out.append(f"  train.steps: {t.steps} steps x {STEP_RECORD_BYTES} B of metrics records = "
                       f"{_bytes(t.steps * STEP_RECORD_BYTES)} (estimate, a lower bound); the limit is the "
                       f"{_bytes(free_disk)} free in {cfg.out_dir}; fix: lower train.steps or free space")
    out += _memory_problem("sft.traces", cfg.sft.traces * TRACE_BYTES, f"{cfg.sft.traces} traces x {TRACE_BYTES} B",
                           available)
    for i, a in enumerate(cfg.agents):
        context = _context_length(cfg, a.model) if a.model in cfg.models else None
        prompt = cfg.models[a.model].rollout.max_prompt_tokens if a.model in cfg.models else None
        if context and a.sampling.max_new_tokens + (prompt or 0) > context:
            what = f"max_new_tokens={a.sampling.max_new_tokens}" + (f" + max_prompt_tokens={prompt}" if prompt else "")
            out.append(f"  agents[{i}].sampling.max_new_tokens: {what} exceeds the context length {context} of model "
                       f"{a.model!r} (the limit); fix: lower it")
    return out


def check_before_work(cfg: RunConfig, train: bool = True) -> None:
    """Raise one :class:`ConfigError` listing every problem found (one line per key), else return."""
    from drmas.orchestra import ORCHESTRA_REGISTRY

    problems = []
    if not cfg.agents:
        slots = list(getattr(ORCHESTRA_REGISTRY.get(cfg.env.orchestra), "slots", None) or [])
        problems.append(f"  agents: empty; env.orchestra={cfg.env.orchestra!r} needs one agent per slot {slots}; fix: "
                        "add them (see experiments/configs/cpu/*.yaml)")
    problems += size_problems(cfg, train)
    for key, folder in writes_of(cfg, train).items():
        if (why := unwritable(folder)) is not None:
            problems.append(f"  {key} = {folder!r}: not writable: {why}; fix: choose a folder you can write")
    if problems:
        raise ConfigError("\n".join(["cannot start:", *problems]))


def check_before_eval(cfg: RunConfig, recorded_shapes: dict[str, dict], available: int | None = None) -> None:
    """What ``drmas eval`` checks before a model or a checkpoint is loaded: the evaluation's memory (the estimate
    :func:`size_problems` applies to a run's evaluations) and the models' shapes against the run's
    (:func:`shape_problems`). Raises one :class:`ConfigError` listing every problem (one line per key)."""
    problems = _evaluation_memory(cfg, _available_memory() if available is None else available)
    problems += shape_problems(cfg, recorded_shapes)
    if problems:
        raise ConfigError("\n".join(["cannot evaluate:", *problems]))
