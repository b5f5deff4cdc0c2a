"""Task sources: where a run's training tasks, evaluation sets, environment and SFT traces come from.

A task source is selected by ``env.name`` in the run config and built with ``env.args``:

- ``math_generated``: procedurally generated arithmetic/algebra problems (CPU default);
- ``math_dataset``: prepared jsonl files (DAPO-Math train; AIME24/25, AMC23, MATH500, Minerva,
  OlympiadBench test), see ``drmas data prepare math``;
- ``search_generated``: a generated knowledge base served by the in-process retriever (CPU default);
- ``search_dataset``: prepared QA files and a corpus (paper scale: NQ+HotpotQA train, seven test sets).

Training batches are a pure function of (seed, step), so a resumed run sees the same tasks.
"""
from __future__ import annotations

import abc
import inspect
import json
import logging
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

import numpy as np

from drmas.registry import Registry
from envs.base import Env, Task, make_env

logger = logging.getLogger(__name__)


class TaskSource(abc.ABC):
    #: SFT trace record ``(system, role)`` -> the registered agent role that renders its prompt
    #: (``system`` is "" for sources whose records carry none)
    trace_roles: dict[tuple[str, str], str] = {}

    def agent_role_of(self, record: dict[str, Any]) -> str | None:
        """The agent role (``drmas.agents`` registry name) whose prompt an SFT trace record teaches."""
        return self.trace_roles.get((record.get("system", ""), record["role"]))

    @abc.abstractmethod
    def train_tasks(self, step: int, n: int, seed: int) -> list[Task]:
        """The ``n`` tasks of training step ``step`` (deterministic)."""

    @abc.abstractmethod
    def eval_sets(self, n: int) -> dict[str, list[Task]]:
        """Evaluation sets by benchmark name (at most ``n`` tasks each)."""

    @abc.abstractmethod
    def make_env(self) -> Env:
        """A fresh batched environment."""

    def role_traces(self, n: int, seed: int) -> list[dict[str, Any]]:
        """SFT warm-up records ``{role, task, context, target}`` (generated sources only)."""
        raise NotImplementedError(f"{type(self).__name__} has no SFT traces; give models a checkpoint `path`")

    #: the constructor arguments (``env.args``) that shape :meth:`role_traces`
    trace_arg_names: tuple[str, ...] = ()

    @classmethod
    def trace_args(cls, **env_args: Any) -> dict[str, Any]:
        """The settings that shape :meth:`role_traces` (besides ``n`` and ``seed``, which the ``sft`` block
        holds), with the constructor's defaults filled in; computed from ``env.args`` without building the
        source. A base checkpoint's build record keeps them, so a base built from other traces is refused
        rather than reused (``drmas.checkpoints.build_record``)."""
        bound = inspect.signature(cls.__init__).bind_partial(None, **env_args)
        bound.apply_defaults()
        return json.loads(json.dumps({name: bound.arguments[name] for name in cls.trace_arg_names}))  # as recorded

    def close(self) -> None:
        """Release tools (grader worker processes, ...)."""

    def tool_counts(self) -> dict[str, ToolCounts]:
        """Counters of the tools the environments call (``retrieval``, ``grader``) since they were built; the
        trainer logs their increments per step (``tools/{tool}/calls``, ``tools/{tool}/failures``) and stops
        a run whose failures pass ``train.max_tool_failure_rate``. Tools not built yet are absent."""
        return {}

    def check_tools(self) -> None:
        """Reach every external service the source's environments need (a retrieval server) and raise
        :class:`ToolUnavailable` naming it when one does not answer; called before step 0."""


@dataclass(frozen=True)
class ToolCounts:
    """Calls of one tool and how many of them failed (after the tool's own retries), with the last error."""

    calls: int
    failures: int
    last_error: str = ""


class ToolUnavailable(RuntimeError):
    """An external service a run needs does not answer (the message names it and the config key)."""


class ToolFailure(RuntimeError):
    """A step's (or an evaluation's) tool failures passed ``train.max_tool_failure_rate``: its rewards would
    be failures of the tool, not of the policy. Nothing of that step is recorded or learnt from."""


