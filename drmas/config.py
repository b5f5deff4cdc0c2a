"""Typed run configuration: YAML files + ``key.sub=value`` command-line overrides, validated up front.

A run config names the environment and its orchestra, the models (worker groups), the agents and which
model each agent runs on (the agent -> model assignment: one shared model = "LLM sharing", one model
per agent = "non-sharing", models of different sizes = "heterogeneous"), the algorithm and the
training schedule. Every field has a default that runs the CPU embedded default.

Validation happens before any work starts and names the offending key and the fix: unknown keys,
wrong types, negative sizes, agents mapped to undefined models, unknown agent/orchestra/estimator
names, agents sharing a model with conflicting optimizer settings.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, model_validator


class Strict(BaseModel):
    """Base: unknown keys are errors; values are validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SamplingConfig(Strict):
    temperature: float = Field(1.0, ge=0, description="sampling temperature (0 = greedy)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass")
    top_k: int = Field(0, ge=0, description="top-k sampling (0 = off)")
    max_new_tokens: PositiveInt = Field(48, description="response length limit of one agent call")


class OptimConfig(Strict):
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate (paper: 1e-6 for 4B-8B models)")
    warmup_steps: int = Field(0, ge=0, description="linear warm-up of the learning rate, in RL steps")
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = Field(1.0, gt=0, description="clip threshold (the pre-clip norm is logged)")
    micro_batch_size: PositiveInt = Field(64, description="samples per forward/backward pass")
    mini_batches: PositiveInt = Field(1, description="optimizer steps per RL step (paper search: 5)")


class ModelConfig(Strict):
    """One worker group: a policy model with its own optimizer."""

    preset: Optional[str] = Field("tiny", description="tiny-model preset built from config (CPU default)")
    path: Optional[str] = Field(None, description="checkpoint folder (SFT output or a real Qwen/Llama model)")
    sft_roles: Optional[list[str]] = Field(
        None, description="agent roles whose traces the SFT warm-up of a missing `path` trains on (default: the "
                          "roles of this model's agents). Models that name the same `path` start from one "
                          "checkpoint, as the paper's agents all start from one base model")
    optim: OptimConfig = OptimConfig()

    @model_validator(mode="after")
    def _one_source(self) -> "ModelConfig":
        if self.preset is None and self.path is None:
            raise ValueError("a model needs `preset` (tiny model from config) or `path` (a checkpoint)")
        if self.sft_roles is not None:
            from drmas.agents import AGENT_REGISTRY

            unknown = [r for r in self.sft_roles if r not in AGENT_REGISTRY.names()]
            if unknown or not self.sft_roles:
                raise ValueError(f"sft_roles {self.sft_roles}: unknown or empty; registered agent roles: "
                                 f"{sorted(AGENT_REGISTRY.names())}")
        return self


class AgentConfig(Strict):
    """One agent: its role (a registered agent class), the model it runs on, per-agent overrides."""

    name: str = Field(description="agent id as it appears in the step table and metrics")
    role: str = Field(description="registered agent class, e.g. math_solver, math_verifier")
    model: str = Field(description="key into `models` (agents with the same key share one LLM)")
    sampling: SamplingConfig = SamplingConfig()
    lr: Optional[float] = Field(None, gt=0, description="overrides the model's optim.lr")
    warmup_steps: Optional[int] = Field(None, ge=0, description="overrides the model's optim.warmup_steps")
    micro_batch_size: Optional[PositiveInt] = Field(None, description="overrides optim.micro_batch_size")


