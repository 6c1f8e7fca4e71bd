#!/usr/bin/env bash
# Set-up, then the whole test suite (unit, MPI at 1/2/4/8 ranks, end-to-end CLI, benchmark smoke).
# Fails if the suite runs past 10 minutes.  Extra arguments go to ctest, e.g. `jobs/test.sh -L quick`.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs/setup.sh
. jobs/env.sh
build_dir=${KVGRID_BUILD_DIR:-build}
start=$(date +%s)
set +e
(cd "$build_dir" && timeout --signal=TERM 600 ctest --output-on-failure -j "$(nproc 2>/dev/null || echo 2)" "$@")
rc=$?
set -e
echo "# test suite: $(( $(date +%s) - start )) s"
if [ "$rc" -eq 124 ]; then
  echo "test.sh: the test suite ran past its 10-minute limit" >&2
  exit 1
fi
exit "$rc"
