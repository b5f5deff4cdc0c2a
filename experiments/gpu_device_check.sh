#!/usr/bin/env bash
# The one script to run on a GPU machine (<= 9 min in all, a hard time limit per part; plain python3, no
# install: the wheels of `.whl/` go to /tmp/site as in gpu_local_smoke.sh). Five files land in $OUT (default
# results/device_check): summary.txt, report.json, smoke_summary.{txt,json} and logs.tar.gz (every log).
#   1. experiments/gpu_local_smoke.sh: SFT, two RL runs at once, kill + resume, per-phase timings (<= 240 s);
#   2. the CPU default grid's math and search settings on the GPU (experiments/grids/cpu.yaml, one run per
#      entry, short SFT, a few RL steps each, `--jobs auto`): s/step per setting, tokens/s; then 1, 2, 4, 8
#      concurrent copies of the math non-sharing run: how many concurrent runs pay off; from both, the time of
#      the whole default grid on this GPU against its measured 47.4 min on 2 CPU cores (run_all.sh, results deleted) (<= 270 s);
#   3. if time is left (9 min in all): the first steps of the gpu grid (experiments/grids/gpu.yaml), one run
#      per entry, and the estimate of its full time.
#
#   OUT=/path bash experiments/gpu_device_check.sh          # on the GPU machine
#   DRMAS_DEVICE_CHECK_SCALE=tiny OUT=/tmp/dc bash experiments/gpu_device_check.sh --device cpu   # CPU check
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-results/device_check}"
SCALE="${DRMAS_DEVICE_CHECK_SCALE:-full}"
DEVICE=auto
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --scale) SCALE="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "gpu_device_check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$SCALE" in full|tiny) ;; *) echo "gpu_device_check.sh: scale must be full or tiny, got '$SCALE'" >&2; exit 2 ;; esac
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH="${PYTHONPATH:-$PWD}" PYTHONHASHSEED=0 TOKENIZERS_PARALLELISM=false
PY="${PYTHON:-python3}"
BUDGET=540                               # 9 minutes for the three parts
if [ "$SCALE" = tiny ]; then             # the CPU check of this script: nano models, tiny batches, 1-2 lanes
  SMOKE=(--scale tiny --steps 4) STEPS=3 SFT=20 LANES="1 2" PART1=240 PART2=420 BUDGET=900
  TINY=(--set train.batch_tasks=2 --set train.group_size=2 --set train.eval_tasks=2)
  SETTINGS=(--only "math_nonsharing_drmas,search_sharing_drmas")
else
  SMOKE=(--scale gpu --steps 6) STEPS=3 SFT=300 LANES="1 2 4 8" PART1=240 PART2=270
  TINY=() SETTINGS=()
fi
WORK="${TMPDIR:-/tmp}/drmas_device_check"   # runs and checkpoints stay out of $OUT; their logs are tarred there
rm -rf "$WORK"; mkdir -p "$WORK" "$OUT"
pack() {  # on any exit (also a kill by an outer time limit): the logs into $OUT/logs.tar.gz, the work folder removed
  tar -czf "$OUT/logs.tar.gz" -C "$WORK" --exclude='*.safetensors' --exclude='*.pt' --exclude='*/checkpoints/*' \
    --exclude='*/tokenizer*' . 2>/dev/null
  rm -rf "$WORK"
}
trap pack EXIT
trap 'exit 143' TERM INT
: > "$OUT/summary.txt"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }

say "== part 1: gpu_local_smoke.sh (limit ${PART1}s)"
timeout -k 10 "$PART1" bash experiments/gpu_local_smoke.sh --out "$WORK/smoke" --device "$DEVICE" "${SMOKE[@]}" \
  > "$WORK/smoke.out" 2>&1
say "   exit $? after $(( $(date +%s) - T0 )) s"
tail -25 "$WORK/smoke.out" | sed 's/^/   /' | tee -a "$OUT/summary.txt" > /dev/null
cp "$WORK/smoke/summary.txt" "$OUT/smoke_summary.txt" 2>/dev/null; cp "$WORK/smoke/summary.json" "$OUT/smoke_summary.json" 2>/dev/null

# a scaled-down copy of a grid (experiments/device_check.py prepare), run with --jobs J under a time limit
grid_run() {  # NAME JOBS LIMIT PREPARE-ARGS...
  local name="$1" jobs="$2" limit="$3"; shift 3
  "$PY" -m experiments.device_check prepare "$@" "${TINY[@]}" --work "$WORK" --name "$name" --steps "$STEPS" \
    --sft-steps "$SFT" \
    > /dev/null 2> "$WORK/prepare_$name.log" || { say "   prepare $name failed: $(tail -1 "$WORK/prepare_$name.log")"; return 1; }
  local t=$(date +%s)
  timeout -k 10 "$limit" "$PY" -m experiments.grid run "$WORK/$name/grid.yaml" --jobs "$jobs" --device "$DEVICE" \
    > "$WORK/grid_$name.log" 2>&1
  say "   $name: exit $? in $(( $(date +%s) - t )) s (--jobs $jobs)"
}

P2_END=$(( $(date +%s) + PART2 ))
remaining() { echo $(( P2_END - $(date +%s) )); }
say "== part 2: the CPU grid's settings on this device (limit ${PART2}s)"
grid_run cpu-settings auto $(( PART2 * 60 / 100 )) experiments/grids/cpu.yaml "${SETTINGS[@]}"
for n in $LANES; do
  r=$(remaining); [ "$r" -gt 20 ] || { say "   no time left for $n concurrent runs"; break; }
  grid_run "lanes$n" "$n" "$r" experiments/grids/cpu.yaml --only math_nonsharing_drmas --copies "$n"
done

r=$(left)
if [ "$r" -gt 60 ] && [ "$SCALE" = full ]; then
  say "== part 3: the gpu grid's first steps (limit $(( r - 15 ))s)"
  grid_run gpu-settings auto $(( r - 15 )) experiments/grids/gpu.yaml
else
  say "== part 3 skipped (${r}s left, scale $SCALE)"
fi

say "== report"
"$PY" -m experiments.device_check report --work "$WORK" --cpu-minutes 47.4 --out "$OUT/report.json" 2>&1 \
  | tee -a "$OUT/summary.txt"
say "== total $(( $(date +%s) - T0 )) s"
