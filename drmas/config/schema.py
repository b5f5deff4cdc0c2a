"""The run configuration's schema: one pydantic model per section, each field with its default and its
description, and the validators that check invariants across fields (registered names, the agent -> model
assignment, what the backend can do). Reading YAML and overrides is :mod:`drmas.config.loader`; turning a
validation error into one line per problem is :mod:`drmas.config.errors`.

A run config names the environment and its orchestra, the models (worker groups), the agents and which
model each agent runs on (the agent -> model assignment: one shared model = "LLM sharing", one model
per agent = "non-sharing", models of different sizes = "heterogeneous"), the algorithm and the
training schedule. Every field has a default that runs the CPU embedded default.

Validation names the offending key and the fix: unknown keys, wrong types, negative sizes, agents mapped
to undefined models, unknown agent/orchestra/estimator/backend names, agents sharing a model with
conflicting optimizer settings, settings the backend cannot run.
"""
from __future__ import annotations

import types
from pathlib import Path
from typing import Any, Literal, Optional, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator

from drmas.algos.catalog import Conventions, Ddof, Singleton
from drmas.devices import DEVICE_PATTERN


YAML_TRUE, YAML_FALSE = ("on", "yes", "true", "y"), ("off", "no", "false", "n")
"""Words YAML 1.1 (PyYAML) reads as booleans: `shared_prefix: off` arrives as False."""


def literal_choices(annotation: Any) -> tuple[Any, ...]:
    """The choices of a ``Literal[...]`` annotation, also inside ``Optional``/``Union``; () for any other type."""
    if get_origin(annotation) is Literal:
        return get_args(annotation)
    if get_origin(annotation) in (Union, types.UnionType):
        return tuple(c for arg in get_args(annotation) for c in literal_choices(arg))
    return ()


def as_written(value: Any, choices: tuple[Any, ...]) -> Any:
    """The string choice a user wrote when YAML turned it into a bool or a number (``off`` -> False -> "off",
    ``1`` -> 1 -> "1"); any other value unchanged (validation then reports it)."""
    words = {c.lower(): c for c in choices if isinstance(c, str)}
    if isinstance(value, bool):
        return next((words[w] for w in (YAML_TRUE if value else YAML_FALSE) if w in words), value)
    if isinstance(value, (int, float)) and value not in choices:
        return words.get(str(value).lower(), value)
    return value


class Strict(BaseModel):
    """Base: unknown keys are errors, NaN/inf are not numbers a run can use; values are validated on
    assignment too. A string choice that YAML 1.1 reads as a bool or a number (``on``/``off``, ``yes``/``no``)
    is taken as written (:func:`as_written`), in files and in overrides alike."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _yaml_spellings(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name, info in cls.model_fields.items():
            choices = literal_choices(info.annotation)
            if choices and name in out:
                out[name] = as_written(out[name], choices)
        return out


def _registered(name: str, registered: list[str], what: str, fix: str = "; use one of them") -> str:
    """``name`` if it is one of the ``registered`` names, else the error that lists them, says the fix and names
    the nearest registered name (``difflib``) when one is close."""
    if name not in registered:
        import difflib

        close = difflib.get_close_matches(name, registered, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown {what} {name!r}{hint}; registered: {registered}{fix}")
    return name


def check_run_name(name: str, what: str = "name") -> str:
    """``name`` if it is one folder name, so that a run (and the grid's log of it) stays inside ``out_dir``; else
    the error that says the fix."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ValueError(f"{what} = {name!r} would put the run outside out_dir/<name>; use one folder name such as "
                         "'math_sharing_s0' (no '/', not '.' or '..', not empty)")
    return name


class SamplingConfig(Strict):
    temperature: float = Field(1.0, ge=0, description="sampling temperature (0 = greedy)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass")
    top_k: int = Field(0, ge=0, description="top-k sampling (0 = off)")
    max_new_tokens: PositiveInt = Field(48, description="response length limit of one agent call")


LR_RANGE = (1e-8, 0.1)
"""The plausible AdamW learning rates (paper: 1e-6 for 4B-8B models; the CPU presets 5e-5 to 3.2e-3); a value
outside needs ``train.allow_unusual_lr``."""


