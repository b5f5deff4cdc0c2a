"""QA task loaders for the search system: the seven test sets, the training set, "test_sampled".

The paper (Search-R1 setup) trains on NQ + HotpotQA train and tests on NQ, TriviaQA, PopQA, HotpotQA,
2WikiMultiHopQA, MuSiQue and Bamboogle; its "test_sampled" split takes the first 30 rows of each
``data_source`` of the test file. Offline, the files of ``shared/data/qa`` stand in (see its README):

- hotpotqa / 2wikimultihopqa / musique default to ``dev_full`` (whole dev set in HF order, as
  FlashRAG's files that Search-R1 uses); ``variant="sub500"`` picks the MIT-licensed R1-Searcher subsets.
- triviaqa / popqa exist only as random 1,000-row subsamples, so their first 30 rows are *not* the
  paper's; nq is the full NQ-open dev (= test) set, possibly in a different order than FlashRAG's.
- training: ``qa/train/r1searcher_stage2.jsonl`` (HotpotQA + 2Wiki train questions) stands in for
  ``PeterJinGo/nq_hotpotqa_train``; users with internet load the hub set with ``load_hub_split``
  (needs ``pip install datasets``; not testable offline).

Questions get Search-R1's preprocessing: stripped, with a "?" appended when missing.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

from envs.base import Task
from envs.paths import shared_data_dir
from envs.search.corpus import read_jsonl, write_jsonl

# name -> {variant: path under shared_data_dir()}; the first variant is the default.
QA_TEST_FILES: dict[str, dict[str, str]] = {
    "nq": {"full": "qa/nq/test.jsonl"},
    "triviaqa": {"sub1000": "qa/triviaqa/test_sub1000.jsonl"},
    "popqa": {"sub1000": "qa/popqa/test_sub1000.jsonl"},
    "hotpotqa": {"full": "qa/hotpotqa/dev_full.jsonl", "sub500": "qa/hotpotqa/dev_sub500.jsonl"},
    "2wikimultihopqa": {"full": "qa/2wikimultihopqa/dev_full.jsonl", "sub500": "qa/2wikimultihopqa/dev_sub500.jsonl"},
    "musique": {"full": "qa/musique/dev_full.jsonl", "sub500": "qa/musique/dev_sub500.jsonl"},
    "bamboogle": {"full": "qa/bamboogle/test.jsonl"},
}
TEST_SETS: tuple[str, ...] = tuple(QA_TEST_FILES)  # paper order
TRAIN_FILE = "qa/train/r1searcher_stage2.jsonl"
HUB_DATASET = "PeterJinGo/nq_hotpotqa_train"


def search_r1_question(question: str) -> str:
    """Search-R1's question preprocessing: strip, then end with "?"."""
    question = question.strip()
    return question if question.endswith("?") or not question else question + "?"


def row_to_task(row: dict[str, Any], source: str | None = None) -> Task:
    """A unified-schema qa row (``{"id","question","golden_answers","source","meta"}``) -> ``Task``."""
    answers = row["golden_answers"]
    answers = (answers,) if isinstance(answers, str) else tuple(str(a) for a in answers)
    return Task(task_id=str(row["id"]), question=search_r1_question(row["question"]), answers=answers,
                source=source or row.get("source", ""), meta=dict(row.get("meta") or {}))


def task_to_row(task: Task) -> dict[str, Any]:
    """Inverse of ``row_to_task`` (the files ``prepare`` writes use the same schema as the inputs)."""
    return {"id": task.task_id, "question": task.question, "golden_answers": list(task.answers),
            "source": task.source, "meta": task.meta}


def _shared_file(rel: str, data_dir: str | Path | None) -> Path:
    path = Path(data_dir or shared_data_dir()) / rel
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: set DRMAS_SHARED_DATA to the shared/data folder, or prepare "
                                f"the data with `drmas data prepare search` (hub data needs internet)")
    return path


