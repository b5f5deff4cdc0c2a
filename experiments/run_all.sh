#!/usr/bin/env bash
# The main job: regenerate the suite's results on this machine (default: CPU scale, the embedded default).
#   bash experiments/run_all.sh [--scale cpu|gpu|paper] [--only STAGE[,STAGE...]] [--seeds N] [--runs PATTERN]
#                               [--jobs auto|N] [--device auto|cpu|cuda] [--stale error|rerun|keep] [--rebuild-bases]
# Stages: bench, theory, train (at CPU scale first the mechanism sweep experiments/grids/mechanism.yaml, then the
# grid experiments/grids/<scale>.yaml), analysis. Not in the default run, only when named in --only: stability (the
# long-horizon stability grids, docs/stability.md: per system, search then math, its GRPO pilot, then
# experiments/grids/stability{,_math}.yaml, then python -m analysis.stability; 2 x 3 x 3 runs of 150 steps each; then the
# confirmatory round experiments/grids/stability_confirm.yaml, 48 runs of 200 steps).
# Sets up the environment itself (idempotent). Resumable: complete
# runs are skipped, interrupted runs resume from their checkpoint. The SFT'd base checkpoints of the CPU grid are
# shipped in results/sft/ (this scale's "pre-trained models"; results/sft/bases.json says how they were made).
# On a fresh clone every run is committed: they are reused and only the analysis is rebuilt (~1 min); the end says
# what was computed and what reused, and each claim's verdict (details: results/REPORT.md).
#   --seeds N      seeds per grid entry (default: the grid's own; the CPU grid: 3, math 4, single agent fewer)
#   --runs PATTERN only runs whose names match (fnmatch, comma-separated), e.g. 'math_*'
#   --jobs N       runs at a time (default auto: one per CPU core, one torch thread each; on a GPU machine
#                  several runs share each GPU, experiments/grid.py auto_jobs)
#   --device D     where the runs train (default auto: a GPU when torch sees one, else the CPU; same grid and
#                  result semantics either way); the device is printed before the grid starts
#   --scale gpu    the one-GPU grid (experiments/grids/gpu.yaml: 12.8M models, paper batch, 4 seeds, ~40 min)
#   --stale MODE   run folders made with another config than the YAML gives now: stop and list them (error,
#                  default), move them aside to <run>.stale-<k> and run again (rerun), or use them (keep)
#   --rebuild-bases  move the shipped base checkpoints (results/sft) aside to results/sft.old-<time> and SFT them
#                  again from scratch before the grid (the search bases: 43 min on 2 cores; runs made from the old bases are kept:
#                  delete results/runs/<grid> to redo them); results/sft/bases.json is then written anew
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SCALE=cpu
ONLY=""
SEEDS=""
RUNS=""
JOBS=auto
DEVICE=auto
STALE=error
REBUILD=0
while [ $# -gt 0 ]; do
  case "$1" in
    --scale) SCALE="$2"; shift 2 ;;
    --only) ONLY="$2"; shift 2 ;;
    --seeds) SEEDS="$2"; shift 2 ;;
    --runs) RUNS="$2"; shift 2 ;;
    --jobs) JOBS="$2"; shift 2 ;;
    --device) DEVICE="$2"; shift 2 ;;
    --stale) STALE="$2"; shift 2 ;;
    --rebuild-bases) REBUILD=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "run_all.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$SCALE" in cpu|gpu|paper) ;; *) echo "run_all.sh: --scale must be cpu, gpu or paper, got '$SCALE'" >&2; exit 2 ;; esac
case "$DEVICE" in auto|cpu|cuda) ;; *) echo "run_all.sh: --device must be auto, cpu or cuda, got '$DEVICE'" >&2; exit 2 ;; esac
bash "$ROOT/scripts/setup_env.sh"
PY="$ROOT/.venv/bin/python"
cd "$ROOT"
export PYTHONHASHSEED=0

want() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }
asked() { [[ ",$ONLY," == *",$1,"* ]]; }  # stages outside the default run
stage() { echo; echo "==== [run_all] stage: $1 ($(date +%H:%M:%S))"; }
SUMMARY="$(mktemp -d)"  # what each stage computed or reused, and the claims: printed at the end
trap 'rm -rf "$SUMMARY"' EXIT
note() { echo "$1" >> "$SUMMARY/runs.txt"; }

