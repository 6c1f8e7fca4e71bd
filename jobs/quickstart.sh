#!/usr/bin/env bash
# Set-up, then an 8-rank run (TP2 x CP2 x PP2) of experiments/quickstart.toml; prints the run's
# summary and where its trace is. Extra arguments go to `kvgrid run` (e.g. --seed 7).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs/setup.sh
. jobs/env.sh
out="results/quickstart/$(date -u +%Y%m%d-%H%M%S)"
mkdir -p results/quickstart
set +e
mpirun -np 8 build/kvgrid run experiments/quickstart.toml --out "$out" "$@"
rc=$?
set -e
if [ -f "$out/run.h5" ]; then
  echo
  build/kvgrid report "$out"
  echo "# trace: $out/run.h5  (read it with h5py, or: build/kvgrid report|check $out)"
fi
exit "$rc"
