"""Command line: ``drmas train|sft|eval|data``.

    drmas train CONFIG.yaml [key.sub=value ...]     SFT warm-up of missing models, then RL
    drmas sft CONFIG.yaml [overrides]               only the warm-up
    drmas eval RUN_DIR [overrides]                  evaluation of a finished run's checkpoint
    drmas data prepare {math,search} [options]      write the data files a run needs
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from contextlib import nullcontext

from drmas.checkpoints import CheckpointDamaged, CheckpointMismatch
from drmas.config import ConfigError, load_config
from drmas.config.identity import STALE_POLICIES, ConfigDrift, check_run_folder
from drmas.io import JsonlDamaged, WriteFailed
from drmas.locks import FolderLocked, folder_lock
from drmas.preflight import check_before_work
from drmas.shutdown import children_end_with_me
from drmas.tasks import ToolFailure, ToolUnavailable

EXIT_CODES: dict[type[Exception], int] = {ConfigError: 2, FolderLocked: 1, CheckpointDamaged: 1, CheckpointMismatch: 1,
                                          JsonlDamaged: 1, WriteFailed: 1, ConfigDrift: 2,
                                          ToolUnavailable: 1, ToolFailure: 1}
"""Errors reported as one ``drmas: message`` line (no traceback), with their exit codes."""


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")


def cmd_train(args: argparse.Namespace) -> int:
    from drmas.trainer.trainer import Trainer
    from drmas.trainer.warmup import warmup

    cfg = load_config(args.config, args.overrides)
    check_before_work(cfg, train=not args.sft_only)
    if cfg.train.threads:
        import torch

        torch.set_num_threads(cfg.train.threads)
    _log_device(cfg.train.device, cfg.train.precision)
    with nullcontext() if args.sft_only else folder_lock(cfg.run_dir, "run folder"):  # before any work
        if not args.sft_only and args.stale != "keep":  # keep: the trainer records the changes it continues with
            check_run_folder(cfg, args.stale)  # a folder made with another config: before the warm-up too
        sft = warmup(cfg, progress=not args.no_progress)
        if sft:
            print(json.dumps({"sft": sft}, default=float))
        if args.sft_only:
            return 0
        trainer = Trainer(cfg, stale="keep" if args.stale == "keep" else "error")  # rerun: already moved aside
        try:
            trainer.train(progress=not args.no_progress)
        finally:
            trainer.close()
    print(f"run complete: {cfg.run_dir}")
    return 0


def _log_device(spec: str, precision: str) -> None:
    """Resolve ``train.device`` before any work (a GPU that is not there is a config error) and say it."""
    from drmas.devices import describe, resolve_device

    try:
        device = resolve_device(spec)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    logging.getLogger("drmas").info("device: %s, precision %s (train.device=%s)", describe(device), precision, spec)


def cmd_eval(args: argparse.Namespace) -> int:
    from pathlib import Path

    from drmas.trainer.trainer import Trainer

    cfg = load_config(Path(args.run_dir) / "config.yaml", args.overrides)
    _log_device(cfg.train.device, cfg.train.precision)
    trainer = Trainer(cfg)
    try:
        trainer.source.check_tools()
        step = trainer.load_checkpoint()
        if step == 0:
            print(f"drmas: {args.run_dir} has no checkpoint yet; evaluating the initial models", file=sys.stderr)
        records = trainer.evaluate(step, record=False)  # the run's eval.jsonl stays as training wrote it
    finally:
        trainer.close()
    print(json.dumps({k: {m: v[m] for m in ("avg", "pass", "k", "n_tasks")} for k, v in records.items()}, indent=2))
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    result = args.prepare_run(args)
    print(json.dumps(result, indent=2, default=str))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="drmas", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default="info")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, helptext in (("train", "SFT warm-up (if needed) then RL"), ("sft", "only the SFT warm-up")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("config")
        p.add_argument("overrides", nargs="*", help="key.sub=value")
        p.add_argument("--no-progress", action="store_true")
        if name == "train":
            p.add_argument("--stale", choices=STALE_POLICIES, default="error",
                           help="a run folder made with another config: stop and list the keys (error), move its "
                                "files aside to <name>.stale-<k> and start afresh (rerun), or continue it (keep)")
        p.set_defaults(func=cmd_train, sft_only=name == "sft", stale="error")
    p = sub.add_parser("eval", help="evaluate a run's latest checkpoint")
    p.add_argument("run_dir")
    p.add_argument("overrides", nargs="*")
    p.set_defaults(func=cmd_eval)
    p = sub.add_parser("data", help="data preparation")
    data_sub = p.add_subparsers(dest="data_command", required=True)
    prep = data_sub.add_parser("prepare", help="write the files a run needs")
    kinds = prep.add_subparsers(dest="kind", required=True)
    from envs.math import prepare as math_prepare
    from envs.search import prepare as search_prepare

    for kind, module in (("math", math_prepare), ("search", search_prepare)):
        kp = kinds.add_parser(kind)
        module.add_arguments(kp)
        kp.set_defaults(func=cmd_data, prepare_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level)
    try:
        with children_end_with_me():  # SIGTERM/SIGINT end the SFT workers, grader and Ray processes too
            return args.func(args)
    except tuple(EXIT_CODES) as exc:
        print(f"drmas: {exc}", file=sys.stderr)
        return next(code for cls, code in EXIT_CODES.items() if isinstance(exc, cls))


if __name__ == "__main__":
    sys.exit(main())