def load_test_set(name: str, variant: str | None = None, data_dir: str | Path | None = None) -> list[Task]:
    """One test set as tasks with ``source = name`` (Search-R1's ``data_source``)."""
    if name not in QA_TEST_FILES:
        raise KeyError(f"unknown test set {name!r}; choose one of {list(QA_TEST_FILES)}")
    variants = QA_TEST_FILES[name]
    variant = variant or next(iter(variants))
    if variant not in variants:
        raise KeyError(f"test set {name!r} has no variant {variant!r}; available: {list(variants)}")
    return [row_to_task(r, source=name) for r in read_jsonl(_shared_file(variants[variant], data_dir))]


def load_test_sets(names: Sequence[str] = TEST_SETS, data_dir: str | Path | None = None) -> list[Task]:
    """The given test sets (default variants), concatenated in the given order."""
    return [t for name in names for t in load_test_set(name, data_dir=data_dir)]


def first_per_source(tasks: Iterable[Task], n: int = 30) -> list[Task]:
    """The paper's "test_sampled": the first ``n`` tasks of every source, sources in first-seen order."""
    by_source: dict[str, list[Task]] = {}
    for t in tasks:
        rows = by_source.setdefault(t.source, [])
        if len(rows) < n:
            rows.append(t)
    return [t for rows in by_source.values() for t in rows]


def load_test_sampled(n_per_source: int = 30, data_dir: str | Path | None = None) -> list[Task]:
    """First ``n_per_source`` rows of each of the seven test sets (210 tasks by default)."""
    return first_per_source(load_test_sets(data_dir=data_dir), n_per_source)


def load_train(path: str | Path | None = None, data_dir: str | Path | None = None) -> list[Task]:
    """Training tasks from a unified-schema jsonl (default: the shared R1-Searcher stage-2 file)."""
    return [row_to_task(r) for r in read_jsonl(Path(path) if path else _shared_file(TRAIN_FILE, data_dir))]


def hub_rows_to_tasks(rows: Iterable[dict[str, Any]], split: str) -> list[Task]:
    """Rows of ``PeterJinGo/nq_hotpotqa_train`` (Search-R1 parquet: ``question``, ``golden_answers`` or
    ``reward_model.ground_truth.target``, ``data_source``) -> tasks."""
    tasks = []
    for n, row in enumerate(rows):
        answers = row.get("golden_answers")
        if answers is None:
            answers = row["reward_model"]["ground_truth"]["target"]
        tasks.append(row_to_task({"id": row.get("id") or f"{split}_{n}", "question": row["question"],
                                  "golden_answers": list(answers), "source": row.get("data_source", ""),
                                  "meta": {"split": split, "index": n}}))
    return tasks


def load_hub_split(split: str = "train", repo: str = HUB_DATASET) -> list[Task]:
    """Search-R1's NQ+HotpotQA train (or 7-source test) split from the Hugging Face hub.
    Needs internet and ``pip install datasets``; not exercised by the offline tests."""
    try:
        import datasets
    except ImportError as e:
        raise ImportError(f"loading {repo} needs the `datasets` package: pip install datasets "
                          f"(offline, use load_train() / load_test_sets() on shared/data instead)") from e
    return hub_rows_to_tasks(datasets.load_dataset(repo, split=split), split)


def write_tasks(tasks: Iterable[Task], path: str | Path) -> Path:
    """Write tasks as unified-schema jsonl, atomically."""
    return write_jsonl(map(task_to_row, tasks), path)


def read_tasks(path: str | Path) -> list[Task]:
    """Read a unified-schema jsonl of tasks (as written by ``write_tasks``); questions are kept as is."""
    return [Task(task_id=str(r["id"]), question=r["question"], answers=tuple(r["golden_answers"]),
                 source=r.get("source", ""), meta=dict(r.get("meta") or {})) for r in read_jsonl(path)]
