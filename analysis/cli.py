"""Command lines generated from a dataclass of run arguments (CleanRL's ``Args`` style): one field, one
flag, the help text in the field's ``metadata["help"]``."""
from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
from typing import Any, get_type_hints


def parse_dataclass_args(cls: type, prog: str, description: str, argv: list[str] | None = None) -> Any:
    """``cls(**parsed)``: a bool field is a flag, a field without default a required option."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    hints = get_type_hints(cls)
    for f in fields(cls):
        flag = "--" + f.name.replace("_", "-")
        if hints[f.name] is bool:
            parser.add_argument(flag, action="store_true", help=f.metadata["help"])
        elif f.default is MISSING:
            parser.add_argument(flag, type=hints[f.name], required=True, help=f.metadata["help"])
        else:
            parser.add_argument(flag, type=hints[f.name], default=f.default,
                                help=f"{f.metadata['help']} (default: {f.default})")
    return cls(**vars(parser.parse_args(argv)))
