#!/usr/bin/env bash
# Runs an experiment over seeds and variants and writes a sweep table.
#   jobs/sweep.sh EXPERIMENT.toml --seeds 1-20 [--set key=v1,v2 ...] [--out DIR] [-- kvgrid args]
# Every combination of the comma-separated --set values runs once per seed (one run directory
# each, under DIR, default results/sweeps/<experiment>-<UTC time>/); DIR/sweep.csv gets one row per
# run (variant, seed, exit code, verdict, oracle mismatches, divergences, hit rate, modelled TTFT
# p50, wall seconds) and a per-variant summary is printed. Under Slurm, submit it inside an
# allocation (jobs/slurm.sbatch); each run uses jobs/run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/kvgrid ] || jobs/setup.sh
exec /usr/bin/python3 jobs/sweep.py "$@"
