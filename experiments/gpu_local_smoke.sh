#!/usr/bin/env bash
# One-GPU smoke test of the LOCAL path (no vLLM, Ray, OpenRLHF or DeepSpeed: torch, transformers and the
# project's pure-Python dependencies only), in under 5 minutes on one GPU:
#   1. the device and package versions;
#   2. SFT of a base checkpoint (math roles; the `base` 12.8M preset at --scale gpu);
#   3. two RL runs of the non-sharing math system (Solver <-> Verifier, Dr. MAS) AT ONCE on the device, twins
#      with the same seed; run B is killed (SIGKILL) after its step-2 checkpoint and started again (it resumes);
#   4. per-step phase timings, generation tokens/s and per-agent gradient norms of both runs, and the comparison
#      of the resumed run B with the uninterrupted run A (identical on a CPU; on a GPU, non-deterministic CUDA
#      kernels may leave float-level differences, which are printed).
#
#   bash experiments/gpu_local_smoke.sh [--out DIR] [--device auto|cpu|cuda] [--scale gpu|tiny] [--steps N]
#     --out DIR     logs of every process (DIR/logs), runs (DIR/runs) and summary.{json,txt}; default results/gpu_smoke
#     --scale tiny  nano models and tiny batches: the CPU check of this script (a few minutes on 2 cores)
# Runs with plain `python3` (or $PYTHON) from the repository root, no install: when a `.whl` folder is present,
# its wheels (the pure-Python dependencies a bare GPU image lacks) go to /tmp/site first.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT=results/gpu_smoke
DEVICE=auto
SCALE=gpu
STEPS=6
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --device) DEVICE="$2"; shift 2 ;;
    --scale) SCALE="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "gpu_local_smoke.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$SCALE" in gpu|tiny) ;; *) echo "gpu_local_smoke.sh: --scale must be gpu or tiny, got '$SCALE'" >&2; exit 2 ;; esac
case "$DEVICE" in auto|cpu|cuda|cuda:[0-9]*) ;; *) echo "gpu_local_smoke.sh: --device must be auto, cpu or cuda[:i], got '$DEVICE'" >&2; exit 2 ;; esac
if ! [ "$STEPS" -ge 4 ] 2>/dev/null; then echo "gpu_local_smoke.sh: --steps must be >= 4 (a kill after step 2), got '$STEPS'" >&2; exit 2; fi

# ---- optional: the wheels of a bare GPU image (no pip install -e, no venv)
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH="${PYTHONPATH:-$PWD}" PYTHONHASHSEED=0 TOKENIZERS_PARALLELISM=false
PY="${PYTHON:-python3}"
mkdir -p "$OUT/logs"
rm -rf "$OUT/runs" "$OUT/sft"
SUMMARY="$OUT/summary.txt"
# every process runs under its own `timeout` (its own process group); a TERM to this script (e.g. the
# time limit of gpu_device_check.sh) ends them all, and `wait` keeps the script interruptible
GROUPS_STARTED=()
cleanup() { for g in "${GROUPS_STARTED[@]}"; do kill -TERM -- "-$g" 2>/dev/null || true; done; }
trap cleanup EXIT
trap 'exit 143' TERM INT
limited() {  # LIMIT LOG CMD...: CMD under `timeout LIMIT` in the background, output to LOG; sets LAST_PID
  local limit="$1" log="$2"; shift 2
  timeout "$limit" "$@" >> "$log" 2>&1 &
  LAST_PID=$!
  GROUPS_STARTED+=("$LAST_PID")
}
: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
T0=$(date +%s)
phase_start() { PHASE="$1"; PHASE_T=$(date +%s%N); say "== $1"; }
phase_end() { local ms=$(( ($(date +%s%N) - PHASE_T) / 1000000 )); say "   phase time: $((ms / 1000)).$(( ms % 1000 / 100 )) s"; }

phase_start "device and packages"
"$PY" - "$DEVICE" <<'EOF' 2>&1 | tee -a "$SUMMARY"
import importlib.metadata as md, sys
import torch
from drmas.devices import describe, resolve_device
print(f"   device: {describe(resolve_device(sys.argv[1]))} (--device {sys.argv[1]}); torch {torch.__version__} "
      f"(CUDA {torch.version.cuda}), python {sys.version.split()[0]}")
