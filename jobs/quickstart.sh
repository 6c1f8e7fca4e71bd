#!/usr/bin/env bash
# Set-up, then an 8-rank run (TP2 x CP2 x PP2) of experiments/quickstart.toml; prints the run's
# summary and where its trace is (results/quickstart/<seed>-<UTC time>/). Extra arguments go to
# `kvgrid run` (e.g. --seed 7, --set cache.device_pages=256).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs/setup.sh
. jobs/env.sh
log=$(mktemp /tmp/kvgrid-quickstart.XXXXXX)
trap 'rm -f "$log"' EXIT
set +e
mpirun -np 8 build/kvgrid run experiments/quickstart.toml "$@" | tee "$log"
rc=${PIPESTATUS[0]}
set -e
run=$(sed -n 's|^# trace \(.*\)/run\.h5$|\1|p' "$log")
if [ -n "$run" ] && [ -f "$run/run.h5" ]; then
  echo
  build/kvgrid report "$run"
  echo "# trace: $run/run.h5  (h5py, or: build/kvgrid report $run, build/kvgrid check $run)"
fi
exit "$rc"
