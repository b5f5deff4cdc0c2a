"""The drmas command line: train, sft, eval, config, data (``drmas --help`` lists them with examples).

    drmas train CONFIG.yaml [key.sub=value ...]     SFT warm-up of missing models, then RL
    drmas sft CONFIG.yaml [overrides]               only the warm-up
    drmas eval RUN_DIR [overrides]                  evaluation of a finished run's checkpoint
    drmas config show CONFIG.yaml [overrides]       the effective config, each field with its description
    drmas config list                               the shipped configs
    drmas data prepare {math,search} [options]      write the data files a run needs
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from contextlib import nullcontext
from pathlib import Path

from drmas.checkpoints import CheckpointDamaged, CheckpointMismatch
from drmas.config import ConfigError, load_config
from drmas.config.identity import STALE_POLICIES, ConfigDrift
from drmas.io import JsonlDamaged, WriteFailed
from drmas.locks import FolderLocked
from drmas.preflight import check_before_work
from drmas.shutdown import children_end_with_me
from drmas.loggers import LoggerUnavailable
from drmas.tasks import ToolFailure, ToolUnavailable
from drmas.trainer.health import NonFiniteStop, WorkerGroupLost
from envs.search.corpus import CorpusMismatch

EXIT_CODES: dict[type[Exception], int] = {ConfigError: 2, FolderLocked: 1, CheckpointDamaged: 1, CheckpointMismatch: 1,
                                          JsonlDamaged: 1, WriteFailed: 1, ConfigDrift: 2,
                                          ToolUnavailable: 1, ToolFailure: 1, NonFiniteStop: 1, WorkerGroupLost: 1,
                                          LoggerUnavailable: 1, CorpusMismatch: 1}
"""Errors reported as one ``drmas: message`` line (no traceback), with their exit codes."""


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")


def cmd_train(args: argparse.Namespace) -> int:
    from drmas.trainer.run_folder import claim_run_folder
    from drmas.trainer.trainer import Trainer
    from drmas.trainer.warmup import warmup

    cfg = load_config(args.config, args.overrides, plugins=args.plugin)
    check_before_work(cfg, train=not args.sft_only)
    if cfg.train.threads:
        import torch

        torch.set_num_threads(cfg.train.threads)
    _log_device(cfg.train.device, cfg.train.precision)
    # the run folder is claimed before any work (the warm-up too): its lock and its identity check, once
    with nullcontext() if args.sft_only else claim_run_folder(cfg, args.stale):
        sft = warmup(cfg, progress=not args.no_progress)
        if sft:
            print(json.dumps({"sft": sft}, default=float))
        if args.sft_only:
            return 0
        trainer = Trainer(cfg, stale=args.stale)  # Trainer.train's claim is the one taken here
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
    """Evaluate the checkpoint of the folder named on the command line, wherever that folder now lives (its
    config's ``out_dir``/``name`` are replaced by the folder's own place); print the result and write it into the
    folder as ``eval_cli_step<k>.json``. No checkpoint is an error unless ``--initial-models`` asks for the models
    the run started from."""
    from drmas.io import atomic_write_text
    from drmas.trainer.trainer import Trainer

    run_dir = Path(args.run_dir).resolve()
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{args.run_dir} is not a run folder (no config.yaml); pass the folder `drmas train` wrote")
    cfg = load_config(run_dir / "config.yaml", [f"out_dir={run_dir.parent}", f"name={run_dir.name}", *args.overrides],
                      plugins=args.plugin)
    _log_device(cfg.train.device, cfg.train.precision)
    trainer = Trainer(cfg)
    try:
        trainer.source.check_tools()
        step = trainer.load_checkpoint()
        if step == 0 and not args.initial_models:
            finished = " although the run is finished (DONE)" if (run_dir / "DONE").exists() else ""
            raise ConfigError(f"{args.run_dir} has no checkpoint{finished}; pass --initial-models to evaluate the "
                              "models the run starts from")
        if step == 0:
            print(f"drmas: {args.run_dir} has no checkpoint; evaluating the initial models (--initial-models)",
                  file=sys.stderr)
        records = trainer.evaluate(step, record=False)  # the run's eval.jsonl stays as training wrote it
    finally:
        trainer.close()
    result = {"run_dir": str(run_dir), "step": step, "initial_models": step == 0, "overrides": list(args.overrides),
              "benchmarks": {k: {m: v[m] for m in ("avg", "pass", "k", "n_tasks")} for k, v in records.items()}}
    text = json.dumps(result, indent=2)
    atomic_write_text(run_dir / f"eval_cli_step{step}.json", text + "\n")
    print(text)
    return 0


def cmd_config_show(args: argparse.Namespace) -> int:
    from drmas.config.describe import describe_config
    from drmas.config.loader import import_plugins
    from drmas.plugins import describe_registered

    if args.config is not None and "=" in args.config and not Path(args.config).exists():  # only overrides given
        args.config, args.overrides = None, [args.config, *args.overrides]
    cfg = load_config(args.config, args.overrides, plugins=args.plugin)
    lines = describe_config(cfg).splitlines()
    if cfg.plugins:  # the plug-ins' line says what each one registered
        lines = [f"{line.split('  # ')[0]}  # {describe_registered(import_plugins(cfg.plugins))}"
                 if line.startswith("plugins:") else line for line in lines]
    print("\n".join(lines))
    return 0


def cmd_config_list(args: argparse.Namespace) -> int:
    from drmas.config.describe import CONFIGS, shipped_configs

    configs = shipped_configs()
    if not configs:
        print(f"drmas: no shipped configs under {CONFIGS} (they come with a repository checkout)", file=sys.stderr)
        return 1
    for path, summary in configs:
        print(f"{path.relative_to(CONFIGS.parents[1])}\n    {summary}")
    return 0


MAIN_HELP = """\
Dr. MAS: RL for multi-agent LLM systems with agent-wise advantage normalization.

