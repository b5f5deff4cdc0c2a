"""Plug-ins: a researcher's own modules (estimators, agent roles, orchestras, task sources, environments, rollout
engines, backends, loggers), imported in every process of a run before anything is looked up by name.

A run config lists them in ``plugins`` (``drmas train --plugin X`` appends to it). Each entry is one of

- a module name, ``my_pkg.estimators``: imported as usual, so it must be importable in every process of the run
  (installed, e.g. ``pip install -e .``, or its folder on ``PYTHONPATH``);
- a Python file, ``./my_estimator.py``, ``plugins/roles.py`` or an absolute path (an entry ending in ``.py``): a
  relative path starts at the current directory, the rule of every path in a run config. The file is imported
  as one module named after its resolved path (:func:`module_name`): importing it again in the same process
  does nothing, and an object of a class it defines, pickled in one process, unpickles in every process that
  loaded the same plug-ins.

:func:`load_plugins` imports the entries and, given the registries to watch, records what each one registered.
The config loader calls it before validation (:func:`drmas.config.loader.load_config`); a process the run
starts calls it with the entries its parent loaded (:func:`loaded_plugins`): the SFT warm-up's workers through
:func:`init_worker`, the Ray actors in their constructor (drmas/workers/ray_backend.py).

This module imports nothing of drmas but the shutdown helpers, so every layer may use it.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import re
import sys
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from drmas.progress import setup_logging
from drmas.shutdown import die_with_parent, ignore_ctrl_c

MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
"""An importable dotted module name (``my_pkg.estimators``)."""
FILE_PREFIX = "drmas_plugin_"
"""The ``sys.modules`` names of file plug-ins start with it (:func:`module_name`)."""


class PluginError(ValueError):
    """A plug-in that cannot be found or fails to import; the message names the entry, the cause and the fix."""


@dataclass(frozen=True)
class Plugin:
    """One imported plug-in and what it registered."""

    entry: str
    """the entry as written (``./my_estimator.py``, ``my_pkg.estimators``)"""
    target: str
    """the module name, or the file's resolved absolute path: what a worker process is given to import"""
    module: str
    """its name in ``sys.modules``"""
    registered: tuple[tuple[str, str], ...] = ()
    """(kind, name) of every name it added to the watched registries, e.g. ("estimator", "my_estimator")"""
    sources: tuple[str, ...] = ()
    """the source files of the modules its import loaded from outside the installed packages (its own helpers,
    :func:`local_sources`), beside its own file: part of its :func:`source_digest`"""


_LOADED: dict[str, Plugin] = {}
"""The plug-ins imported in this process, by target, in import order."""


def is_file_entry(entry: str) -> bool:
    """A ``.py`` file path (anything else is a module name)."""
    return entry.endswith(".py")


def module_name(path: str | Path) -> str:
    """The module name of a plug-in file: ``drmas_plugin_<file stem>_<12 hex digits of the sha256 of its resolved
    path>``, the same in every process that imports the same file."""
    resolved = Path(path).resolve()
    stem = re.sub(r"\W", "_", resolved.stem)
    return f"{FILE_PREFIX}{stem}_{hashlib.sha256(str(resolved).encode()).hexdigest()[:12]}"


def resolve_entry(entry: str, base_dir: str | Path | None = None) -> str:
    """The target of an entry: a module name as it is, a file's absolute resolved path (a relative path starts at
    ``base_dir``, default: the current directory). Raises :class:`PluginError` for an entry that is neither."""
    if is_file_entry(entry):
        path = Path(entry).expanduser()
        return str((path if path.is_absolute() else Path(base_dir or Path.cwd()) / path).resolve())
    if not MODULE_NAME.fullmatch(entry):
        raise PluginError(f"plugin {entry!r} is neither a module name (my_pkg.estimators) nor a .py file "
                          "(./my_estimator.py); write one of them")
    return entry


def _origin(target: str) -> Path | None:
    """The source file of a plug-in: the file of a file plug-in, the module's file of a module plug-in (its
    ``__init__.py`` for a package); ``None`` when it has none."""
    if Path(target).is_absolute():
        return Path(target)
    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        spec = None
    return Path(spec.origin) if spec is not None and spec.origin not in (None, "built-in", "frozen") else None


