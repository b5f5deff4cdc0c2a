"""Math data sets as ``envs.base.Task`` lists.

Two kinds of files:

- **benchmark files** (``load_benchmark``): the public sets in ``<shared>/math/<set>/*.jsonl`` with rows
  ``{"id", "problem", "answer", "source", "meta"}`` (see ``shared/data/README.md``);
- **prepared files** (``load_prepared``): what ``python -m envs.math.prepare`` writes, one Task per line
  ``{"task_id", "question", "answers", "source", "meta"}``, deduplicated and free of test problems.

Set names (``MATH_SETS``): train ``dapo17k`` (stand-in for the paper's DAPO-Math filter), ``math_train``,
``gsm8k``; test ``aime24``, ``aime25``, ``amc23``, ``math500``, ``math500_sampled`` (the paper's first 50
rows), ``minerva_math``, ``olympiadbench`` (the six of the paper), ``gsm8k_test``.

Minerva's extra reference forms (``meta.alt_answers``) are accepted as gold answers except where they
belong to another subproblem (``trusted_alt_answers``; 34 of the 69 multi-part rows).
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from drmas.io import read_jsonl, write_jsonl
from envs.base import Task
from envs.math.answers import extract_boxed, fast_match
from envs.paths import data_cache_dir, shared_data_dir

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MathSet:
    """Where one set lives: its file under the shared data folder and the HF hub set the reference uses."""

    split: str  # "train" or "test"
    local_file: str | None  # path under the shared data folder; None: no local copy
    hf_name: str | None = None  # Hugging Face hub set (with ``hf_config``/``hf_split``); None: no hub copy
    hf_config: str | None = None
    hf_split: str = "train"
    first_n: int | None = None  # keep only the first n rows (the paper's "sampled" MATH500)
    note: str = ""


MATH_SETS: dict[str, MathSet] = {
    "dapo17k": MathSet("train", "math/dapo17k/train.jsonl",
                       note="DAPO-Math-17k without repetition; local stand-in for the paper's aaabiao/dapo_filter"),
    "dapo_filter": MathSet("train", None, "aaabiao/dapo_filter", note="the paper's training set (hub only)"),
    "math_train": MathSet("train", "math/math_train/train.jsonl", "DigitalLearningGmbH/MATH-lighteval", "default"),
    "gsm8k": MathSet("train", "math/gsm8k/train.jsonl", "openai/gsm8k", "main"),
    "gsm8k_test": MathSet("test", "math/gsm8k/test.jsonl", "openai/gsm8k", "main", "test"),
    "aime24": MathSet("test", "math/aime24/test.jsonl", "HuggingFaceH4/aime_2024"),
    "aime25": MathSet("test", "math/aime25/test.jsonl", "MathArena/aime_2025"),
    "amc23": MathSet("test", "math/amc23/test.jsonl", "knoveleng/AMC-23"),
    "math500": MathSet("test", "math/math500/test.jsonl", "HuggingFaceH4/MATH-500", hf_split="test"),
    "math500_sampled": MathSet("test", "math/math500/test.jsonl", "HuggingFaceH4/MATH-500", hf_split="test",
                               first_n=50, note="first 50 rows of MATH500 (the reference's test_sampled)"),
    "minerva_math": MathSet("test", "math/minerva_math/test.jsonl", "zwhe99/simplerl-minerva-math", hf_split="test"),
    "olympiadbench": MathSet("test", "math/olympiadbench/test.jsonl", "realtreetune/olympiadbench", hf_split="test"),
}
PAPER_TRAIN_SETS = ("dapo17k",)
PAPER_TEST_SETS = ("aime24", "aime25", "amc23", "math500", "minerva_math", "olympiadbench")


def _math_set(name: str) -> MathSet:
    if name not in MATH_SETS:
        raise KeyError(f"unknown math set {name!r}; known: {sorted(MATH_SETS)}")
    return MATH_SETS[name]


# ----------------------------------------------------------------------------------------------------------
# Task <-> JSON
# ----------------------------------------------------------------------------------------------------------


def task_to_record(task: Task) -> dict[str, Any]:
    """JSON-ready dict of a Task (the prepared-file schema)."""
    return {"task_id": task.task_id, "question": task.question, "answers": list(task.answers),
            "source": task.source, "meta": task.meta}


def task_from_record(record: Mapping[str, Any]) -> Task:
    """Inverse of ``task_to_record``; also reads the QA-style keys ``id`` / ``golden_answers``."""
    answers = record["answers"] if "answers" in record else record["golden_answers"]
    return Task(task_id=str(record["task_id"] if "task_id" in record else record["id"]),
                question=record["question"], answers=tuple(str(a) for a in answers),
                source=record.get("source", ""), meta=dict(record.get("meta") or {}))


def write_tasks_jsonl(tasks: Iterable[Task], path: Path) -> int:
    """Write Tasks one per line (UTF-8, atomically: :func:`drmas.io.write_jsonl`); returns the number written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(task_to_record(task), ensure_ascii=False, default=str) for task in tasks]
    write_jsonl(path, lines)
    return len(lines)


