#!/usr/bin/env bash
# Runs an experiment over seeds and variants and writes a sweep table.
#   jobs/sweep.sh EXPERIMENT.toml --seeds 1-20 [--set key=v1,v2 ...] [--out DIR] [--jobs N] [--slurm] [-- kvgrid args]
# Every combination of the comma-separated --set values runs once per seed, N at a time (one run
# directory each, under DIR, default results/<experiment>/sweep-<UTC time>/); DIR/sweep.csv and
# DIR/sweep.h5 (group /runs, one dataset per column) get one row per run: variant, seed, exit code,
# verdict, oracle mismatches, divergences, faults injected, failed requests, hit rate, modelled
# TTFT p50, first divergence (from `kvgrid check`, for runs that failed), wall seconds, run
# directory; a per-variant summary is printed. --slurm writes DIR/sweep.sbatch (a Slurm array,
# one task per run) and DIR/runs.txt instead of running. KVGRID_BIN names the binary (default
# build/kvgrid, built by jobs/setup.sh when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x "${KVGRID_BIN:-build/kvgrid}" ]; then
  [ -z "${KVGRID_BIN:-}" ] || { echo "jobs/sweep.sh: KVGRID_BIN=$KVGRID_BIN is not an executable" >&2; exit 2; }
  jobs/setup.sh
fi
exec /usr/bin/python3 jobs/sweep.py "$@"