done_already() { echo "[run_all] $1 exists: stage complete, skipped (delete it to redo the stage)"; note "$2 reused"; }

if want bench; then
  stage "bench: vectorized advantages vs per-row loops (ratios measured in this run)"
  if [ -s results/bench/advantages.txt ]; then done_already results/bench/advantages.txt bench; else
    mkdir -p results/bench
    "$PY" benchmarks/bench_advantages.py > results/bench/advantages.txt.tmp
    mv results/bench/advantages.txt.tmp results/bench/advantages.txt && cat results/bench/advantages.txt
    note "bench computed"
  fi
fi
if want theory; then
  stage "theory: Lemma 4.2 / Proposition 4.3 checks"
  if [ -s results/theory/summary.md ]; then done_already results/theory/summary.md theory; else
    "$PY" -m analysis.theory --out results/theory
    note "theory computed"
  fi
fi
GRID="experiments/grids/$SCALE.yaml"
MECH="experiments/grids/mechanism.yaml"
out_dir() { grep '^out_dir:' "$1" | cut -d' ' -f2; }
if [ "$REBUILD" = 1 ] && [ -d results/sft ]; then
  aside="results/sft.old-$(date +%Y%m%d-%H%M%S)"
  echo "[run_all] --rebuild-bases: moving results/sft aside to $aside; the warm-up SFTs every base again"
  mv results/sft "$aside"
fi
if want train; then
  echo "[run_all] device: $("$PY" -m drmas.devices "$DEVICE") (--device $DEVICE)"
  if [ "$SCALE" = cpu ] && [ -z "$RUNS" ]; then  # first: it is short and it is the test of the mechanism (claim a)
    stage "train: the mechanism sweep ($MECH): retrieval-miss rate x estimator x seed, short runs without evaluation"
    "$PY" -m experiments.grid run "$MECH" --jobs "$JOBS" --device "$DEVICE" --stale "$STALE" --summary "$SUMMARY/grids.txt"
    stage "train: rollout probes of the search system's outcome structure (experiments/probe_search.py, ~2 min)"
    mkdir -p results/mechanism
    for miss in 0 0.6 0.8 0.9; do  # the levels the grid's miss rate was chosen from (search_base.yaml)
      probe="results/mechanism/probe_miss$miss.json"
      if [ -s "$probe" ]; then done_already "$probe" probe; else
        "$PY" -m experiments.probe_search experiments/configs/cpu/search_base.yaml env.args.miss_rate=$miss \
          train.batch_tasks=8 --steps 4 --grad-samples 40 --out "$probe" > "$probe.log" 2>&1 \
          || { echo "[run_all] probe at miss $miss failed; see $probe.log"; exit 1; }
        note "probe computed"
      fi
    done
  fi
  stage "train: the $SCALE grid ($GRID): SFT warm-up of missing base checkpoints, then every run not yet complete"
  "$PY" -m experiments.grid run "$GRID" --jobs "$JOBS" --device "$DEVICE" --stale "$STALE" ${SEEDS:+--seeds "$SEEDS"} \
    ${RUNS:+--only "$RUNS"} --summary "$SUMMARY/grids.txt"
  if [ "$REBUILD" = 1 ]; then  # the rebuilt bases' hashes and build records (tests/test_mechanism.py checks them)
    "$PY" -m experiments.record_bases --built "$(date +%F); bash experiments/run_all.sh --rebuild-bases; $("$PY" -m drmas.devices "$DEVICE")"
  fi