def read_tasks_jsonl(path: Path) -> list[Task]:
    """Read a file written by ``write_tasks_jsonl``."""
    return [task_from_record(rec) for rec in read_jsonl(path)]


# ----------------------------------------------------------------------------------------------------------
# Benchmark rows -> Tasks
# ----------------------------------------------------------------------------------------------------------


def _unique_nonempty(answers: Iterable[Any]) -> tuple[str, ...]:
    out: list[str] = []
    for answer in answers:
        text = str(answer).strip()
        if text and text not in out:
            out.append(text)
    return tuple(out)


def trusted_alt_answers(problem: str, answer: str, alt_answers: Sequence[str]) -> list[str]:
    """The ``alt_answers`` of a Minerva row that can be accepted as extra gold answers.

    The shared file matched them to rows by problem text, which fails for multi-part problems: there the
    list often holds a sibling subproblem's answer (minerva-57 asks for a doubling time, 0.53, but its
    alt_answers are 4.4e7, the answer of the previous subproblem that the problem text itself shows). So for
    a problem with "Subproblem" in its text the list is kept only when one of its entries equals the main
    answer (``fast_match``); single-part problems keep theirs (e.g. ``3.83 \\times 10^{35}`` for ``3.83e35``).
    """
    if "Subproblem" in problem and not any(fast_match(alt, answer) for alt in alt_answers):
        return []
    return list(alt_answers)


def benchmark_row_to_task(row: Mapping[str, Any]) -> Task:
    """One shared-data row ``{"id", "problem", "answer", "source", "meta"}`` as a Task.

    Minerva rows carry accepted reference forms in ``meta.alt_answers``; the ``trusted_alt_answers`` among
    them become extra gold answers (``meta`` keeps the full list).
    """
    meta = dict(row.get("meta") or {})
    answer = str(row.get("answer", ""))
    alt_answers = trusted_alt_answers(row["problem"], answer, [str(a) for a in meta.get("alt_answers") or []])
    answers = _unique_nonempty([answer, *alt_answers])
    return Task(task_id=str(row["id"]), question=row["problem"], answers=answers,
                source=row.get("source", ""), meta=meta)


def benchmark_path(name: str, shared_dir: Path | None = None) -> Path:
    """File of set ``name`` under the shared data folder (default ``envs.paths.shared_data_dir()``)."""
    spec = _math_set(name)
    if spec.local_file is None:
        raise FileNotFoundError(f"math set {name!r} has no local file; it exists only on the Hugging Face hub "
                                f"({spec.hf_name}): run `python -m envs.math.prepare --source hf --train {name}`")
    return Path(shared_dir or shared_data_dir()) / spec.local_file


def load_benchmark(name: str, shared_dir: Path | None = None) -> list[Task]:
    """Tasks of a public set read from the shared data folder; rows without an answer are dropped (logged).

    Raises FileNotFoundError naming the missing file and how to get it.
    """
    spec = _math_set(name)
    path = benchmark_path(name, shared_dir)
    if not path.is_file():
        raise FileNotFoundError(
            f"math set {name!r}: file {path} not found. Fix: point DRMAS_SHARED_DATA (or --shared-dir) at the "
            f"folder holding {spec.local_file}, or download the set with "
            f"`python -m envs.math.prepare --source hf` (needs internet and `pip install datasets`)")
    tasks = [benchmark_row_to_task(rec) for rec in read_jsonl(path)]
    return _finish(tasks, name, spec)


