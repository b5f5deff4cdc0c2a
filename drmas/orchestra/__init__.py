"""Orchestra registry and the paper's systems (importing this package registers them)."""
from drmas.orchestra import systems  # noqa: F401  (registers the built-in orchestras)
from drmas.orchestra.base import ORCHESTRA_REGISTRY, CallFn, Episodes, Orchestra, make_orchestra, register_orchestra

__all__ = ["ORCHESTRA_REGISTRY", "CallFn", "Episodes", "Orchestra", "make_orchestra", "register_orchestra"]
