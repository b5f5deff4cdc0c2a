"""The effective config as commented YAML (``drmas config show``) and the shipped configs (``drmas config list``).

Each field's comment is its description from :mod:`drmas.config.schema`, so the output documents the schema
and the values a run would use at once.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

CONFIGS = Path(__file__).resolve().parents[2] / "experiments" / "configs"
"""The shipped configs (in a repository checkout): cpu/ (the embedded default), gpu/ (one GPU), paper/."""


def _scalar(value: Any) -> str:
    """One value as YAML flow text (``[1, 2]``, ``{a: 1}``, ``null``, ``'on'``)."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**6, allow_unicode=True).strip().removesuffix("...").strip()


def _comment(text: str | None) -> str:
    return f"  # {' '.join(text.split())}" if text else ""


def describe_lines(model: BaseModel, indent: str = "") -> list[str]:
    """``model`` as YAML lines, each field followed by its schema description as a comment."""
    lines = []
    dumped = model.model_dump(mode="json")
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        head = f"{indent}{name}:"
        if isinstance(value, BaseModel):
            lines += [head + _comment(info.description), *describe_lines(value, indent + "  ")]
        elif isinstance(value, dict) and value and all(isinstance(v, BaseModel) for v in value.values()):
            lines.append(head + _comment(info.description))
            for key, sub in value.items():
                lines += [f"{indent}  {key}:", *describe_lines(sub, indent + "    ")]
        elif isinstance(value, list) and value and all(isinstance(v, BaseModel) for v in value):
            lines.append(head + _comment(info.description))
            for sub in value:
                first, *rest = describe_lines(sub, indent + "    ")
                lines += [f"{indent}  - {first.lstrip()}", *rest]
        else:
            lines.append(f"{head} {_scalar(dumped[name])}" + _comment(info.description))
    return lines


def describe_config(cfg: BaseModel) -> str:
    """The effective config, every field with its value and description (valid YAML: comments only added)."""
    return "\n".join(describe_lines(cfg)) + "\n"


def shipped_config_paths(root: Path = CONFIGS) -> list[Path]:
    """Every shipped config under ``root`` (``<kind>/<name>.yaml``), sorted."""
    return sorted(root.glob("*/*.yaml"))


def shipped_configs(root: Path = CONFIGS) -> list[tuple[Path, str]]:
    """(path, first sentence of its header comment) of every shipped config under ``root``."""
    out = []
    for path in shipped_config_paths(root):
        header = []
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            header.append(line.lstrip("# ").strip())
        text = " ".join(header)
        out.append((path, text.split(". ")[0].rstrip(".") if text else ""))
    return out
