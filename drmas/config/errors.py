"""Configuration errors: :class:`ConfigError`, and the formatting of a pydantic validation error as one line
per problem (``key.path: what is wrong (got value); fix: what to write instead``)."""
from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from drmas.config.schema import RunConfig


class ConfigError(ValueError):
    """A configuration problem, with the key path and the fix in the message."""


def format_validation_error(err: ValidationError, source: str, schema: type[BaseModel] = RunConfig,
                            what: str = "config") -> str:
    """One line per problem: ``key.path: what is wrong (got value); fix: what to write instead``, after a line
    naming the ``what`` and its ``source``; ``schema``: the model that was validated (a run config, or another file
    written in the same machinery, e.g. a grid spec), whose fields an unknown key is matched against."""
    lines = [f"invalid {what} ({source}):"]
    for e in err.errors():
        loc = _format_loc(e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        if e["type"] == "extra_forbidden":
            msg, got_txt = "unknown key", ""
        elif e["type"] == "value_error" or isinstance(got, (dict, list)):
            got_txt = ""  # our validators' messages quote the values themselves
        else:
            got_txt = f" (got {got!r})"
        fix = _fix_hint(e, schema)
        named = loc and not msg.startswith(loc)  # model-level validators name the exact key themselves
        lines.append(f"  {loc + ': ' if named else ''}{msg}{got_txt}{'; fix: ' + fix if fix else ''}")
    return "\n".join(lines)


def _format_loc(loc: tuple) -> str:
    """("agents", 0, "role") -> "agents[0].role"."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_TYPE_FIXES = {
    "int_parsing": "write an integer, e.g. 4", "int_type": "write an integer, e.g. 4",
    "int_from_float": "write a whole number", "float_parsing": "write a number, e.g. 1e-4",
    "float_type": "write a number, e.g. 1e-4", "bool_parsing": "write true or false", "bool_type": "write true or false",
    "string_type": "write a string (quote it in YAML)", "dict_type": "write a mapping {key: value, ...}",
    "model_type": "write a mapping of its sub-keys {key: value, ...}", "list_type": "write a list [...]",
    "tuple_type": "write a list [...]", "missing": "add it", "finite_number": "write a finite number",
}
_BOUNDS = {"greater_than": ("gt", ">"), "greater_than_equal": ("ge", ">="), "less_than": ("lt", "<"),
           "less_than_equal": ("le", "<=")}


def _fix_hint(e: dict[str, Any], schema: type[BaseModel]) -> str:
    """What to write instead, from a pydantic error (empty for our own validators: their text says it)."""
    kind, ctx, loc = e["type"], e.get("ctx") or {}, e["loc"]
    if kind == "extra_forbidden":
        fields = _fields_at(loc[:-1], schema)
        close = difflib.get_close_matches(str(loc[-1]), fields, n=1)
        return (f"did you mean `{close[0]}`? " if close else "") + f"remove it or use one of {fields}"
    if kind in _BOUNDS:
        key, op = _BOUNDS[kind]
        return f"use a value {op} {ctx.get(key)}"
    if kind == "literal_error":
        return f"use {ctx.get('expected')}"
    if kind in ("too_long", "too_short"):
        n = ctx.get("max_length") if kind == "too_long" else ctx.get("min_length")
        return f"give {'at most' if kind == 'too_long' else 'at least'} {n} item(s)"
    if kind == "missing" and loc and isinstance(loc[-1], int):
        return f"the list is too short: give at least {loc[-1] + 1} item(s)"
    return _TYPE_FIXES.get(kind, "" if kind == "value_error" else
                           "see the field's description in drmas/config/schema.py")


def _fields_at(loc: tuple, schema: type[BaseModel]) -> list[str]:
    """Field names of the section of ``schema`` at ``loc`` (list indexes and dict keys are stepped over)."""
    node: Any = schema
    for part in loc:
        node = _section_type(node)
        if isinstance(node, type) and issubclass(node, BaseModel):
            field = node.model_fields.get(str(part))
            if field is None:
                return []
            node = field.annotation
        elif typing.get_origin(node) in (dict, list):
            node = typing.get_args(node)[-1]
        else:
            return []
    node = _section_type(node)
    return sorted(node.model_fields) if isinstance(node, type) and issubclass(node, BaseModel) else []


def _section_type(annotation: Any) -> Any:
    """``Optional[X]`` -> X (the non-None member of a union)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, getattr(types, "UnionType", None)) and len(args) == 1:
        return args[0]
    return annotation
