#!/usr/bin/env bash
# Set-up, then the whole test suite (unit, MPI at 1/2/4/8 ranks, end-to-end CLI, benchmark smoke).
# Set-up (packages, build, the CUDA check build) is timed apart from the suite; the suite fails
# past 10 minutes (it runs in about 4 on 2 cores) and ends with its ten slowest tests.
# Extra arguments go to ctest, e.g. `jobs/test.sh -L quick`. The Slurm tests (label slurm: a
# local one-node cluster, about 2 minutes) are kept out; `jobs/test.sh --slurm` installs Slurm and
# runs them alone (.ci/run does, after the suite).
set -euo pipefail
cd "$(dirname "$0")/.."
setup_start=$(date +%s)
if [ "${1:-}" = "--slurm" ]; then
  shift
  jobs/setup.sh --slurm
  echo "# set-up: $(( $(date +%s) - setup_start )) s"
  . jobs/env.sh
  start=$(date +%s)
  (cd "${KVGRID_BUILD_DIR:-build}" && timeout --signal=TERM 480 ctest --output-on-failure --no-tests=error -L slurm "$@")
  echo "# slurm tests: $(( $(date +%s) - start )) s"
  exit 0
fi
jobs/setup.sh
echo "# set-up: $(( $(date +%s) - setup_start )) s"
. jobs/env.sh
build_dir=${KVGRID_BUILD_DIR:-build}
out=$(mktemp)
# The tests' files (storage objects, traces, runs: many small files) on a RAM file system where one
# has room (4 GiB free), in a directory of this suite's own, removed at the end: opening, renaming
# and removing them on the disk took a quarter of the 8-rank MPI tests' time here. KVGRID_TEST_TMPDIR
# names another place (e.g. a disk, to test there).
tests_tmp=${KVGRID_TEST_TMPDIR:-}
if [ -z "$tests_tmp" ] && [ -d /dev/shm ] && [ -w /dev/shm ] &&
   [ "$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')" -ge $((4 * 1024 * 1024)) ] 2>/dev/null; then
  tests_tmp=/dev/shm
fi
if [ -n "$tests_tmp" ]; then
  TMPDIR=$(mktemp -d "$tests_tmp/kvgrid-test-XXXXXX")
  export TMPDIR
  echo "# test files under $TMPDIR"
fi
trap 'rm -f "$out"; [ -z "$tests_tmp" ] || rm -rf "$TMPDIR"' EXIT
start=$(date +%s)
set +e
# (unit_case: each unit test as its own entry, for ctest -R; the suite runs them in one process, unit_tests)
(cd "$build_dir" && timeout --signal=TERM 600 ctest --output-on-failure -j "$(nproc 2>/dev/null || echo 2)" -LE 'slurm|unit_case' "$@") | tee "$out"
rc=${PIPESTATUS[0]}
set -e
echo "# test suite: $(( $(date +%s) - start )) s"
echo "# slowest tests:"
sed -nE 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) [ .]*[A-Za-z*]+[^0-9]* ([0-9.]+) sec$/\2 \1/p' "$out" | sort -rn |
  awk 'NR <= 10 {printf "#   %8.2f s  %s\n", $1, $2}'  # awk reads it all: no SIGPIPE under pipefail
if [ "$rc" -eq 124 ]; then
  echo "test.sh: the test suite ran past its 10-minute limit" >&2
  exit 1
fi
exit "$rc"
