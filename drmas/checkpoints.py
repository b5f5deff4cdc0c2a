"""Checkpoint integrity: a sha256 manifest per checkpoint folder, and the build record of base checkpoints.

Every checkpoint folder drmas writes (an RL run's ``checkpoints/latest``, an SFT'd base checkpoint) gets
``manifest.sha256.json``: ``{"files": {relative path: {"sha256", "bytes"}}, ...extra}``. It is written last
into the temporary folder that is then renamed into place, so it appears atomically with the checkpoint.
:func:`verify_checkpoint` recomputes the hashes and raises :class:`CheckpointDamaged` with one line naming
the first damaged file (missing, another size, another sha256): a flipped byte, a truncated file or an
emptied ``trainer.json`` is caught before anything is loaded from it.

A base checkpoint's manifest also records ``built_by``: the model preset, the roles it was fine-tuned on
and the run config's ``sft`` block with its hash. :func:`check_base_checkpoint` compares that hash with
the ``sft`` block of the config about to use the checkpoint and refuses (``CheckpointMismatch``, naming
the changed keys) when they differ: the checkpoint would not be the one the config describes.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from drmas.io import atomic_write_json, sha256_file

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.sha256.json"


class CheckpointDamaged(RuntimeError):
    """A checkpoint file does not match its manifest (the message names the file)."""


def refused_pickle(exc: Exception) -> str:
    """What ``torch.load(weights_only=True)`` refused in a file, in one clause: the first sentence of its
    ``UnpicklingError`` that names the refused global (``Unsupported global: GLOBAL builtins.exec was not an allowed
    global by default``; for a module torch blocks outright, ``Trying to load unsupported GLOBAL posix.system whose
    module posix is blocked``), else its first sentence."""
    lines = [line for line in str(exc).split("WeightsUnpickler error: ")[-1].splitlines() if line.strip()] or [""]
    return next((line for line in lines if "GLOBAL" in line), lines[0]).split(". ")[0].rstrip(".")


class CheckpointMismatch(RuntimeError):
    """A base checkpoint was built from another ``sft`` block than the config's."""


def file_digests(folder: str | Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {"sha256", "bytes"}}`` of every file under ``folder`` but a manifest: what a manifest lists
    (:func:`write_manifest`), and what the openrlhf backend records of the DeepSpeed states a run's checkpoint points
    to (:meth:`~drmas.workers.openrlhf.backend.OpenRLHFBackend.get_states`)."""
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST_NAME}


def write_manifest(folder: str | Path, **extra: Any) -> Path:
    """Hash every file under ``folder`` (but the manifest) into ``folder/manifest.sha256.json`` (atomic)."""
    folder = Path(folder)
    atomic_write_json(folder / MANIFEST_NAME, {"files": file_digests(folder), **extra}, indent=1, sort_keys=True)
    return folder / MANIFEST_NAME


def read_manifest(folder: str | Path) -> dict[str, Any] | None:
    """The manifest of ``folder``, or None when it has none (or an unreadable one)."""
    try:
        manifest = json.loads((Path(folder) / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) else None


def verify_checkpoint(folder: str | Path) -> dict[str, Any]:
    """Check every file of ``folder`` against its manifest; returns the manifest. Raises
    :class:`CheckpointDamaged` naming the first bad file, or the missing/unreadable manifest."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        raise CheckpointDamaged(f"{folder / MANIFEST_NAME}: missing or unreadable, so the checkpoint cannot be verified")
    verify_files(folder, manifest["files"], MANIFEST_NAME)
    return manifest


def verify_files(folder: str | Path, files: dict[str, dict[str, Any]], lister: str,
                 why: str = "the file was damaged after it was written") -> None:
    """Check that ``folder`` holds each of ``files`` (:func:`file_digests`) with its size and sha256; raises
    :class:`CheckpointDamaged` naming the first that does not, ``lister`` (what listed it) and, for a file of the
    listed size whose sha256 differs, ``why``."""
    for name, want in files.items():
        path = Path(folder) / name
        if not path.is_file():
            raise CheckpointDamaged(f"{path}: missing (listed in {lister})")
        size = path.stat().st_size
        if size != want.get("bytes"):
            raise CheckpointDamaged(f"{path}: {size} bytes, {lister} says {want.get('bytes')} (truncated or "
                                    "overwritten)")
        if sha256_file(path) != want.get("sha256"):
            raise CheckpointDamaged(f"{path}: sha256 differs from {lister} ({why})")


