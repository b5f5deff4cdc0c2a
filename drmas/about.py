"""What this installation is, for bug reports and run manifests: the drmas version and commit, the versions of
the libraries a run uses, and the devices torch sees (``drmas env``)."""
from __future__ import annotations

import importlib.metadata
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

PACKAGES: tuple[str, ...] = ("torch", "transformers", "tokenizers", "safetensors", "numpy", "pandas", "scipy",
                             "statsmodels", "lifelines", "pydantic", "pyyaml", "filelock", "math-verify", "bm25s",
                             "matplotlib", "tensorboard", "wandb", "nbconvert", "ray", "vllm", "openrlhf", "deepspeed")
"""The distributions ``drmas env`` reports (``None``: not installed); read from their metadata, not imported."""


def git_commit() -> str | None:
    """The checkout's commit (``None`` outside a git checkout), with ``+dirty`` when tracked files differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=REPO)
        if head.returncode != 0 or not head.stdout.strip():
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10, cwd=REPO).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def devices() -> dict[str, Any]:
    """CPU cores and torch's view of the accelerators (imports torch)."""
    import torch

    from drmas.devices import cpu_cores

    gpus = [f"cuda:{i} {torch.cuda.get_device_name(i)} ({torch.cuda.get_device_properties(i).total_memory / 2**30:.0f} GiB)"
            for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {"cpu_cores": cpu_cores(), "torch_threads": torch.get_num_threads(), "cuda_build": torch.version.cuda,
            "cuda_available": torch.cuda.is_available(), "gpus": gpus}


def environment() -> dict[str, Any]:
    """Everything ``drmas env`` prints."""
    try:
        version = importlib.metadata.version("drmas")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {"drmas": version, "commit": git_commit(), "python": platform.python_version(),
            "executable": sys.executable, "platform": platform.platform(), **devices(),
            "packages": package_versions()}


def environment_text(env: dict[str, Any]) -> str:
    """``environment()`` as aligned ``key: value`` lines (packages not installed are listed last, as one line)."""
    lines = [f"{k + ':':15} {v}" for k, v in env.items() if k not in ("packages", "gpus")]
    lines.append(f"{'gpus:':15} {', '.join(env['gpus']) or 'none'}")
    installed = {k: v for k, v in env["packages"].items() if v is not None}
    lines.append("packages:")
    lines += [f"  {k:13} {v}" for k, v in installed.items()]
    missing = [k for k, v in env["packages"].items() if v is None]
    if missing:
        lines.append(f"  not installed: {', '.join(missing)}")
    return "\n".join(lines)
