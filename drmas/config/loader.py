"""Reading a run config: YAML files (with ``base:`` includes), ``key.sub=value`` overrides, the config's plug-ins
imported (:mod:`drmas.plugins`), validation into a :class:`~drmas.config.schema.RunConfig`; and writing one back
as YAML."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import yaml
from pydantic import ValidationError

from drmas.config.errors import ConfigError, format_validation_error
from drmas.config.schema import RunConfig
from drmas.plugins import Plugin, PluginError, load_plugins


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], value parsed as YAML, so 1e-4, true, [1, 2] work)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.sub=value")
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def _set_path(data: dict, path: list[str], value: Any, item: str) -> None:
    node: Any = data
    for depth, part in enumerate(path[:-1]):
        if isinstance(node, list):
            node = node[_list_index(node, part, item)]
            continue
        node = node.setdefault(part, {})
        if not isinstance(node, (dict, list)):
            raise ConfigError(f"override {item!r}: {'.'.join(path[:depth + 1])} is not a section")
    last = path[-1]
    if isinstance(node, list):
        node[_list_index(node, last, item)] = value
    else:
        node[last] = value


def _list_index(node: list, part: str, item: str) -> int:
    """List entries are addressed by position (agents.0.lr) or by their `name` (agents.solver.lr)."""
    if part.lstrip("-").isdigit():
        idx = int(part)
        if not -len(node) <= idx < len(node):
            raise ConfigError(f"override {item!r}: index {idx} out of range (list has {len(node)} entries)")
        return idx
    for i, entry in enumerate(node):
        if isinstance(entry, dict) and entry.get("name") == part:
            return i
    raise ConfigError(f"override {item!r}: no entry named {part!r}")


def _nearest_shipped(path: Path) -> str:
    """``; did you mean experiments/configs/cpu/math_base.yaml?``: the shipped config whose path (relative to the
    repository, or from ``configs/`` on) or file name is closest to ``path``; else the hint to list them."""
    import difflib

    from drmas.config.describe import CONFIGS, shipped_config_paths

    shipped = shipped_config_paths()
    if not shipped:
        return ""
    root = CONFIGS.parents[1]
    given = path.as_posix().removeprefix("./")
    keys = {}  # each spelling a user may type -> the shipped path, as it is given from the repository root
    for p in shipped:
        rel = p.relative_to(root).as_posix()
        for key in (rel, p.relative_to(CONFIGS).as_posix(), p.name, p.stem):
            keys.setdefault(key, rel)
    close = difflib.get_close_matches(given, list(keys), n=1, cutoff=0.75) \
        or difflib.get_close_matches(path.name, list(keys), n=1, cutoff=0.75)
    hint = f"; did you mean {keys[close[0]]}?" if close else ""
    return f"{hint} (`drmas config list` lists the shipped configs)"


def _read_yaml(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    """A YAML mapping; a top-level ``base: other.yaml`` (relative to this file) is read first and this
    file's keys are merged into it (see :func:`_merge`)."""
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist{_nearest_shipped(path)}")
    if path.resolve() in seen:
        raise ConfigError(f"config file {path} includes itself through `base`")
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    base = loaded.pop("base", None)
    if base is None:
        return loaded
    return _merge(_read_yaml(path.parent / base, seen + (path.resolve(),)), loaded)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Merge ``over`` into ``base``: mappings recursively, unless ``over``'s mapping has ``_replace: true``
    (then it replaces the base's, e.g. a sharing config's `models`); lists and values replace."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and value.get("_replace"):
            out[key] = {k: v for k, v in value.items() if k != "_replace"}
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _unshared(node: Any) -> Any:
    """A copy in which no two places share one object. ``copy.deepcopy`` keeps YAML aliases shared
    (``search_model: *nano_base``), so an override of one model would silently change every model that
    the file wrote as an alias of it."""
    if isinstance(node, dict):
        return {k: _unshared(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_unshared(v) for v in node]
    return node


def plugin_registries() -> dict[str, Any]:
    """The registries a plug-in may add names to, by the word ``drmas config show`` uses for each. Importing them
    registers the built-ins first, so that only a plug-in's own names are recorded as its registrations."""
    import envs.math  # noqa: F401  (registers the math environment)
    import envs.search  # noqa: F401  (registers the search environment)
    from drmas.agents import AGENT_REGISTRY
    from drmas.algos.catalog import ESTIMATORS
    from drmas.backends import BACKENDS
    from drmas.loggers import LOGGERS
    from drmas.orchestra import ORCHESTRA_REGISTRY
    from drmas.rollout.catalog import ENGINES
    from drmas.tasks import TASK_SOURCES
    from envs.base import ENV_REGISTRY

    return {"estimator": ESTIMATORS, "agent": AGENT_REGISTRY, "orchestra": ORCHESTRA_REGISTRY,
            "task source": TASK_SOURCES, "env": ENV_REGISTRY, "engine": ENGINES, "backend": BACKENDS,
            "logger": LOGGERS}


def import_plugins(entries: Sequence[str]) -> list[Plugin]:
    """Import the plug-ins ``entries`` (once per process; :func:`drmas.plugins.load_plugins`, relative files from
    the current directory) and return what each registered. A plug-in that cannot be found or fails to import is
    a ConfigError naming it."""
    if not entries:
        return []
    try:
        return load_plugins(entries, registries=plugin_registries())
    except PluginError as exc:
        raise ConfigError(str(exc)) from None


def _plugin_entries(data: dict[str, Any], extra: Sequence[str], source: str) -> list[str]:
    """The config's ``plugins`` with ``extra`` (``--plugin``) appended, each entry once, in order."""
    written = data.get("plugins")
    entries = [*([] if written is None else written), *extra] if isinstance(written, (list, type(None))) else written
    if not isinstance(entries, list) or not all(isinstance(e, str) and e.strip() for e in entries):
        raise ConfigError(f"invalid config ({source}):\n  plugins: must be a list of module names or .py file paths "
                          f"(got {entries!r}); fix: write e.g. [my_pkg.estimators, ./my_estimator.py]")
    return list(dict.fromkeys(entries))


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                plugins: Sequence[str] = ()) -> RunConfig:
    """Read a YAML config (or the defaults), apply overrides, append ``plugins`` (``--plugin``) to its ``plugins``,
    import them (:func:`import_plugins`: the names they register are then known), validate. Raises ConfigError."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        data = _read_yaml(Path(path), seen=())
        source = str(path)
    data = _unshared(data)
    for item in overrides or []:
        keys, value = parse_override(item)
        _set_path(data, keys, value, item)
    return validate_config(data, source, plugins)


def validate_config(data: dict[str, Any], source: str, plugins: Sequence[str] = ()) -> RunConfig:
    """A config given as a mapping (read from YAML, or recorded in a run's ``manifest.json``) with ``plugins``
    appended to its ``plugins`` and imported (:func:`import_plugins`), validated; ``source`` names it in the
    errors. ``data`` is not changed. Raises ConfigError."""
    data = {**_unshared(data), "plugins": _plugin_entries(data, plugins, source)}
    import_plugins(data["plugins"])
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def config_record(cfg: RunConfig) -> dict[str, Any]:
    """``cfg`` as a run records it (``config.yaml``, the loggers' copy); a derived DeepSpeed checkpoint folder is
    left out (null), so loading it derives it from where the run folder is then
    (:meth:`RunConfig.default_checkpoint_dir`)."""
    data = cfg.model_dump(mode="json")
    for model in data["models"].values():
        if model["resources"]["checkpoint_dir"] == cfg.default_checkpoint_dir():
            model["resources"]["checkpoint_dir"] = None
    return data


def dump_config(cfg: RunConfig) -> str:
    """``cfg`` as a run's ``config.yaml`` (:func:`config_record`)."""
    return yaml.safe_dump(config_record(cfg), sort_keys=False)
