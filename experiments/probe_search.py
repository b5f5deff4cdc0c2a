"""Rollout-only probe of the search system's outcome structure: does how often each agent acts depend on the
outcome, and how large is each agent's Lemma 4.2 factor? No training; seconds per setting.

    python -m experiments.probe_search experiments/configs/cpu/search_base.yaml [KEY=VALUE ...] \
        [--steps 4] [--grad-samples 48] [--out probe.json]

For ``--steps`` training batches (the run's own task stream and rollout seeds, so step 0 is the rollout a
run of this config sees first) it classifies every trajectory:

- S: answered from a history that holds a gold answer, correct;  W: the same, wrong;
- U: answered from a history without the answer (the Verifier said yes too early);
- E: unanswered (the 4-turn budget ran out; reward 0).

and reports each agent's Lemma 4.2 factor under the two global baselines (``drmas.algos.lemma_factors``,
mean and max over task groups), the Verifier's P(yes) after a search by the question's hop count and
whether the history then holds the answer, each agent's share of distinct responses within a task group
(identical samples share one gradient, so advantages that sum to 0 over them, as Dr. MAS's do, cancel),
and, with ``--grad-samples N``, the mean per-sample gradient norm ||∇ Σ_t log π(y_t)|| of up to N
Answer-agent steps in successful and in failed trajectories. Lemma 4.2 takes that gradient z to be
independent of the outcome; if successes have smaller per-sample gradients (confident responses), the
factor inflates E_k[A²] but not the gradient norm. docs/mechanism.md quotes this probe's numbers.

``class_aware`` (per agent): the share of distinct (prompt, response) pairs per group (``pairs_distinct``:
identical pairs share one gradient z_c; ``distinct_responses`` compares the response texts alone) and, for each
global baseline b, the ratio over Dr. MAS of Σ_c S_c² (``equal/b``: equal ‖z_c‖, the trainer's
``class_factor_{b}``) summed over the probed batches; with ``--grad-samples N`` also, over the first N task groups
of each agent, of Σ_c S_c² ‖z_c‖² (``measured/b``: one backward pass per class) and of ‖Σ_c S_c z_c‖² (``exact/b``:
the squared gradient norm itself on those groups, no assumption on the z_c). docs/theory.md, "Repeated responses".
"""
from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from drmas.algos import GLOBAL_BASELINES, class_factors, class_sums, compute_advantages, lemma_factors, step_classes
from drmas.config import load_config
from drmas.io import atomic_write_json
from drmas.models.logprobs import batch_logprobs, make_batch
from drmas.trainer.trainer import Trainer

logger = logging.getLogger("experiments.probe_search")
OUTCOMES = ("S", "W", "U", "E")


def classify(answered: np.ndarray, informed: np.ndarray, reward: np.ndarray) -> np.ndarray:
    """Outcome class of each trajectory (see the module doc): S, W, U or E."""
    return np.where(~answered, "E", np.where(~informed, "U", np.where(reward > 0, "S", "W")))


def _holds_answer(text: str, answers) -> bool:
    low = text.lower()
    return any(a.lower() in low for a in answers)


def _sample_grad(worker, prompt_ids, response_ids, temperature: float) -> torch.Tensor:
    """z = ∇_θ Σ_t log π_θ(y_t | prefix) of one (prompt, response) pair on the worker's model, flat, float64
    (drmas.algos.grad_norm sums in float32: the probe's 4-decimal means would move)."""
    model = worker.model
    model.zero_grad(set_to_none=True)
    packed = make_batch([prompt_ids], [response_ids], worker.pad_id, device=worker.device)
    logp, _ = batch_logprobs(model, packed, temperature=temperature)
    logp.sum().backward()
    z = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().double().flatten()
                   for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return z


def _sample_grad_norm(worker, prompt_ids, response_ids, temperature: float) -> float:
    """||z|| of one (prompt, response) pair (:func:`_sample_grad`)."""
    return float(_sample_grad(worker, prompt_ids, response_ids, temperature).pow(2).sum()) ** 0.5


ESTIMATORS_PROBED = ("drmas", *GLOBAL_BASELINES)