def _finish(tasks: list[Task], name: str, spec: MathSet) -> list[Task]:
    kept = [t for t in tasks if t.answers]
    if len(kept) < len(tasks):
        logger.info("math set %s: dropped %d rows with an empty answer (%s)", name, len(tasks) - len(kept),
                    ", ".join(t.task_id for t in tasks if not t.answers)[:200])
    if spec.first_n is not None:
        kept = kept[:spec.first_n]
    return kept


# ----------------------------------------------------------------------------------------------------------
# Hugging Face hub rows -> Tasks (used only by the hub download path of envs.math.prepare)
# ----------------------------------------------------------------------------------------------------------

_STEP_BY_STEP_SUFFIX = re.compile(
    r"\s*Let'?s\s+think\s+step\s+by\s+step\s+and\s+output\s+the\s+final\s+answer\s+within\s*\\boxed\{\}\.?\s*$",
    re.IGNORECASE)


def _answer_text(value: Any) -> str:
    """A hub answer field as text: 27.0 -> "27", lists joined with ", "."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, tuple)):
        return ", ".join(_answer_text(v) for v in value)
    return str(value).strip()


def hub_row_to_task(row: Mapping[str, Any], name: str, index: int) -> Task:
    """One Hugging Face hub row of set ``name`` as a Task.

    Handles the layouts of the hub sets the reference uses: verl rows (``prompt`` chat list +
    ``reward_model.ground_truth``, the DAPO filter), ``problem``/``question`` + ``answer``, GSM8K answers
    ending in ``#### 72``, ``final_answer`` lists (OlympiadBench) and MATH rows with only a ``solution``
    (answer = its last ``\\boxed{}``). Other fields go to ``meta``.
    """
    row = dict(row)
    if "prompt" in row and "reward_model" in row:
        prompt = row.pop("prompt")
        content = prompt[0]["content"] if isinstance(prompt, (list, tuple)) else str(prompt)
        question = _STEP_BY_STEP_SUFFIX.sub("", content).strip()
        answer = _answer_text(row.pop("reward_model").get("ground_truth", ""))
    else:
        question = str(row.pop("problem", None) or row.pop("question", "")).strip()
        if "answer" in row:
            answer = _answer_text(row.pop("answer"))
            if "####" in answer:  # GSM8K: worked solution, then "#### <number>"
                row["solution"] = answer
                answer = answer.rsplit("####", 1)[1].strip().replace(",", "")
        elif "final_answer" in row:
            answer = _answer_text(row.pop("final_answer"))
        else:
            answer = extract_boxed(str(row.get("solution", ""))) or ""
    meta = json.loads(json.dumps(row, default=str))  # JSON-safe copy of the remaining fields
    task_id = f"{name}-{row.get('id', row.get('unique_id', index))}"
    return Task(task_id=task_id, question=question, answers=_unique_nonempty([answer]), source=name, meta=meta)


def load_hub(name: str) -> list[Task]:
    """Download set ``name`` from the Hugging Face hub (needs internet and the ``datasets`` package).

    Not exercised by the test suite (no network there); ``hub_row_to_task`` is tested on sample rows.
    """
    spec = _math_set(name)
    if spec.hf_name is None:
        raise KeyError(f"math set {name!r} has no Hugging Face hub copy; use --source local")
    try:
        import datasets
    except ImportError as exc:
        raise ImportError("downloading math sets from the Hugging Face hub needs the `datasets` package: "
                          "`pip install datasets` (or use --source local with the shared jsonl files)") from exc
    rows = datasets.load_dataset(spec.hf_name, spec.hf_config, split=spec.hf_split)
    tasks = [hub_row_to_task(row, name, i) for i, row in enumerate(rows)]
    return _finish(tasks, name, spec)


# ----------------------------------------------------------------------------------------------------------
# Prepared files
# ----------------------------------------------------------------------------------------------------------


def prepared_dir(data_dir: Path | None = None) -> Path:
    """Folder of the prepared math files (default ``envs.paths.data_cache_dir() / "math"``)."""
    return Path(data_dir) if data_dir is not None else data_cache_dir() / "math"


def load_prepared(name: str, data_dir: Path | None = None) -> list[Task]:
    """Tasks of a prepared set (``<data_dir>/<name>.jsonl``, written by ``python -m envs.math.prepare``)."""
    path = prepared_dir(data_dir) / f"{name}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"prepared math set {path} not found. Fix: run `drmas data prepare math` "
                                f"(or `python -m envs.math.prepare --out {path.parent}`) first")
    return read_tasks_jsonl(path)
