"""The drmas command line: train, sft, eval, summary, config, env, data (``drmas --help`` lists them with examples).

    drmas train CONFIG.yaml [key.sub=value ...]     SFT warm-up of missing models, then RL
    drmas sft CONFIG.yaml [overrides]               only the warm-up
    drmas eval RUN_DIR [overrides]                  evaluation of a finished run's checkpoint
    drmas summary RUN_DIR                           a run's evaluations, step time, files; summary.md with curves
    drmas export RUN_DIR [--out DIR]                each model of the run as a Hugging Face folder
    drmas config show CONFIG.yaml [overrides]       the effective config, each field with its description
    drmas config list                               the shipped configs
    drmas env                                       versions and devices, for a bug report
    drmas data prepare {math,search} [options]      write the data files a run needs
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from drmas.config import ConfigError, load_config
from drmas.config.identity import STALE_POLICIES
from drmas.preflight import check_before_work
from drmas.progress import quiet_third_party_progress, reader_left, setup_logging
from drmas.shutdown import children_end_with_me


CONFIG_ERROR_EXIT = 2
"""The exit code of a bad config (and of a run folder made with another config, :class:`ConfigDrift`)."""


def exit_codes() -> dict[type[Exception], int]:
    """Errors reported as one ``drmas: message`` line (no traceback), with their exit codes. Imported here, when
    a command has failed, so that ``drmas --help`` and a config error import neither torch nor pandas."""
    from drmas.checkpoints import CheckpointDamaged, CheckpointMismatch
    from drmas.config.identity import ConfigDrift
    from drmas.io import JsonlDamaged, WriteFailed
    from drmas.locks import FolderLocked
    from drmas.loggers import LoggerUnavailable
    from drmas.records import RecordsRefused
    from drmas.tasks import ToolFailure, ToolUnavailable
    from drmas.trainer.health import NonFiniteStop, WorkerGroupLost
    from envs.search.corpus import CorpusMismatch

    return {ConfigError: CONFIG_ERROR_EXIT, ConfigDrift: CONFIG_ERROR_EXIT, FolderLocked: 1, CheckpointDamaged: 1,
            CheckpointMismatch: 1, JsonlDamaged: 1, WriteFailed: 1, ToolUnavailable: 1, ToolFailure: 1, NonFiniteStop: 1,
            WorkerGroupLost: 1, LoggerUnavailable: 1, CorpusMismatch: 1, RecordsRefused: 1}


def cmd_train(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides, plugins=args.plugin)
    check_before_work(cfg, train=not args.sft_only)
    from drmas.trainer.run_folder import claim_run_folder  # torch: imported once the config is known to be good
    from drmas.trainer.trainer import Trainer
    from drmas.trainer.warmup import checkpoints_to_build, warmup

    checkpoints_to_build(cfg)  # the bases' plan fails here, before the run folder is claimed
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
    from drmas.summary import read_summary, summary_text

    print(summary_text(read_summary(cfg.run_dir)))  # what `drmas summary RUN_DIR` prints
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
    config's ``out_dir``/``name`` are replaced by the folder's own place), after the checks of
    :func:`_eval_config`; print the result and write it into the folder as ``eval_cli_step<k>.json`` (atomically:
    a write that fails, e.g. on a full disk, keeps the file as it was and says so in one line, the result printed
    above it). No checkpoint is an error unless ``--initial-models`` asks for the models the run started from."""
    from drmas.io import WriteFailed, atomic_write_text
    from drmas.trainer.trainer import Trainer

    run_dir, cfg = _eval_config(args)
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
    print(text)  # first: a result the disk cannot take is not lost
    try:
        atomic_write_text(run_dir / f"eval_cli_step{step}.json", text + "\n")
    except WriteFailed as exc:
        print(f"drmas: {exc}; the evaluation's result is the one printed above", file=sys.stderr)
        return 1
    return 0


EVAL_PLACE = ("name", "out_dir")
"""The keys that say where a run folder is: ``drmas eval RUN`` sets them to RUN's place and refuses overrides of
them."""