def _client_counts(retriever: Any) -> dict[str, ToolCounts]:
    """``retrieval`` counts of an HTTP retrieval client (the in-process index does not fail on its own)."""
    if not hasattr(retriever, "failures"):
        return {}
    return {"retrieval": ToolCounts(retriever.calls, retriever.failures, retriever.last_error)}


def _check_client(retriever: Any) -> None:
    """Send one query through an HTTP retrieval client and check the corpus its server serves (the client's
    ``expected``); raise :class:`ToolUnavailable` with one line naming the URL (and both corpora) otherwise."""
    from envs.search.corpus import CorpusMismatch

    if hasattr(retriever, "check"):
        try:
            retriever.check()
        except ConnectionError as exc:
            raise ToolUnavailable(f"env.args.server_url: {exc}; start the server (python -m envs.search.server "
                                  "--corpus ...) or fix the URL; nothing was trained") from None
        except CorpusMismatch as exc:
            raise ToolUnavailable(f"env.args.server_url: {exc}; nothing was trained") from None


def _retrieval_client(server_url: str, topk: int, expected: Any) -> Any:
    """The HTTP client of a run's retrieval server, checking that it serves ``expected`` (a CorpusIdentity)."""
    from envs.search.client import RetrievalClient

    return RetrievalClient(server_url, topk=topk, expected=expected)


def generated_kb_identity(kb: Any) -> Any:
    """The CorpusIdentity of a generated knowledge base, with the commands that serve it."""
    from dataclasses import asdict

    fields = {k: v for k, v in asdict(kb.config).items() if k != "seed"}
    kb_yaml = "{" + ", ".join(f"{k}: {v}" for k, v in fields.items()) + "}"
    seed, out = kb.config.seed, "data_cache/search_cpu"
    fix = (f"start the server on it (drmas data prepare search --what generated --out {out} --gen-seed {seed} "
           f"--gen-kb '{kb_yaml}', then python -m envs.search.server --corpus {out}/generated/seed{seed}/corpus.jsonl)"
           ", or point env.args.server_url at a server that serves it")
    return kb.corpus().identity(name=f"the generated knowledge base of env.args.kb (seed {seed})", fix=fix)


def named_corpus_identity(corpus: str | None, corpus_hash: str | None) -> Any:
    """The CorpusIdentity of ``env.args.corpus`` (a shared name or a JSONL path, loaded here and hashed as the
    server hashes it) or of ``env.args.corpus_hash`` (the hash alone, for a corpus too large to load twice);
    None when the config names neither. A corpus that cannot be read raises :class:`ToolUnavailable`."""
    from envs.search.corpus import CorpusIdentity, corpus_file_problem, load_corpus, resolve_corpus_path

    where = "or point env.args.server_url at a server that serves it"
    if corpus_hash is not None:
        return CorpusIdentity(name="env.args.corpus_hash", content_hash=corpus_hash,
                              fix=f"start the server on the corpus of that hash (the server logs its hash at start, "
                                  f"GET /health reports it), {where}, or fix env.args.corpus_hash")
    if corpus is None:
        return None
    path = resolve_corpus_path(corpus)
    if problem := corpus_file_problem(corpus, path):
        raise ToolUnavailable(f"env.args.corpus: {problem}; nothing was trained")
    try:
        loaded = load_corpus(path)
    except ValueError as exc:  # a damaged line, an empty corpus, a row that is no passage
        raise ToolUnavailable(f"env.args.corpus: {exc}; nothing was trained") from None
    name = f"env.args.corpus = {corpus}" + ("" if Path(corpus) == path else f" ({path})")
    return loaded.identity(name=name, fix=f"start the server on it (python -m envs.search.server --corpus {corpus}) "
                                          f"{where}")


TASK_SOURCES: Registry[Callable[..., TaskSource]] = Registry("task source (env.name)")
register_task_source = TASK_SOURCES.register  # class decorator


def make_task_source(name: str, **kwargs: Any) -> TaskSource:
    return TASK_SOURCES.build(name, **kwargs)


def _step_seed(seed: int, step: int) -> int:
    return int(np.random.SeedSequence([seed, step, 0x5EED]).generate_state(1)[0])


