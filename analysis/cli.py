"""Command lines generated from a dataclass of run arguments (CleanRL's ``Args`` style): one field, one
flag, the help text in the field's ``metadata["help"]``."""
from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
from typing import Any, Union, get_args, get_origin, get_type_hints


def parse_dataclass_args(cls: type, prog: str, description: str, argv: list[str] | None = None) -> Any:
    """``cls(**parsed)``: a bool field is a flag, a ``list[X]`` field takes any number of values, a field without
    default a required option."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    hints = get_type_hints(cls)
    for name, hint in hints.items():  # Optional[X] fields parse as X (default None)
        if get_origin(hint) is Union and type(None) in get_args(hint):
            hints[name] = next(a for a in get_args(hint) if a is not type(None))
    for f in fields(cls):
        flag = "--" + f.name.replace("_", "-")
        if hints[f.name] is bool:
            parser.add_argument(flag, action="store_true", help=f.metadata["help"])
        elif get_origin(hints[f.name]) is list:
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            parser.add_argument(flag, type=get_args(hints[f.name])[0], nargs="*", default=default,
                                help=f"{f.metadata['help']} (default: {default or 'none'})")
        elif f.default is MISSING:
            parser.add_argument(flag, type=hints[f.name], required=True, help=f.metadata["help"])
        else:
            parser.add_argument(flag, type=hints[f.name], default=f.default,
                                help=f"{f.metadata['help']} (default: {f.default})")
    return cls(**vars(parser.parse_args(argv)))
