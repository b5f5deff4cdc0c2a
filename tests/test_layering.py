"""The layers of docs/architecture.md hold: every import in drmas/, envs/ and analysis/ (module level, inside
functions and under TYPE_CHECKING alike) points to the same layer or one below, and no modules import each
other in a loop. One list of layers, one walk over the source."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LAYERS: list[tuple[str, tuple[str, ...]]] = [  # bottom first; a module belongs to the longest prefix that names it
    ("foundation", ("drmas", "drmas.registry", "drmas.io", "drmas.devices", "drmas.shutdown", "drmas.step_table",
                    "drmas.progress")),
    ("records and catalogues", ("drmas.locks", "drmas.checkpoints", "drmas.loggers", "drmas.records", "drmas.backends",
                                "drmas.plugins", "drmas.algos.catalog", "drmas.rollout.catalog")),
    ("environments", ("envs",)),
    ("algorithm, workflow, task sources, models", ("drmas.algos", "drmas.agents", "drmas.orchestra", "drmas.tasks",
                                                   "drmas.models")),
    ("generation", ("drmas.rollout",)),
    ("config", ("drmas.config",)),
    ("execution", ("drmas.workers", "drmas.preflight")),
    ("pipeline", ("drmas.trainer", "drmas.summary")),
    ("entry points", ("drmas.cli", "drmas.testing")),
    ("analysis: verdicts, records, command lines", ("analysis", "analysis.claims", "analysis.schema",
                                                    "analysis.integrity", "analysis.stats", "analysis.runs",
                                                    "analysis.cli")),
    ("analysis: claims", ("analysis.theory", "analysis.tables", "analysis.mechanism", "analysis.class_aware",
                          "analysis.figures")),
    ("analysis: studies", ("analysis.main_grid", "analysis.sweep", "analysis.stability", "analysis.confirm",
                           "analysis.frontier")),
    ("analysis: the report", ("analysis.report", "analysis.notebooks")),
]
PACKAGES = ("drmas", "envs", "analysis")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    """Index in :data:`LAYERS` of the longest prefix naming ``module``."""
    best, length = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = i, len(prefix)
    assert best is not None, f"{module} is in no layer of tests/test_layering.py: add it to LAYERS"
    return best


def imports_of(path: Path, module: str) -> set[str]:
    """The project modules ``path`` imports, anywhere in it (relative imports resolved)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [base]
        else:
            continue
        out.update(n for n in names if n.split(".")[0] in PACKAGES)
    return out


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            module = module_name(path)
            graph[module] = imports_of(path, module) - {module}
    return graph


def test_every_import_points_to_its_own_layer_or_below():
    upward = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
              for m, targets in import_graph().items() for t in sorted(targets) if layer_of(t) > layer_of(m)]
    assert not upward, "imports that point up a layer (docs/architecture.md):\n" + "\n".join(upward)


def test_no_modules_import_each_other_in_a_loop():
    graph = import_graph()
    resolved = {m: {t if t in graph else t.rpartition(".")[0] for t in ts} & graph.keys() for m, ts in graph.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(resolved[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(resolved):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_walk_sees_function_level_and_type_checking_imports(tmp_path):
    """The walk is not blind to the imports that made the cycles this test guards against."""
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from drmas.workers.policy import X\n"
              "def f():\n    from drmas.trainer.metrics import LOGGERS\n    from . import sibling\n")
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert imports_of(path, "drmas.config.probe") == {"drmas.workers.policy", "drmas.trainer.metrics", "drmas.config"}
