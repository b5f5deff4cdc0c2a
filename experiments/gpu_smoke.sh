#!/usr/bin/env bash
# GPU smoke test of the paper-scale path, on ONE GPU, in under 10 minutes:
#   the math system (Solver <-> Verifier) with two tiny models (non-sharing: two worker groups), each an
#   OpenRLHF actor group (DeepSpeed) with its own vLLM engine, both in one shared Ray placement group
#   (time-sharing the GPU), a few RL steps with Dr. MAS advantages; prints per-step time, generation
#   tokens/s and per-agent gradient norms.
#
#   bash experiments/gpu_smoke.sh                    # 4 RL steps into results/gpu_smoke/
#   STEPS=8 bash experiments/gpu_smoke.sh rollout.enable_sleep=false   # extra args: config overrides
#
# Needs the GPU environment (requirements/gpu.txt or environment.yml, docs/gpu.md); no internet: the two
# tiny models are built here (SFT warm-up of the CPU preset on generated arithmetic, on the CPU cores).
# Phases and typical cost: API check (s), SFT warm-up (~1-3 min), engine + DeepSpeed start (~1-2 min),
# RL steps (s each), evaluation before/after, a DeepSpeed checkpoint at the end.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python}"
OUT="${OUT:-results/gpu_smoke}"
STEPS="${STEPS:-4}"
TIMEOUT_S="${TIMEOUT_S:-570}"   # stop before 10 minutes, whatever happens

echo "== GPU and packages"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
"$PY" - <<'EOF'
import importlib.metadata as md
for name in ("torch", "vllm", "openrlhf", "deepspeed", "ray", "transformers", "flash-attn"):
    try:
        print(f"  {name}=={md.version(name)}")
    except md.PackageNotFoundError:
        print(f"  {name}: NOT INSTALLED")
import torch
assert torch.cuda.is_available(), "no CUDA device visible"
EOF

echo "== OpenRLHF API check (drmas/workers/openrlhf/api.py)"
"$PY" -c "from drmas.workers.openrlhf.api import require_openrlhf_api as r; r(strict_version=False); print('  contract holds')"

# The CPU math config with the GPU path switched on; the models get their own paths so that the CPU grid's
# SFT checkpoints are never touched.
OVERRIDES=(
  name=run out_dir="$OUT"
  train.backend=openrlhf train.steps="$STEPS" train.batch_tasks=16 train.group_size=8
  train.eval_every=0 train.eval_tasks=32 train.eval_samples=2 train.save_every=0 train.threads=0
  sft.steps=400 sft.tokenizer_dir="$OUT/tokenizer"
)
for m in solver_model verifier_model; do
  OVERRIDES+=(
    models.$m.path="$OUT/base_tiny"
    models.$m.rollout.engine=vllm models.$m.rollout.enforce_eager=true models.$m.rollout.max_model_len=512
    models.$m.resources.num_gpus=1 models.$m.resources.zero_stage=2
  )
done
rm -rf "$OUT/run"
export RAY_DEDUP_LOGS=1 TOKENIZERS_PARALLELISM=false

echo "== train (${STEPS} RL steps; timeout ${TIMEOUT_S}s)"
start=$(date +%s)
timeout "$TIMEOUT_S" "$PY" -m drmas.cli train experiments/configs/cpu/math_base.yaml "${OVERRIDES[@]}" "$@" --no-progress
echo "== done in $(( $(date +%s) - start )) s"

"$PY" - "$OUT/run" <<'EOF'
import json, sys
from pathlib import Path

run = Path(sys.argv[1])
rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
agents = sorted({k.split("/")[1] for r in rows for k in r if k.startswith("agent/") and k.endswith("/steps")})
print(f"{'step':>4} {'step s':>7} {'rollout s':>9} {'update s':>8} {'gen tok/s':>9} {'reward':>6}  "
      + "  ".join(f"{'|g| ' + a:>14}" for a in agents))
for r in rows:
    generated = sum(r.get(f"agent/{a}/steps", 0) * r.get(f"agent/{a}/response_len", 0.0) for a in agents)
    tps = generated / r["timing/rollout"] if r.get("timing/rollout") else float("nan")
    norms = "  ".join(f"{r.get(f'agent/{a}/grad_norm', float('nan')):>14.4g}" for a in agents)
    print(f"{r['step']:>4} {r['timing/step']:>7.2f} {r['timing/rollout']:>9.2f} {r['timing/update']:>8.2f} "
          f"{tps:>9.0f} {r['reward/mean']:>6.3f}  {norms}")
for line in (run / "eval.jsonl").read_text().splitlines():
    e = json.loads(line)
    print(f"eval step {e['step']} {e['benchmark']}: avg@{e['k']} {e['avg']:.3f} pass@{e['k']} {e['pass']:.3f}")
EOF