_VERIFIED: set[tuple[str, float]] = set()  # (folder, manifest mtime) verified by this process


def verify_artifact(path: str | Path, key: str, required: bool = True) -> dict[str, Any] | None:
    """Verify a folder a run loads (a base checkpoint, a tokenizer) against its manifest before it is used;
    ``key`` names it in messages (``models.solver_model.path``). A name that is not a local folder (a hub
    id) is the hub's to verify and is skipped. A folder without a manifest raises :class:`CheckpointDamaged`
    when ``required`` (``train.verify_artifacts``), else is used with a warning. Each folder is hashed once
    per process (while its manifest is unchanged)."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    manifest_file = folder / MANIFEST_NAME
    if not manifest_file.is_file():
        if required:
            raise CheckpointDamaged(f"{key}={folder} has no {MANIFEST_NAME}, so its files cannot be verified; "
                                    "rebuild it (delete the folder: the SFT warm-up writes it again with a manifest), "
                                    f"write one if you trust the files (python -c \"from drmas.checkpoints import "
                                    f"write_manifest; write_manifest('{folder}')\"), or set "
                                    "train.verify_artifacts=false")
        logger.warning("%s=%s has no %s: loaded unverified (train.verify_artifacts=false)", key, folder, MANIFEST_NAME)
        return None
    stamp = (str(folder.resolve()), manifest_file.stat().st_mtime)
    if stamp in _VERIFIED:
        return read_manifest(folder)
    try:
        manifest = verify_checkpoint(folder)
    except CheckpointDamaged as exc:
        raise CheckpointDamaged(f"{key}: {exc}") from None
    _VERIFIED.add(stamp)
    return manifest


# ------------------------------------------------------------------------------ base checkpoints
def build_record(preset: str, roles: list[str], sft_block: dict[str, Any],
                 traces: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a base checkpoint is built from; ``hash`` is the sha256 of the ``sft`` block without
    ``tokenizer_dir`` (where the tokenizer lives, not what it is) and, when the task source has any, of
    the settings that shape its SFT traces (``TaskSource.trace_args``: e.g. the search source's trace
    noise and knowledge base). Preset and roles are recorded for the reader: configs sharing one base may
    teach it different role subsets."""
    block = {k: v for k, v in sft_block.items() if k != "tokenizer_dir"}
    hashed: dict[str, Any] = {"sft": block, "traces": traces} if traces else block
    digest = hashlib.sha256(json.dumps(hashed, sort_keys=True, default=str).encode()).hexdigest()
    return {"preset": preset, "roles": sorted(roles), "sft": block, **({"traces": traces} if traces else {}),
            "hash": digest}


def _changed(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [k for key in sorted(set(old) | set(new))
                for k in _changed(old.get(key), new.get(key), f"{prefix}{key}.")]
    return [] if old == new else [f"{prefix[:-1]} ({old!r} -> {new!r})"]


def check_base_checkpoint(path: str | Path, expected: dict[str, Any], key: str, required: bool = True) -> None:
    """Verify the base checkpoint at ``path`` (files and build record) for model ``key``.

    A checkpoint without a manifest is refused (:func:`verify_artifact`; with ``required`` false, used with a
    warning); one whose files are damaged raises :class:`CheckpointDamaged`; one built from another ``sft``
    block raises :class:`CheckpointMismatch` naming the changed keys."""
    manifest = verify_artifact(path, f"models.{key}.path", required)
    if manifest is None:
        return
    built = manifest.get("built_by")
    if not built:
        logger.warning("models.%s.path=%s records no build config: its sft block cannot be checked", key, path)
        return
    if built.get("hash") != expected["hash"]:
        changes = _changed({"sft": built.get("sft"), "env.args": built.get("traces")},
                           {"sft": expected["sft"], "env.args": expected.get("traces")})
        raise CheckpointMismatch(f"models.{key}.path={path} was built from another `sft` block or other SFT traces "
                                 f"({'; '.join(changes)}); delete that folder to rebuild it with the current settings "
                                 "(`run_all.sh --rebuild-bases` for the shipped bases), or restore them")
