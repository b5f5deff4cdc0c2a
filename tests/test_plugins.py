"""Plug-ins (drmas/plugins.py): a researcher's own estimator, agent role, orchestra and reward, named in a config's
`plugins` or with `--plugin`, imported before validation and in every process of a run; docs/extending.md shows
the example plug-ins of docs/examples/plugins/ as they are; `drmas.testing.check_estimator`."""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import textwrap
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from drmas.cli import main
from drmas.config import ConfigError, dump_config, load_config
from drmas.config.identity import saved_config_changes
from drmas.plugins import FILE_PREFIX, PluginError, init_worker, load_plugins, module_name
from drmas.testing import EstimatorCheckFailed, check_estimator

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples" / "plugins"
DOC = ROOT / "docs" / "extending.md"
ALL_PROPERTIES = ("returns", "finite", "row permutation", "zero on constant groups", "shift invariance")


# ------------------------------------------------------------------------------ the documented examples
def test_the_doc_shows_every_example_file_as_it_is():
    shown = dict(re.findall(r"\[`(docs/examples/plugins/[^`]+)`\]\([^)]*\):\n\n```(?:python|yaml)\n(.*?)```",
                            DOC.read_text(), flags=re.S))
    files = sorted(p.relative_to(ROOT).as_posix() for p in EXAMPLES.iterdir() if p.suffix in (".py", ".yaml"))
    assert sorted(shown) == files, "docs/extending.md must show each file of docs/examples/plugins/ once"
    for name, block in shown.items():
        assert block == (ROOT / name).read_text(), f"docs/extending.md shows another {name} than the file"
    assert "..." not in "".join(shown.values())