class OptimConfig(Strict):
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate (paper: 1e-6 for 4B-8B models)")
    warmup_steps: int = Field(0, ge=0, description="linear warm-up of the learning rate, in RL steps")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW (beta1, beta2)")
    max_grad_norm: float = Field(1.0, gt=0, description="clip threshold (the pre-clip norm is logged)")
    micro_batch_size: PositiveInt = Field(64, description="samples per forward/backward pass")
    mini_batches: PositiveInt = Field(1, description="optimizer steps per RL step (paper search: 5)")


class RolloutEngineConfig(Strict):
    """How one worker group generates: its rollout engine (``drmas.rollout.ENGINES``). The local and ray
    backends generate in the worker (``fast``, or ``hf``: transformers ``generate``); the openrlhf backend gives each worker
    group its own vLLM engine (``vllm``), refreshed once per RL step. Fields marked vLLM are read only
    by the ``vllm`` engine."""

    engine: str = Field("fast", description="registered rollout engine: fast (the CPU default: a fused decode loop for "
                        "small Qwen2 models, drmas/rollout/fast.py; other models fall back to hf), hf (transformers "
                        "generate, its reference; on the openrlhf backend both run in the driver, its CPU mode) or vllm "
                        "(GPU, openrlhf backend)")
    tensor_parallel_size: PositiveInt = Field(1, description="vLLM: GPUs per engine replica (tensor parallelism); "
                                              "the group runs resources.num_gpus / tensor_parallel_size replicas")
    gpu_memory_utilization: Optional[float] = Field(
        None, gt=0, le=1, description="vLLM: share of each GPU one engine may take (weights + KV cache); None = "
                                      "0.85 split evenly among the engines of all worker groups sharing a GPU")
    max_prompt_tokens: Optional[PositiveInt] = Field(None, description="longer prompts are truncated (paper: math "
                                                     "8192, search 4096); None = no limit")
    truncation: Literal["left", "middle"] = Field("left", description="which part of an over-long prompt is cut "
                                                  "(reference: middle for math, left for search)")
    max_model_len: Optional[PositiveInt] = Field(None, description="vLLM: context length (prompt + response) the "
                                                 "engine reserves; None = the checkpoint's own limit")
    chat_template: bool = Field(False, description="wrap each prompt as one user message in the tokenizer's chat "
                                "template (real checkpoints; the tiny CPU models have none)")
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict, description="extra chat-template arguments, "
                                                 "e.g. {enable_thinking: false} for Qwen3 (reference math runs)")
    enable_sleep: bool = Field(True, description="vLLM sleep mode and DeepSpeed offload between rollout and update, so "
                               "that several models time-share the same GPUs (openrlhf backend)")
    enforce_eager: bool = Field(False, description="vLLM: no CUDA graphs (slower decoding, faster start)")
    enable_prefix_caching: bool = Field(False, description="vLLM: reuse the KV cache of shared prompt prefixes")

    @model_validator(mode="after")
    def _known_engine(self) -> "RolloutEngineConfig":
        from drmas.rollout.catalog import ENGINES

        if self.engine not in ENGINES:
            raise ValueError(f"unknown rollout engine {self.engine!r}; registered: {ENGINES.names()}")
        if self.max_model_len is not None and self.max_prompt_tokens is not None \
                and self.max_model_len <= self.max_prompt_tokens:
            raise ValueError(f"max_model_len={self.max_model_len} leaves no room for a response after "
                             f"max_prompt_tokens={self.max_prompt_tokens}; raise max_model_len")
        return self


class ResourcesConfig(Strict):
    """GPUs and DeepSpeed settings of one worker group on the openrlhf backend (ignored by local/ray).
    All worker groups share one Ray placement group of max(num_gpus) GPUs (the paper's shared pool)."""

    num_gpus: PositiveInt = Field(1, description="training ranks (DeepSpeed data parallel), one per GPU of the pool")
    zero_stage: Literal[0, 1, 2, 3] = Field(2, description="DeepSpeed ZeRO stage (3 shards weights too: 7B-8B models)")
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass (reference: on)")
    adam_offload: bool = Field(False, description="keep the Adam states in CPU memory (reference: optimizer_offload)")
    checkpoint_dir: Optional[str] = Field(None, description="DeepSpeed checkpoints of the group go to "
                                          "checkpoint_dir/<model key>; None = <run dir>/checkpoints/deepspeed "
                                          "(computed by RunConfig)")


class ModelConfig(Strict):
    """One worker group: a policy model with its own optimizer."""

    preset: Optional[str] = Field("tiny", description="tiny-model preset built from config (CPU default)")
    path: Optional[str] = Field(None, description="checkpoint folder (SFT output or a real Qwen/Llama model)")
    sft_roles: Optional[list[str]] = Field(
        None, description="agent roles whose traces the SFT warm-up of a missing `path` trains on (default: the "
                          "roles of this model's agents). Models that name the same `path` start from one "
                          "checkpoint, as the paper's agents all start from one base model")
    optim: OptimConfig = Field(OptimConfig(), description="this worker group's optimizer (agents may override lr, "
                               "warmup_steps, micro_batch_size)")
    rollout: RolloutEngineConfig = Field(default_factory=RolloutEngineConfig,  # built lazily: imports drmas.rollout
                                         description="how this worker group generates")
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig, description="GPUs and DeepSpeed settings "
                                       "(openrlhf backend)")
    trust_remote_code: bool = Field(False, description="let transformers and vLLM run the Python code a hub "
                                    "checkpoint at `path` ships (its own tokenizer or model class); only for "
                                    "checkpoints whose code you have read. Off: such a checkpoint is refused by "
                                    "transformers, and no code from a checkpoint runs")

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
        tp, gpus = self.rollout.tensor_parallel_size, self.resources.num_gpus
        if gpus % tp:
            raise ValueError(f"rollout.tensor_parallel_size={tp} does not divide resources.num_gpus={gpus}: a worker "
                             "group's vLLM engines cover exactly its training GPUs (weights reach them through CUDA "
                             "IPC on each GPU); use a divisor of num_gpus")
        return self


class AgentConfig(Strict):
    """One agent: its role (a registered agent class), the model it runs on, per-agent overrides."""

    name: str = Field(description="agent id as it appears in the step table and metrics")
    role: str = Field(description="registered agent class, e.g. math_solver, math_verifier")
    model: str = Field(description="key into `models` (agents with the same key share one LLM)")
    sampling: SamplingConfig = Field(SamplingConfig(), description="this agent's sampling during training rollouts")
    lr: Optional[float] = Field(None, gt=0, description="overrides the model's optim.lr")
    warmup_steps: Optional[int] = Field(None, ge=0, description="overrides the model's optim.warmup_steps")
    micro_batch_size: Optional[PositiveInt] = Field(None, description="overrides optim.micro_batch_size")
    invalid_penalty: Optional[float] = Field(None, ge=0, description="this agent's c in score = R - c (1 - valid); "
                                             "overrides algo.invalid_penalty (paper: one c per task)")

    @field_validator("role")
    @classmethod
    def _known_role(cls, role: str) -> str:
        from drmas.agents import AGENT_REGISTRY

        return _registered(role, AGENT_REGISTRY.names(), "agent role", ". Use one of them, or register your class with "
                           "@register_agent and import its module before loading the config")