def _installed_roots() -> tuple[Path, ...]:
    """Folders whose modules are installed code, not a plug-in's own: the standard library, every site-packages (the
    user's too), and the folders of the packages drmas ships (their code is the run's ``git_commit``)."""
    import site
    import sysconfig

    specs = [importlib.util.find_spec(package) for package in ("drmas", "envs", "analysis", "experiments")]
    shipped = {Path(spec.origin).resolve().parent for spec in specs if spec is not None and spec.origin}
    paths = sysconfig.get_paths()
    installed = [*(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")), *site.getsitepackages(),
                 site.getusersitepackages()]
    return tuple({Path(p).resolve() for p in installed if p} | shipped)


def local_sources(modules: Sequence[str], own: Path | None = None) -> tuple[str, ...]:
    """The source files (sorted, resolved) of ``modules`` (names in ``sys.modules``) that lie outside the installed
    packages (:func:`_installed_roots`), ``own`` (the plug-in's file) left out: the helper modules a plug-in loads."""
    roots = _installed_roots()
    out = set()
    for name in modules:
        file = getattr(sys.modules.get(name), "__file__", None)
        if not file or not file.endswith(".py"):
            continue
        path = Path(file).resolve()
        if path != own and path.is_file() and not any(path.is_relative_to(root) for root in roots):
            out.add(str(path))
    return tuple(sorted(out))


def source_digest(target: str) -> str | None:
    """sha256 of a plug-in's source: its file (:func:`_origin`) and, when its import loaded modules from outside
    the installed packages (:attr:`Plugin.sources`), those files too (the sha256 of ``path sha256`` lines, its own
    file first); ``None`` when it has no source file. A run folder records it, so that a run is not resumed with
    other plug-in code, its helpers' included (:mod:`drmas.config.identity`)."""
    path = _origin(target)
    if path is None or not path.is_file():
        return None
    own = hashlib.sha256(path.read_bytes()).hexdigest()
    helpers = _LOADED[target].sources if target in _LOADED else ()
    if not helpers:
        return own
    lines = [f"{path} {own}"] + [f"{h} {hashlib.sha256(Path(h).read_bytes()).hexdigest()}" if Path(h).is_file()
                                 else f"{h} missing" for h in helpers]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def load_plugins(entries: Sequence[str], base_dir: str | Path | None = None,
                 registries: Mapping[str, Any] | None = None) -> list[Plugin]:
    """Import every entry once per process, in order, and return their :class:`Plugin` records.

    ``base_dir``: where a relative file path starts (default: the current directory). ``registries``: kind ->
    registry (anything with ``names()``) whose names an import adds are recorded as the plug-in's registrations
    (on the first import in this process; a repeated call returns the first record). Raises
    :class:`PluginError` naming the entry when it cannot be found or its import fails."""
    return [_load_one(entry, base_dir, registries or {}) for entry in entries]


def loaded_plugins() -> tuple[str, ...]:
    """The targets of every plug-in imported in this process, in import order: what a process this one starts
    imports (:func:`init_worker`, the Ray actors) so that it knows the same names and classes."""
    return tuple(_LOADED)


def init_worker(parent: int, sig: int, plugins: Sequence[str], log_level: int = logging.INFO) -> None:
    """Initializer of a worker process of a run (``ProcessPoolExecutor(initializer=init_worker, ...)``): it ends
    when ``parent`` dies (:func:`drmas.shutdown.die_with_parent` with ``sig``), leaves Ctrl-C to its parent, which
    ends it (:func:`drmas.shutdown.ignore_ctrl_c`), logs at ``log_level`` (the parent's
    ``logging.getLogger().getEffectiveLevel()``, so that ``--log-level warning`` holds in the workers too) and
    imports ``plugins`` (:func:`loaded_plugins` of the parent) before it takes any work."""
    die_with_parent(parent, sig)
    ignore_ctrl_c()
    setup_logging(log_level)
    load_plugins(plugins)


def describe_registered(plugins: Sequence[Plugin]) -> str:
    """What the plug-ins registered, for ``drmas config show``: ``registered: estimator my_estimator, agent
    my_role`` for one plug-in; ``registered: ./a.py: estimator x; my_pkg.roles: agent y`` for several."""
    def names(plugin: Plugin) -> str:
        return ", ".join(f"{kind} {name}" for kind, name in plugin.registered) or "nothing"

    if len(plugins) == 1:
        return f"registered: {names(plugins[0])}"
    return "registered: " + "; ".join(f"{p.entry}: {names(p)}" for p in plugins)


def _load_one(entry: str, base_dir: str | Path | None, registries: Mapping[str, Any]) -> Plugin:
    if not isinstance(entry, str) or not entry.strip():
        raise PluginError(f"plugin {entry!r}: write a module name (my_pkg.estimators) or a .py file path")
    target = resolve_entry(entry, base_dir)
    if target in _LOADED:
        return replace(_LOADED[target], entry=entry)
    before = {kind: set(registry.names()) for kind, registry in registries.items()}
    modules_before = set(sys.modules)
    if is_file_entry(entry):
        name = module_name(target)
        _import_file(entry, Path(target), name, base_dir)
    else:
        name = target
        _import_module(entry)
    registered = tuple((kind, n) for kind, registry in registries.items()
                       for n in registry.names() if n not in before[kind])
    origin = _origin(target)
    sources = local_sources([m for m in list(sys.modules) if m not in modules_before],
                            origin.resolve() if origin else None)
    _LOADED[target] = Plugin(entry, target, name, registered, sources)
    return _LOADED[target]


def _import_file(entry: str, path: Path, name: str, base_dir: str | Path | None) -> None:
    if name in sys.modules:
        return
    if not path.is_file():
        start = f"relative paths start at {Path(base_dir or Path.cwd())}"
        what = "is a folder" if path.is_dir() else "does not exist"
        raise PluginError(f"plugin {entry!r}: {path} {what} ({start}); fix the path, or name an importable module")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs: its dataclasses and pickles look it up by name
    try:
        spec.loader.exec_module(module)
    except SystemExit as exc:
        del sys.modules[name]
        raise PluginError(_exited(entry, exc, str(path))) from None
    except BaseException as exc:
        del sys.modules[name]
        if isinstance(exc, Exception):
            raise PluginError(_failed(entry, exc, str(path))) from None
        raise


def _import_module(entry: str) -> None:
    try:
        importlib.import_module(entry)
    except ModuleNotFoundError as exc:
        parts = entry.split(".")
        if exc.name in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}:
            raise PluginError(f"plugin {entry!r}: no module named {exc.name!r} on sys.path; install it (pip install "
                              "-e <its project>), put its folder on PYTHONPATH, or give the path of a .py file") from None
        raise PluginError(_failed(entry, exc)) from None
    except SystemExit as exc:
        raise PluginError(_exited(entry, exc, _origin(entry))) from None
    except Exception as exc:  # noqa: BLE001 -- any failure of the plug-in's own code, reported in one line
        raise PluginError(_failed(entry, exc)) from None


def _exited(entry: str, exc: SystemExit, path: str | Path | None) -> str:
    """``plugin 'x' called sys.exit(0) while it was imported (at /path/x.py:3); ...``: a plug-in that ends the
    process at import would end the run with nothing done (with exit status 0, as if it had finished)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen importlib")]
    own = [f for f in frames if path is None or f.filename == str(path)] or frames
    where = f" (at {own[-1].filename}:{own[-1].lineno})" if own else f" ({path})" if path else ""
    return (f"plugin {entry!r} called sys.exit({exc.code!r}) while it was imported{where}; nothing was run: a plug-in "
            "only defines and registers; fix the plug-in")


def _failed(entry: str, exc: Exception, path: str | None = None) -> str:
    """``plugin 'x' failed to import: KeyError: 'a' (at /path/x.py:12); fix the plug-in``: the line is the last one
    of the plug-in file that the error passed through (of a module plug-in: the last one outside importlib)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen importlib")]
    own = [f for f in frames if path is None or f.filename == path] or frames
    where = f" (at {own[-1].filename}:{own[-1].lineno})" if own and not isinstance(exc, SyntaxError) else ""
    return f"plugin {entry!r} failed to import: {type(exc).__name__}: {exc}{where}; fix the plug-in"
