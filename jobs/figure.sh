#!/usr/bin/env bash
# Runs the experiments behind a named figure, then its plot script (which reads only HDF5).
#   jobs/figure.sh NAME [kvgrid run args]   -> results/figures/NAME.png and .pdf; runs under results/NAME/
#   jobs/figure.sh --all [kvgrid run args]  -> every figure, one after the other
#   jobs/figure.sh --list
#   jobs/figure.sh NAME --slurm [kvgrid run args]  -> the same, every run a Slurm batch job (a sweep:
#                        one array job) — needs a Slurm (jobs/slurm/cluster.sh start, or a cluster's)
# Extra arguments go to every `kvgrid run` of the figure (e.g. --set ...).
# Environment:
#   KVGRID_BIN           the binary (default build/kvgrid; jobs/run.sh and jobs/sweep.sh read it too)
#   KVGRID_FIGURE_SEEDS  the seeds of every variant of a seeded figure (e.g. 1-5 or 1,4,9); default
#                        1-3 for tiers, spec_draft and pd, 1-50 for the pp_sync sweep
#   KVGRID_FIGURE_DIR    where the images go (default results/figures)
#   KVGRID_FIGURE_RUNS   where the runs go, under NAME/ (default results)
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/.."
declare -A experiment plot
# name                experiment                          plot script
experiment[hit-ttft]=experiments/quickstart.toml; plot[hit-ttft]=results/plots/hit_ttft.py
experiment[tiers]=experiments/multiturn_tiers.toml; plot[tiers]=results/plots/tiers.py
experiment[pp_sync]=experiments/pp_sync.toml; plot[pp_sync]=results/plots/pp_sync.py
experiment[cp_sharding]=experiments/cp_sharding.toml; plot[cp_sharding]=results/plots/cp_sharding.py
experiment[spec_draft]=experiments/spec_draft.toml; plot[spec_draft]=results/plots/spec_draft.py
experiment[pd]=experiments/pd_multiturn.toml; plot[pd]=results/plots/pd.py
experiment[urc_tiers]=experiments/urc_swa.toml; plot[urc_tiers]=results/plots/urc_tiers.py
experiment[sessions]=experiments/agentic_sessions.toml; plot[sessions]=results/plots/sessions.py
order="hit-ttft tiers pp_sync cp_sharding spec_draft pd urc_tiers sessions"
# Seeds of each variant where the figure's claim is statistical (KVGRID_FIGURE_SEEDS overrides);
# the others are one run at the experiment's seed (hit-ttft; cp_sharding replays a recorded trace).
declare -A seeds
seeds[tiers]=1-3
seeds[spec_draft]=1-3
seeds[pd]=1-3
seeds[sessions]=1-3
seeds[pp_sync]=1-50
# Figures drawn from a sweep (jobs/sweep.sh): its axes.
declare -A sweeps
sweeps[pp_sync]="--set protocol.pp_sync=pp_sync,independent_polling --jobs 2"
declare -A sweep_run_args  # kvgrid run arguments of every run of the sweep
sweep_run_args[pp_sync]="--set output.flush_every=1"  # a run stopped by a shape mismatch keeps every step
# Figures drawn from several runs of one experiment: label and the overrides of each run. A label
# LABEL@EXPERIMENT_FILE runs that experiment instead (the plot sees LABEL@<its name>).
declare -A variants
variants[tiers]="device-only:--set cache.storage=none --set cache.host_pages=0
+host:--set cache.storage=none
+storage:"
# Equal device pages per rank, equal host bytes per CP group (sharded: host_pages / CP per rank).
variants[cp_sharding]="replicated:--set cache.cp_sharding=replicated
sharded:--set cache.cp_sharding=sharded --set cache.host_pages=65536"
# The draft's state across the tiers: HiCache off (device only), then the three draft modes.
variants[spec_draft]="hicache-off:--set cache.host_pages=0 --set cache.storage=none --set model.draft.mode=packed
target_only:--set model.draft.mode=target_only
packed:--set model.draft.mode=packed
sidecar:--set model.draft.mode=sidecar"
# The second article's Figure 4 (scaled): two hybrid models, each device only, + host, + storage.
variants[urc_tiers]="device-only@experiments/urc_swa.toml:--set cache.storage=none --set cache.host_pages=0
+host@experiments/urc_swa.toml:--set cache.storage=none
+storage@experiments/urc_swa.toml:
device-only@experiments/urc_all.toml:--set cache.storage=none --set cache.host_pages=0
+host@experiments/urc_all.toml:--set cache.storage=none
+storage@experiments/urc_all.toml:"
# The second article's Figure 6 (scaled): LRU against session-aware eviction per batch size (requests
# running at once = agent sessions active at once).
variants[sessions]="lru-b4:--set cache.eviction=lru --set engine.max_running=4 --set workload.agentic.max_active=4
session-b4:--set cache.eviction=session --set engine.max_running=4 --set workload.agentic.max_active=4
lru-b8:--set cache.eviction=lru --set engine.max_running=8 --set workload.agentic.max_active=8
session-b8:--set cache.eviction=session --set engine.max_running=8 --set workload.agentic.max_active=8
lru-b16:--set cache.eviction=lru --set engine.max_running=16 --set workload.agentic.max_active=16
session-b16:--set cache.eviction=session --set engine.max_running=16 --set workload.agentic.max_active=16"
# P/D: decode-side reuse against the full transfer of every prompt.
variants[pd]="decode_reuse:--set protocol.pd=decode_reuse
full_transfer:--set protocol.pd=full_transfer"

