"""The paper-scale configs (experiments/configs/paper/): every file loads and validates, and the values the
paper (docs/paper.md §5) and the reference scripts fix are the ones in the files.

Validation checks that data files exist, so each test runs in a temporary working directory holding empty
placeholders at the configured data paths (the files a `drmas data prepare` run writes)."""
from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from drmas.config import load_config

PAPER = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "paper"

MATH = {f"math_qwen3-{size}_{setting}.yaml": f"Qwen/Qwen3-{size.upper()}"
        for size in ("4b", "8b") for setting in ("single", "sharing", "nonsharing")}
SEARCH = {f"search_qwen2.5-{size}_{setting}.yaml": f"Qwen/Qwen2.5-{size.upper()}"
          for size in ("3b", "7b") for setting in ("single", "sharing", "nonsharing")}
HETERO = "search_hetero_qwen2.5-7b_llama3.2-3b.yaml"
ALL = sorted([*MATH, *SEARCH, HETERO])

AGENTS = {"single": {"math": ["solver"], "search": ["agent"]},
          "sharing": {"math": ["solver", "verifier"], "search": ["verifier", "search", "answer"]},
          "nonsharing": {"math": ["solver", "verifier"], "search": ["verifier", "search", "answer"]}}


def _data_paths(path: Path) -> list[str]:
    """Data-file paths named under env.args of a config (after `base:` inheritance)."""
    from drmas.config.loader import _read_yaml

    args = _read_yaml(path, seen=()).get("env", {}).get("args", {})
    found = []

    def walk(node):
        if isinstance(node, dict):
            for v in node.values():
                walk(v)
        elif isinstance(node, str) and node.endswith(".jsonl"):
            found.append(node)

    walk(args)
    return found


@pytest.fixture
def load(tmp_path, monkeypatch):
    """load_config(paper file) in a working directory with placeholder data files."""
    monkeypatch.chdir(tmp_path)

    def _load(name: str, overrides: list[str] | None = None):
        path = PAPER / name
        for rel in _data_paths(path):
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).touch()
        return load_config(path, overrides)

    return _load


def test_the_grid_files_exist():
    present = sorted(p.name for p in PAPER.glob("*.yaml"))
    assert present == ALL, f"experiments/configs/paper holds {present}; the grid runner expects {ALL}"


@pytest.mark.parametrize("name", ALL)
def test_paper_config_loads_and_fits_the_gpu_path(load, name):
    cfg = load(name)
    assert cfg.name == name.removesuffix(".yaml")  # run directories do not collide
    assert cfg.train.backend == "openrlhf"
    assert cfg.algo.estimator == "drmas"  # default; GRPO is the override algo.estimator=trajectory_grpo
    assert load(name, ["algo.estimator=trajectory_grpo"]).algo.estimator == "trajectory_grpo"
    for key, m in cfg.models.items():
        assert m.preset is None and "/" in m.path, f"{key}: paper runs load a hub checkpoint"
        assert m.rollout.engine == "vllm" and m.rollout.chat_template
        assert m.resources.num_gpus % m.rollout.tensor_parallel_size == 0
        assert m.resources.checkpoint_dir == str(Path(cfg.out_dir) / cfg.name / "checkpoints" / "deepspeed")
    assert cfg.train.eval_samples == 16
    assert (cfg.train.eval_sampling.temperature, cfg.train.eval_sampling.top_p) == (0.6, 0.95)
    for a in cfg.agents:
        assert cfg.effective_optim(a.model).lr == 1e-6, f"{a.name}: lr 1e-6 per agent (docs/paper.md §5)"
        assert a.sampling.temperature == 1.0