fi
if asked stability; then
  stage "stability: the GRPO pilot that set the learning rates, then the stability grid (resumable), then its verdicts"
  "$PY" -m experiments.grid run experiments/grids/stability_pilot.yaml --jobs "$JOBS" --device "$DEVICE" --stale "$STALE"
  "$PY" -m experiments.grid run experiments/grids/stability.yaml --jobs "$JOBS" --device "$DEVICE" --stale "$STALE" \
    ${RUNS:+--only "$RUNS"}
  "$PY" -m analysis.stability --runs results/runs/stability --pilot results/runs/stability_pilot --out results/stability \
    --figures paper_figures
  stage "stability, confirmatory round: experiments/grids/stability_confirm.yaml (fresh seeds, rules in docs/stability.md; resumable)"
  "$PY" -m experiments.grid run experiments/grids/stability_confirm.yaml --jobs "$JOBS" --device "$DEVICE" --stale "$STALE" \
    ${RUNS:+--only "$RUNS"}
  "$PY" -m analysis.confirm --runs results/runs/stability_confirm --out results/stability_confirm
  if [ -f experiments/grids/frontier.yaml ]; then  # the frontier round's levels are committed once its pilot is done
    stage "stability, frontier round: experiments/grids/frontier.yaml (pre-registered in docs/frontier.md; resumable)"
    "$PY" -m experiments.grid run experiments/grids/frontier.yaml --jobs "$JOBS" --device "$DEVICE" --stale "$STALE" \
      ${RUNS:+--only "$RUNS"}
    "$PY" -m analysis.frontier --runs results/runs/frontier_pilot --out results/frontier_pilot --pilot
    "$PY" -m analysis.frontier --runs results/runs/frontier --out results/frontier
  fi
  stage "stability, math: its GRPO pilot, then experiments/grids/stability_math.yaml (resumable), then its verdicts"
  "$PY" -m experiments.grid run experiments/grids/stability_math_pilot.yaml --jobs "$JOBS" --device "$DEVICE" --stale "$STALE"
  "$PY" -m experiments.grid run experiments/grids/stability_math.yaml --jobs "$JOBS" --device "$DEVICE" --stale "$STALE" \
    ${RUNS:+--only "$RUNS"}
  "$PY" -m analysis.stability --runs results/runs/stability_math --pilot results/runs/stability_math_pilot \
    --out results/stability_math --figures paper_figures
fi
if want analysis; then
  stage "analysis: tables, figures, statistics and results/REPORT.md from $(out_dir "$GRID")"
  MECH_ARGS=()
  if [ "$SCALE" = cpu ] && [ -f "$(out_dir "$MECH")/index.json" ]; then MECH_ARGS=(--mechanism "$(out_dir "$MECH")"); fi
  STAB_ARGS=()
  if [ "$SCALE" = cpu ]; then
    for grid in results/runs/stability results/runs/stability_math; do
      if [ -f "$grid/index.json" ]; then STAB_ARGS+=("$grid"); fi
    done
    if [ "${#STAB_ARGS[@]}" -gt 0 ]; then STAB_ARGS=(--stability "${STAB_ARGS[@]}"); fi
    if [ -f results/runs/stability_confirm/index.json ]; then STAB_ARGS+=(--confirm results/runs/stability_confirm); fi
    if [ -f results/runs/frontier/index.json ]; then STAB_ARGS+=(--frontier results/runs/frontier); fi
  fi
  "$PY" -m analysis.report --runs "$(out_dir "$GRID")" --out results --figures paper_figures "${MECH_ARGS[@]}" "${STAB_ARGS[@]}" \
    > "$SUMMARY/claims.txt"
fi
echo
echo "==== [run_all] done ($(date +%H:%M:%S))"
if [ -s "$SUMMARY/grids.txt" ]; then
  echo "runs:"; sed 's/^/  /' "$SUMMARY/grids.txt"
  if grep -q " 0 computed now" "$SUMMARY/grids.txt"; then
    echo "  (committed runs are reused; to recompute them, ~52 min on 2 CPU cores: docs/experiments.md, \"What a fresh clone does\")"
  fi
fi
if [ -s "$SUMMARY/runs.txt" ]; then  # e.g. "other outputs: bench reused, probe reused x4, theory reused"
  echo "other outputs: $(sort "$SUMMARY/runs.txt" | uniq -c | awk '{printf "%s%s %s%s", sep, $2, $3, ($1 > 1 ? " x" $1 : ""); sep = ", "}')"
fi
[ -s "$SUMMARY/claims.txt" ] && cat "$SUMMARY/claims.txt"
exit 0
