"""Every command in a ```bash block of README.md and docs/*.md works as written on a fresh clone, as far as it can be
checked cheaply: the program it names exists (a module that imports, a script file), every `drmas` command parses,
and the config and overrides it names validate (``load_config``); the cheap ones run for real (``CHEAP``), each
checked to be in the docs so that a doc edit cannot drift away from the test."""
from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from drmas.cli import parse_args
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
    args = parse_args(argv[1:])
    config = getattr(args, "config", None)
    if config is not None and args.command in ("train", "sft", "config"):
        assert (ROOT / config).is_file(), f"{doc}: {config} does not exist"
        try:
            load_config(ROOT / config, args.overrides)  # raises ConfigError naming the key
        except ConfigError as exc:  # data files that a documented `drmas data prepare` step writes first are fine
            problems = str(exc).splitlines()[1:]
            assert problems and all("data file not found" in p for p in problems), f"{doc}: {exc}"


def _drmas(*argv: str) -> int:
    from drmas.cli import main

    return main(list(argv))


def _report_help() -> int:
    from analysis.report import main

    return main(["--help"])


def _server_help() -> int:
    from envs.search.server import main

    return main(["--help"])


CHEAP = [
    (lambda: _drmas("config", "show", str(ROOT / "experiments/configs/cpu/search_base.yaml"), "algo.shared_prefix=off"),
     "drmas config show", "shared_prefix: 'off'"),
    (lambda: _drmas("config", "list"), "drmas config list", "experiments/configs/paper/"),
    (lambda: _drmas("train", "--help"), "drmas train", "key.sub=value"),
    (lambda: _drmas("--help"), "drmas --help", "python -m analysis.report"),
    (_report_help, "python -m analysis.report", "--mechanism"),
    (_server_help, "python -m envs.search.server --corpus hotpotqa_train", "--corpus"),
    (["bash", "experiments/run_all.sh", "--help"], "bash experiments/run_all.sh", "--rebuild-bases"),
    (["bash", "scripts/test.sh", "--help"], "bash scripts/test.sh", "pytest"),
]
"""Commands that run in seconds: (how to run it: in process or argv, the text the docs show, a text its output
holds). In-process calls save an interpreter start each."""


@pytest.mark.parametrize("run,shown,says", CHEAP, ids=[s for _, s, _ in CHEAP])
def test_cheap_documented_commands_run(run, shown, says, capsys):
    assert any(shown in doc.read_text() for doc in DOCS), f"'{shown}' is no longer in README.md or docs/"
    if callable(run):
        try:
            code = run()
        except SystemExit as exc:  # --help
            code = exc.code
        out = capsys.readouterr().out
    else:
        done = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120)
        code, out = done.returncode, done.stdout + done.stderr
    assert code in (0, None), out[-2000:]
    assert says in out, out[-2000:]


def test_the_documented_retrieval_corpus_is_a_shared_name():
    from envs.paths import shared_data_dir
    from envs.search.corpus import SHARED_CORPORA, resolve_corpus_path

    shown = [argv for _, argv in COMMANDS if "envs.search.server" in argv and "--corpus" in argv]
    assert shown, "the retrieval-server command is no longer documented"
    for argv in shown:
        name = argv[argv.index("--corpus") + 1]
        if "/" in name:  # a file a documented `drmas data prepare` writes first
            continue
        assert name in SHARED_CORPORA, f"--corpus {name}: not a shared corpus name ({sorted(SHARED_CORPORA)})"
        if not shared_data_dir().is_dir():
            pytest.skip(f"shared data absent ({shared_data_dir()})")
        assert resolve_corpus_path(name).is_file(), resolve_corpus_path(name)


def test_the_bench_environment_imports_drmas():
    """`.venv-bench/bin/python benchmarks/bench_vs_trl.py` (docs/training.md) imports drmas from the main
    environment's editable install (scripts/setup_bench_env.sh); runs where .venv-bench was set up."""
    bench = ROOT / ".venv-bench" / "bin" / "python"
    if not bench.exists():
        pytest.skip("no .venv-bench (bash scripts/setup_bench_env.sh)")
    done = subprocess.run([str(bench), "benchmarks/bench_vs_trl.py", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_readme_results_table_quotes_report_labels_and_gains_in_points():
    """README's "Results at a glance" rows start with a REPORT.md label, give gains in points (no relative "%"), and
    every pts / × number of a row's paper column is the one REPORT.md's row gives."""
    readme = (ROOT / "README.md").read_text().split("## Results at a glance", 1)[1].split("\n## ", 1)[0]
    report = (ROOT / "results" / "REPORT.md").read_text()
    rows = {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split(" | ")]
                                          for line in report.splitlines() if line.startswith("| ") and "](#" in line)}
    quoted = [[c.strip() for c in line.strip("|").split(" | ")] for line in readme.splitlines()
              if line.startswith("| ") and not line.startswith("| claim") and not line.startswith("|---")]
    assert len(quoted) >= 5
    for claim, paper, ours, verdict in quoted:
        label = claim.split(":", 1)[0]
        assert label in rows, f"README quotes a label REPORT.md does not have: {label}"
        assert not re.search(r"[+\-−]\d+(\.\d+)? ?%", paper + ours), claim
        for number in re.findall(r"[+\-−]?\d+\.\d+ pts|× \d+\.\d+", paper):
            assert number in rows[label][3], (label, number)
        assert verdict in rows[label][5], (label, verdict)
