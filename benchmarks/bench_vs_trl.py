"""Benchmark: one drmas RL step against one TRL ``GRPOTrainer`` step, side by side on the same machine.

    .venv-bench/bin/python benchmarks/bench_vs_trl.py [--steps 10] [--rounds 5] [--trl-default-checkpointing]

Needs TRL (the ``bench`` extra: ``pip install -e .[bench]``, in its own environment, never the main job's;
docs/training.md says how .venv-bench is built). The single-agent math GRPO of
experiments/configs/cpu/math_single.yaml, both trainers starting from its shipped SFT'd base:

- same base checkpoint and tokenizer (results/sft/math/base_tiny), fp32, one torch thread;
- same prompts per step: step s trains on the drmas task source's tasks of step s, rendered by the drmas
  agent, in order (TRL: ``shuffle_dataset=False``);
- same batch shape and sampling: B tasks x G samples, one optimizer step per RL step (on-policy: no
  old-log-prob pass in either), ``max_new_tokens``, temperature / top-p / top-k of the config;
- same objective: reward = correct - c * (1 - valid) (valid: a \\boxed{} answer), group-normalized
  advantages (r - mean) / (std + eps), PPO-clip with clip_low / clip_high, token-mean loss (TRL's
  ``dapo``), no KL (beta 0), AdamW with the config's lr / betas / weight decay, constant lr, the same
  gradient clip;
- rounds alternate which trainer runs first; each round builds both trainers afresh from the base and
  times ``--steps`` steps of each (the whole step: generation, reward, advantages, update; TRL:
  ``on_step_begin`` to ``on_step_end``), by the wall clock and by this process's CPU time
  (``time.process_time``: on a shared, loaded machine the wall clock also counts the time other
  processes hold the core). The first step of every round is a warm-up and not counted. Prints
  medians, their ratios and the settings that differ.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from drmas.agents.base import AgentView
from drmas.config import RunConfig, load_config
from drmas.models.factory import load_policy
from drmas.trainer.trainer import Trainer
from envs.math import grade_batch

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "experiments" / "configs" / "cpu" / "math_single.yaml"

#: What is not the same in the two steps (printed with the result).
DIFFERENCES = (
    "each computes its own step metrics inside the step (TRL: reward / entropy / clip statistics; drmas: "
    "step table, per-agent gradient norms); TRL prints them once per round, after its last timed step",
    "generation: both HF generate with a KV cache on the same model; drmas prefills each distinct prompt once "
    "(algo.shared_prefix=auto), sorts prompts by length and strips the padding; TRL pads the batch as one",
    "drmas's update runs the shared-prompt layout (algo.shared_prefix=auto; the G samples of a task share "
    "its prompt); TRL runs every prompt per sample",
)


def drmas_config(steps: int, run_dir: Path) -> RunConfig:
    return load_config(CONFIG, [f"out_dir={run_dir}", "name=drmas", "train.evaluate=false", f"train.steps={steps}"])


def step_prompts(cfg: RunConfig, steps: int) -> list[dict]:
    """The drmas task source's tasks of steps 0..steps-1, rendered as the single agent's prompts."""
    from drmas.agents import make_agent
    from drmas.tasks import make_task_source

    source = make_task_source(cfg.env.name, **cfg.env.args)
    agent_cfg = cfg.agents[0]
    agent = make_agent(agent_cfg.role, agent_cfg.name)
    rows = []
    for step in range(steps):
        for task in source.train_tasks(step, cfg.train.batch_tasks, seed=cfg.train.seed):
            rows.append({"prompt": agent.render(AgentView(task)), "answers": list(task.answers)})
    return rows


def make_reward(cfg: RunConfig):
    """TRL reward function: the drmas score of a single-agent trajectory, R - c (1 - valid)."""
    from drmas.agents import make_agent

    agent = make_agent(cfg.agents[0].role, cfg.agents[0].name)
    penalty = cfg.invalid_penalties()[cfg.agents[0].name]

    def reward(prompts, completions, answers, **kwargs):
        correct = grade_batch(list(completions), [tuple(a) for a in answers])
        valid = np.array([agent.parse(c).valid for c in completions], np.float32)
        return (correct - penalty * (1.0 - valid)).tolist()

    reward.__name__ = "drmas_score"
    return reward


Times = list[tuple[float, float]]
"""(wall, CPU) seconds of each step."""


def time_drmas(cfg: RunConfig) -> Times:
    trainer = Trainer(cfg)
    times = []
    for step in range(cfg.train.steps):
        start = (time.perf_counter(), time.process_time())
        trainer.train_step(step)
        times.append((time.perf_counter() - start[0], time.process_time() - start[1]))
    trainer.close()
    return times


def time_trl(cfg: RunConfig, rows: list[dict], out: Path, checkpointing: bool) -> Times:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model_cfg = next(iter(cfg.models.values()))
    optim = cfg.effective_optim(next(iter(cfg.models)))
    sampling = cfg.agents[0].sampling
    model, tokenizer = load_policy(model_cfg.path)
    times: Times = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = (time.perf_counter(), time.process_time())

        def on_step_end(self, args, state, control, **kwargs):
            times.append((time.perf_counter() - self.start[0], time.process_time() - self.start[1]))

    a = cfg.algo
    args = GRPOConfig(
        output_dir=str(out), max_steps=cfg.train.steps, per_device_train_batch_size=cfg.train.batch_tasks *
        cfg.train.group_size, num_generations=cfg.train.group_size, gradient_accumulation_steps=1,
        max_completion_length=sampling.max_new_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
        top_k=sampling.top_k, learning_rate=optim.lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=optim.weight_decay, adam_beta1=optim.betas[0], adam_beta2=optim.betas[1],
        max_grad_norm=optim.max_grad_norm, beta=0.0, epsilon=a.clip_low, epsilon_high=a.clip_high, loss_type="dapo",
        scale_rewards="group", num_iterations=1, shuffle_dataset=False, gradient_checkpointing=checkpointing,
        bf16=False, fp16=False, use_cpu=True, seed=cfg.train.seed, logging_steps=cfg.train.steps,
        save_strategy="no", report_to=[], remove_unused_columns=False, dataloader_num_workers=0, disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=make_reward(cfg), args=args,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer, callbacks=[StepTimer()])
    trainer.train()
    return times


def median(times: Times, clock: int) -> float:
    return statistics.median(t[clock] for t in times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="RL steps per trainer per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; they alternate which trainer runs first")
    parser.add_argument("--trl-default-checkpointing", action="store_true",
                        help="TRL with its default gradient checkpointing on (matched settings: off)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    import transformers
    import trl

    checkpointing = args.trl_default_checkpointing
    drmas_times: Times = []
    trl_times: Times = []
    round_medians: list[dict[str, Times]] = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = drmas_config(args.steps, Path(tmp))
        rows = step_prompts(cfg, args.steps)
        for r in range(args.rounds):
            order = ("drmas", "trl") if r % 2 == 0 else ("trl", "drmas")
            round_medians.append({})
            for name in order:
                if name == "drmas":
                    times = time_drmas(drmas_config(args.steps, Path(tmp) / f"r{r}"))
                    drmas_times += times[1:]
                else:
                    times = time_trl(cfg, rows, Path(tmp) / f"trl{r}", checkpointing)
                    trl_times += times[1:]
                round_medians[-1][name] = times[1:]
                print(f"round {r + 1}/{args.rounds} {name:5s} median step: wall {median(times[1:], 0):.3f} s, "
                      f"CPU {median(times[1:], 1):.3f} s", flush=True)
    a = cfg.algo
    print(f"\ndrmas vs TRL {trl.__version__} GRPOTrainer, medians of {len(drmas_times)} and {len(trl_times)} steps:")
    for i, clock in enumerate(("wall", "CPU")):
        d, t = median(drmas_times, i), median(trl_times, i)
        ratios = [median(m["trl"], i) / median(m["drmas"], i) for m in round_medians]
        print(f"  {clock:4s} drmas {d:.3f} s/step, TRL {t:.3f} s/step: drmas is {t / d:.2f}x faster; per round "
              f"{min(ratios):.2f} / {statistics.median(ratios):.2f} / {max(ratios):.2f}x (min / median / max)")
    print(f"settings: {cfg.train.batch_tasks} tasks x {cfg.train.group_size} samples, max_new_tokens "
          f"{cfg.agents[0].sampling.max_new_tokens}, T {cfg.agents[0].sampling.temperature}, lr "
          f"{cfg.effective_optim(next(iter(cfg.models))).lr}, clip [{a.clip_low}, {a.clip_high}], token-mean loss, "
          f"fp32, {torch.get_num_threads()} thread(s), torch {torch.__version__}, transformers "
          f"{transformers.__version__}; TRL gradient checkpointing {'on (its default)' if checkpointing else 'off'}; "
          f"drmas algo.shared_prefix={a.shared_prefix}")
    print("differences:\n  - " + "\n  - ".join(DIFFERENCES))


if __name__ == "__main__":
    main()