def _eval_config(args: argparse.Namespace):
    """``(run_dir, cfg)`` of ``drmas eval RUN [overrides]``, checked before any model or checkpoint is loaded: RUN
    is a run folder; the overrides do not point to another folder (its checkpoint would be evaluated and its result
    written into RUN as RUN's); the plug-ins' sources are the ones the run recorded (as a resume checks,
    :func:`drmas.config.identity.saved_plugin_changes`); the evaluation fits in memory and the models have the
    shapes of the run's checkpoint (:func:`drmas.preflight.check_before_eval`)."""
    from drmas.config.identity import ConfigDrift, saved_plugin_changes
    from drmas.io import read_json_object
    from drmas.preflight import check_before_eval, model_shapes

    run_dir = Path(args.run_dir).resolve()
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{args.run_dir} is not a run folder (no config.yaml); pass the folder `drmas train` wrote")
    elsewhere = [o for o in args.overrides if o.partition("=")[0].strip() in EVAL_PLACE]
    if elsewhere:
        raise ConfigError(f"drmas eval evaluates the run folder it is given ({run_dir}); the override(s) "
                          f"{' '.join(elsewhere)} would point to another one; fix: drop them and pass that folder "
                          "instead (drmas eval OUT_DIR/NAME)")
    place = [f"out_dir={run_dir.parent}", f"name={run_dir.name}"]
    cfg = load_config(run_dir / "config.yaml", [*place, *args.overrides], plugins=args.plugin)
    if changes := saved_plugin_changes(cfg):
        raise ConfigDrift(f"run folder {run_dir} was trained with other plug-in code ({'; '.join(changes)}); its "
                          "evaluation would be reported for code that did not train it. Restore the plug-in's "
                          "source (and the modules it loads), or train a new run with this code")
    missing = {key: m.path for key, m in cfg.models.items() if m.path is not None and not Path(m.path).exists()}
    if missing:
        key, path = next(iter(missing.items()))
        raise ConfigError(f"model {key!r}: path {path!r} (from {run_dir / 'config.yaml'}) does not exist from the "
                          f"working directory {Path.cwd()}; a relative path resolves there. Fix: run drmas eval from "
                          "the directory the run was trained in (the repository root for the shipped configs), or "
                          f"pass models.{key}.path=ABSOLUTE_PATH")
    recorded = (read_json_object(run_dir / "manifest.json") or {}).get("model_shapes")
    if not isinstance(recorded, dict):  # a run recorded before its manifest held the shapes: its config's models
        recorded = model_shapes(load_config(run_dir / "config.yaml", place))
    check_before_eval(cfg, recorded)
    return run_dir, cfg