class AlgoConfig(Strict):
    """The RL algorithm: the advantage estimator and its conventions, the clipped policy loss, the penalty."""

    estimator: str = Field("drmas", description="advantage estimator (drmas.algos.ESTIMATORS): drmas = agent-wise "
                           "mu_k, sigma_k (paper Eq. 5); trajectory_grpo = vanilla GRPO (Eq. 2); Table 3 ablations")

    @field_validator("estimator")
    @classmethod
    def _known_estimator(cls, estimator: str) -> str:
        from drmas.algos.catalog import ESTIMATORS

        return _registered(estimator, ESTIMATORS.names(), "estimator")

    ddof: Ddof = Field(Conventions.ddof, description="std of the advantage groups: 1 = unbiased "
                                "(reference), 0 = population")
    eps: float = Field(Conventions.eps, ge=0, description="added to the std in the advantage denominator")
    singleton: Singleton = Field(Conventions.singleton, description="a group of one sample: raw = "
                                              "mean 0, std 1 (its score / (1 + eps)); zero = advantage 0")
    scale_by_std: bool = Field(Conventions.scale_by_std, description="divide advantages by the std (false = "
                               "mean-only, Dr. GRPO style)")
    clip_low: float = Field(0.2, ge=0, lt=1, description="PPO ratio clip below: 1 - clip_low (paper Eq. 3)")
    clip_high: float = Field(0.28, ge=0, description="PPO ratio clip above: 1 + clip_high (clip-higher, DAPO); "
                             "the reference uses 0.28")
    aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"] = Field(
        "token_mean", description="how token losses make a batch loss: mean over all tokens (reference), mean of "
                                  "per-sequence token means, or mean of per-sequence token sums")
    kl_coef: float = Field(0.0, ge=0, description="k3 KL penalty to a frozen reference model (0 = none, the paper)")
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus of the policy loss (0 = none)")
    invalid_penalty: float = Field(0.1, ge=0, description="c in score = R - c (1 - valid); math 0.1, search 0.01 "
                                   "(agents[i].invalid_penalty overrides it per agent)")
    shared_prefix: Literal["auto", "on", "off"] = Field(
        "auto", description="rows with the same prompt (a task group's trajectories) run it through the model once: "
                            "in the update, old-log-prob and reference passes (per micro-batch; loss and gradients "
                            "unchanged) and in the HF rollout engine's prefill. auto: where the padded token count "
                            "falls to 0.8 of the plain layout's or less (drmas.models.logprobs.PREFIX_SHARING_PAYS); "
                            "on: always; off: never (docs/training.md, 'Shared prompts')")

    def conventions(self) -> Conventions:
        """The advantage conventions these fields set (:func:`drmas.algos.compute_advantages` keywords)."""
        return Conventions(ddof=self.ddof, eps=self.eps, singleton=self.singleton, scale_by_std=self.scale_by_std)


class EnvConfig(Strict):
    name: str = Field("math_generated", description="task source (registered task source)")
    orchestra: str = Field("math", description="registered orchestra")
    orchestra_args: dict[str, Any] = Field(default_factory=dict, description="e.g. max_loops, max_turns")
    args: dict[str, Any] = Field(default_factory=dict, description="task-source arguments (difficulty, files, ...)")
    eval_args: dict[str, Any] = Field(default_factory=dict, description="overrides of `args` for evaluation tasks")

    @field_validator("name")
    @classmethod
    def _known_source(cls, name: str) -> str:
        from drmas.tasks import TASK_SOURCES

        return _registered(name, TASK_SOURCES.names(), "task source")

    @field_validator("orchestra")
    @classmethod
    def _known_orchestra(cls, orchestra: str) -> str:
        from drmas.orchestra import ORCHESTRA_REGISTRY

        return _registered(orchestra, ORCHESTRA_REGISTRY.names(), "orchestra", "; use one of them, or register yours "
                           "with @register_orchestra and import its module first")

    @model_validator(mode="after")
    def _data_files_exist(self) -> "EnvConfig":
        """Every data-file path under ``args`` / ``eval_args`` (a string ending in a data suffix) must exist,
        so a missing file stops the run before any work, not after the SFT warm-up."""
        for section in ("args", "eval_args"):
            for key, value in _leaves(getattr(self, section), f"env.{section}"):
                if isinstance(value, str) and value.lower().endswith(DATA_SUFFIXES) and not Path(value).is_file():
                    raise ValueError(f"{key} = {value!r}: data file not found (relative paths start at {Path.cwd()}); "
                                     "fix the path, or write the file first (`drmas data prepare math|search`)")
        return self


DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".tsv", ".jsonl.gz", ".json.gz")
"""A string value under ``env.args`` ending in one of these is a data-file path that must exist."""


def _leaves(node: Any, prefix: str) -> list[tuple[str, Any]]:
    """(dotted key, value) of every leaf of nested dicts / lists."""
    if isinstance(node, dict):
        return [leaf for k, v in node.items() for leaf in _leaves(v, f"{prefix}.{k}")]
    if isinstance(node, (list, tuple)):
        return [leaf for i, v in enumerate(node) for leaf in _leaves(v, f"{prefix}[{i}]")]
    return [(prefix, node)]


