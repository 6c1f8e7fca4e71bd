#!/usr/bin/env bash
# The combination sweep: every pair of features (tiers, CP sharding, PP, P/D, draft, hybrid; each alone on
# the diagonal) over experiments/combinations.toml at 4 and 8 ranks, under sets of failpoints and
# seeds, then each buggy protocol variant in every cell where it is active.
#   jobs/combinations.sh [--ranks 4,8] [--seeds 1-3] [--cells tiers+pp,...] [--faults none,copies,storage,requests,pd]
#                        [--bugs ...] [--out DIR] [--jobs N] [--deadline S] [--markdown FILE] [--smoke] [--golden FILE]
# Writes DIR/sweep.csv and DIR/sweep.h5 (jobs/sweep.sh's table, one row per run; default DIR
# results/combinations/sweep-<UTC time>/) and prints the summary matrix (runs failed per cell), the
# cells where each buggy variant was caught and by what, and the failpoints that never fired.
# Exit 0: every correct run OK and every buggy variant caught in every cell where it is active;
# 1 otherwise; 2 on bad arguments. The full sweep (457 runs) takes about 9 minutes here (2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x "${KVGRID_BIN:-build/kvgrid}" ]; then
  [ -z "${KVGRID_BIN:-}" ] || { echo "jobs/combinations.sh: KVGRID_BIN=$KVGRID_BIN is not an executable" >&2; exit 2; }
  jobs/setup.sh
fi
exec /usr/bin/python3 jobs/combinations.py "$@"
