"""Prepare the search task's data: task files, the generated CPU-scale task, and cached indexes.

    python -m envs.search.prepare --what test test_sampled train generated --corpus hotpotqa_train --backend bm25 dense
    (also wired as ``drmas data prepare search ...``)

Writes under ``--out`` (default ``data_cache_dir()/search``):
  test/<name>.jsonl, test_sampled.jsonl, train.jsonl          (from shared/data/qa; unified qa schema)
  hub/{train,test,test_sampled}.jsonl                         (--what hub; needs internet + `datasets`)
  generated/seed<S>/{corpus,train,test,traces}.jsonl          (procedural KB, role traces for SFT)
and builds/caches an index for every ``--corpus`` x ``--backend`` (and the generated corpus).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path
from typing import Any

import yaml

from envs.paths import data_cache_dir
from envs.search import generated, tasks
from envs.search.corpus import load_corpus, resolve_corpus_path, write_jsonl
from envs.search.retriever import BACKENDS, build_retriever

logger = logging.getLogger(__name__)

WHAT = ("test", "test_sampled", "train", "generated", "hub")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the prepare options to ``parser``."""
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <data_cache_dir>/search)")
    parser.add_argument("--what", nargs="*", choices=WHAT, default=["test", "test_sampled", "train", "generated"],
                        help="which task files to write")
    parser.add_argument("--corpus", nargs="*", default=[],
                        help="corpora to index: shared names (wiki18_sample1000, 2wikimultihopqa, hotpotqa_train, "
                             "musique_train) or jsonl paths")
    parser.add_argument("--backend", nargs="+", choices=BACKENDS, default=["bm25"], help="index backends to build")
    parser.add_argument("--n-per-source", type=int, default=30, help="rows per source in test_sampled (paper: 30)")
    parser.add_argument("--gen-seed", type=int, default=0, help="seed of the generated knowledge base and questions")
    parser.add_argument("--gen-people", type=int, default=generated.KBConfig.n_people, help="people in the generated KB")
    parser.add_argument("--gen-train", type=int, default=500, help="generated training questions")
    parser.add_argument("--gen-test", type=int, default=100, help="generated test questions")
    parser.add_argument("--gen-kb", type=_kb_fields, default={},
                        help="KB sizes as a YAML mapping of KBConfig fields, e.g. the run config's env.args.kb: "
                             "'{n_countries: 12, n_cities: 60, n_companies: 60, n_people: 500}' (overrides --gen-people; "
                             "a retrieval server for a run must serve the corpus of that run's KB)")


def _kb_fields(text: str) -> dict[str, Any]:
    """``--gen-kb``: a YAML mapping whose keys are KBConfig fields."""
    known = {f.name for f in dataclasses.fields(generated.KBConfig)} - {"seed"}
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:  # argparse turns only ArgumentTypeError/TypeError/ValueError into a usage error
        problem = " ".join(str(getattr(e, "problem", "") or e).split())
        raise argparse.ArgumentTypeError(f"--gen-kb is not valid YAML ({problem}); write a mapping of "
                                         f"{sorted(known)}, e.g. '{{n_people: 500}}'") from None
    if not isinstance(value, dict) or set(value) - known:
        raise argparse.ArgumentTypeError(f"--gen-kb wants a mapping of {sorted(known)} (seed: --gen-seed), got {text!r}")
    return value


def rows(ts: list[Any]) -> list[dict[str, Any]]:
    return [tasks.task_to_row(t) for t in ts]


def _write(files: dict[str, str], counts: dict[str, int], key: str, rows: list[dict[str, Any]], path: Path) -> None:
    files[key], counts[key] = str(write_jsonl(rows, path)), len(rows)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Write the requested files and indexes; return ``{"files": {key: path}, "counts": {key: rows},
    "indexes": {"<corpus>:<backend>": cache folder}}``."""
    out = Path(args.out) if args.out else data_cache_dir() / "search"
    files: dict[str, str] = {}
    counts: dict[str, int] = {}
    indexes: dict[str, str] = {}
    if "test" in args.what or "test_sampled" in args.what:
        all_test = {name: tasks.load_test_set(name) for name in tasks.TEST_SETS}
        if "test" in args.what:
            for name, ts in all_test.items():
                _write(files, counts, f"test/{name}", rows(ts), out / "test" / f"{name}.jsonl")
        if "test_sampled" in args.what:
            sampled = tasks.first_per_source([t for ts in all_test.values() for t in ts], args.n_per_source)
            _write(files, counts, "test_sampled", rows(sampled), out / "test_sampled.jsonl")
    if "train" in args.what:
        _write(files, counts, "train", rows(tasks.load_train()), out / "train.jsonl")
    if "hub" in args.what:
        train, test = tasks.load_hub_split("train"), tasks.load_hub_split("test")
        _write(files, counts, "hub/train", rows(train), out / "hub" / "train.jsonl")
        _write(files, counts, "hub/test", rows(test), out / "hub" / "test.jsonl")
        _write(files, counts, "hub/test_sampled", rows(tasks.first_per_source(test, args.n_per_source)),
               out / "hub" / "test_sampled.jsonl")
    corpora = [(name, load_corpus(resolve_corpus_path(name))) for name in args.corpus]
    if "generated" in args.what:
        gen_dir = out / "generated" / f"seed{args.gen_seed}"
        kb = generated.generate_kb(generated.KBConfig(**{"n_people": args.gen_people, **args.gen_kb,
                                                         "seed": args.gen_seed}))
        train, test = generated.generate_splits(kb, args.gen_train, args.gen_test, seed=args.gen_seed)
        _write(files, counts, "generated/corpus", kb.passages, gen_dir / "corpus.jsonl")
        _write(files, counts, "generated/train", rows(train), gen_dir / "train.jsonl")
        _write(files, counts, "generated/test", rows(test), gen_dir / "test.jsonl")
        traces = generated.build_traces(train, build_retriever(kb.corpus(), "bm25"))
        _write(files, counts, "generated/traces", traces, gen_dir / "traces.jsonl")
        corpora.append((f"generated/seed{args.gen_seed}", kb.corpus()))
    for name, corpus in corpora:
        for backend in args.backend:
            indexes[f"{name}:{backend}"] = str(build_retriever(corpus, backend).index.cache_dir)
    for key, path in files.items():
        logger.info("wrote %s (%d rows) -> %s", key, counts[key], path)
    return {"files": files, "counts": counts, "indexes": indexes}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = run(parser.parse_args(argv))
    for key, path in {**result["files"], **result["indexes"]}.items():
        print(f"{key}\t{result['counts'].get(key, '')}\t{path}")


if __name__ == "__main__":
    main()