for name in ("transformers", "tokenizers", "safetensors", "pydantic", "numpy", "pandas", "math-verify", "vllm", "ray"):
    try:
        print(f"   {name}=={md.version(name)}")
    except md.PackageNotFoundError:
        print(f"   {name}: not installed")
EOF
phase_end

CONFIG=experiments/configs/gpu/math_base.yaml
COMMON=(train.device="$DEVICE" train.steps="$STEPS" train.save_every=2 train.eval_every=0 out_dir="$OUT/runs"
        models.solver_model.path="$OUT/sft/base" models.verifier_model.path="$OUT/sft/base"
        sft.tokenizer_dir="$OUT/sft/tokenizer" train.threads=1)
SFT_LIMIT=150 RUN_LIMIT=180   # seconds per process (one GPU); the tiny CPU check gets more (shared, loaded cores)
if [ "$SCALE" = tiny ]; then  # the CPU check of this script: nano models, tiny batches
  SFT_LIMIT=900 RUN_LIMIT=900
  COMMON+=(models.solver_model.preset=nano models.verifier_model.preset=nano train.batch_tasks=4 train.group_size=4
           train.eval_tasks=8 train.eval_samples=1 sft.steps=30 sft.traces=300 sft.batch_size=32)
else                          # one GPU: the gpu grid's model and batch, a shorter SFT and evaluation
  COMMON+=(train.eval_tasks=64 train.eval_samples=2 sft.steps=600 sft.traces=3000)
fi

phase_start "SFT warm-up of the base checkpoint"
limited "$SFT_LIMIT" "$OUT/logs/sft.log" "$PY" -m drmas.cli sft "$CONFIG" "${COMMON[@]}" --no-progress
wait "$LAST_PID" || { say "SFT failed or timed out (exit $?); see $OUT/logs/sft.log"; tail -5 "$OUT/logs/sft.log"; exit 1; }
grep -h '"sft"' "$OUT/logs/sft.log" | "$PY" -c "import json,sys; [print('   ' + k, {m: round(v, 4) for m, v in d.items()}) for line in sys.stdin for k, d in json.loads(line)['sft'].items()]" | tee -a "$SUMMARY"
phase_end

phase_start "two RL runs at once (A: uninterrupted; B: killed after its step-2 checkpoint, then resumed)"
train() { limited "$RUN_LIMIT" "$OUT/logs/$2.log" "$PY" -m drmas.cli train "$CONFIG" "${COMMON[@]}" name="$1" --no-progress; }
train A run_a; PID_A=$LAST_PID
train B run_b; PID_B=$LAST_PID
CKPT="$OUT/runs/B/checkpoints/latest/trainer.json"
KILLED=0
while kill -0 "$PID_B" 2>/dev/null; do
  if [ -f "$CKPT" ] && "$PY" -c "import json,sys; sys.exit(json.load(open('$CKPT'))['step'] < 2)" 2>/dev/null; then
    kill -KILL -- "-$PID_B" || true  # run B's process group (its `timeout` leads it): SIGKILL, no clean-up
    say "   killed run B after its step-2 checkpoint ($(wc -l < "$OUT/runs/B/metrics.jsonl") step records written)"
    KILLED=1
    break
  fi
  sleep 0.2
done
wait "$PID_B" 2>/dev/null; B_EXIT=$?
if [ "$KILLED" = 0 ]; then
  say "run B ended (exit $B_EXIT) before it could be killed after step 2: $( [ -f "$OUT/runs/B/DONE" ] && echo 'it finished: use more --steps' || echo "see $OUT/logs/run_b.log")"
  exit 1
fi
say "   resuming run B"
train B run_b_resumed
wait "$LAST_PID" || { say "resumed run B failed (exit $?); see $OUT/logs/run_b_resumed.log"; exit 1; }
wait "$PID_A" || { say "run A failed (exit $?); see $OUT/logs/run_a.log"; exit 1; }
grep -h "resum\|loaded" "$OUT/logs/run_b_resumed.log" | head -3 | sed 's/^/   /' | tee -a "$SUMMARY" || true
phase_end

phase_start "report"
"$PY" -m experiments.device_report smoke "$OUT/runs/A" "$OUT/runs/B" --out "$OUT/summary.json" 2>&1 | tee -a "$SUMMARY"
STATUS=${PIPESTATUS[0]}
phase_end
say "== total: $(( $(date +%s) - T0 )) s; logs in $OUT/logs, summary in $OUT/summary.{txt,json}"
exit "$STATUS"
