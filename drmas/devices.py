"""Where a run's tensors live and in which precision: ``train.device`` and ``train.precision``.

- ``train.device``: ``auto`` (the first CUDA GPU when torch sees one, else the CPU), ``cpu``, ``cuda`` or
  ``cuda:<i>``. Resolved once per process (:func:`resolve_device`); every worker group, its reference
  model, its rollout engine, the SFT warm-up and the evaluation put their model there, and every tensor of
  the hot path is created on the device of the model that consumes it (no global default device).
- ``train.precision``: ``fp32`` (the default: everything in float32, as on the CPU) or ``bf16`` (weights,
  gradients and optimizer states stay float32; forward passes run under ``torch.autocast`` in bfloat16,
  and log-probs / entropies are still reduced in float32 from the bf16 logits).

The module imports torch only, and only when a function needs it (validating ``train.device`` reads
:data:`DEVICE_PATTERN` alone); it is the one place that turns the two strings into torch objects.
"""
from __future__ import annotations

import contextlib
import os
import re
from typing import TYPE_CHECKING, ContextManager

if TYPE_CHECKING:
    import torch

DEVICE_PATTERN = r"^(auto|cpu|cuda(:\d+)?)$"
"""The values ``train.device`` accepts (resolved by :func:`resolve_device`)."""

PRECISIONS: dict[str, str | None] = {"fp32": None, "bf16": "bfloat16"}
"""Precision name -> the torch dtype of the forward passes' autocast (``None``: no autocast, plain float32)."""


def resolve_device(spec: str) -> torch.device:
    """The torch device ``spec`` names on this machine (``auto``: ``cuda`` when a GPU is visible, else
    ``cpu``). Raises ``ValueError`` naming the problem when ``spec`` is malformed or asks for a GPU this
    process cannot see, so a run stops before any work."""
    import torch

    if not re.match(DEVICE_PATTERN, spec):
        raise ValueError(f"train.device={spec!r}: use auto, cpu, cuda or cuda:<index>")
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"train.device={spec!r} but torch sees no CUDA GPU (torch {torch.__version__}, "
                             f"CUDA build {torch.version.cuda}); use train.device=cpu or auto")
        if device.index is not None and device.index >= count:
            raise ValueError(f"train.device={spec!r} but torch sees {count} GPU(s) (indices 0..{count - 1}); "
                             "pick one of them or use train.device=cuda")
    return device


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def check_precision(precision: str) -> str:
    """``precision`` if it is registered in :data:`PRECISIONS`, else the error that lists them."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; registered: {sorted(PRECISIONS)}")
    return precision


def autocast(device: torch.device, precision: str) -> ContextManager:
    """The context of a forward pass at ``precision`` on ``device``: nothing for ``fp32``, else
    ``torch.autocast`` to the precision's dtype."""
    import torch

    dtype = PRECISIONS[check_precision(precision)]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, dtype))


def cpu_identity() -> dict[str, str]:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere) and the vector ISA torch's
    kernels dispatch to. Floating-point results, and so the tokens a sampler draws, can differ between CPU
    models: twins that must share a rollout (docs/frontier.md, "Twins") are compared by this record."""
    import platform

    import torch

    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        pass
    return {"model": model or platform.processor() or platform.machine(),
            "capability": str(torch.backends.cpu.get_cpu_capability())}


def describe(device: torch.device) -> str:
    """One line naming the device (GPU model and memory for CUDA), for logs and manifests."""
    import torch

    if device.type != "cuda":
        return f"{device} ({cpu_cores()} cores)"
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    return f"cuda:{index} ({props.name}, {props.total_memory / 2**30:.0f} GiB)"


if __name__ == "__main__":  # `python -m drmas.devices [auto|cpu|cuda|cuda:<i>]`: the device a run would use
    import sys

    try:
        print(describe(resolve_device(sys.argv[1] if len(sys.argv) > 1 else "auto")))
    except ValueError as exc:
        sys.exit(f"drmas.devices: {exc}")
