#!/usr/bin/env bash
# Runs an experiment over seeds and variants and writes a sweep table.
#   jobs/sweep.sh EXPERIMENT.toml --seeds 1-20 [--set key=v1,v2 ...] [--out DIR] [--jobs N] [--slurm | --slurm-script] [-- kvgrid args]
# Every combination of the comma-separated --set values runs once per seed, N at a time (one run
# directory each, under DIR, default results/<experiment>/sweep-<UTC time>/); DIR/sweep.csv and
# DIR/sweep.h5 (group /runs, one dataset per column) get one row per run: variant, seed, exit code,
# verdict, oracle mismatches, divergences, faults injected, failed requests, hit rate, modelled
# TTFT p50, first divergence (from `kvgrid check`, for runs that failed), wall seconds, run
# directory; a per-variant summary is printed. --slurm runs the sweep as a Slurm array job (one
# task per run, --jobs N at a time, --slurm-time M minutes each): it submits DIR/sweep.sbatch,
# waits, and collects every task's run into the same table (a task Slurm killed at its time limit
# is `timed out`, exit 124; failed tasks are named with their Slurm log). --slurm-script only
# writes DIR/sweep.sbatch and DIR/runs.txt. KVGRID_BIN names the binary (default build/kvgrid,
# built by jobs/setup.sh when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x "${KVGRID_BIN:-build/kvgrid}" ]; then
  [ -z "${KVGRID_BIN:-}" ] || { echo "jobs/sweep.sh: KVGRID_BIN=$KVGRID_BIN is not an executable" >&2; exit 2; }
  jobs/setup.sh
fi
exec /usr/bin/python3 jobs/sweep.py "$@"