def class_gradient_sums(table, classes: np.ndarray, rows: np.ndarray, grad_of) -> dict[str, tuple[float, float]]:
    """For the steps ``rows`` (one agent's steps of some task groups) and each estimator e of
    :data:`ESTIMATORS_PROBED`: (Σ_c S_c(e)² ‖z_c‖², ‖Σ_c S_c(e) z_c‖²), the class-aware second moment with
    measured class-gradient norms and the exact squared norm of the gradient Σ_i A_i z_i (z_i = z_c), with
    one backward pass per class (``grad_of(row)`` gives z of a row). A is the estimator's advantage at
    population std and no ε, as in ``drmas.algos.class_factors``."""
    sums = {}
    for est in ESTIMATORS_PROBED:
        a = compute_advantages(table.score, table.task, table.agent, table.traj, estimator=est, ddof=0, eps=0.0,
                               singleton="zero").advantages.double().numpy()
        sums[est] = class_sums(a, classes)
    mine = np.unique(classes[rows])
    first_row = {c: r for r, c in zip(rows[::-1], classes[rows][::-1])}  # one row per class
    acc = {est: None for est in ESTIMATORS_PROBED}
    diag = dict.fromkeys(ESTIMATORS_PROBED, 0.0)
    for c in mine:
        if all(sums[est][c] == 0 for est in ESTIMATORS_PROBED):
            continue  # no weight under any estimator: its gradient is not needed
        z = grad_of(first_row[c])
        sq = float(z.pow(2).sum())
        for est in ESTIMATORS_PROBED:
            diag[est] += float(sums[est][c]) ** 2 * sq
            acc[est] = z * float(sums[est][c]) if acc[est] is None else acc[est].add_(z, alpha=float(sums[est][c]))
    return {est: (diag[est], float(acc[est].pow(2).sum()) if acc[est] is not None else 0.0) for est in ESTIMATORS_PROBED}


def probe(config: str, overrides: list[str], steps: int, grad_samples: int, scratch: str) -> dict:
    """The probe's result for ``config`` with ``overrides``; ``scratch`` holds the trainer's run folder."""
    cfg = load_config(config, ["train.evaluate=false", "name=probe", f"out_dir={scratch}", *overrides])
    trainer = Trainer(cfg)
    env_of_batch: list = []

    def make_env():
        env = trainer.source.make_env()
        env_of_batch.append(env)
        return env

    classes, factors, verdicts, distinct = [], defaultdict(list), defaultdict(lambda: [0, 0]), defaultdict(list)
    class_moments: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    groups_done: dict[str, int] = defaultdict(int)
    answer_rows: dict[str, list] = {"success": [], "failure": []}
    t0 = time.perf_counter()
    for step in range(steps):
        env_of_batch.clear()
        ro = trainer.rollout(step, make_env)  # the run's own task batch and rollout seed
        env, table = env_of_batch[0], ro.table
        table.assign_rewards(ro.traj_reward, trainer.invalid_penalties)
        for baseline in GLOBAL_BASELINES:
            for row in lemma_factors(table.score, table.task, table.agent, table.traj, baseline).itertuples():
                factors[(baseline, row.agent)].append(row.factor)
        # how alike an agent's samples of one task group are: identical samples have one gradient, so under Dr. MAS
        # (advantages summing to 0 over the agent's steps of the group) their contributions cancel
        steps_of = pd.DataFrame({"task": table.task, "agent": table.agent, "text": list(table.texts)})
        share = steps_of.groupby(["task", "agent"])["text"].agg(lambda t: t.nunique() / len(t))
        for (_, agent), value in share.items():
            distinct[agent].append(value)
        # classes of identical (prompt, response) pairs: the class-aware factor (equal ||z_c||) of the batch, and with
        # --grad-samples the measured-||z_c||^2 variant and the exact gradient norms on up to N task groups per agent
        pair_class = step_classes(table.task, table.agent, table.prompt_ids, table.response_ids)
        per_agent = class_factors(table.score, table.task, table.agent, table.traj, pair_class, GLOBAL_BASELINES)
        for agent, row in per_agent.iterrows():
            class_moments[agent]["pairs_distinct"].append(row["distinct"])  # mean over the batch's groups
            for est in ESTIMATORS_PROBED:
                class_moments[agent][f"equal/{est}"].append(row[f"m2_{est}"])
        for agent in dict.fromkeys(table.agent) if grad_samples else ():
            tasks = [t for t in dict.fromkeys(table.task[table.agent == agent])][:grad_samples - groups_done[agent]]
            if not tasks:
                continue
            groups_done[agent] += len(tasks)
            rows = np.flatnonzero((table.agent == agent) & np.isin(table.task, tasks))
            temperature = trainer.slots[agent].sampling.temperature
            workers = trainer.backend.generators()
            got = class_gradient_sums(table, pair_class, rows, lambda r: _sample_grad(
                workers[table.wg[r]], table.prompt_ids[r], table.response_ids[r], temperature))
            for est, (diag, exact) in got.items():
                class_moments[agent][f"measured/{est}"].append(diag)
                class_moments[agent][f"exact/{est}"].append(exact)
        n = len(ro.traj_reward)
        answered = np.zeros(n, bool)
        answered[table.traj[table.agent == "answer"]] = True
        turns = [env.turns(i) for i in range(n)]
        informed = np.array([_holds_answer(" ".join(t["observation"] for t in turns[i]), env.tasks[i].answers)
                             for i in range(n)])
        cls = classify(answered, informed, ro.traj_reward)
        classes.extend(cls.tolist())
        # the Verifier's verdict after each search, against whether the history then held the answer
        for row in np.flatnonzero(table.agent == "verifier"):
            i, turn = int(table.traj[row]), int(table.turn[row])
            if turn == 0:
                continue
            seen = " ".join(t["observation"] for t in turns[i][:turn])
            hops = env.tasks[i].meta.get("n_hops", "?")
            key = f"{hops}-hop {'informed' if _holds_answer(seen, env.tasks[i].answers) else 'uninformed'}"
            verdicts[key][0] += "<verify>yes</verify>" in table.texts[row].lower()
            verdicts[key][1] += 1
        for row in np.flatnonzero(table.agent == "answer"):
            kind = "success" if ro.traj_reward[table.traj[row]] > 0 else "failure"
            answer_rows[kind].append((table.prompt_ids[row], table.response_ids[row], table.wg[row]))
        logger.info("step %d: %d trajectories, reward %.3f", step, n, float(ro.traj_reward.mean()))

    cls = np.array(classes)
    out = {"config": config, "overrides": overrides, "steps": steps, "trajectories": int(cls.size),
           "seconds": round(time.perf_counter() - t0, 1),
           "outcomes": {c: round(float((cls == c).mean()), 3) for c in OUTCOMES},
           "factors": {f"{b}/{a}": {"mean": round(float(np.mean(v)), 3), "max": round(float(np.max(v)), 3),
                                    "groups": len(v)} for (b, a), v in sorted(factors.items())},
           "verifier_p_yes": {k: {"p": round(y / max(m, 1), 3), "calls": m} for k, (y, m) in sorted(verdicts.items())},
           "distinct_responses": {a: {"mean": round(float(np.mean(v)), 3), "groups": len(v)}
                                  for a, v in sorted(distinct.items())},
           "class_aware": {a: _class_summary(m) for a, m in sorted(class_moments.items())}}
    if grad_samples:
        temperature = trainer.slots["answer"].sampling.temperature
        workers = trainer.backend.generators()
        rng = np.random.default_rng(0)
        norms = {}
        for kind, rows in answer_rows.items():
            pick = rng.permutation(len(rows))[:grad_samples]
            norms[kind] = [_sample_grad_norm(workers[rows[j][2]], rows[j][0], rows[j][1], temperature) for j in pick]
        out["answer_grad_norm"] = {k: {"mean": round(float(np.mean(v)), 4) if v else None, "samples": len(v)}
                                   for k, v in norms.items()}
    trainer.close()
    return out