class AlgoConfig(Strict):
    estimator: str = Field("drmas", description="advantage estimator (drmas.algos.ESTIMATORS)")

    @model_validator(mode="after")
    def _known_estimator(self) -> "AlgoConfig":
        from drmas.algos import ESTIMATORS

        if self.estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {self.estimator!r}; registered: {sorted(ESTIMATORS)}")
        return self

    ddof: Literal[0, 1] = 1
    eps: float = Field(1e-6, ge=0)
    singleton: Literal["raw", "zero"] = "raw"
    scale_by_std: bool = True
    clip_low: float = Field(0.2, ge=0, lt=1)
    clip_high: float = Field(0.28, ge=0, description="clip-higher (DAPO); the reference uses 0.28")
    aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"] = "token_mean"
    kl_coef: float = Field(0.0, ge=0)
    entropy_coef: float = Field(0.0, ge=0)
    invalid_penalty: float = Field(0.1, ge=0, description="c in score = R - c (1 - valid); math 0.1, search 0.01")


class EnvConfig(Strict):
    name: str = Field("math_generated", description="task source (registered task source)")
    orchestra: str = Field("math", description="registered orchestra")
    orchestra_args: dict[str, Any] = Field(default_factory=dict, description="e.g. max_loops, max_turns")
    args: dict[str, Any] = Field(default_factory=dict, description="task-source arguments (difficulty, files, ...)")
    eval_args: dict[str, Any] = Field(default_factory=dict, description="overrides of `args` for evaluation tasks")


class TrainConfig(Strict):
    steps: int = Field(100, ge=0, description="RL steps")
    batch_tasks: PositiveInt = Field(16, description="tasks per step (paper: math 32, search 128)")
    group_size: PositiveInt = Field(8, description="trajectories per task (paper: math 8, search 5)")
    seed: int = 0
    eval_every: int = Field(25, ge=0, description="evaluate every N steps (0 = only at start and end)")
    eval_tasks: int = Field(64, ge=0, description="evaluation tasks")
    eval_samples: PositiveInt = Field(4, description="samples per evaluation task (paper: 16)")
    eval_sampling: SamplingConfig = SamplingConfig(temperature=0.6, top_p=0.95)
    save_every: int = Field(25, ge=0, description="checkpoint every N steps (0 = only at the end)")
    max_nonfinite_skips: PositiveInt = Field(3, description="stop after this many consecutive non-finite steps")
    backend: Literal["local", "ray"] = "local"
    threads: int = Field(1, ge=0, description="torch threads per process (0 = leave as is); on 2 shared cores "
                         "1 thread was measured 10-27x faster than 2 under load")


class SFTSection(Strict):
    """SFT warm-up of models whose checkpoint `path` does not exist yet (tiny models from scratch)."""

    traces: PositiveInt = Field(4000, description="tasks to draw role traces from")
    steps: PositiveInt = Field(600, description="optimizer steps")
    batch_size: PositiveInt = 64
    lr: float = Field(3e-3, gt=0)
    warmup_steps: int = Field(30, ge=0)
    vocab_size: PositiveInt = Field(512, description="byte-level BPE vocabulary")
    tokenizer_dir: str = Field("results/sft/tokenizer", description="shared tokenizer of the task source")
    seed: int = 0


