#!/usr/bin/env bash
# Runs the experiments behind a named figure, then its plot script (which reads only HDF5).
#   jobs/figure.sh NAME        -> results/NAME/*.png and the run directories next to it
#   jobs/figure.sh --list
# Extra arguments go to every `kvgrid run` of the figure (e.g. --seed 7, --set ...).
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A experiment plot
# name                experiment                          plot script
experiment[hit-ttft]=experiments/quickstart.toml; plot[hit-ttft]=results/plots/hit_ttft.py
experiment[tiers]=experiments/multiturn_tiers.toml; plot[tiers]=results/plots/tiers.py
experiment[pp_sync]=experiments/pp_sync.toml; plot[pp_sync]=results/plots/pp_sync.py
experiment[cp_sharding]=experiments/cp_sharding.toml; plot[cp_sharding]=results/plots/cp_sharding.py
experiment[spec_draft]=experiments/spec_draft.toml; plot[spec_draft]=results/plots/spec_draft.py
experiment[pd]=experiments/pd_multiturn.toml; plot[pd]=results/plots/pd.py
# Figures drawn from a sweep (jobs/sweep.sh): its seeds and axes (KVGRID_FIGURE_SEEDS overrides the seeds).
declare -A sweeps
sweeps[pp_sync]="--set protocol.pp_sync=pp_sync,independent_polling --jobs 2"
declare -A sweep_run_args  # kvgrid run arguments of every run of the sweep
sweep_run_args[pp_sync]="--set output.flush_every=1"  # a run stopped by a shape mismatch keeps every step
# Figures drawn from several runs of one experiment: label and the overrides of each run.
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
# P/D: decode-side reuse against the full transfer of every prompt.
variants[pd]="decode_reuse:--set protocol.pd=decode_reuse
full_transfer:--set protocol.pd=full_transfer"

if [ "${1:-}" = "--list" ] || [ $# -lt 1 ]; then
  for n in "${!experiment[@]}"; do echo "$n  ${experiment[$n]}  ${plot[$n]}"; done
  [ $# -ge 1 ] && exit 0 || exit 2
fi
name=$1
shift
[ -n "${experiment[$name]:-}" ] || { echo "figure.sh: no figure '$name' (jobs/figure.sh --list)" >&2; exit 2; }
[ -x build/kvgrid ] || jobs/setup.sh
out="results/$name"
mkdir -p "$out"
stamp=$(date -u +%Y%m%d-%H%M%S)
if [ -n "${sweeps[$name]:-}" ]; then
  read -r -a axes <<< "${sweeps[$name]}"
  sweep="$out/sweep-$stamp"
  read -r -a run_args <<< "${sweep_run_args[$name]:-}"
  jobs/sweep.sh "${experiment[$name]}" --seeds "${KVGRID_FIGURE_SEEDS:-1-50}" "${axes[@]}" --out "$sweep" -- \
    "${run_args[@]}" "$@" < /dev/null
  /usr/bin/python3 "${plot[$name]}" "$sweep" "$out/$name.png"
  echo "# figure: $out/$name.png (from $sweep/sweep.h5)"
  exit 0
fi
if [ -z "${variants[$name]:-}" ]; then
  run="$out/run-$stamp"
  jobs/run.sh "${experiment[$name]}" -- --out "$run" "$@"
  /usr/bin/python3 "${plot[$name]}" "$run" "$out/$name.png"
  echo "# figure: $out/$name.png (from $run/run.h5)"
  exit 0
fi
pairs=()
while IFS= read -r line; do
  label=${line%%:*}
  read -r -a sets <<< "${line#*:}"
  run="$out/run-$stamp-${label//+/}"
  jobs/run.sh "${experiment[$name]}" -- --out "$run" "${sets[@]}" "$@" < /dev/null  # mpirun would eat the list
  pairs+=("$label=$run")
done <<< "${variants[$name]}"
/usr/bin/python3 "${plot[$name]}" "$out/$name.png" "${pairs[@]}"
echo "# figure: $out/$name.png (from ${pairs[*]})"
