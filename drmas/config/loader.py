"""Reading a run config: YAML files (with ``base:`` includes), ``key.sub=value`` overrides, validation into a
:class:`~drmas.config.schema.RunConfig`; and writing one back as YAML."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from drmas.config.errors import ConfigError, format_validation_error
from drmas.config.schema import RunConfig


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


def _read_yaml(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    """A YAML mapping; a top-level ``base: other.yaml`` (relative to this file) is read first and this
    file's keys are merged into it (see :func:`_merge`)."""
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
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


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML config (or the defaults), apply overrides, validate. Raises ConfigError."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        data = _read_yaml(Path(path), seen=())
        source = str(path)
    data = _unshared(data)
    for item in overrides or []:
        keys, value = parse_override(item)
        _set_path(data, keys, value, item)
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None
    return cfg


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