class RunConfig(Strict):
    name: str = "run"
    out_dir: str = Field("results/runs", description="the run directory is out_dir/name")
    env: EnvConfig = EnvConfig()
    models: dict[str, ModelConfig] = Field(default_factory=lambda: {"shared": ModelConfig()})
    agents: list[AgentConfig] = Field(default_factory=list)
    algo: AlgoConfig = AlgoConfig()
    train: TrainConfig = TrainConfig()
    sft: SFTSection = SFTSection()

    @model_validator(mode="after")
    def _check_assignment(self) -> "RunConfig":
        names = [a.name for a in self.agents]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"agents: duplicate agent names {dupes}; give each agent a unique `name`")
        for i, agent in enumerate(self.agents):
            if agent.model not in self.models:
                raise ValueError(f"agents[{i}].model = {agent.model!r} is not defined under `models` "
                                 f"(defined: {sorted(self.models)}); add it or fix the name")
        unused = sorted(set(self.models) - {a.model for a in self.agents})
        if self.agents and unused:
            raise ValueError(f"models {unused} are defined but no agent uses them; remove them or assign an agent")
        for key in self.models:
            self.effective_optim(key)  # raises on conflicting per-agent overrides
        return self

    def agents_of(self, model_key: str) -> list[AgentConfig]:
        return [a for a in self.agents if a.model == model_key]

    def effective_optim(self, model_key: str) -> OptimConfig:
        """The optimizer config of one worker group: the model's, with its agents' overrides applied.
        Agents that share a model must agree on every override they set."""
        optim = self.models[model_key].optim.model_copy()
        for field in ("lr", "warmup_steps", "micro_batch_size"):
            values = {a.name: getattr(a, field) for a in self.agents_of(model_key) if getattr(a, field) is not None}
            if len(set(values.values())) > 1:
                raise ValueError(f"agents {sorted(values)} share model {model_key!r} but set different `{field}` "
                                 f"({values}); one model has one optimizer: use the same value or separate models")
            if values:
                setattr(optim, field, next(iter(values.values())))
        return optim

    def effective_agents(self) -> dict[str, dict[str, Any]]:
        """Per-agent view written to the manifest: role, model, sampling and the optimizer it trains with."""
        return {a.name: {"role": a.role, "model": a.model, "sampling": a.sampling.model_dump(),
                         "optim": self.effective_optim(a.model).model_dump()} for a in self.agents}

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name


class ConfigError(ValueError):
    """A configuration problem, with the key path and the fix in the message."""


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see drmas/config.py for the fields)"
        got = e.get("input")
        got_txt = "" if e["type"] == "extra_forbidden" or isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"  {loc}: {msg}{got_txt}")
    return "\n".join(lines)


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], value parsed as YAML, so 1e-4, true, [1, 2] work)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.sub=value")
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def _set_path(data: dict, path: list[str], value: Any, item: str) -> None:
    node: Any = data
    for depth, part in enumerate(path[:-1]):
        if isinstance(node, list):
            node = node[_list_index(node, part, item)]
            continue
        node = node.setdefault(part, {})
        if not isinstance(node, (dict, list)):
            raise ConfigError(f"override {item!r}: {'.'.join(path[:depth + 1])} is not a section")
    last = path[-1]
    if isinstance(node, list):
        node[_list_index(node, last, item)] = value
    else:
        node[last] = value


def _list_index(node: list, part: str, item: str) -> int:
    """List entries are addressed by position (agents.0.lr) or by their `name` (agents.solver.lr)."""
    if part.lstrip("-").isdigit():
        idx = int(part)
        if not -len(node) <= idx < len(node):
            raise ConfigError(f"override {item!r}: index {idx} out of range (list has {len(node)} entries)")
        return idx
    for i, entry in enumerate(node):
        if isinstance(entry, dict) and entry.get("name") == part:
            return i
    raise ConfigError(f"override {item!r}: no entry named {part!r}")


def _read_yaml(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    """A YAML mapping; a top-level ``base: other.yaml`` (relative to this file) is read first and this
    file's keys are merged into it (see :func:`_merge`)."""
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    if path.resolve() in seen:
        raise ConfigError(f"config file {path} includes itself through `base`")
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    base = loaded.pop("base", None)
    if base is None:
        return loaded
    return _merge(_read_yaml(path.parent / base, seen + (path.resolve(),)), loaded)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Merge ``over`` into ``base``: mappings recursively, unless ``over``'s mapping has ``_replace: true``
    (then it replaces the base's, e.g. a sharing config's `models`); lists and values replace."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and value.get("_replace"):
            out[key] = {k: v for k, v in value.items() if k != "_replace"}
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML config (or the defaults), apply overrides, validate. Raises ConfigError."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        data = _read_yaml(Path(path), seen=())
        source = str(path)
    data = copy.deepcopy(data)
    for item in overrides or []:
        keys, value = parse_override(item)
        _set_path(data, keys, value, item)
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None
    return cfg


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
