"""A procedurally generated knowledge base and QA task for CPU-scale runs of the search system.

Invented entities (people, cities, countries, companies) with relations

    person --born_in--> city --in_country--> country
    person --works_for--> company --founded_in--> year
                          company --based_in--> city

are rendered as short passages (one fact each by default), so a question can only be answered by
retrieving them: the names are made up, no model can know them. Questions are single-hop ("Where was
Bavo Tirel born?") or 2-hop ("Which country was Bavo Tirel born in?": born_in, then in_country). All of it
is seeded and deterministic, short enough for a ~1-5M parameter byte-level model.

``role_traces`` turns a task into SFT warm-up records of the Dr. MAS search system (verifier, search
agent, answer agent) and of the single-agent Search-R1 loop, as structured dicts; prompts are rendered by
the agents elsewhere. Searches in the traces go through a real retriever, so they show what the
environment will return.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any, Sequence

from envs.base import Task
from envs.search.corpus import Corpus
from envs.search.env import format_information, render_history
from envs.search.retriever import SearchBackend

logger = logging.getLogger(__name__)

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "tr", "th")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "io")
_CODAS = ("", "", "n", "l", "r", "s", "th")
_COMPANY_SUFFIXES = ("Corp", "Labs", "Works", "Group", "Systems")
_COUNTRY_SUFFIXES = ("ia", "land", "or")

# relation -> (passage sentence, search query, "I need to find ..." phrase); {s} subject, {o} object
RELATIONS: dict[str, tuple[str, str, str]] = {
    "born_in": ("{s} was born in {o}.", "{s} born", "where {s} was born"),
    "works_for": ("{s} works for {o}.", "{s} works for", "which company {s} works for"),
    "in_country": ("{s} is a city in the country of {o}.", "{s} country", "which country {s} is in"),
    "founded_in": ("{s} was founded in {o}.", "{s} founded", "when {s} was founded"),
    "based_in": ("{s} is based in the city of {o}.", "{s} based city", "where {s} is based"),
}
# template -> (question, relation chain); {s} is the subject of the first hop
TEMPLATES: dict[str, tuple[str, tuple[str, ...]]] = {
    "born_in": ("Where was {s} born?", ("born_in",)),
    "works_for": ("Which company does {s} work for?", ("works_for",)),
    "in_country": ("Which country is {s} in?", ("in_country",)),
    "founded_in": ("When was {s} founded?", ("founded_in",)),
    "based_in": ("Where is {s} based?", ("based_in",)),
    "born_country": ("Which country was {s} born in?", ("born_in", "in_country")),
    "employer_founded": ("When was the company that {s} works for founded?", ("works_for", "founded_in")),
    "employer_city": ("Where is the company that {s} works for based?", ("works_for", "based_in")),
    "company_country": ("Which country is {s} based in?", ("based_in", "in_country")),
}
_SUBJECT_KIND = {"born_in": "people", "works_for": "people", "in_country": "cities", "founded_in": "companies",
                 "based_in": "companies"}


@dataclass(frozen=True)
class KBConfig:
    """Size of the generated world (defaults: ~300 one-sentence passages)."""

    n_countries: int = 8
    n_cities: int = 24
    n_companies: int = 24
    n_people: int = 120
    facts_per_passage: int = 1  # facts about one subject grouped into one passage (1 = one fact each)
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.n_countries, self.n_cities, self.n_companies, self.n_people, self.facts_per_passage) < 1:
            raise ValueError(f"every KBConfig size must be >= 1, got {self}")


@dataclass
class KnowledgeBase:
    """Entities, facts ``(subject, relation) -> object`` and their passages."""

    config: KBConfig
    entities: dict[str, list[str]]  # kind -> names
    facts: dict[tuple[str, str], str]
    passages: list[dict[str, str]]  # unified corpus schema {"id","title","text","source"}
    fact_passage: dict[tuple[str, str], str] = field(default_factory=dict)  # (subject, relation) -> passage id

    def corpus(self) -> Corpus:
        return Corpus.from_records(self.passages, name=f"generated-seed{self.config.seed}")


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)).capitalize() + rng.choice(_CODAS)


def _unique_names(n: int, make: Any, taken: set[str]) -> list[str]:
    """``n`` names from ``make()`` unseen in ``taken`` (compared lower-case; ``taken`` is updated)."""
    names: list[str] = []
    while len(names) < n:
        name = make()
        if name.lower() not in taken:
            taken.add(name.lower())
            names.append(name)
    return names


def generate_kb(config: KBConfig = KBConfig()) -> KnowledgeBase:
    """Build the world for ``config.seed`` (same config -> identical KB)."""
    rng = random.Random(config.seed)
    taken: set[str] = set()
    countries = _unique_names(config.n_countries, lambda: _word(rng, 2) + rng.choice(_COUNTRY_SUFFIXES), taken)
    cities = _unique_names(config.n_cities, lambda: _word(rng, rng.choice((2, 3))), taken)
    companies = _unique_names(config.n_companies,
                              lambda: f"{_word(rng, 2)} {rng.choice(_COMPANY_SUFFIXES)}", taken)
    people = _unique_names(config.n_people, lambda: f"{_word(rng, 2)} {_word(rng, rng.choice((1, 2)))}", taken)

    facts: dict[tuple[str, str], str] = {}
    for c in cities:
        facts[(c, "in_country")] = rng.choice(countries)
    for c in companies:
        facts[(c, "founded_in")] = str(rng.randint(1850, 2020))
        facts[(c, "based_in")] = rng.choice(cities)
    for p in people:
        facts[(p, "born_in")] = rng.choice(cities)
        facts[(p, "works_for")] = rng.choice(companies)

    by_subject: dict[str, list[tuple[str, str]]] = {}
    for (subject, relation), obj in facts.items():
        by_subject.setdefault(subject, []).append((relation, obj))
    passages, fact_passage = [], {}
    for subject, rel_objs in by_subject.items():
        for start in range(0, len(rel_objs), config.facts_per_passage):
            group = rel_objs[start:start + config.facts_per_passage]
            pid = f"gen{config.seed}-p{len(passages)}"
            text = " ".join(RELATIONS[r][0].format(s=subject, o=o) for r, o in group)
            passages.append({"id": pid, "title": subject, "text": text, "source": "generated"})
            fact_passage.update({(subject, r): pid for r, _ in group})
    entities = {"countries": countries, "cities": cities, "companies": companies, "people": people}
    return KnowledgeBase(config, entities, facts, passages, fact_passage)


def _make_task(kb: KnowledgeBase, template: str, subject: str, task_id: str) -> Task:
    question, chain = TEMPLATES[template]
    hops, s = [], subject
    for relation in chain:
        o = kb.facts[(s, relation)]
        hops.append({"relation": relation, "subject": s, "answer": o,
                     "query": RELATIONS[relation][1].format(s=s), "passage_id": kb.fact_passage[(s, relation)]})
        s = o
    return Task(task_id=task_id, question=question.format(s=subject), answers=(s,), source="generated",
                meta={"template": template, "n_hops": len(chain), "hops": hops})


def _question_pool(kb: KnowledgeBase, hops: Sequence[int]) -> list[tuple[str, str]]:
    return [(t, s) for t, (_, chain) in TEMPLATES.items() if len(chain) in hops
            for s in kb.entities[_SUBJECT_KIND[chain[0]]]]


def count_questions(kb: KnowledgeBase, hops: Sequence[int] = (1, 2)) -> int:
    """How many distinct questions the KB offers with the given hop counts."""
    return len(_question_pool(kb, hops))


def generate_tasks(kb: KnowledgeBase, n: int, hops: Sequence[int] = (1, 2), seed: int = 0,
                   id_prefix: str = "gen") -> list[Task]:
    """``n`` distinct questions (template, subject) drawn uniformly among the templates with the given hop
    counts; deterministic in ``(kb, n, hops, seed)``. Raises if ``n`` exceeds the distinct questions."""
    pool = _question_pool(kb, hops)
    if n > len(pool):
        raise ValueError(f"asked for {n} distinct questions but this KB has only {len(pool)} with hops={tuple(hops)}; "
                         f"lower n or enlarge KBConfig")
    picked = random.Random(seed).sample(pool, n)
    return [_make_task(kb, t, s, f"{id_prefix}{kb.config.seed}-{i}") for i, (t, s) in enumerate(picked)]


def generate_splits(kb: KnowledgeBase, n_train: int, n_test: int, hops: Sequence[int] = (1, 2),
                    seed: int = 0) -> tuple[list[Task], list[Task]]:
    """Disjoint train / test questions (no (template, subject) pair in both)."""
    tasks = generate_tasks(kb, n_train + n_test, hops, seed)
    train = [Task(f"gen{kb.config.seed}-train-{i}", t.question, t.answers, t.source, t.meta)
             for i, t in enumerate(tasks[:n_train])]
    test = [Task(f"gen{kb.config.seed}-test-{i}", t.question, t.answers, t.source, t.meta)
            for i, t in enumerate(tasks[n_train:])]
    return train, test


# --------------------------------------------------------------------------------------------------
# Role traces for SFT warm-up
# --------------------------------------------------------------------------------------------------

def _task_dict(task: Task) -> dict[str, Any]:
    return {"task_id": task.task_id, "question": task.question, "answers": list(task.answers), "source": task.source}


def _fact(hop: dict[str, str]) -> str:
    return RELATIONS[hop["relation"]][0].format(s=hop["subject"], o=hop["answer"])


@dataclass(frozen=True)
class TraceNoise:
    """How far the SFT episodes depart from the ideal script (docs/mechanism.md).

    ``miss_rate``: probability that a search in a trace episode misses (its observation is the passages
    ranked k+1..2k, as the environment's ``miss_rate`` does), so the traces show the Verifier saying no
    after an uninformative retrieval and the Search agent asking again; an episode whose misses use up
    ``max_turns`` ends unanswered. ``verdict_noise``: probability that a Verifier label is wrong (yes
    before the history holds the answer, or no once it does); the trace episode stops after a wrong
    verdict, so no other role is taught to act on it. Both 0 = the ideal episode only."""

    miss_rate: float = 0.0
    verdict_noise: float = 0.0
    verifier_think: bool = False
    """The Verifier restates what the question still needs, then either the fact that answers it or "It is
    not in the passages.", before its verdict (``<think>…</think><verify>…</verify>``), as the Search and
    Answer agents think before acting; False: the bare verdict."""
    max_turns: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        if not (0.0 <= self.miss_rate < 1.0 and 0.0 <= self.verdict_noise < 1.0 and self.max_turns >= 1):
            raise ValueError(f"TraceNoise needs 0 <= miss_rate, verdict_noise < 1 and max_turns >= 1, got {self}")


def role_traces(task: Task, hop_hits: Sequence[Sequence[dict[str, Any]]],
                hop_misses: Sequence[Sequence[dict[str, Any]]] | None = None,
                noise: TraceNoise = TraceNoise(), rng: random.Random | None = None) -> list[dict[str, Any]]:
    """SFT records of one episode of a generated task, given each hop query's retrieved hits
    (``Retriever.retrieve(...).results``) and, for misses, its ranks k+1..2k (``hop_misses``); ``[]``
    when a hop's hits miss its gold passage.

    Dr. MAS roles; each turn the Verifier judges the history, then the Search agent searches or the
    Answer agent answers:
    - ``verifier``: ``<verify>yes</verify>`` iff the history holds the passage stating the answer (the last
      hop's gold passage), else ``<verify>no</verify>`` (flipped with probability ``noise.verdict_noise``);
    - ``search``: ``<think>I need to find ...</think><search>query</search>`` for the first hop whose gold
      passage the history lacks (a missed search is asked again);
    - ``answer``: ``<think><the fact></think><answer>X</answer>``;
    - ``single_agent``: the Search-R1 single-agent step (search or answer) at each turn with a correct verdict.
    A search misses with probability ``noise.miss_rate``; the Verifier is not followed by a search on the
    last of ``noise.max_turns`` turns (the episode ends unanswered, as in the orchestra). ``rng`` draws
    the misses and flips (default: ``random.Random(noise.seed)``).
    Each record: ``{"role", "task": {...}, "context": {"history": [...], "history_text", "step",
    "teammates"}, "target"}``; history entries are ``SearchEnv.turns`` dicts (kind/query/observation).
    """
    hops = task.meta["hops"]
    if any(hop["passage_id"] not in {hit["document"]["id"] for hit in hits} for hop, hits in zip(hops, hop_hits)):
        return []
    if noise.miss_rate > 0 and hop_misses is None:
        raise ValueError("role_traces: noise.miss_rate > 0 needs hop_misses (each hop query's ranks k+1..2k)")
    rng = rng or random.Random(noise.seed)
    history: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    seen: set[str] = set()  # passage ids in the history

    def record(role: str, target: str, teammates: dict[str, str] | None = None) -> None:
        context = {"history": [dict(h) for h in history], "history_text": render_history(history),
                   "step": len(history), "teammates": dict(teammates or {})}
        records.append({"role": role, "task": _task_dict(task), "context": context, "target": target})

    def need(h: int) -> str:  # what the history still lacks, as the Search agent thinks it
        wanted = RELATIONS[hops[h]["relation"]][2].format(s=hops[h]["subject"])
        return f"I need to find {wanted}." if h == 0 else f"{_fact(hops[h - 1])} Now I need to find {wanted}."

    for turn in range(noise.max_turns):
        h = next((i for i, hop in enumerate(hops) if hop["passage_id"] not in seen), len(hops))
        enough = h == len(hops)
        flipped = rng.random() < noise.verdict_noise
        say_yes = enough != flipped
        verdict = f"<verify>{'yes' if say_yes else 'no'}</verify>"
        if noise.verifier_think:
            evidence = f"{need(len(hops) - 1)} {_fact(hops[-1])}" if enough else f"{need(h)} It is not in the passages."
            record("verifier", f"<think>{evidence}</think>{verdict}")
        else:
            record("verifier", verdict)
        if flipped:
            return records  # nothing else is taught to act on a wrong verdict
        if enough:
            answer = f"<think>{_fact(hops[-1])}</think><answer>{task.answers[0]}</answer>"
            record("answer", answer, {"verifier": verdict})
            record("single_agent", answer)
            return records
        if turn == noise.max_turns - 1:
            return records  # budget used up: the episode ends unanswered (reward 0)
        hop = hops[h]
        search = f"<think>{need(h)}</think><search>{hop['query']}</search>"
        record("search", search, {"verifier": verdict})
        record("single_agent", search)
        hits = hop_misses[h] if noise.miss_rate > 0 and rng.random() < noise.miss_rate else hop_hits[h]
        seen.update(hit["document"]["id"] for hit in hits)
        history.append({"turn": turn + 1, "kind": "search", "query": hop["query"], "answer": "",
                        "observation": format_information(hits), "valid": True})
    return records


def build_traces(tasks: Sequence[Task], retriever: SearchBackend, topk: int = 3,
                 noise: TraceNoise = TraceNoise()) -> list[dict[str, Any]]:
    """``role_traces`` of every task; all hop queries go to the retriever in one batched call (depth 2k
    when misses are drawn). Tasks whose searches miss a gold passage are skipped (logged). Raises if the
    retrieval itself fails."""
    queries = [hop["query"] for t in tasks for hop in t.meta["hops"]]
    batch = retriever.retrieve(queries, 2 * topk if noise.miss_rate > 0 else topk)
    if not batch.ok:
        raise RuntimeError(f"retrieval for the role traces failed: {batch.error}")
    rng = random.Random(noise.seed)
    out, skipped, pos = [], 0, 0
    for task in tasks:
        n_hops = len(task.meta["hops"])
        results = batch.results[pos:pos + n_hops]
        recs = role_traces(task, [r[:topk] for r in results], [r[topk:2 * topk] for r in results], noise, rng)
        pos += n_hops
        skipped += not recs
        out.extend(recs)
    if skipped:
        logger.info("role traces: skipped %d of %d tasks (a search missed its gold passage)", skipped, len(tasks))
    return out