def cmd_summary(args: argparse.Namespace) -> int:
    """Print the summary of a run folder, finished or not (:mod:`drmas.summary`), and write ``summary.md`` with
    its curves (``summary.png``) into it."""
    from dataclasses import replace

    from drmas.summary import read_summary, run_files, summary_text, write_summary

    summary = read_summary(args.run_dir)  # once: its warnings are said once
    path = write_summary(summary)
    print(summary_text(replace(summary, files=run_files(summary.run_dir))))  # the files now include summary.md
    print(f"wrote {path}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write each model of a run's latest checkpoint as a Hugging Face folder (:mod:`drmas.trainer.export`)."""
    from drmas.trainer.export import export_run

    for key, folder in export_run(args.run_dir, args.out).items():
        print(f"{key}: {folder}")
    return 0


def _add_export_parser(sub: Any) -> None:
    p = sub.add_parser("export", help="each model of a run as a Hugging Face folder (transformers, vLLM)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Write the run's latest checkpoint as one Hugging Face model folder per model "
                                   "(safetensors, config.json, generation config, the run's tokenizer, a model card), "
                                   "under --out (default RUN_DIR/export), atomically. A run in progress, or a "
                                   "damaged or unverified checkpoint, is refused (docs/training.md: train, export, load "
                                   "in transformers, serve with vLLM).\n\nexample:\n  drmas export runs/run")
    p.add_argument("run_dir", help="a run folder with a checkpoint (checkpoints/latest)")
    p.add_argument("--out", default=None, help="the export folder (default RUN_DIR/export); an earlier export "
                                               "there is replaced, anything else is refused")
    p.set_defaults(func=cmd_export)


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
  drmas eval runs/grpo                                                      # evaluate a run's latest checkpoint
  drmas summary runs/grpo                                                   # its evaluations, files; summary.md
  drmas export runs/grpo                                                    # its models for transformers / vLLM
  drmas env                                                                 # versions and devices, for a bug report

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


DATA_KINDS = {"math": "envs.math.prepare", "search": "envs.search.prepare"}
"""``drmas data prepare KIND``: the module whose ``add_arguments`` and ``run`` prepare that data."""


def cmd_data(args: argparse.Namespace) -> int:
    result = args.prepare_run(args.prepare_args)
    print(json.dumps(result, indent=2, default=str))
    return 0


def _parse_data_options(args: argparse.Namespace, options: list[str]) -> None:
    """``drmas data prepare KIND OPTIONS``: parse the options with the kind's own parser, imported only now (so
    ``drmas --help`` imports no environment)."""
    import importlib

    module = importlib.import_module(DATA_KINDS[args.kind])
    parser = argparse.ArgumentParser(prog=f"drmas data prepare {args.kind}", description=module.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_arguments(parser)
    args.prepare_args, args.prepare_run = parser.parse_args(options), module.run


def cmd_env(args: argparse.Namespace) -> int:
    from drmas.about import environment, environment_text

    env = environment()
    print(json.dumps(env, indent=2) if args.json else environment_text(env))
    return 0


def build_parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="drmas", description=MAIN_HELP, formatter_class=raw)
    parser.add_argument("--log-level", default="info", help="debug, info (default), warning or error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,sft,eval,summary,export,config,env,data}")
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
    p = sub.add_parser("summary", help="a run's state, evaluations, step time and files; writes summary.md",
                       formatter_class=raw,
                       description="Print a run folder's summary (finished, in progress or stopped at step k of N; "
                                   "the final and best evaluation per benchmark and their average; the mean step "
                                   "time; where its files are; the next commands) and write it into the folder as "
                                   "summary.md, with the curves of the training reward and the evaluation average "
                                   "(summary.png).\n\nexample:\n  drmas summary runs/run")
    p.add_argument("run_dir", help="a run folder (holds config.yaml), finished or not")
    p.set_defaults(func=cmd_summary)
    _add_export_parser(sub)
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
    p = sub.add_parser("env", help="versions and devices, for a bug report",
                       description="The drmas version and commit, Python, the libraries a run uses and the devices "
                                   "torch sees: paste it into a bug report.")
    p.add_argument("--json", action="store_true", help="as JSON")
    p.set_defaults(func=cmd_env)
    p = sub.add_parser("data", help="data preparation")
    data_sub = p.add_subparsers(dest="data_command", required=True)
    prep = data_sub.add_parser("prepare", help="write the files a run needs")
    kinds = prep.add_subparsers(dest="kind", required=True)
    for kind in DATA_KINDS:  # each kind's options are its module's, parsed when the command runs (cmd_data)
        kinds.add_parser(kind, add_help=False, help=f"the {kind} data (`drmas data prepare {kind} --help`: its options)") \
            .set_defaults(func=cmd_data)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line as a namespace (``args.func`` runs it); a usage error exits 2 with argparse's message."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.func is cmd_data:
        _parse_data_options(args, extra)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.log_level)
    if args.log_level.lower() != "debug":  # drmas's own progress only; --log-level debug keeps the libraries' bars
        quiet_third_party_progress()
    try:
        with children_end_with_me():  # SIGTERM/SIGINT end the SFT workers, grader and Ray processes too
            return args.func(args)
    except ConfigError as exc:  # the common case, reported without importing the other errors' modules
        print(f"drmas: {exc}", file=sys.stderr)
        return CONFIG_ERROR_EXIT
    except BrokenPipeError:  # `drmas config list | head`
        return reader_left()
    except Exception as exc:
        codes = exit_codes()
        if not isinstance(exc, tuple(codes)):
            raise
        print(f"drmas: {exc}", file=sys.stderr)
        return next(code for cls, code in codes.items() if isinstance(exc, cls))


if __name__ == "__main__":
    sys.exit(main())
