"""The layers of docs/architecture.md hold: every import in drmas/, envs/, analysis/, experiments/ and benchmarks/
(module level, inside functions and under TYPE_CHECKING alike) points to the same layer or one below, and no
modules import each other in a loop.

The layers are read from the table in docs/architecture.md (one list: a row per layer, bottom first, naming its
files and folders by link). An import counts as an arrow to the module it loads: ``from pkg import sub`` to
``pkg.sub``, a lazy export of a package (``from drmas.algos import compute_advantages``, drmas/lazy.py) to the
module it is imported from on first use. The last tests plant one violation each, of a form a shallower walk
misses, in a copy of the tree and check that the walk reports it."""
from __future__ import annotations

import ast
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("drmas", "envs", "analysis", "experiments", "benchmarks")
LAYERS_DOC = Path("docs/architecture.md")
LAYERS_HEADING = "## Layers"
LINK = re.compile(r"\]\(\.\./([^)#\s]+)\)")  # a link from docs/ into the tree


# ---------------------------------------------------------------------------------------------- the layers
@dataclass(frozen=True)
class Layer:
    name: str
    modules: frozenset[str]
    """Modules named by a file link (``drmas/io.py``; ``pkg/__init__.py`` names the package module only)."""
    packages: frozenset[str]
    """Packages named by a folder link (``drmas/algos/``): the package and every module under it."""
    links: tuple[str, ...]
    """The row's link targets, relative to the repository root."""


def read_layers(root: Path = REPO) -> list[Layer]:
    """The layers table of docs/architecture.md (the first table under ``## Layers``), bottom first: each row's
    name (first cell) and the files and folders its second cell links to."""
    lines = (root / LAYERS_DOC).read_text().splitlines()
    if LAYERS_HEADING not in lines:
        raise ValueError(f"{LAYERS_DOC}: no {LAYERS_HEADING!r} section (the layers table the import check reads)")
    rows: list[str] = []
    for line in lines[lines.index(LAYERS_HEADING) + 1:]:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    layers = []
    for row in rows[2:]:  # after the header and its separator
        cells = row.split("|")  # the first two cells hold no "|" (the third may: `drmas train|sft|...`)
        modules, packages = set(), set()
        for target in LINK.findall(cells[2]):
            dotted = target.removesuffix("/").removesuffix(".py").replace("/", ".")
            if target.endswith("/"):
                packages.add(dotted)
            else:
                modules.add(dotted.removesuffix(".__init__"))
        layers.append(Layer(cells[1].strip(), frozenset(modules), frozenset(packages), tuple(LINK.findall(cells[2]))))
    return layers


def layer_of(module: str, layers: list[Layer]) -> int | None:
    """Index of the layer naming ``module``: its file, else the longest folder above it; None: no layer names it."""
    best, length = None, -1
    for i, layer in enumerate(layers):
        if module in layer.modules:
            return i
        for package in layer.packages:
            if (module == package or module.startswith(package + ".")) and len(package) > length:
                best, length = i, len(package)
    return best


# ------------------------------------------------------------------------------------------------ the walk
def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules(root: Path = REPO) -> dict[str, Path]:
    """Every module of the walked packages -> its file."""
    return {module_name(path, root): path for package in PACKAGES for path in sorted((root / package).rglob("*.py"))}


