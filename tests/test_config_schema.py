"""The config schema documents itself: every field of every section has a description, and the advantage
conventions' defaults are the one Conventions dataclass's."""
from __future__ import annotations

import re
from dataclasses import asdict

import pytest
from pydantic import BaseModel

from drmas.algos.advantages import Conventions
from drmas.config import AlgoConfig, RunConfig


def _sections(model: type[BaseModel], seen: set) -> list[type[BaseModel]]:
    import typing

    out = [model]
    seen.add(model)
    for field in model.model_fields.values():
        for t in [field.annotation, *typing.get_args(field.annotation)]:
            if isinstance(t, type) and issubclass(t, BaseModel) and t not in seen:
                out += _sections(t, seen)
    return out


def test_every_config_field_is_described():
    missing = [f"{m.__name__}.{name}" for m in _sections(RunConfig, set())
               for name, f in m.model_fields.items() if not f.description]
    assert not missing, f"fields without a description: {missing}"


def test_algo_conventions_default_to_the_one_dataclass():
    assert AlgoConfig().conventions() == Conventions()
    assert asdict(AlgoConfig().conventions()) == asdict(Conventions())


def _yaml_word_fields() -> list[tuple[type[BaseModel], str, str]]:
    """(section, field, choice) for every string choice of a Literal field that YAML 1.1 reads as a bool or number."""
    import yaml

    from drmas.config.schema import literal_choices

    out = []
    for m in _sections(RunConfig, set()):
        for name, f in m.model_fields.items():
            for c in literal_choices(f.annotation):
                if isinstance(c, str) and not isinstance(yaml.safe_load(c), str):
                    out.append((m, name, c))
    return out


def test_every_choice_yaml_reads_as_a_bool_is_taken_as_written():
    import yaml

    found = _yaml_word_fields()
    assert ("AlgoConfig", "shared_prefix", "off") in {(m.__name__, n, c) for m, n, c in found}
    for section, name, choice in found:  # YAML turns the word into True/False/a number; the field gets the word back
        assert getattr(section.model_validate({name: yaml.safe_load(choice)}), name) == choice


@pytest.mark.parametrize("word", ["on", "off", "auto"])
def test_shared_prefix_on_off_as_override_and_in_a_file(tmp_path, word):
    from drmas.config import load_config

    assert load_config(None, [f"algo.shared_prefix={word}"]).algo.shared_prefix == word
    path = tmp_path / "c.yaml"
    path.write_text(f"algo:\n  shared_prefix: {word}\n")
    assert load_config(path).algo.shared_prefix == word
    with pytest.raises(Exception, match="shared_prefix"):  # a real mistake is still refused, naming the key
        load_config(None, ["algo.shared_prefix=maybe"])


def test_default_run_folder_is_git_ignored():
    """A default ``drmas train`` writes under runs/ (and its W&B / TensorBoard output): never into the committed
    results."""
    import subprocess
    from pathlib import Path

    from drmas.config import load_config

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(root / "experiments" / "configs" / "cpu" / "math_base.yaml", [])
    assert cfg.out_dir == "runs"
    for path in (f"{cfg.out_dir}/{cfg.name}/metrics.jsonl", f"{cfg.out_dir}/{cfg.name}/tb/events.out", "wandb/run-1/x"):
        out = subprocess.run(["git", "check-ignore", "-q", path], cwd=root)
        assert out.returncode == 0, f"{path} is not git-ignored"
    assert subprocess.run(["git", "check-ignore", "-q", "results/runs/cpu/index.json"], cwd=root).returncode == 1


@pytest.mark.parametrize("override, field", [("models.solver_model.optim.lr=1e6", "models.solver_model.optim.lr=1e+06"),
                                             ("agents.verifier.lr=0.5", "agents[1].lr=0.5"),
                                             ("sft.lr=1e-9", "sft.lr=1e-09")])
def test_a_learning_rate_outside_the_plausible_range_is_refused_unless_allowed(override, field):
    from drmas.config import ConfigError, load_config
    from drmas.config.schema import LR_RANGE

    with pytest.raises(ConfigError) as err:
        load_config("experiments/configs/cpu/math_base.yaml", [override])
    assert f"{field} is outside the plausible range [{LR_RANGE[0]:g}, {LR_RANGE[1]:g}]" in str(err.value)
    assert "train.allow_unusual_lr=true" in str(err.value)
    cfg = load_config("experiments/configs/cpu/math_base.yaml", [override, "train.allow_unusual_lr=true"])
    assert cfg.train.allow_unusual_lr


@pytest.mark.parametrize("override, expected", [("algo.estimator=drmass", "unknown estimator 'drmass' (did you mean 'drmas'?)"),
                                                ("agents.solver.role=math_solvr",
                                                 "unknown agent role 'math_solvr' (did you mean 'math_solver'?)")])
def test_an_unknown_name_names_the_nearest_registered_one(override, expected):
    from drmas.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_config("experiments/configs/cpu/math_base.yaml", [override])
