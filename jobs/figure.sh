#!/usr/bin/env bash
# Runs the experiments behind a named figure, then its plot script (which reads only HDF5).
#   jobs/figure.sh NAME        -> results/NAME/*.png and the run directories next to it
#   jobs/figure.sh --list
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A experiment plot
# name                experiment                          plot script
experiment[hit-ttft]=experiments/quickstart.toml; plot[hit-ttft]=results/plots/hit_ttft.py

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
run="$out/run-$(date -u +%Y%m%d-%H%M%S)"
jobs/run.sh "${experiment[$name]}" -- --out "$run" "$@"
/usr/bin/python3 "${plot[$name]}" "$run" "$out/$name.png"
echo "# figure: $out/$name.png (from $run/run.h5)"