def _class_summary(m: dict[str, list]) -> dict:
    """One agent's class-aware numbers over the probed batches: the share of distinct (prompt, response) pairs per
    group, and for each global baseline b the ratio over Dr. MAS of the summed second moments: ``equal`` (Σ S_c²,
    the trainer's class_factor_{b}), ``measured`` (Σ S_c² ‖z_c‖²) and ``exact`` (‖Σ S_c z_c‖², no assumption)."""
    out: dict = {"pairs_distinct": round(float(np.mean(m["pairs_distinct"])), 3)}
    for variant in ("equal", "measured", "exact"):
        ref = float(np.sum(m.get(f"{variant}/drmas", [])))
        for b in GLOBAL_BASELINES:
            num = float(np.sum(m.get(f"{variant}/{b}", [])))
            if f"{variant}/{b}" in m:
                out[f"{variant}/{b}"] = round(num / ref, 4) if ref > 0 else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides, as for `drmas train`")
    p.add_argument("--steps", type=int, default=4, help="training batches to roll out (default 4)")
    p.add_argument("--grad-samples", type=int, default=0,
                   help="per-sample gradient norms of up to N Answer-agent steps per outcome, and per-class gradients "
                        "of each agent's first N task groups (default 0: off)")
    p.add_argument("--out", type=Path, help="also write the result as JSON here")
    args = p.parse_args(argv)
    if args.steps < 1 or args.grad_samples < 0:
        p.error("--steps must be >= 1 and --grad-samples >= 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="drmas-probe-") as scratch:  # the trainer's run folder; nothing is kept
        result = probe(args.config, args.overrides, args.steps, args.grad_samples, scratch)
    if args.out:
        atomic_write_json(args.out, result)
    logger.info("%s", json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