def test_config_show_lists_what_a_plugin_registered(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert main(["config", "show", "experiments/configs/cpu/math_base.yaml", "--plugin",
                 "docs/examples/plugins/estimator.py"]) == 0
    out = capsys.readouterr().out
    line = "plugins: [docs/examples/plugins/estimator.py]  # registered: estimator drmas_clipped"
    assert line in out.splitlines()
    assert line in DOC.read_text()  # the doc shows the line as the command prints it
    yaml.safe_load(out)  # still valid YAML


def test_the_example_config_loads_its_plugins_and_shows_them(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    cfg = load_config("docs/examples/plugins/math_critique.yaml")
    assert (cfg.env.name, cfg.env.orchestra, cfg.algo.estimator) == ("math_generated_partial", "math_critique",
                                                                      "drmas_clipped")
    assert cfg.env.orchestra_args == {} and [a.role for a in cfg.agents] == ["math_solver", "math_critic"]
    assert main(["config", "show", "docs/examples/plugins/math_critique.yaml"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("plugins:"))
    assert line.endswith("# registered: docs/examples/plugins/estimator.py: estimator drmas_clipped; "
                         "docs/examples/plugins/agent.py: agent math_critic; docs/examples/plugins/orchestra.py: "
                         "orchestra math_critique; docs/examples/plugins/reward.py: task source math_generated_partial, "
                         "env math_partial_credit")


def test_example_estimator_passes_check_estimator(monkeypatch):
    monkeypatch.chdir(ROOT)
    load_config(None, ["plugins=[docs/examples/plugins/estimator.py]"])
    assert check_estimator("drmas_clipped").passed == ALL_PROPERTIES  # as docs/extending.md prints it


def test_example_orchestra_agent_and_reward_on_a_scripted_team(monkeypatch):
    """Solver -> Critic -> Solver with scripted texts: the critic's critique reaches the rewrite, which is graded
    with partial credit (task a: exact, task b: 10 for 10.5, within 10%; task c: far off)."""
    from drmas.agents import make_agent
    from drmas.orchestra import Episodes, make_orchestra
    from drmas.tasks import make_task_source
    from envs.base import Task

    monkeypatch.chdir(ROOT)
    load_config(None, ["plugins=[docs/examples/plugins/agent.py, docs/examples/plugins/orchestra.py, "
                       "docs/examples/plugins/reward.py]"])
    agents = {"solver": make_agent("math_solver", "solver"), "critic": make_agent("math_critic", "critic")}
    calls, seen = [], []

    def call(slot, idx, views, turn):
        calls.append((slot, turn))
        if slot == "critic":
            seen.extend(v.team["solution"] for v in views)
            texts = ["<critique>check the sum</critique>", "no tags", "<critique>redo it</critique>"]
        elif turn == 0:
            texts = ["\\boxed{1}"] * 3
        else:
            assert [v.team["verifier_output"] for v in views][0] == "<critique>check the sum</critique>"
            texts = ["\\boxed{4}", "\\boxed{10}", "\\boxed{99}"]
        return texts, [agents[slot].parse(t) for t in texts]

    source = make_task_source("math_generated_partial", difficulty=1)
    try:
        tasks = [Task("a", "2+2", ("4",)), Task("b", "5+5.5", ("10.5",)), Task("c", "1+1", ("2",))]
        episodes = Episodes(tasks, source.make_env())
        make_orchestra("math_critique").run(episodes, call)
    finally:
        source.close()
    assert calls == [("solver", 0), ("critic", 1), ("solver", 2)] and seen == ["\\boxed{1}"] * 3
    np.testing.assert_array_equal(episodes.reward, [1.0, 0.5, 0.0])
    assert agents["critic"].parse("<critique> x </critique>").action == "x"
    assert not agents["critic"].parse("no tags").valid


# ------------------------------------------------------------------------------------- import rules
def _write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_a_file_is_imported_once_under_a_name_of_its_resolved_path(tmp_path, monkeypatch):
    plugin = _write(tmp_path / "counted.py", """
        COUNT = [0]
        COUNT[0] += 1
    """)
    monkeypatch.chdir(tmp_path)
    first, = load_plugins(["./counted.py"])
    again, = load_plugins([str(plugin)])  # another spelling of the same file
    assert first.module == again.module == module_name(plugin) and first.target == again.target == str(plugin)
    assert re.fullmatch(FILE_PREFIX + r"counted_[0-9a-f]{12}", first.module)
    import sys

    assert sys.modules[first.module].COUNT == [1]


def test_a_plugin_that_is_missing_or_fails_is_one_config_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["config", "show", "--plugin", "./nope.py"]) == 2
    err = capsys.readouterr().err
    assert err == (f"drmas: plugin './nope.py': {tmp_path / 'nope.py'} does not exist (relative paths start at "
                   f"{tmp_path}); fix the path, or name an importable module\n")
    _write(tmp_path / "broken.py", """
        x = 1
        y = x / 0
    """)
    (tmp_path / "run.yaml").write_text("train: {steps: 0}\n")
    assert main(["train", "run.yaml", "--plugin", "broken.py", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("drmas: plugin 'broken.py' failed to import: ZeroDivisionError: "
                                                   "division by zero (at ") and f"{tmp_path / 'broken.py'}:3)" in err
    with pytest.raises(ConfigError, match=r"no module named 'no_such_pkg' on sys.path; install it"):
        load_config(None, plugins=["no_such_pkg.estimators"])
    with pytest.raises(ConfigError, match="plugins: must be a list of module names or .py file paths"):
        load_config(None, ["plugins=./one.py"])
    with pytest.raises(PluginError, match="neither a module name"):
        load_plugins(["plugins/not-python"])


def test_a_pickled_plugin_object_resolves_in_a_worker_that_loaded_the_plugins(tmp_path):
    """The SFT warm-up's pool initializer (init_worker) imports the parent's plug-ins in a spawned worker, under
    the same module name: a function and a dataclass of a plug-in file cross the process boundary."""
    plugin = _write(tmp_path / "geometry.py", """
        import os
        from dataclasses import dataclass

        @dataclass
        class Point:
            x: float
            y: float

        def norm(p):
            return (p.x ** 2 + p.y ** 2) ** 0.5, os.getpid()
    """)
    loaded, = load_plugins([str(plugin)])
    import sys

    module = sys.modules[loaded.module]
    with ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=init_worker,
                             initargs=(os.getpid(), signal.SIGKILL, (loaded.target,))) as pool:
        value, pid = pool.submit(module.norm, module.Point(3.0, 4.0)).result(timeout=120)
    assert value == 5.0 and pid != os.getpid()


@pytest.mark.parametrize("level", [logging.WARNING, logging.INFO])
def test_a_worker_logs_at_its_parents_level(capfd, level):
    """init_worker sets a spawned worker's log level to the one it is given (the warm-up passes its own): under
    ``--log-level warning`` a worker's INFO lines (the SFT warm-up's "built Qwen2 policy ...") stay out of the
    terminal, its warnings do not; at INFO both show."""
    with ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=init_worker,
                             initargs=(os.getpid(), signal.SIGKILL, (), level)) as pool:
        worker_logger = logging.getLogger("drmas.test_worker")
        pool.submit(worker_logger.info, "an info line of the worker").result(timeout=120)
        pool.submit(worker_logger.warning, "a warning of the worker").result(timeout=120)
    err = capfd.readouterr().err
    assert re.search(r"\d\d:\d\d:\d\d WARNING drmas.test_worker: a warning of the worker", err), err
    assert ("an info line of the worker" in err) == (level == logging.INFO), err


# -------------------------------------------------------------------------------------- check_estimator
def test_check_estimator_names_the_broken_property():
    from drmas.algos.advantages import drmas, register_estimator

    @register_estimator("test_plugins_by_position")
    def by_position(batch):  # depends on the row order
        adv, grouping = drmas(batch)
        return adv + torch.arange(adv.numel(), dtype=adv.dtype) * 1e-3, grouping

    @register_estimator("test_plugins_raw_scores")
    def raw_scores(batch):  # no baseline: a constant group keeps its score
        _, grouping = drmas(batch)
        return batch.scores.clone(), grouping

    @register_estimator("test_plugins_numpy")
    def as_numpy(batch):
        adv, grouping = drmas(batch)
        return adv.numpy(), grouping

    @register_estimator("test_plugins_says_shift")
    def scaled(batch):  # declares shift invariance it lacks
        adv, grouping = drmas(batch)
        return adv * (1 + batch.scores.mean()), grouping

    scaled.shift_invariant = True
    with pytest.raises(EstimatorCheckFailed, match=r"'test_plugins_by_position' breaks `row permutation` under Conv"):
        check_estimator(by_position)
    with pytest.raises(EstimatorCheckFailed, match=r"breaks `zero on constant groups`.*got \[.*\], not 0"):
        check_estimator("test_plugins_raw_scores")
    with pytest.raises(EstimatorCheckFailed, match=r"breaks `returns`.*floating tensor of shape \(30,\), got numpy.ndarray"):
        check_estimator("test_plugins_numpy")
    with pytest.raises(EstimatorCheckFailed, match=r"breaks `shift invariance`"):
        check_estimator("test_plugins_says_shift")
    with pytest.raises(EstimatorCheckFailed, match="is not a registered estimator; decorate it"):
        check_estimator(lambda batch: batch)
    report = check_estimator("drmas", table=([1.0, 0.0, 0.5], ["t"] * 3, ["a"] * 3, [0, 1, 2]))
    assert "shift invariance" in report.skipped and report.rows == 3


# ------------------------------------------------------------------------------- run identity, old runs
def test_a_config_without_plugins_is_the_same_run(tmp_path, monkeypatch):
    """A committed run folder's config.yaml (written before the field existed) loads with plugins [] and
    compares equal to the config as it is dumped now (with `plugins: []`)."""
    monkeypatch.chdir(ROOT)
    run = ROOT / "results" / "runs" / "cpu" / "math_nonsharing_drmas_s0"
    assert "plugins" not in yaml.safe_load((run / "config.yaml").read_text())
    saved = load_config(run / "config.yaml", [f"out_dir={run.parent}", f"name={run.name}"])
    assert saved.plugins == [] and saved_config_changes(saved) == []
    now = tmp_path / "config.yaml"
    now.write_text(dump_config(saved))
    assert "plugins: []" in now.read_text()
    assert saved_config_changes(load_config(now)) == []


# --------------------------------------------------------------------- training with a plug-in (CLI)
PLUGIN = """
    import os
    import re
    from pathlib import Path

    from drmas.agents import Parsed, register_agent
    from drmas.agents.roles import MathSolver
    from drmas.algos.advantages import drmas, register_estimator

    with open(Path(__file__).with_name("imported_in.txt"), "a") as fh:  # each process that imports it
        fh.write(f"{os.getpid()}\\n")


    @register_estimator("plugin_test_clipped")
    def plugin_test_clipped(batch):
        advantages, grouping = drmas(batch)
        return advantages.clamp(-2.0, 2.0), grouping


    plugin_test_clipped.shift_invariant = True


    @register_agent("plugin_test_solver")
    class LenientSolver(MathSolver):
        def parse(self, text):
            parsed = super().parse(text)
            number = re.search(r"(-?\\d+)\\s*$", text)
            return parsed if parsed.valid or number is None else Parsed(True, number.group(1))
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`drmas train CONFIG --plugin FILE`: the SFT warm-up of two models (two spawned workers), then 2 RL steps
    with the plug-in's estimator and agent role."""
    tmp = tmp_path_factory.mktemp("plugins")
    plugin = _write(tmp / "my_plugin.py", PLUGIN)
    config = tmp / "config.yaml"
    config.write_text(textwrap.dedent(f"""
        name: plugin_run
        out_dir: {tmp}/runs
        env: {{name: math_generated, orchestra: math, args: {{difficulty: 1}}}}
        models:
          solver_model: {{preset: nano, path: {tmp}/sft/solver, sft_roles: [math_solver]}}
          verifier_model: {{preset: nano, path: {tmp}/sft/verifier}}
        agents:
          - {{name: solver, role: plugin_test_solver, model: solver_model, sampling: {{max_new_tokens: 24}}}}
          - {{name: verifier, role: math_verifier, model: verifier_model, sampling: {{max_new_tokens: 16}}}}
        algo: {{estimator: plugin_test_clipped}}
        train: {{steps: 2, batch_tasks: 4, group_size: 4, evaluate: false, save_every: 0}}
        sft: {{traces: 200, steps: 20, tokenizer_dir: {tmp}/sft/tok}}
    """))
    assert main(["train", str(config), "--plugin", str(plugin), "--no-progress"]) == 0
    return tmp, config, plugin


def test_training_with_a_plugin_imports_it_in_every_process(trained):
    tmp, config, plugin = trained
    pids = set((tmp / "imported_in.txt").read_text().split())
    assert str(os.getpid()) in pids and len(pids) >= 3, pids  # this process and both SFT workers
    run = tmp / "runs" / "plugin_run"
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    assert yaml.safe_load((run / "config.yaml").read_text())["plugins"] == [str(plugin)]  # recorded: resumes see it
    assert check_estimator("plugin_test_clipped").passed == ALL_PROPERTIES
    # the same config and flag: the same run; without the plug-in it is another run
    assert saved_config_changes(load_config(config, plugins=[str(plugin)])) == []
    assert saved_config_changes(load_config(config)) == [f"plugins ([{str(plugin)!r}] -> [])"]


def test_a_run_does_not_resume_with_other_plugin_code(trained):
    """The manifest records the plug-in's source sha256; the same entry with edited code is a change of the run's
    identity, which `drmas train` refuses (ConfigDrift) like any other, and the grid sees through the same rule."""
    import hashlib

    from drmas.config.identity import ConfigDrift, check_run_folder

    tmp, config, plugin = trained
    manifest = json.loads((tmp / "runs" / "plugin_run" / "manifest.json").read_text())
    assert manifest["plugin_sources"] == {str(plugin): hashlib.sha256(plugin.read_bytes()).hexdigest()}
    original = plugin.read_text()
    try:
        plugin.write_text(original + "\n# an edit\n")
        cfg = load_config(config, plugins=[str(plugin)])
        changes = saved_config_changes(cfg)
        assert len(changes) == 1 and changes[0].startswith(f"plugin {plugin} (source sha256 "), changes
        with pytest.raises(ConfigDrift, match="plugin .*my_plugin.py"):
            check_run_folder(cfg)
    finally:
        plugin.write_text(original)
    assert saved_config_changes(load_config(config, plugins=[str(plugin)])) == []


@pytest.mark.slow
def test_ray_actors_import_the_plugins(trained):
    pytest.importorskip("ray")
    import ray

    tmp, config, plugin = trained
    before = set((tmp / "imported_in.txt").read_text().split())
    try:
        assert main(["train", str(config), "name=ray_run", "train.backend=ray", "train.steps=1", "--plugin",
                     str(plugin), "--no-progress"]) == 0
    finally:
        ray.shutdown()
    assert len(set((tmp / "imported_in.txt").read_text().split()) - before) >= 2  # one Ray actor per model