@pytest.mark.parametrize("name", sorted(MATH))
def test_math_values(load, name):
    cfg = load(name)
    setting = name.removesuffix(".yaml").split("_")[-1]
    assert cfg.env.name == "math_dataset"
    assert cfg.env.orchestra == ("math_single" if setting == "single" else "math")
    if setting != "single":
        assert cfg.env.orchestra_args == {"max_loops": 2}
    assert (cfg.train.group_size, cfg.train.batch_tasks) == (8, 32)
    assert cfg.algo.invalid_penalty == 0.1
    assert sorted(a.name for a in cfg.agents) == sorted(AGENTS[setting]["math"])
    assert {m.path for m in cfg.models.values()} == {MATH[name]}
    assert len(cfg.models) == (2 if setting == "nonsharing" else 1)
    for key, m in cfg.models.items():
        optim = cfg.effective_optim(key)
        assert optim.mini_batches == 1  # on-policy: one update per step
        assert (m.rollout.max_prompt_tokens, m.rollout.max_model_len) == (8192, 8192 + 4096)
        assert m.rollout.chat_template_kwargs == {"enable_thinking": False}
    assert all(a.sampling.max_new_tokens == 4096 for a in cfg.agents)
    assert set(cfg.env.args["test"]) == {"aime24", "aime25", "amc23", "math500", "minerva_math", "olympiadbench"}


@pytest.mark.parametrize("name", sorted(SEARCH) + [HETERO])
def test_search_values(load, name):
    cfg = load(name)
    setting = "nonsharing" if name == HETERO else name.removesuffix(".yaml").split("_")[-1]
    assert cfg.env.name == "search_dataset"
    assert cfg.env.orchestra == ("search_single" if setting == "single" else "search")
    assert (cfg.train.group_size, cfg.train.batch_tasks) == (5, 128)
    assert cfg.algo.invalid_penalty == 0.01
    assert cfg.env.args["topk"] == 3 and cfg.env.args["max_turns"] == 4
    if setting != "single":
        assert cfg.env.orchestra_args == {"max_turns": 4}
    assert set(cfg.env.args["test"]) == {"nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique",
                                         "bamboogle"}
    assert sorted(a.name for a in cfg.agents) == sorted(AGENTS[setting]["search"])
    for key, m in cfg.models.items():
        assert cfg.effective_optim(key).mini_batches == 5  # 5 updates per step
        assert (m.rollout.max_prompt_tokens, m.rollout.max_model_len) == (4096, 4096 + 800)
    assert all(a.sampling.max_new_tokens == 800 for a in cfg.agents)
    from drmas.tasks import TASK_SOURCES

    inspect.signature(TASK_SOURCES.get("search_dataset")).bind(**cfg.env.args)  # the source takes these args


@pytest.mark.parametrize("name", sorted(SEARCH))
def test_search_checkpoints(load, name):
    cfg = load(name)
    assert {m.path for m in cfg.models.values()} == {SEARCH[name]}
    setting = name.removesuffix(".yaml").split("_")[-1]
    assert len(cfg.models) == (3 if setting == "nonsharing" else 1)


def test_heterogeneous_assignment(load):
    cfg = load(HETERO)
    model_of = {a.name: cfg.models[a.model].path for a in cfg.agents}
    assert model_of == {"verifier": "Qwen/Qwen2.5-7B", "search": "meta-llama/Llama-3.2-3B-Instruct",
                        "answer": "meta-llama/Llama-3.2-3B-Instruct"}


def test_math_dataset_takes_the_math_args(load):
    from drmas.tasks import TASK_SOURCES

    cfg = load("math_qwen3-4b_nonsharing.yaml")
    inspect.signature(TASK_SOURCES.get("math_dataset")).bind(**cfg.env.args)


def test_worker_group_settings_from_a_paper_config(load):
    """What the openrlhf backend would build for each worker group (no GPU needed to derive it)."""
    from drmas.workers.openrlhf.seam import check_spec, num_engines, openrlhf_overrides
    from drmas.workers.base import WorkerSpec

    cfg = load("math_qwen3-4b_nonsharing.yaml")
    for i, (key, m) in enumerate(cfg.models.items()):
        spec = check_spec(WorkerSpec(key, m, cfg.effective_optim(key), cfg.algo, seed=i))
        assert (m.resources.num_gpus, m.rollout.tensor_parallel_size, num_engines(spec), m.resources.zero_stage) == (
            8, 1, 8, 3)
        o = openrlhf_overrides(spec, 0.4)
        assert o["actor.adam.lr"] == 1e-6 and o["train.micro_batch_size"] == 2 and o["train.batch_size"] == 16
        assert o["actor.model_name_or_path"] == "Qwen/Qwen3-4B"
        assert o["ckpt.path"].endswith(f"math_qwen3-4b_nonsharing/checkpoints/deepspeed/{key}")
