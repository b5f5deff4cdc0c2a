"""The command line's small costs: ``drmas --help`` and a config error import neither torch nor pandas (so they
take well under a second of CPU), a missing config file names the nearest shipped one, ``drmas env`` reports
versions and devices, and the registries' catalogues name exactly what their modules register."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from drmas.cli import main

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import sys
from drmas.cli import main
try:
    code = main({argv!r})
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in ("torch", "pandas", "transformers", "matplotlib") if m in sys.modules)
print("HEAVY", ",".join(heavy) or "-", "CODE", code)
"""


def _probe(argv: list[str]) -> tuple[str, str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True, cwd=REPO,
                         timeout=300)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("HEAVY"))
    return line, out.stderr


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["data", "prepare", "--help"],
                                  ["train", "experiments/configs/cpu/math_base.yaml", "algo.estimator=drmsa"],
                                  ["train", "experiments/configs/cpu/search_base.yaml", "agents.search.lr=1e6"],
                                  ["train", "experiments/configs/cpu/math_bse.yaml"]])
def test_help_and_config_errors_import_neither_torch_nor_pandas(argv):
    line, stderr = _probe(argv)
    assert line.startswith("HEAVY - CODE"), (line, stderr[-2000:])
    assert line.endswith("CODE 0") if "--help" in argv else line.endswith("CODE 2"), (line, stderr[-2000:])


def test_a_missing_config_file_names_the_nearest_shipped_one(capsys):
    assert main(["train", "experiments/configs/cpu/math_bse.yaml"]) == 2
    assert "did you mean experiments/configs/cpu/math_base.yaml?" in capsys.readouterr().err
    assert main(["config", "show", "search_base.yaml"]) == 2
    assert "did you mean experiments/configs/cpu/search_base.yaml?" in capsys.readouterr().err
    assert main(["train", "no_such_thing.yaml"]) == 2
    err = capsys.readouterr().err
    assert "did you mean" not in err and "drmas config list" in err


def test_data_prepare_parses_the_kinds_own_options(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["data", "prepare", "math", "--help"])
    assert exc.value.code == 0 and "--sampled-math500" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["data", "prepare", "search", "--no-such-option"])
    assert exc.value.code == 2 and "unrecognized arguments: --no-such-option" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # other commands keep rejecting unknown options
        main(["config", "list", "--no-such-option"])
    assert exc.value.code == 2


def test_drmas_env_reports_versions_and_devices(capsys):
    import torch

    assert main(["env"]) == 0
    text = capsys.readouterr().out
    assert f"torch         {torch.__version__}" in text and "cpu_cores:" in text and "python:" in text
    assert main(["env", "--json"]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["packages"]["torch"] == torch.__version__ and env["cuda_available"] == torch.cuda.is_available()
    assert env["commit"] is None or len(env["commit"].removesuffix("+dirty")) == 40


def test_the_catalogues_name_exactly_what_their_modules_register():
    """Validation reads the catalogues (drmas.algos.catalog, drmas.rollout.catalog); each built-in name must be
    registered by the module the catalogue names, and no module registers a built-in the catalogue lacks."""
    import importlib

    from drmas.algos.catalog import ESTIMATORS
    from drmas.rollout.catalog import ENGINES

    for registry in (ESTIMATORS, ENGINES):
        builtins = registry.builtin_modules()
        for module in set(builtins.values()):
            importlib.import_module(module)
        assert set(builtins) <= set(registry._items)
        for name, obj in registry._items.items():  # partials name the function they wrap
            home = getattr(getattr(obj, "func", obj), "__module__", "")
            if name in builtins:
                assert home == builtins[name], (name, home, builtins[name])
            else:  # registered by a plug-in (a test may have loaded one): never by drmas itself
                assert not home.startswith(("drmas.", "envs.")), f"{home} registers {name!r}, which no catalogue names"


def test_a_builtin_name_is_not_taken_by_someone_else():
    """A plug-in registering a built-in's name, before the built-in's module was ever imported, is a duplicate:
    the registry imports the built-in first, so the plug-in cannot shadow it."""
    from drmas.registry import Registry
    from drmas.rollout.catalog import ENGINES

    with pytest.raises(ValueError, match="rollout engine 'hf' is already registered"):
        ENGINES.register("hf")(object)
    reg = Registry("thing", builtins={"a": "tests.test_cli"})
    assert "a" in reg and reg.names() == ["a"] and len(reg) == 1
    with pytest.raises(LookupError, match="declared as a built-in of tests.test_cli"):
        reg.get("a")  # the declaring module (this one) did not register it
    reg.register("b")(object)
    assert reg.names() == ["a", "b"]
    with pytest.raises(KeyError, match="unknown thing 'c'"):
        reg.get("c")


@pytest.mark.parametrize("command", [["drmas.cli", "config", "list"],
                                     ["experiments.grid", "list", "experiments/grids/frontier.yaml"]])
def test_a_reader_that_leaves_early_gets_no_traceback(command):
    """``drmas config list | head`` or ``python -m experiments.grid list SPEC | head``: the reader has closed the
    pipe (here before the first line, so the write fails whatever the timing); the command stops with exit code 1
    and no traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        out = subprocess.run([sys.executable, "-m", *command], cwd=REPO, stdout=write_end,
                             stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write_end)
    assert out.returncode == 1 and "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr
