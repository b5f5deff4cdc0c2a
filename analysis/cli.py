"""What the analysis' command lines share: a command line generated from a dataclass of run arguments (CleanRL's
``Args`` style: one field, one flag, the help text in the field's ``metadata["help"]``), the refusal of a given folder
that does not exist, a grid that may not have run yet, and the report's study of one such grid."""
from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, Callable, Union, get_args, get_origin, get_type_hints

from analysis.claims import ClaimSpec, Option, Study
from analysis.runs import GridData, load_grid


def missing_paths(**paths: Path | None) -> list[str]:
    """``--flag PATH does not exist`` for each given path that does not exist (flags named by the keywords)."""
    return [f"--{flag.replace('_', '-')} {path} does not exist" for flag, path in paths.items()
            if path is not None and not Path(path).exists()]


def load_optional(path: Path | None) -> GridData | None:
    """The grid in ``path`` (with or without index.json: :func:`analysis.runs.load_grid`), or None where no path is
    given or nothing is there: no folder, or a folder that holds no run folder yet (the grid was not run: "not
    run"). The command lines refuse a path that does not exist before this (:func:`missing_paths`)."""
    if path is None or not Path(path).is_dir() or not any(p.is_dir() for p in Path(path).iterdir()):
        return None
    return load_grid(path)


def one_grid_study(name: str, option: Option, analyze: Callable[[GridData, int, int], Any],
                   claims: tuple[ClaimSpec, ...], figures: Callable[[Any, Path], list[Path]]) -> Study:
    """A study of the report that reads one grid folder, ``--{option.flag} PATH`` (:func:`load_optional`): its
    analysis is ``analyze(grid, seed, n_boot)``, or None where the folder was not given or nothing has run there
    (each claim's judge then says "not run"); the analysis object carries its grid as ``.data``, whose problems
    REPORT.md lists."""
    return Study(
        name=name,
        analyze=lambda inputs: (analyze(inputs.grids[option.flag], inputs.seed, inputs.n_boot)
                                if inputs.grids.get(option.flag) is not None else None),
        claims=claims, figures=figures,
        grids=lambda an: [an.data] if an is not None else [],
        option=option, load=load_optional)


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
