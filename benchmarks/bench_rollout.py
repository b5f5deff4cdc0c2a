"""Benchmark: the fused decode loop (``rollout.engine=fast``) against HF ``generate`` (``hf``), per rollout and per
RL step, in alternating rounds of one run.

    .venv/bin/python benchmarks/bench_rollout.py [--steps 8] [--rounds 4] [--config search|math]

Each round builds two trainers afresh from the shipped SFT'd base, one per engine, and times ``--steps`` RL steps of
each (the engine that runs first alternates between rounds). The setting is the stability grid's
(experiments/grids/stability_confirm.yaml: the search system, non-sharing, 2 tasks x 16 trajectories a step;
``--config math``: the math grid's, 4 x 8), trajectory GRPO at lr 4e-4, one torch thread. Both engines draw the same
tokens from the same generator state (tests/test_fast_rollout.py), so the two trainers of a round run the very same
steps, and this is checked: the rounds' training rewards must agree step for step.

Per step it reads the trainer's own timings (``timing/rollout``: generation, all agents; ``timing/update``) and this
process's CPU time of the whole step. The first step of every round is a warm-up and not counted. It prints, per
round, the ratio hf / fast of the median rollout CPU-proxy (wall of the rollout phase, one process on its core) and of
the median step CPU time, then min / median / max of those ratios over rounds.

The update's attention kernel (``--kernels``): forward + backward of the policy on one batch at the presets' head
dims, under each SDPA backend and the eager (math) path, with the gradients' largest relative difference to the
default; the default (SDPA, which picks its CPU flash kernel) is kept where it is fastest.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SEARCH_MODELS = ("verifier_model", "search_model", "answer_model")
SETTINGS = {  # name: (config, its models, overrides)
    "search": ("experiments/configs/cpu/search_base.yaml", SEARCH_MODELS,
               ["algo.estimator=trajectory_grpo", "train.batch_tasks=2", "train.evaluate=false",
                *[f"models.{m}.optim.lr=4.0e-04" for m in SEARCH_MODELS]]),
    "math": ("experiments/configs/cpu/math_base.yaml", ("solver_model", "verifier_model"),
             ["algo.estimator=trajectory_grpo", "train.batch_tasks=4", "train.group_size=8", "train.evaluate=false"]),
}


def run_engine(setting: str, engine: str, steps: int, out: Path) -> list[dict]:
    """``steps`` RL steps with ``engine`` for every model; per step the trainer's metrics plus ``cpu`` seconds."""
    from drmas.config import load_config
    from drmas.trainer.trainer import Trainer

    config, models, overrides = SETTINGS[setting]
    cfg = load_config(ROOT / config, [*overrides, f"out_dir={out}", f"name={engine}", f"train.steps={steps}",
                                      *[f"models.{m}.rollout.engine={engine}" for m in models]])
    trainer = Trainer(cfg)
    rows = []
    try:
        for step in range(steps):
            start = time.process_time()
            metrics = trainer.train_step(step)
            rows.append({**metrics, "cpu": time.process_time() - start})
    finally:
        trainer.close()
    return rows


def ratio_line(name: str, ratios: list[float]) -> str:
    return (f"{name}: hf / fast = {min(ratios):.2f} / {statistics.median(ratios):.2f} / {max(ratios):.2f} "
            f"(min / median / max over {len(ratios)} rounds)")


def bench_engines(setting: str, steps: int, rounds: int) -> None:
    rollout_ratios, step_ratios = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            order = ("hf", "fast") if r % 2 == 0 else ("fast", "hf")
            rows = {e: run_engine(setting, e, steps, Path(tmp) / f"r{r}") for e in order}
            rewards = {e: [row["reward/mean"] for row in rows[e]] for e in order}
            if rewards["hf"] != rewards["fast"]:
                raise SystemExit(f"round {r + 1}: the engines' training rewards differ ({rewards}); they should run the "
                                 "same steps")
            med = {e: {k: statistics.median(row[k] for row in rows[e][1:]) for k in ("timing/rollout", "cpu")}
                   for e in order}
            rollout_ratios.append(med["hf"]["timing/rollout"] / med["fast"]["timing/rollout"])
            step_ratios.append(med["hf"]["cpu"] / med["fast"]["cpu"])
            print(f"round {r + 1}/{rounds} ({order[0]} first): median rollout hf {med['hf']['timing/rollout']:.2f} s, "
                  f"fast {med['fast']['timing/rollout']:.2f} s ({rollout_ratios[-1]:.2f}x); median step CPU hf "
                  f"{med['hf']['cpu']:.2f} s, fast {med['fast']['cpu']:.2f} s ({step_ratios[-1]:.2f}x); same rewards "
                  f"at all {steps} steps", flush=True)
    print(ratio_line(f"rollout per RL step ({setting})", rollout_ratios))
    print(ratio_line(f"RL step CPU ({setting})", step_ratios))


def bench_kernels(repeats: int = 3) -> None:
    """Forward + backward of one batch per preset under each attention path (module docstring)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from drmas.models import build_policy, make_batch, model_preset, response_logprobs, train_bytelevel_bpe

    tok = train_bytelevel_bpe([f"step {i}: x = {i * 7}" for i in range(300)], vocab_size=300)
    g = torch.Generator().manual_seed(0)
    for preset, (low, high, rows) in {"nano": (100, 600, 16), "tiny": (30, 120, 32)}.items():
        model = build_policy(preset, tok, seed=0)
        prompts = [torch.randint(5, len(tok), (int(n),), generator=g).tolist() for n in torch.randint(low, high, (rows,), generator=g)]
        responses = [torch.randint(5, len(tok), (int(n),), generator=g).tolist() for n in torch.randint(10, 60, (rows,), generator=g)]
        batch = make_batch(prompts, responses, tok.pad_token_id)
        paths = {"sdpa (default)": ("sdpa", None), "sdpa math": ("sdpa", SDPBackend.MATH),
                 "sdpa flash": ("sdpa", SDPBackend.FLASH_ATTENTION), "eager": ("eager", None)}
        reference, results = None, {}
        for name, (impl, backend) in paths.items():
            model.config._attn_implementation = impl
            times = []
            for _ in range(repeats + 1):
                model.zero_grad()
                start = time.process_time()
                with sdpa_kernel(backend) if backend is not None else torch.enable_grad():
                    logp, entropy = response_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask,
                                                      with_entropy=True)
                    (logp.sum() + entropy.sum()).backward()
                times.append(time.process_time() - start)
            grads = [p.grad.clone() for p in model.parameters()]
            reference = reference or grads
            err = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)) for a, b in zip(grads, reference))
            results[name] = (statistics.median(times[1:]), err)
        model.config._attn_implementation = "sdpa"
        head_dim = model_preset(preset).hidden_size // model_preset(preset).num_heads
        best = min(results, key=lambda k: results[k][0])
        print(f"update kernel, {preset} (head dim {head_dim}, {rows} rows, prompts {low}-{high} tokens): " + ", ".join(
            f"{k} {t:.3f} s (grad rel. diff {e:.1e})" for k, (t, e) in results.items()) + f"; fastest: {best}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="RL steps per engine per round (the first is a warm-up)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds; they alternate which engine runs first")
    parser.add_argument("--config", choices=sorted(SETTINGS), default="search")
    parser.add_argument("--kernels", action="store_true", help="also measure the update's attention paths")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    bench_engines(args.config, args.steps, args.rounds)
    if args.kernels:
        bench_kernels()


if __name__ == "__main__":
    main()
