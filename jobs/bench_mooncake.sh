#!/usr/bin/env bash
# The README's serving benchmark: the whole Mooncake trace (3,993 requests, 61.2M prompt tokens)
# in digest mode at TP2 x CP2 x PP2 (8 ranks), 8 layers, 4 KV heads, page 64, device tier only;
# then a 1-rank replay with an unbounded cache, one request at a time, whose hit rate must equal
# the trace's ideal prefix hit rate (computed by a separate helper, tests/mpi/ideal_hit.hpp).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs/setup.sh >/dev/null
. jobs/env.sh
out="results/bench/mooncake-$(date -u +%Y%m%d-%H%M%S)"
mkdir -p results/bench
start=$(date +%s.%N)
mpirun -np 8 build/kvgrid run experiments/mooncake_replay.toml --out "$out" "$@" | grep -E "^# (steps|requests|oracle|rank div|verdict)"
end=$(date +%s.%N)
/usr/bin/python3 - "$out" "$start" "$end" <<'PY'
import json, subprocess, sys
out, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
j = json.loads(subprocess.run(["build/kvgrid", "report", out, "--json"], capture_output=True, text=True, check=True).stdout)
wall = end - start
print(f"# mooncake replay: {j['finished']} requests, {j['prompt_tokens']} prompt tokens, wall {wall:.1f} s "
      f"(loop {j['wall_s']:.1f} s), {j['prompt_tokens'] / wall / 1e6:.2f} M prompt tokens/s, "
      f"device hit rate {100 * j['hit_rate']['device']:.2f}%")
PY
echo "# ideal-hit check (1 rank, unbounded cache, serial):"
KVGRID_IDEAL_FIRST_N=0 mpirun -np 1 build/tests/kvgrid_mpi_tests --gtest_filter='*IdealPrefixHitRate*' | grep -E "ideal hit|OK|FAILED"
