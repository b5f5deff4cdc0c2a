"""Every command in a ```bash block of README.md and docs/*.md works as written on a fresh clone, as far as it can be
checked cheaply: the program it names exists (a module that imports, a script file), every `drmas` command parses,
and the config and overrides it names validate (``load_config``); the cheap ones run for real (``CHEAP``), each
checked to be in the docs so that a doc edit cannot drift away from the test."""
from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from drmas.cli import build_parser
from drmas.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHONS = {"python", "python3", ".venv/bin/python", ".venv-bench/bin/python", "$PY"}
DRMAS = {"drmas", ".venv/bin/drmas"}


def documented_commands() -> list[tuple[str, list[str]]]:
    """(doc name, argv) of every command line in the docs' ```bash blocks (continuations joined, comments dropped,
    leading VAR=value assignments dropped)."""
    out = []
    for doc in DOCS:
        for block in re.findall(r"```bash\n(.*?)```", doc.read_text(), flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                try:
                    argv = shlex.split(line, comments=True)
                except ValueError:
                    continue
                while argv and re.match(r"^[A-Z_]+=", argv[0]):
                    argv = argv[1:]
                if argv:
                    out.append((doc.name, argv))
    return out


COMMANDS = documented_commands()


def _program(argv: list[str]) -> tuple[str, str] | None:
    """("module", name) or ("file", path) a command runs; None for other programs (pip, ray, rm, git, ...)."""
    if argv[0] in PYTHONS and len(argv) > 2 and argv[1] == "-m":
        return "module", argv[2]
    if argv[0] in PYTHONS and len(argv) > 1:
        return "file", argv[1]
    if argv[0] == "bash" and len(argv) > 1:
        return "file", argv[1]
    return None


@pytest.mark.parametrize("doc,argv", COMMANDS, ids=[" ".join(a)[:60] for _, a in COMMANDS])
def test_the_program_a_documented_command_names_exists(doc, argv):
    prog = _program(argv)
    if prog is None:
        return
    kind, name = prog
    if kind == "module":
        assert importlib.util.find_spec(name) is not None, f"{doc}: no module {name} ({' '.join(argv)})"
    elif not name.startswith(("/", "$")):
        assert (ROOT / name).is_file(), f"{doc}: no file {name} ({' '.join(argv)})"


DRMAS_COMMANDS = [(doc, argv) for doc, argv in COMMANDS if argv[0] in DRMAS]


@pytest.mark.parametrize("doc,argv", DRMAS_COMMANDS, ids=[" ".join(a)[:60] for _, a in DRMAS_COMMANDS])
def test_documented_drmas_commands_parse_and_their_configs_validate(doc, argv):
    args = build_parser().parse_args(argv[1:])
    config = getattr(args, "config", None)
    if config is not None and args.command in ("train", "sft", "config"):
        assert (ROOT / config).is_file(), f"{doc}: {config} does not exist"
        try:
            load_config(ROOT / config, args.overrides)  # raises ConfigError naming the key
        except ConfigError as exc:  # data files that a documented `drmas data prepare` step writes first are fine
            problems = str(exc).splitlines()[1:]
            assert problems and all("data file not found" in p for p in problems), f"{doc}: {exc}"


CHEAP = [
    ([sys.executable, "-m", "drmas.cli", "config", "show", "experiments/configs/cpu/search_base.yaml",
      "algo.shared_prefix=off"], "drmas config show"),
    ([sys.executable, "-m", "drmas.cli", "config", "list"], "drmas config list"),
    ([sys.executable, "-m", "drmas.cli", "train", "--help"], "drmas train"),
    (["bash", "experiments/run_all.sh", "--help"], "bash experiments/run_all.sh"),
    (["bash", "scripts/test.sh", "--help"], "bash scripts/test.sh"),
    ([sys.executable, "-m", "analysis.report", "--help"], "python -m analysis.report"),
    ([sys.executable, "-m", "envs.search.server", "--help"], "python -m envs.search.server --corpus hotpotqa_train"),
]
"""Commands that run in seconds: (argv, the text the docs show for it)."""


@pytest.mark.parametrize("argv,shown", CHEAP, ids=[s for _, s in CHEAP])
def test_cheap_documented_commands_run(argv, shown):
    assert any(shown in doc.read_text() for doc in DOCS), f"'{shown}' is no longer in README.md or docs/"
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip()


def test_the_documented_retrieval_corpus_is_a_shared_name():
    from envs.search.corpus import resolve_corpus_path

    shown = [argv for _, argv in COMMANDS if "envs.search.server" in argv and "--corpus" in argv]
    assert shown, "the retrieval-server command is no longer documented"
    for argv in shown:
        name = argv[argv.index("--corpus") + 1]
        try:
            path = resolve_corpus_path(name)
        except FileNotFoundError as exc:
            pytest.skip(f"shared data absent: {exc}")
        assert path.is_file(), path


def test_the_bench_environment_imports_drmas():
    """`.venv-bench/bin/python benchmarks/bench_vs_trl.py` (docs/training.md) imports drmas from the main
    environment's editable install (scripts/setup_bench_env.sh); runs where .venv-bench was set up."""
    bench = ROOT / ".venv-bench" / "bin" / "python"
    if not bench.exists():
        pytest.skip("no .venv-bench (bash scripts/setup_bench_env.sh)")
    done = subprocess.run([str(bench), "benchmarks/bench_vs_trl.py", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