examples:
  drmas train experiments/configs/cpu/math_base.yaml                       # SFT warm-up if needed, then RL
  drmas train experiments/configs/cpu/math_base.yaml algo.estimator=trajectory_grpo name=grpo
  drmas config show experiments/configs/cpu/search_base.yaml train.steps=5  # what a run would use, explained
  drmas config list                                                         # the shipped configs
  drmas eval results/runs/grpo                                              # evaluate a run's latest checkpoint

the whole suite (grid, tables, figures, REPORT.md):  bash experiments/run_all.sh
analysis of a grid directory:  python -m analysis.report --runs results/runs/cpu   (docs/analysis.md)
"""

OVERRIDE_HELP = """\
CONFIG is a YAML run config. Shipped: experiments/configs/cpu/ (the embedded default, 2 CPU cores), gpu/ (one
GPU), paper/ (the paper's settings): `drmas config list`. Every field, its value and meaning: `drmas config show
CONFIG`. Overrides change any field as key.sub=value, the value read as YAML:
  train.steps=5  algo.estimator=trajectory_grpo  algo.shared_prefix=off  name=my_run
  agents.solver.lr=1e-4   (list entries by `name` or by position: agents.0.lr=1e-4)
  models.shared.path=results/sft/math/base_tiny
The run folder is out_dir/name (default runs/run, git-ignored); a bad config stops before any work, naming the key.
Your own estimators, agent roles, orchestras, task sources: --plugin ./my_code.py or --plugin my_pkg.module, before
CONFIG or after the overrides (docs/extending.md).
"""

PLUGIN_HELP = ("a plug-in imported before the config is validated, in every process of the run: a module name "
               "(my_pkg.estimators) or a .py file (./my_estimator.py; relative to the current directory); appended to "
               "the config's `plugins`, so the run's config.yaml records it (repeatable)")


def cmd_data(args: argparse.Namespace) -> int:
    result = args.prepare_run(args)
    print(json.dumps(result, indent=2, default=str))
    return 0


def build_parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="drmas", description=MAIN_HELP, formatter_class=raw)
    parser.add_argument("--log-level", default="info", help="debug, info (default), warning or error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,sft,eval,config,data}")
    for name, helptext in (("train", "SFT warm-up of missing base models, then RL"), ("sft", "only the SFT warm-up")):
        p = sub.add_parser(name, help=helptext, description=f"{helptext}.\n\n{OVERRIDE_HELP}", formatter_class=raw)
        p.add_argument("config", help="YAML run config, e.g. experiments/configs/cpu/math_base.yaml")
        p.add_argument("overrides", nargs="*", help="key.sub=value (see above)")
        p.add_argument("--no-progress", action="store_true", help="no progress bar")
        p.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_FILE", help=PLUGIN_HELP)
        if name == "train":
            p.add_argument("--stale", choices=STALE_POLICIES, default="error",
                           help="a run folder made with another config: stop and list the keys (error), move its "
                                "files aside to <name>.stale-<k> and start afresh (rerun), or continue it (keep)")
        p.set_defaults(func=cmd_train, sft_only=name == "sft", stale="error")
    p = sub.add_parser("eval", help="evaluate a run's latest checkpoint", formatter_class=raw,
                       description="Evaluate a run's latest checkpoint on its config's benchmarks (the run's "
                                   "eval.jsonl is left as training wrote it).\n\nexample:\n"
                                   "  drmas eval runs/run train.eval_samples=16")
    p.add_argument("run_dir", help="a run folder (holds config.yaml and checkpoints/); evaluated where it is now")
    p.add_argument("overrides", nargs="*", help="key.sub=value")
    p.add_argument("--initial-models", action="store_true",
                   help="a folder without a checkpoint: evaluate the models the run starts from (otherwise an error)")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_FILE", help=PLUGIN_HELP)
    p.set_defaults(func=cmd_eval)
    p = sub.add_parser("config", help="show a config with its field descriptions, list the shipped ones")
    config_sub = p.add_subparsers(dest="config_command", required=True)
    show = config_sub.add_parser("show", help="the effective config, each field with its description",
                                 description=f"Print the effective config (defaults, file, overrides) as YAML, "
                                             f"each field commented with its description.\n\n{OVERRIDE_HELP}",
                                 formatter_class=raw)
    show.add_argument("config", nargs="?", default=None, help="YAML run config (default: the built-in defaults)")
    show.add_argument("overrides", nargs="*", help="key.sub=value")
    show.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_FILE", help=PLUGIN_HELP)
    show.set_defaults(func=cmd_config_show)
    config_sub.add_parser("list", help="the shipped configs (cpu: the embedded default, gpu: one GPU, paper)") \
        .set_defaults(func=cmd_config_list)
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