class TrainConfig(Strict):
    steps: int = Field(100, ge=0, description="RL steps")
    batch_tasks: PositiveInt = Field(16, description="tasks per step (paper: math 32, search 128)")
    group_size: PositiveInt = Field(8, description="trajectories per task (paper: math 8, search 5)")
    seed: int = Field(0, description="seed of the task batches, rollouts, worker initialisation and updates")
    evaluate: bool = Field(True, description="false: no evaluation at all (sweeps that measure training statistics "
                           "only, e.g. experiments/grids/mechanism.yaml)")
    eval_every: int = Field(25, ge=0, description="evaluate every N steps (0 = only at start and end)")
    eval_tasks: int = Field(64, ge=0, description="evaluation tasks")
    eval_samples: PositiveInt = Field(4, description="samples per evaluation task (paper: 16)")
    eval_sampling: SamplingConfig = Field(SamplingConfig(temperature=0.6, top_p=0.95), description="temperature, "
                                          "top_p, top_k of every agent during evaluation (max_new_tokens stays the agent's)")
    save_every: int = Field(25, ge=0, description="checkpoint every N steps (0 = only at the end)")
    max_nonfinite_skips: PositiveInt = Field(3, description="stop after this many consecutive non-finite steps")
    max_tool_failure_rate: float = Field(
        0.1, ge=0, le=1, description="stop the run when more than this share of a step's (or an evaluation's) tool "
                                     "calls (retrieval queries, grader comparisons) failed after the tool's own retries "
                                     "(docs/reliability.md §7); 1 = never stop")
    backend: str = Field(
        "local", description="registered backend (drmas.backends.BACKENDS): local: in-process (CPU default); "
                             "ray: one Ray actor per worker group; openrlhf: DeepSpeed actor groups + vLLM engines in "
                             "one shared GPU pool (docs/gpu.md)")
    @field_validator("backend")
    @classmethod
    def _known_backend(cls, backend: str) -> str:
        from drmas.backends import BACKENDS

        return _registered(backend, BACKENDS.names(), "backend")

    threads: int = Field(1, ge=0, description="torch threads per process (0 = leave as is); on 2 shared cores "
                         "1 thread was measured 10-27x faster than 2 under load")
    verify_artifacts: bool = Field(
        True, description="check every folder a run loads (base checkpoints, tokenizers, the run's checkpoints) "
                          "against its manifest.sha256.json first; false: a folder without a manifest is used with a "
                          "warning (a damaged file is refused either way)")
    keep_previous_checkpoint: bool = Field(
        False, description="keep the checkpoint before the latest (checkpoints/latest.old): a resume that finds "
                           "`latest` damaged falls back to it (twice the checkpoint disk space)")
    device: str = Field("auto", pattern=DEVICE_PATTERN,
                        description="where the models of the local and ray backends live (policy, reference model, "
                                    "rollout, SFT warm-up, evaluation): auto = the first CUDA GPU when torch sees "
                                    "one, else the CPU; cpu; cuda; cuda:<index> (drmas/devices.py)")
    precision: Literal["fp32", "bf16"] = Field(
        "fp32", description="fp32: everything in float32 (the CPU default); bf16: float32 weights and optimizer "
                            "states, forward passes under bfloat16 autocast (GPU)")
    allow_unusual_lr: bool = Field(False, description="accept a learning rate (models.*.optim.lr, agents[i].lr, "
                                   "sft.lr) outside the plausible range LR_RANGE = [1e-8, 0.1]; a value outside it is "
                                   "usually a typo (1e6 for 1e-6) that destroys the weights")
    loggers: list[str] = Field(["tensorboard"], description="where step and eval metrics go besides metrics.jsonl "
                               "and eval.jsonl (always written): tensorboard (<run>/tb), wandb (<run>/wandb; "
                               "pip install drmas[wandb]; offline unless WANDB_MODE says otherwise, project "
                               "WANDB_PROJECT or drmas); drmas.loggers.LOGGERS")

    @field_validator("loggers")
    @classmethod
    def _known_loggers(cls, loggers: list[str]) -> list[str]:
        import importlib.util

        from drmas.loggers import LOGGERS

        for name in loggers:
            if name != "jsonl":
                _registered(name, LOGGERS.names(), "logger", "; jsonl is always written")
        if "wandb" in loggers and importlib.util.find_spec("wandb") is None:
            raise ValueError("the wandb logger needs wandb: pip install 'drmas[wandb]' (or pip install wandb)")
        return loggers


