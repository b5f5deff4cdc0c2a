"""Typed run configuration, validated before any work starts.

- :mod:`drmas.config.schema`: the sections (``env``, ``models``, ``agents``, ``algo``, ``train``, ``sft``), each
  field with its default and description, and the cross-field validators;
- :mod:`drmas.config.loader`: YAML files with ``base:`` includes + ``key.sub=value`` overrides -> ``RunConfig``;
- :mod:`drmas.config.errors`: :class:`ConfigError` and the one-line-per-problem error format.

``from drmas.config import ...`` is the import path for all of them.
"""
from drmas.config.errors import ConfigError
from drmas.config.loader import config_record, dump_config, load_config, parse_override
from drmas.config.schema import (
    DATA_SUFFIXES,
    AgentConfig,
    AlgoConfig,
    EnvConfig,
    ModelConfig,
    OptimConfig,
    ResourcesConfig,
    RolloutEngineConfig,
    RunConfig,
    SamplingConfig,
    SFTSection,
    TrainConfig,
)

__all__ = ["ConfigError", "config_record", "dump_config", "load_config", "parse_override", "DATA_SUFFIXES", "AgentConfig", "AlgoConfig",
           "EnvConfig", "ModelConfig", "OptimConfig", "ResourcesConfig", "RolloutEngineConfig", "RunConfig",
           "SamplingConfig", "SFTSection", "TrainConfig"]
