#!/usr/bin/env bash
# Every shipped experiment with a storage tier, run with cache.storage = redis on a private server
# (jobs/redis.sh), and the same experiment on the file backend: each must end OK with the oracle
# OK, and — a private server that never evicts holds exactly what a private directory holds — take
# the same decisions (equal decision-log digests). buckets.toml (two jobs at once) and the slow
# Figure 4 pair (urc_*) are left out unless named.
#   jobs/redis_experiments.sh [EXPERIMENT...]     (default: hybrid_storage hybrid_unified multiturn_tiers pp_sync spec_draft unified_layout)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/kvgrid ] || jobs/setup.sh
. jobs/env.sh
exps=("$@")
[ ${#exps[@]} -gt 0 ] || exps=(hybrid_storage hybrid_unified multiturn_tiers pp_sync spec_draft unified_layout)
read -r url dir < <(jobs/redis.sh start)
trap 'jobs/redis.sh stop "$dir"' EXIT
out=$(mktemp -d -t kvgrid-redis-exp-XXXXXX)
failed=0
digest() { grep -oE 'digest 0x[0-9a-f]+ on every rank' "$1" | head -1 | awk '{print $2}'; }
for e in "${exps[@]}"; do
  f=experiments/$e.toml
  np=$(build/kvgrid run "$f" --world-size)
  mpirun -np "$np" build/kvgrid run "$f" -q --out "$out/$e-redis" --set cache.storage=redis --set cache.storage_url="$url" >"$out/$e-redis.log" 2>&1 || true
  mpirun -np "$np" build/kvgrid run "$f" -q --out "$out/$e-file" >"$out/$e-file.log" 2>&1 || true
  r=$(digest "$out/$e-redis.log"); fl=$(digest "$out/$e-file.log")
  if grep -q "# verdict: OK" "$out/$e-redis.log" && grep -q "# oracle mismatches: 0 OK" "$out/$e-redis.log" && [ -n "$r" ] && [ "$r" = "$fl" ]; then
    echo "ok      $e  ($np ranks, digest $r on both backends)"
  else
    echo "FAILED  $e  (redis digest ${r:-none}, file ${fl:-none}; logs in $out)"
    failed=$((failed + 1))
  fi
done
echo "# experiments ${#exps[@]}, failed $failed"
[ "$failed" -eq 0 ]