class SFTSection(Strict):
    """SFT warm-up of models whose checkpoint `path` does not exist yet (tiny models from scratch)."""

    traces: PositiveInt = Field(4000, description="tasks to draw role traces from")
    steps: PositiveInt = Field(600, description="optimizer steps")
    batch_size: PositiveInt = Field(64, description="examples per optimizer step")
    lr: float = Field(3e-3, gt=0, description="AdamW learning rate")
    warmup_steps: int = Field(30, ge=0, description="linear warm-up of the learning rate, in optimizer steps")
    vocab_size: PositiveInt = Field(512, description="byte-level BPE vocabulary")
    tokenizer_dir: str = Field("results/sft/tokenizer", description="shared tokenizer of the task source")
    seed: int = Field(0, description="seed of the traces, the initial weights and the batches (the same for every "
                      "checkpoint: a checkpoint depends on its preset, roles and this section only)")


class RunConfig(Strict):
    name: str = Field("run", description="run folder name under out_dir: one path component (no '/', not '..')")
    out_dir: str = Field("runs", description="the run directory is out_dir/name; the default, runs/, is git-ignored, so a "
                         "researcher's runs stay apart from the committed results (the grids write there themselves)")
    plugins: list[str] = Field(
        default_factory=list, description="the researcher's own modules, imported before the config is validated and "
                                          "in every process of the run (SFT warm-up workers, Ray actors), so that the "
                                          "estimators, agent roles, orchestras, task sources, environments, engines, "
                                          "backends and loggers they register can be named in it: a module name "
                                          "(my_pkg.estimators; installed or on PYTHONPATH) or a .py file "
                                          "(./my_estimator.py or absolute; a relative path starts at the current "
                                          "directory, as every path of a run config). `--plugin X` appends to it; "
                                          "part of the run's identity (drmas/plugins.py, docs/extending.md)")

    @field_validator("name")
    @classmethod
    def _name_stays_in_out_dir(cls, name: str) -> str:
        return check_run_name(name)
    env: EnvConfig = Field(EnvConfig(), description="task source, orchestra and their arguments")
    models: dict[str, ModelConfig] = Field(default_factory=lambda: {"shared": ModelConfig()},
                                           description="worker groups by key: one policy model + optimizer each")
    agents: list[AgentConfig] = Field(default_factory=list, description="one agent per orchestra slot, each mapped to "
                                      "a key of `models` (the assignment)")
    algo: AlgoConfig = Field(AlgoConfig(), description="advantage estimator, its conventions, policy loss, penalty")
    train: TrainConfig = Field(TrainConfig(), description="RL schedule, evaluation, checkpoints, backend, device")
    sft: SFTSection = Field(SFTSection(), description="SFT warm-up of models whose `path` does not exist yet")

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
        self._check_learning_rates()
        self._check_backend()
        self._check_slots()
        for m in self.models.values():  # derived: each run keeps its DeepSpeed states in its own directory
            if m.resources.checkpoint_dir is None:
                m.resources.checkpoint_dir = self.default_checkpoint_dir()
        return self

    def default_checkpoint_dir(self) -> str:
        """Where the worker groups' DeepSpeed states go unless ``models.<m>.resources.checkpoint_dir`` says: the run
        folder's ``checkpoints/deepspeed``. Derived from where the folder is, so ``config.yaml`` does not hold it
        (:func:`drmas.config.dump_config`): a moved or copied run folder resumes and exports its own states."""
        return str(self.run_dir / "checkpoints" / "deepspeed")

    def _check_learning_rates(self) -> None:
        """Every learning rate within :data:`LR_RANGE`, unless ``train.allow_unusual_lr``."""
        if self.train.allow_unusual_lr:
            return
        lo, hi = LR_RANGE
        fields = {**{f"models.{k}.optim.lr": m.optim.lr for k, m in self.models.items()},
                  **{f"agents[{i}].lr": a.lr for i, a in enumerate(self.agents) if a.lr is not None},
                  "sft.lr": self.sft.lr}
        for field, lr in fields.items():
            if not lo <= lr <= hi:
                raise ValueError(f"{field}={lr:g} is outside the plausible range [{lo:g}, {hi:g}] of an AdamW learning "
                                 "rate (a typo such as 1e6 for 1e-6 destroys the weights); fix it, or set "
                                 "train.allow_unusual_lr=true to run it anyway")

    def _check_slots(self) -> None:
        """One agent per slot of the orchestra (``agents[i].name`` is the slot). An empty ``agents`` list is
        left to the trainer (partial configs are composed with overrides)."""
        from drmas.orchestra import ORCHESTRA_REGISTRY

        slots = list(getattr(ORCHESTRA_REGISTRY.get(self.env.orchestra), "slots", None) or [])
        names = [a.name for a in self.agents]
        if self.agents and slots and sorted(names) != sorted(slots):
            missing, extra = [s for s in slots if s not in names], [n for n in names if n not in slots]
            raise ValueError(f"agents: env.orchestra={self.env.orchestra!r} has the slots {slots}, one agent each; the "
                             f"config defines {names} (missing {missing}, unexpected {extra}); name one agent after "
                             "each slot (`agents[i].name`), or choose another orchestra")

    def _check_backend(self) -> None:
        """The models, agents and algorithm ask only for what the backend can do (its
        :class:`~drmas.backends.Capabilities`): its rollout engines, a checkpoint per model, one
        temperature per model, a reference model, the loss aggregation."""
        from drmas.backends import BACKENDS

        backend = self.train.backend
        caps = BACKENDS.get(backend).capabilities
        for key, m in self.models.items():
            engine = m.rollout.engine
            if engine not in caps.engines:
                fits = [name for name in BACKENDS.names() if engine in BACKENDS.get(name).capabilities.engines]
                raise ValueError(f"models.{key}.rollout.engine={engine!r} needs train.backend={' or '.join(fits)} (the "
                                 f"{backend} backend generates with {caps.generates_with}); use engine "
                                 f"{caps.engines[0]!r}")
        for key, m in self.models.items():
            if caps.needs_checkpoint and m.path is None:
                raise ValueError(f"models.{key}.path: the {backend} backend loads a checkpoint (folder or hub id)")
            temps = {a.name: a.sampling.temperature for a in self.agents_of(key)}
            if caps.one_temperature_per_model and len(set(temps.values())) > 1:
                raise ValueError(f"agents {sorted(temps)} share model {key!r} with temperatures {temps}; the {backend} "
                                 "backend scores a model's samples at one temperature: use the same one")
        if self.algo.kl_coef > 0 and not caps.reference_model:
            raise ValueError(f"algo.kl_coef={self.algo.kl_coef}: the {backend} backend has no reference model "
                             "(the paper trains without KL); set it to 0 or use a backend that has one "
                             f"({[n for n in BACKENDS.names() if BACKENDS.get(n).capabilities.reference_model]})")
        if caps.aggregations is not None and self.algo.aggregation not in caps.aggregations:
            raise ValueError(f"algo.aggregation={self.algo.aggregation} has no equivalent in the {backend} backend; "
                             f"use one of {list(caps.aggregations)} with it")

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

    def invalid_penalties(self) -> dict[str, float]:
        """c per agent: ``agents[i].invalid_penalty`` where set, else ``algo.invalid_penalty``."""
        return {a.name: self.algo.invalid_penalty if a.invalid_penalty is None else a.invalid_penalty
                for a in self.agents}

    def effective_agents(self) -> dict[str, dict[str, Any]]:
        """Per-agent view written to the manifest: role, model, sampling and the optimizer it trains with."""
        penalties = self.invalid_penalties()
        return {a.name: {"role": a.role, "model": a.model, "sampling": a.sampling.model_dump(),
                         "optim": self.effective_optim(a.model).model_dump(), "invalid_penalty": penalties[a.name]}
                for a in self.agents}

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name
