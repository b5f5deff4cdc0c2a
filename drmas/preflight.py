"""Checks a command makes before any work starts (after ``load_config``, before data, SFT or a run folder).

``load_config`` accepts partial configs (they are composed with overrides), so what only a command that is
about to run needs is checked here: an empty ``agents`` list, and folders the command will write that it
cannot (a path under a regular file, a read-only folder). Each problem is one line naming the key; all
of them are raised together as one :class:`~drmas.config.ConfigError`.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from drmas.config import ConfigError, RunConfig


def unwritable(path: str | Path) -> str | None:
    """Why a folder ``path`` (existing or to be created) cannot be written, or None. Creates nothing that
    stays: it probes its nearest existing ancestor with a temporary file."""
    path = Path(path).absolute()
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is a file, not a folder"
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        return f"cannot write in {probe} ({exc.strerror or exc})"
    return None


def writes_of(cfg: RunConfig, train: bool) -> dict[str, str]:
    """Config key -> folder the command writes: the run folder (RL), the tokenizer and every base
    checkpoint the SFT warm-up may build."""
    out = {"sft.tokenizer_dir": cfg.sft.tokenizer_dir}
    out.update({f"models.{k}.path": m.path for k, m in cfg.models.items() if m.preset and m.path})
    if train:
        out["out_dir"] = str(cfg.run_dir)
    return out


def check_before_work(cfg: RunConfig, train: bool = True) -> None:
    """Raise one :class:`ConfigError` listing every problem found (one line per key), else return."""
    from drmas.orchestra import ORCHESTRA_REGISTRY

    problems = []
    if not cfg.agents:
        slots = list(getattr(ORCHESTRA_REGISTRY.get(cfg.env.orchestra), "slots", None) or [])
        problems.append(f"  agents: empty; env.orchestra={cfg.env.orchestra!r} needs one agent per slot {slots}; fix: "
                        "add them (see experiments/configs/cpu/*.yaml)")
    for key, folder in writes_of(cfg, train).items():
        if (why := unwritable(folder)) is not None:
            problems.append(f"  {key} = {folder!r}: not writable: {why}; fix: choose a folder you can write")
    if problems:
        raise ConfigError("\n".join(["cannot start:", *problems]))