# ---------------------------------------------------------------------------------------------- math
class _MathSource(TaskSource):
    """What every math source shares: the grader (built on first use) and the math environment."""

    trace_roles = {("solver_verifier", "solver"): "math_solver", ("solver_verifier", "verifier"): "math_verifier",
                   ("single_agent", "solver"): "math_single"}

    grader_timeout_s: float = 5.0

    @cached_property
    def grader(self):
        from envs.math.grader import MathGrader

        return MathGrader(timeout_s=self.grader_timeout_s)

    def make_env(self) -> Env:
        import envs.math  # noqa: F401  (registers the env)

        return make_env("math", grader=self.grader)

    def close(self) -> None:
        if "grader" in self.__dict__:  # only if it was ever built
            self.grader.close()

    def tool_counts(self) -> dict[str, ToolCounts]:
        if "grader" not in self.__dict__:
            return {}
        stats = self.grader.stats
        return {"grader": ToolCounts(stats.calls, stats.failures, "math-verify workers that died or could not start")}


@register_task_source("math_generated")
class MathGenerated(_MathSource):
    """Generated problems of a given difficulty; evaluation on a fixed held-out seed."""

    trace_arg_names = ("difficulty", "operand_digits", "kinds", "error_rate")

    def __init__(self, difficulty: int = 1, operand_digits: int = 2, kinds: tuple[str, ...] = ("word", "expr", "linear"),
                 eval_seed: int = 10_007, grader_timeout_s: float = 5.0, error_rate: float = 0.2):
        self.difficulty, self.operand_digits, self.kinds = difficulty, operand_digits, tuple(kinds)
        self.eval_seed, self.grader_timeout_s, self.error_rate = eval_seed, grader_timeout_s, error_rate

    def _generate(self, n: int, seed: int) -> list[Task]:
        from envs.math.generated import generate_tasks

        return generate_tasks(n, difficulty=self.difficulty, seed=seed, kinds=self.kinds,
                              operand_digits=self.operand_digits)

    def train_tasks(self, step: int, n: int, seed: int) -> list[Task]:
        return self._generate(n, _step_seed(seed, step))

    def eval_sets(self, n: int) -> dict[str, list[Task]]:
        """One held-out set of ``n`` tasks, reported per problem kind (the CPU stand-in for the paper's
        benchmark columns; the Average row is their mean)."""
        tasks = self._generate(n, self.eval_seed)
        return {f"d{self.difficulty}-{kind}": [t for t in tasks if t.meta["kind"] == kind]
                for kind in self.kinds if any(t.meta["kind"] == kind for t in tasks)}

    def role_traces(self, n: int, seed: int) -> list[dict[str, Any]]:
        from envs.math.generated import single_agent_traces, solver_traces, verifier_traces

        tasks = self._generate(n, seed)
        records = [*solver_traces(tasks, seed=seed + 1, error_rate=self.error_rate),
                   *verifier_traces(tasks, seed=seed + 2), *single_agent_traces(tasks, seed=seed + 3)]
        return [dict(r) for r in records]


@register_task_source("math_dataset")
class MathDataset(_MathSource):
    """Prepared jsonl files (``drmas data prepare math``): ``train`` file and ``test`` files by name; no SFT
    traces (models need a checkpoint ``path``)."""

    def __init__(self, train: str, test: dict[str, str], grader_timeout_s: float = 5.0):
        from envs.math.data import read_tasks_jsonl

        self.grader_timeout_s = grader_timeout_s
        self.train = read_tasks_jsonl(train)
        self.test = {name: read_tasks_jsonl(path) for name, path in test.items()}

    def train_tasks(self, step: int, n: int, seed: int) -> list[Task]:
        rng = np.random.default_rng(_step_seed(seed, step))
        return [self.train[i] for i in rng.choice(len(self.train), size=n, replace=len(self.train) < n)]

    def eval_sets(self, n: int) -> dict[str, list[Task]]:
        return {name: tasks[:n] if n else tasks for name, tasks in self.test.items()}


