#!/usr/bin/env bash
# Runs an experiment with the rank count its topology needs.
#   jobs/run.sh EXPERIMENT.toml [mpirun args...] [-- kvgrid run args...]
# e.g. jobs/run.sh experiments/quickstart.toml -- --seed 7 --set cache.device_pages=512
# Inside a Slurm allocation (SLURM_JOB_ID set) it launches with `srun --mpi=pmix` (PMIx v4, which
# Debian's Slurm and Open MPI share; KVGRID_SRUN_MPI overrides) instead of mpirun. With
# KVGRID_SUBMIT=slurm and no allocation it submits itself as a batch job (jobs/slurm.sbatch with
# --ntasks = the world size, --time = KVGRID_SLURM_TIME minutes, default 30), waits for it and
# exits with its exit code; the run directory is where a local run would leave it. KVGRID_BIN
# names the binary (default build/kvgrid, built by jobs/setup.sh when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: jobs/run.sh EXPERIMENT.toml [mpirun args] [-- kvgrid args]" >&2; exit 2; }
exp=$1
shift
launcher_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do launcher_args+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
bin=${KVGRID_BIN:-build/kvgrid}
if [ ! -x "$bin" ]; then
  [ -z "${KVGRID_BIN:-}" ] || { echo "jobs/run.sh: KVGRID_BIN=$bin is not an executable" >&2; exit 2; }
  jobs/setup.sh
fi
. jobs/env.sh
np=$("$bin" run "$exp" --world-size "$@")
if [ -n "${SLURM_JOB_ID:-}" ]; then
  exec srun --mpi="${KVGRID_SRUN_MPI:-pmix}" -n "$np" "${launcher_args[@]}" "$bin" run "$exp" "$@"
fi
if [ "${KVGRID_SUBMIT:-}" = slurm ]; then
  mkdir -p results
  exec sbatch --wait --quiet --ntasks="$np" --time="${KVGRID_SLURM_TIME:-30}" \
    --output="${KVGRID_SLURM_LOG:-results/slurm-%j.out}" jobs/slurm.sbatch "$exp" "${launcher_args[@]}" -- "$@"
fi
exec mpirun -np "$np" "${launcher_args[@]}" "$bin" run "$exp" "$@"
