"""Typed run configuration (:mod:`drmas.config.schema`), re-exported so that ``from drmas.config import ...``
is the one import path."""
from drmas.config.schema import *  # noqa: F401,F403
from drmas.config.schema import _read_yaml  # noqa: F401