# -------------------------------------------------------------------------------------------- search
@register_task_source("search_generated")
class SearchGenerated(TaskSource):
    """A generated knowledge base served by an in-process BM25 retriever (or a retrieval server);
    single- and 2-hop questions split once into disjoint train and test questions."""

    trace_roles = {("", "verifier"): "search_verifier", ("", "search"): "search_searcher",
                   ("", "answer"): "search_answerer", ("", "single_agent"): "search_single"}

    def __init__(self, kb: dict[str, Any] | None = None, hops: tuple[int, ...] = (1, 2), n_test: int = 200,
                 backend: str = "bm25", topk: int = 3, max_turns: int = 4, server_url: str | None = None,
                 miss_rate: float = 0.0, traces: dict[str, float] | None = None):
        """``miss_rate``: the environment's retrieval-miss probability (``SearchEnv``), in training and
        evaluation. ``traces``: how the SFT episodes depart from the ideal script, ``{miss_rate,
        verdict_noise}`` (``envs.search.generated.TraceNoise``; the trace budget is ``max_turns``)."""
        from envs.search.generated import KBConfig, TraceNoise, count_questions, generate_kb, generate_splits

        if not 0.0 <= miss_rate < 1.0:
            raise ValueError(f"env.args.miss_rate must be in [0, 1), got {miss_rate}")
        unknown = sorted(set(traces or {}) - {"miss_rate", "verdict_noise", "verifier_think"})
        if unknown:
            raise ValueError(f"env.args.traces: unknown keys {unknown}; allowed: miss_rate, verdict_noise, verifier_think")
        self.trace_noise = TraceNoise(**(traces or {}), max_turns=max_turns)
        self.miss_rate = miss_rate
        self.kb = generate_kb(KBConfig(**(kb or {})))
        self.hops, self.topk, self.max_turns, self.backend = tuple(hops), topk, max_turns, backend
        self.server_url = server_url
        n_train = count_questions(self.kb, self.hops) - n_test
        if n_train < n_test:
            raise ValueError(f"env.args.kb is too small: {n_train + n_test} questions for n_test={n_test}; "
                             "enlarge kb.n_people / n_cities / n_companies")
        self.train, self.test = generate_splits(self.kb, n_train, n_test, self.hops)

    @cached_property
    def retriever(self):
        """In-process index, or an HTTP client of a retrieval server serving the same corpus
        (``python -m envs.search.server --corpus <kb corpus file>``) when ``server_url`` is set; the client
        checks that the server serves the knowledge base's corpus (before step 0 and after reconnects)."""
        if self.server_url:
            return _retrieval_client(self.server_url, self.topk, generated_kb_identity(self.kb))
        from envs.search.retriever import build_retriever

        return build_retriever(self.kb.corpus(), backend=self.backend)

    def tool_counts(self) -> dict[str, ToolCounts]:
        return _client_counts(self.__dict__.get("retriever"))

    def check_tools(self) -> None:
        if self.server_url:
            _check_client(self.retriever)

    def train_tasks(self, step: int, n: int, seed: int) -> list[Task]:
        rng = np.random.default_rng(_step_seed(seed, step))
        return [self.train[i] for i in rng.choice(len(self.train), size=n, replace=False)]

    def eval_sets(self, n: int) -> dict[str, list[Task]]:
        """The first ``n`` held-out questions, reported by number of hops (1-hop ~ NQ-style, 2-hop ~
        HotpotQA-style; the Average row is their mean)."""
        tasks = self.test[:n] if n else self.test
        return {f"kb-{h}hop": [t for t in tasks if t.meta["n_hops"] == h]
                for h in self.hops if any(t.meta["n_hops"] == h for t in tasks)}

    def make_env(self) -> Env:
        import envs.search  # noqa: F401  (registers the env)

        return make_env("search", retriever=self.retriever, max_turns=self.max_turns, topk=self.topk,
                        miss_rate=self.miss_rate)

    trace_arg_names = ("kb", "hops", "n_test", "topk", "max_turns", "traces")

    @classmethod
    def trace_args(cls, **env_args: Any) -> dict[str, Any]:
        """As the base class, with the knowledge base and the trace noise in their full form (so that
        writing a default out, e.g. ``traces.verifier_think: false``, changes nothing)."""
        from dataclasses import asdict

        from envs.search.generated import KBConfig, TraceNoise

        args = super().trace_args(**env_args)
        noise = asdict(TraceNoise(**(args["traces"] or {})))
        return {**args, "kb": asdict(KBConfig(**(args["kb"] or {}))), "hops": list(args["hops"]),
                "traces": {k: v for k, v in noise.items() if k not in ("seed", "max_turns")}}

    def role_traces(self, n: int, seed: int) -> list[dict[str, Any]]:
        """Traces of (up to) ``n`` training questions; test questions never enter SFT."""
        from dataclasses import replace

        from envs.search.generated import build_traces

        rng = np.random.default_rng(seed)
        picked = rng.choice(len(self.train), size=min(n, len(self.train)), replace=False)
        return build_traces([self.train[i] for i in picked], self.retriever, topk=self.topk,
                            noise=replace(self.trace_noise, seed=seed))