if [ "${1:-}" = "--list" ] || [ $# -lt 1 ]; then
  for n in $order; do echo "$n  ${experiment[$n]}  ${plot[$n]}  seeds ${seeds[$n]:-one run}"; done
  [ $# -ge 1 ] && exit 0 || exit 2
fi
if [ "$1" = "--all" ]; then
  shift
  for n in $order; do
    t0=$SECONDS
    "$self" "$n" "$@"
    echo "# $n: $((SECONDS - t0)) s"
  done
  exit 0
fi
name=$1
shift
sweep_mode=()
if [ "${1:-}" = "--slurm" ]; then
  shift
  export KVGRID_SUBMIT=slurm  # jobs/run.sh submits each run and waits for it
  sweep_mode=(--slurm)
fi
[ -n "${experiment[$name]:-}" ] || { echo "figure.sh: no figure '$name' (jobs/figure.sh --list)" >&2; exit 2; }
bin=${KVGRID_BIN:-build/kvgrid}
if [ ! -x "$bin" ]; then
  [ -z "${KVGRID_BIN:-}" ] || { echo "figure.sh: KVGRID_BIN=$bin is not an executable" >&2; exit 2; }
  jobs/setup.sh
fi
export KVGRID_BIN=$bin
out="${KVGRID_FIGURE_RUNS:-results}/$name"
figdir=${KVGRID_FIGURE_DIR:-results/figures}
mkdir -p "$out" "$figdir"
stamp=$(date -u +%Y%m%d-%H%M%S)
spec=${seeds[$name]:+${KVGRID_FIGURE_SEEDS:-${seeds[$name]}}}
# "1-3,7" -> 1 2 3 7
seed_list() {
  local part a b
  for part in ${1//,/ }; do
    if [[ $part == *-* ]]; then a=${part%-*}; b=${part#*-}; seq "$a" "$b"; else echo "$part"; fi
  done
}
if [ -n "${sweeps[$name]:-}" ]; then
  read -r -a axes <<< "${sweeps[$name]}"
  sweep="$out/sweep-$stamp"
  read -r -a run_args <<< "${sweep_run_args[$name]:-}"
  jobs/sweep.sh "${experiment[$name]}" --seeds "$spec" "${axes[@]}" "${sweep_mode[@]}" --out "$sweep" -- \
    "${run_args[@]}" "$@" < /dev/null
  /usr/bin/python3 "${plot[$name]}" --out "$figdir/$name" "$sweep"
  echo "# figure: $figdir/$name.png and .pdf (from $sweep/sweep.h5)"
  exit 0
fi
if [ -z "${variants[$name]:-}" ]; then
  run="$out/run-$stamp"
  jobs/run.sh "${experiment[$name]}" -- --out "$run" "$@" < /dev/null
  /usr/bin/python3 "${plot[$name]}" --out "$figdir/$name" "$run"
  echo "# figure: $figdir/$name.png and .pdf (from $run/run.h5)"
  exit 0
fi
pairs=()
while IFS= read -r line; do
  label=${line%%:*}
  read -r -a sets <<< "${line#*:}"
  exp=${experiment[$name]}
  if [[ $label == *@* ]]; then
    exp=${label#*@}
    label="${label%%@*}@$(basename "${exp%.toml}")"
  fi
  tag=${label//+/}
  tag=${tag//@/-}
  if [ -z "$spec" ]; then
    run="$out/run-$stamp-$tag"
    jobs/run.sh "$exp" -- --out "$run" "${sets[@]}" "$@" < /dev/null  # mpirun would eat the list
    pairs+=("$label=$run")
    continue
  fi
  for s in $(seed_list "$spec"); do
    run="$out/run-$stamp-$tag-s$s"
    jobs/run.sh "$exp" -- --out "$run" --seed "$s" "${sets[@]}" "$@" < /dev/null
    pairs+=("$label=$run")
  done
done <<< "${variants[$name]}"
/usr/bin/python3 "${plot[$name]}" --out "$figdir/$name" "${pairs[@]}"
echo "# figure: $figdir/$name.png and .pdf (from ${#pairs[@]} runs: ${pairs[*]})"
