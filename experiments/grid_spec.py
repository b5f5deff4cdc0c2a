"""The grid spec's schema: what a grid YAML file (``experiments/grids/*.yaml``) may hold, validated with the run
configs' machinery (:mod:`drmas.config.schema`'s ``Strict`` models, :func:`drmas.config.errors.format_validation_error`'s
one line per problem naming the key, the value and the fix) before the runner does any work.

A spec is a mapping: ``name``, ``out_dir``, ``requires_gpu``, ``sft`` (the configs whose missing checkpoints are
warmed up first), ``defaults`` (what every entry gives unless it says otherwise) and ``runs``, a non-empty list of
entries. An entry names its run folders (``name``, one folder name: its runs are ``<name>_s<seed>``), its
``config`` (relative to the repository root), its ``overrides`` (``key.sub=value``; the runner sets ``name``,
``out_dir`` and ``train.seed`` itself, :data:`drmas.config.identity.GRID_KEYS`), its ``seeds`` (integers >= 0, each
once) and the ``tags`` the analysis groups by (scalars; the runner adds ``entry`` and ``seed``).
"""
from __future__ import annotations

from typing import Annotated, Any, Optional, Union

from pydantic import AfterValidator, Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

from drmas.config.identity import GRID_KEYS, REPOSITORY, in_repository
from drmas.config.loader import parse_override
from drmas.config.schema import Strict, check_run_name

ROOT = REPOSITORY
RESERVED_TAGS = ("run", "config", "overrides", "status", "seconds", "error", "stale", "entry", "seed")
"""Keys of an ``index.json`` row that the runner writes itself; a tag may not take their place."""


def _existing_file(path: str) -> str:
    if not in_repository(path).is_file():
        raise ValueError(f"{path} does not exist (relative paths start at the repository root, {ROOT}); fix the path, "
                         "e.g. experiments/configs/cpu/math_base.yaml")
    return path


def _override(item: str) -> str:
    keys, _ = parse_override(item)
    key = ".".join(keys)
    if key in GRID_KEYS:
        raise ValueError(f"override {item!r} sets {key}, which the grid sets for each run (its folder and seed); "
                         "remove it and use the entry's `name` / `seeds` or the spec's `out_dir`")
    return item


def _distinct_seeds(seeds: list[int]) -> list[int]:
    dupes = sorted({s for s in seeds if seeds.count(s) > 1})
    if dupes:
        raise ValueError(f"seeds {seeds}: {dupes} given more than once (each seed is one run); give each seed once")
    return seeds


def _free_tags(tags: dict[str, Any]) -> dict[str, Any]:
    taken = sorted(set(tags) & set(RESERVED_TAGS))
    if taken:
        raise ValueError(f"tags {taken} are written by the runner itself ({list(RESERVED_TAGS)}); rename them")
    return tags


ConfigPath = Annotated[StrictStr, AfterValidator(_existing_file)]
Override = Annotated[StrictStr, AfterValidator(_override)]
Seed = Annotated[StrictInt, Field(ge=0)]
Seeds = Annotated[list[Seed], Field(min_length=1), AfterValidator(_distinct_seeds)]
TagValue = Union[StrictBool, StrictInt, StrictFloat, StrictStr, None]
Tags = Annotated[dict[StrictStr, TagValue], AfterValidator(_free_tags)]


class EntrySettings(Strict):
    """What a grid entry gives its runs; under ``defaults``, what every entry gives unless it says otherwise."""

    config: Optional[ConfigPath] = Field(None, description="run config, relative to the repository root")
    overrides: Optional[list[Override]] = Field(None, description="key.sub=value overrides of the config (default: none)")
    seeds: Optional[Seeds] = Field(None, description="train.seed of each run, integers >= 0, each once (default: [0])")
    tags: Optional[Tags] = Field(None, description="what the analysis groups by: task, setting, estimator, "
                                 "assignment, level, ... (scalars)")


class GridEntry(EntrySettings):
    """One entry of ``runs``: one run per seed, in the folders ``<name>_s<seed>``."""

    name: Annotated[StrictStr, AfterValidator(lambda n: check_run_name(n))] = Field(
        description="the entry's name: its runs' folders are <name>_s<seed> (one folder name)")


class GridSpec(Strict):
    """A grid spec file."""

    name: Optional[StrictStr] = Field(None, description="the grid's name (default: the spec file's stem)")
    out_dir: Optional[StrictStr] = Field(None, description="where the run folders go (default: results/runs/<stem>)")
    requires_gpu: StrictBool = Field(False, description="the grid's runs need a GPU (a dry run lists them anywhere)")
    twins_together: StrictBool = Field(False, description="start twins (runs whose tags differ only in the "
                                       "estimator) side by side, so that they draw their step-0 rollout in one sitting "
                                       "on one machine: a lane waits for its twin's lane")
    sft: list[ConfigPath] = Field(default_factory=list, description="configs whose missing model checkpoints are "
                                  "SFT'd before the runs that start from them")
    defaults: EntrySettings = Field(default_factory=EntrySettings, description="what every entry gives unless it "
                                    "says otherwise")
    runs: Annotated[list[GridEntry], Field(min_length=1)] = Field(description="the entries, one run per seed")

    @model_validator(mode="after")
    def _every_entry_has_a_config(self) -> "GridSpec":
        for i, entry in enumerate(self.runs):
            if entry.config is None and self.defaults.config is None:
                raise ValueError(f"runs[{i}] ({entry.name}) lacks `config`, and `defaults` gives none; fix: add "
                                 "config: experiments/configs/cpu/<file>.yaml to the entry or to `defaults`")
        return self

    def settings(self, entry: GridEntry) -> dict[str, Any]:
        """The entry's config, overrides, seeds and tags, each from the entry or else from ``defaults``."""
        given = {key: getattr(entry, key) if getattr(entry, key) is not None else getattr(self.defaults, key)
                 for key in EntrySettings.model_fields}
        fallback = {"overrides": [], "seeds": [0], "tags": {}}
        return {key: value if value is not None else fallback.get(key) for key, value in given.items()}
