"""Write results/sft/bases.json, the record of the shipped SFT'd base checkpoints, from their manifests.

Each base's ``manifest.sha256.json`` (written by the warm-up, ``drmas.checkpoints``) holds how it was built and
the sha256 of every file; ``bases.json`` gathers them in one place for a reader and for
``tests/test_mechanism.py::test_shipped_bases_match_their_record``. Only the bases named on the command line get a
new ``built`` note: the others keep theirs (the shipped bases need not all come from one machine). ``used_by``
lists the CPU configs whose models start from the base.

    python -m experiments.record_bases search/base_nano search/base_tiny --built "2026-12-01; drmas sft CONFIG; 2 CPU cores"

``run_all.sh --rebuild-bases`` calls it for every base after the warm-ups.
"""
from __future__ import annotations

import argparse
import glob
import json
import logging
import sys
from pathlib import Path
from typing import Any

from drmas.checkpoints import read_manifest
from drmas.io import atomic_write_json, sha256_file

logger = logging.getLogger(__name__)

ROOT = Path("results/sft")
CONFIGS = "experiments/configs/cpu/*.yaml"  # the configs whose model paths say which base each starts from


def configs_using(pattern: str = CONFIGS) -> dict[str, list[str]]:
    """Checkpoint path -> the configs (matching ``pattern``) whose models start from it."""
    from drmas.config import load_config

    used: dict[str, list[str]] = {}
    for config in sorted(glob.glob(pattern)):
        for path in sorted({m.path for m in load_config(config).models.values() if m.path}):
            used.setdefault(path, []).append(config)
    return used


def base_entry(folder: Path, used_by: list[str], built: str) -> dict[str, Any]:
    """One base's entry: its build record and file hashes, as its manifest gives them."""
    manifest = read_manifest(folder)
    if manifest is None or "built_by" not in manifest:
        raise SystemExit(f"record_bases: {folder} has no manifest with a build record; build it with `drmas sft`")
    record = manifest["built_by"]
    return {"used_by": used_by, "preset": record["preset"], "roles": record["roles"], "sft": record["sft"],
            "trace_args": record.get("traces", {}), "build_hash": record["hash"], "built": built,
            "files_sha256": {name: f["sha256"] for name, f in sorted(manifest["files"].items())}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bases", nargs="*", help="bases to record anew, e.g. search/base_nano (default: every base "
                                             "under --root)")
    ap.add_argument("--built", required=True, help="the named bases' build record: date; command; machine (e.g. '2026-12-01; drmas sft CONFIG; 2 CPU cores')")
    ap.add_argument("--root", type=Path, default=ROOT)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    path = args.root / "bases.json"
    old = json.loads(path.read_text()).get("bases", {}) if path.exists() else {}
    found = sorted(str(p.parent.relative_to(args.root)) for p in args.root.glob("*/base_*/config.json"))
    named = args.bases or found
    missing = sorted(set(named) - set(found))
    if missing:
        raise SystemExit(f"record_bases: no base at {', '.join(str(args.root / m) for m in missing)}")
    used = configs_using()
    bases = {}
    for name in found:
        before = old.get(name, {})
        built = args.built if name in named or "built" not in before else before["built"]
        bases[name] = base_entry(args.root / name, used.get(str(args.root / name), []), built)
    tokenizers = {str(p.parent.relative_to(args.root)): sha256_file(p) for p in sorted(args.root.glob("*/tokenizer/tokenizer.json"))}
    record = {"bases": bases, "tokenizers_sha256": tokenizers,
              "rebuild": "bash experiments/run_all.sh --rebuild-bases (a rebuild on another machine or torch build "
                         "is not bit-identical to these files; it rewrites this record)"}
    atomic_write_json(path, record, indent=1)
    logger.info("record_bases: wrote %s (%d bases; recorded anew: %s)", path, len(bases), ", ".join(named))
    return 0


if __name__ == "__main__":
    sys.exit(main())
