#!/usr/bin/env bash
# The MPI tests' seed sweeps, at more seeds than the test suite runs (the suite: 3 per case, fewer
# on 4 and 8 oversubscribed ranks). Each named test loops its cases × seeds inside one mpirun:
#   PpSync.HostTierAcrossStagesAgreesOverManySeedsAndFaults   pp_sync + prefetch_consensus, 12 fault cases, PP 2 / PP 4
#   Storage.*                                                 every storage/transfer/allocation failpoint, aborts, per_rank caught
#   LoadBack.FailedLoadBacksAreRecomputedAtEveryLayout        transfer.load.fail (+ aborts) at every layout of the world
#   HybridHost.* / HybridStorage.*                             hybrid models (FULL + SWA + MAMBA) with host and storage
#                                                             tiers, every tier failpoint, at every layout of the world
#   Pd.HybridModels* / SpecDraft.HybridTargets*               hybrid P/D and speculative decoding under their faults
#   jobs/mpi_seeds.sh [SEEDS] [RANKS...]     (default: 20 seeds at 2 and 4 ranks)
# Exit status non-zero when any case fails.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/tests/kvgrid_mpi_tests ] || jobs/setup.sh >/dev/null
. jobs/env.sh
seeds=${1:-20}
shift || true
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(2 4)
filter='PpSync.HostTierAcrossStagesAgreesOverManySeedsAndFaults:Storage.*:LoadBack.FailedLoadBacksAreRecomputedAtEveryLayout:HybridHost.*:HybridStorage.*:Pd.HybridModels*:SpecDraft.HybridTargets*:Sessions.*'
rc=0
for np in "${ranks[@]}"; do
  echo "# $np ranks, $seeds seeds per case"
  start=$(date +%s)
  KVGRID_SEEDS=$seeds mpirun -np "$np" -x KVGRID_SEEDS build/tests/kvgrid_mpi_tests --gtest_filter="$filter" --gtest_color=no \
    | grep -E "^\[ (pp_sync|storage|storage faults|load_back|hybrid host|hybrid storage|sessions) \]|OK \]|FAILED" || rc=1
  echo "# $np ranks: $(( $(date +%s) - start )) s"
done
exit "$rc"
