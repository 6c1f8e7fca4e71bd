#!/usr/bin/env bash
# Systematic exploration of every protocol with a buggy variant: the buggy variant's minimal
# counterexample, then the correct variant over every schedule within the bound (docs/exploration.md).
#   jobs/explore.sh [--bound N] [--only pp_sync,tp_sync,...] [--markdown FILE] [--deadline S]
# Exit 0: every correct variant clean and every buggy variant found; 1 otherwise; 2 on bad arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x "${KVGRID_BIN:-build/kvgrid}" ]; then
  [ -z "${KVGRID_BIN:-}" ] || { echo "jobs/explore.sh: KVGRID_BIN=$KVGRID_BIN is not an executable" >&2; exit 2; }
  jobs/setup.sh
fi
exec /usr/bin/python3 jobs/explore.py "$@"
