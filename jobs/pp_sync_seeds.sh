#!/usr/bin/env bash
# protocol.pp_sync and prefetch_consensus over many seeds × faults (transfer.delay, p2p.delay,
# storage.read.slow, storage.read.fail) at PP 2 and PP 4: the MPI test with 50 seeds per case at
# every rank count (the test suite runs 50 at PP 2 and fewer at PP 4).
#   jobs/pp_sync_seeds.sh [SEEDS]      (default 50)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/tests/kvgrid_mpi_tests ] || jobs/setup.sh >/dev/null
. jobs/env.sh
for np in 2 4; do
  echo "# PP $np ($np ranks)"
  KVGRID_PP_SYNC_SEEDS=${1:-50} mpirun -np "$np" -x KVGRID_PP_SYNC_SEEDS build/tests/kvgrid_mpi_tests \
    --gtest_filter='PpSync.HostTierAcrossStagesAgreesOverManySeedsAndFaults' | grep -E "pp_sync \]|OK|FAILED"
done