@register_task_source("search_dataset")
class SearchDataset(TaskSource):
    """Prepared question files (``drmas data prepare search``): a ``train`` file (paper: NQ + HotpotQA)
    and ``test`` files by name (NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, MuSiQue, Bamboogle), answered
    against a retrieval server (``python -m envs.search.server``; paper: E5 over Wikipedia 2018).

    ``corpus`` (a shared corpus name or a JSONL path) or ``corpus_hash`` (its ``content_hash``, for a corpus too
    large to load in the trainer too) names the corpus the server must serve: checked before step 0 and after
    every reconnect (``envs.search.client``). With neither, the server's corpus is not checked (a warning says
    what it reports)."""

    trace_roles = SearchGenerated.trace_roles

    def __init__(self, train: str, test: dict[str, str], server_url: str, topk: int = 3, max_turns: int = 4,
                 corpus: str | None = None, corpus_hash: str | None = None):
        import re

        from envs.search.tasks import read_tasks

        if corpus is not None and corpus_hash is not None:
            raise ValueError("env.args: give corpus (a shared name or a JSONL path) or corpus_hash, not both")
        if corpus_hash is not None and not re.fullmatch(r"[0-9a-f]{64}", str(corpus_hash)):
            raise ValueError(f"env.args.corpus_hash must be 64 lower-case hex digits (the sha256 a retrieval server "
                             f"reports at GET /health), got {corpus_hash!r}")
        self.corpus, self.corpus_hash = corpus, corpus_hash

        for name, path in {"train": train, **{f"test.{k}": v for k, v in test.items()}}.items():
            if not Path(path).is_file():
                raise FileNotFoundError(f"env.args.{name}: {path} does not exist; write it with "
                                        "`drmas data prepare search`")
        self.train = read_tasks(train)
        self.test = {name: read_tasks(path) for name, path in test.items()}
        self.server_url, self.topk, self.max_turns = server_url, topk, max_turns

    @cached_property
    def retriever(self):
        return _retrieval_client(self.server_url, self.topk, named_corpus_identity(self.corpus, self.corpus_hash))

    def tool_counts(self) -> dict[str, ToolCounts]:
        return _client_counts(self.__dict__.get("retriever"))

    def check_tools(self) -> None:
        _check_client(self.retriever)
        if self.retriever.expected is None:
            from envs.search.client import served_corpus

            health = self.retriever.health()
            logger.warning("env.args.corpus is not set, so the corpus of the retrieval server %s (%s) is not checked "
                           "against the questions; set env.args.corpus (or corpus_hash) to the corpus they need",
                           self.server_url, served_corpus(health) if health else "it does not say which it serves")

    def train_tasks(self, step: int, n: int, seed: int) -> list[Task]:
        rng = np.random.default_rng(_step_seed(seed, step))
        return [self.train[i] for i in rng.choice(len(self.train), size=n, replace=len(self.train) < n)]

    def eval_sets(self, n: int) -> dict[str, list[Task]]:
        return {name: tasks[:n] if n else tasks for name, tasks in self.test.items()}

    def make_env(self) -> Env:
        import envs.search  # noqa: F401  (registers the env)

        return make_env("search", retriever=self.retriever, max_turns=self.max_turns, topk=self.topk)