def imports_of(path: Path, module: str) -> list[tuple[str, tuple[str, ...]]]:
    """The project imports of ``path``, anywhere in it (relative ones resolved): ``(module, ())`` for
    ``import module``, ``(module, names)`` for ``from module import names``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                kept = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(kept + ([base] if base else []))
            out.append((base, tuple(alias.name for alias in node.names)))
    return [(base, names) for base, names in out if base.split(".")[0] in PACKAGES]


def lazy_homes(path: Path) -> dict[str, str]:
    """Name -> module it is loaded from, for a package ``__init__`` that exports lazily
    (``lazy_exports(package, homes)``, drmas/lazy.py); empty for any other module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    assigned = {target.id: node.value for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(target, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "lazy_exports":
            homes = node.args[1] if len(node.args) > 1 else next(k.value for k in node.keywords if k.arg == "homes")
            homes = assigned[homes.id] if isinstance(homes, ast.Name) else homes
            return {name: home for home, names in ast.literal_eval(homes).items() for name in names}
    return {}


def loaded_modules(base: str, names: tuple[str, ...], modules: dict[str, Path],
                   lazy: dict[str, dict[str, str]]) -> set[str]:
    """The project modules an import loads for what it names: ``import a.b`` -> ``a.b``; ``from pkg import x``
    -> ``pkg.x`` where that is a module, the home of lazy export ``x`` of ``pkg``, else ``pkg`` (a name it
    defines). A name that is no module is charged to the nearest module above it."""
    targets = {base} if not names else {f"{base}.{x}" if f"{base}.{x}" in modules else lazy.get(base, {}).get(x, base)
                                        for x in names}
    out = set()
    for target in targets:
        while target not in modules and "." in target:
            target = target.rpartition(".")[0]
        out.add(target)
    return out & modules.keys()


def import_graph(root: Path = REPO) -> dict[str, set[str]]:
    """Module -> the project modules it loads (:func:`loaded_modules` of each of its imports)."""
    modules = project_modules(root)
    lazy = {m: homes for m, path in modules.items() if path.name == "__init__.py" and (homes := lazy_homes(path))}
    return {m: set().union(*(loaded_modules(base, names, modules, lazy) for base, names in imports_of(path, m))) - {m}
            for m, path in modules.items()}


# ----------------------------------------------------------------------------------------------- the rules
def unplaced_modules(graph: dict[str, set[str]], layers: list[Layer]) -> list[str]:
    return [f"{m} is in no layer of {LAYERS_DOC}: link its file or folder in a row of the layers table"
            for m in sorted(graph) if layer_of(m, layers) is None]


def upward_imports(graph: dict[str, set[str]], layers: list[Layer]) -> list[str]:
    level = {m: layer_of(m, layers) for m in graph}
    return [f"{m} ({layers[level[m]].name}) imports {t} ({layers[level[t]].name})"
            for m, targets in sorted(graph.items()) for t in sorted(targets)
            if None not in (level[m], level[t]) and level[t] > level[m]]


def import_cycles(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return [" -> ".join(c) for c in cycles]


def layering_problems(root: Path = REPO) -> list[str]:
    """Every breach of the layers of ``root``'s docs/architecture.md in ``root``'s tree: modules in no layer,
    upward imports, import cycles."""
    graph, layers = import_graph(root), read_layers(root)
    return ([f"unplaced: {p}" for p in unplaced_modules(graph, layers)]
            + [f"upward: {p}" for p in upward_imports(graph, layers)]
            + [f"cycle: {p}" for p in import_cycles(graph)])


# ----------------------------------------------------------------------------------------- the tree's state
def test_every_module_is_in_exactly_one_layer_of_the_table():
    layers = read_layers()
    assert len(layers) >= 10 and all(layer.modules or layer.packages for layer in layers), layers
    named = [m for layer in layers for m in sorted(layer.modules | layer.packages)]
    twice = sorted({m for m in named if named.count(m) > 1})
    assert not twice, f"named in two rows of the layers table of {LAYERS_DOC}: {twice}"
    missing = [link for layer in layers for link in layer.links if not (REPO / link).exists()]
    assert not missing, f"the layers table of {LAYERS_DOC} links files or folders that do not exist: {missing}"
    assert not unplaced_modules(import_graph(), layers)


def test_every_import_points_to_its_own_layer_or_below():
    upward = upward_imports(import_graph(), read_layers())
    assert not upward, f"imports that point up a layer ({LAYERS_DOC}):\n" + "\n".join(upward)


def test_no_modules_import_each_other_in_a_loop():
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_walk_sees_function_level_and_type_checking_imports(tmp_path):
    """The walk is not blind to the imports that made the cycles this test guards against."""
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from drmas.workers.policy import X\n"
              "def f():\n    from drmas.trainer.metrics import LOGGERS\n    from . import sibling\n")
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert imports_of(path, "drmas.config.probe") == [("drmas.workers.policy", ("X",)),
                                                      ("drmas.trainer.metrics", ("LOGGERS",)),
                                                      ("drmas.config", ("sibling",))]


def test_imports_resolve_to_the_modules_they_load():
    modules = project_modules()
    lazy = {"drmas.algos": lazy_homes(modules["drmas.algos"])}
    assert loaded_modules("drmas", ("io", "__version__"), modules, lazy) == {"drmas.io", "drmas"}
    assert loaded_modules("drmas.algos", ("compute_advantages", "policy_loss"), modules, lazy) == {
        "drmas.algos.advantages", "drmas.algos.loss"}
    assert loaded_modules("drmas.algos.loss", ("policy_loss",), modules, lazy) == {"drmas.algos.loss"}
    assert lazy_homes(modules["drmas.rollout"])["FastRolloutEngine"] == "drmas.rollout.fast"


# ------------------------------------------------------------------------------------- planted violations
#: Packages whose modules import their siblings (each a regular package with an ``__init__.py``; without one,
#: ``from . import module`` names no module of the walk).
SIBLING_PACKAGES = ("drmas.trainer", "drmas.workers", "drmas.workers.openrlhf")


def copy_tree(dest: Path) -> Path:
    """The walked sources and the layers table, copied to ``dest``."""
    for path in [*(p for package in PACKAGES for p in (REPO / package).rglob("*.py")), REPO / LAYERS_DOC]:
        target = dest / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return dest


def plant(root: Path, module: str, statement: str) -> None:
    """Append a function holding ``statement`` (an import) to ``module``'s file in the tree at ``root``."""
    path = project_modules(root)[module]
    path.write_text(path.read_text() + f"\n\ndef _planted():\n    {statement}\n")


def _upward_from_pkg_import(root: Path) -> tuple[str, str]:
    """A foundation module imports the command line, written ``from drmas import cli``: only ``drmas`` (the
    foundation) is named in the statement."""
    plant(root, "drmas.io", "from drmas import cli")
    return "drmas.io", "drmas.cli"


def _cycle_through_lazy_export(root: Path) -> tuple[str, str]:
    """Module B of a lazily exporting package imports, through the package, a name whose home A imports B;
    A and B in one layer, so only the cycle can show it."""
    graph, layers, modules = import_graph(root), read_layers(root), project_modules(root)
    for package in sorted(m for m, path in modules.items() if path.name == "__init__.py"):
        homes = lazy_homes(modules[package])
        for name, a in sorted(homes.items()):
            for b in sorted(graph[a] & set(homes.values())):
                if layer_of(a, layers) == layer_of(b, layers):
                    plant(root, b, f"from {package} import {name}")
                    return b, a
    raise AssertionError("no lazily exported module imports another of its package in the same layer")


def _cycle_through_relative_import(root: Path) -> tuple[str, str]:
    """Module B of one of :data:`SIBLING_PACKAGES` imports A, which imports B, written ``from . import a``."""
    graph = import_graph(root)
    for package in SIBLING_PACKAGES:
        children = {m for m in graph if m.rpartition(".")[0] == package}
        for a in sorted(children):
            for b in sorted(graph[a] & children):
                plant(root, b, f"from . import {a.rpartition('.')[2]}")
                return b, a
    raise AssertionError(f"no module of {SIBLING_PACKAGES} imports a sibling")


def _upward_in_analysis(root: Path) -> tuple[str, str]:
    """A module of analysis/'s bottom layer imports one of its top layer, written ``from analysis import top``
    (the modules are read from the layers table, whatever they are named)."""
    layers, modules = read_layers(root), project_modules(root)
    children = sorted((layer_of(m, layers), m) for m in modules if m.rpartition(".")[0] == "analysis"
                      and modules[m].name != "__init__.py")
    (low_level, low), (high_level, high) = children[0], children[-1]
    assert low_level < high_level, f"analysis/ has one layer only: {children}"
    plant(root, low, f"from analysis import {high.rpartition('.')[2]}")
    return low, high


def _experiments_from_library(root: Path) -> tuple[str, str]:
    """The library's top module (the command line) imports the experiment grid."""
    plant(root, "drmas.cli", "from experiments import grid")
    return "drmas.cli", "experiments.grid" if "experiments.grid" in project_modules(root) else "experiments"


PLANTED = {
    "upward import written `from pkg import module`": (_upward_from_pkg_import, "upward"),
    "cycle through a lazy export": (_cycle_through_lazy_export, "cycle"),
    "cycle written `from . import module` inside a package": (_cycle_through_relative_import, "cycle"),
    "upward import in analysis/ written `from analysis import module`": (_upward_in_analysis, "upward"),
    "import of experiments from drmas/": (_experiments_from_library, "upward"),
}


@pytest.mark.parametrize("form", PLANTED)
def test_the_check_fails_on_a_planted_violation(form, tmp_path):
    make, kind = PLANTED[form]
    root = copy_tree(tmp_path)
    importer, imported = make(root)
    problems = layering_problems(root)
    if kind == "upward":
        expected = [p for p in problems if p.startswith(f"upward: {importer} (") and f" imports {imported} (" in p]
    else:
        expected = [p for p in problems if p.startswith("cycle: ") and f"{importer} -> {imported}" in p]
    assert expected, f"planted {form} ({importer} -> {imported}) not reported; problems: {problems}"
