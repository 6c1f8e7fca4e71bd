#!/usr/bin/env bash
# Replay speed (docs/performance.md "Replay speed"): experiments/policy_sim.toml — the
# configuration of SGLang's standalone HiCache policy simulator on the Mooncake synthetic trace
# (1 rank, page 512, L1 = device, L2 = host, write-through) — at the three L1/L2 capacities the
# docs compare, REPEAT runs each (median), with engine.decode = step and = fused (and fused without
# engine.helper_thread), printing kvgrid's hit rates in page units, wall time and prompt pages per
# second next to the simulator's; then the cost of one decode step (step and fused, on a trace of
# 200 requests decoding 3,000 tokens each); then the 8-rank replay (experiments/mooncake_replay.toml)
# once.
#
#   jobs/bench_replay.sh [--repeat N] [--baseline REV] [--no-8rank]
#
# --baseline REV builds commit REV in a worktree (results/bench/baseline-REV) and runs the same
# commands with it, alternating with this tree's build run by run, so both see the same machine.
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=3 baseline="" eight=1
while [ $# -gt 0 ]; do
  case "$1" in
    --repeat) repeat="$2"; shift 2 ;;
    --baseline) baseline="$2"; shift 2 ;;
    --no-8rank) eight=0; shift ;;
    *) echo "bench_replay: unknown argument '$1' (--repeat N, --baseline REV, --no-8rank)" >&2; exit 2 ;;
  esac
done
jobs/setup.sh >/dev/null
. jobs/env.sh
# Each entry: a build, its name, the directory of the experiments it runs (its own tree's) and the
# settings it adds. This tree runs three times: engine.decode = step and = fused (policy_sim as
# shipped: with engine.helper_thread), and fused without the helper thread (one core's work).
bins=("build/kvgrid" "build/kvgrid" "build/kvgrid")
names=("this tree" "this tree, fused" "fused, no helper")
exps=("experiments" "experiments" "experiments")
extra=("" "--set engine.decode=fused" "--set engine.decode=fused --set engine.helper_thread=false")
if [ -n "$baseline" ]; then
  rev=$(git rev-parse --short "$baseline")
  wt="results/bench/baseline-$rev"
  if [ ! -x "$wt/build/kvgrid" ]; then
    mkdir -p results/bench
    [ -d "$wt" ] || git worktree add -f "$wt" "$rev" >/dev/null
    (cd "$wt" && KVGRID_CUDA_CHECK=0 jobs/setup.sh >/dev/null)
  fi
  bins+=("$wt/build/kvgrid")
  names+=("baseline $rev")
  exps+=("$wt/experiments")
  extra+=("")
fi
out=$(mktemp -d /tmp/kvgrid-bench-replay.XXXXXX)
trap 'rm -rf "$out"' EXIT
pages=121877  # the trace's prompt pages of 512 tokens (sum of ceil(input_length / 512))

# One run: prints "wall_s loop_s l1 l1l2" (hit rates in page units).
one() {
  local bin="$1" np="$2" exp="$3"; shift 3
  rm -rf "$out/run"
  local t0 t1
  t0=$(date +%s.%N)
  mpirun -np "$np" "$bin" run "$exp" --out "$out/run" "$@" >"$out/log" 2>&1 || { tail -20 "$out/log" >&2; exit 1; }
  t1=$(date +%s.%N)
  "$bin" report "$out/run" --json | /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin); c = j["cached_tokens"]; t0, t1, pages = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
l1 = c["device"] / 512 / pages; l2 = (c["device"] + c["host"]) / 512 / pages
print("%.3f %.3f %.4f %.4f" % (t1 - t0, j["wall_s"], l1, l2))' "$t0" "$t1" "$pages"
}

median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

# SGLang's hicache_policy_simulator.py on the same trace at each capacity, pages per second, as
# measured for issue "Replay speed" (another machine; the simulator is not part of kvgrid).
declare -A sim=([2000]=63400 [5000]=75100 [20000]=117900)
echo "# policy_sim (1 rank, page 512, write-through, one request at a time), $repeat runs each, median wall"
echo "# of the whole process; x sim: pages/s over the simulator's (63.4K, 75.1K, 117.9K pages/s at the three capacities)"
printf "# %-18s %-11s %8s %8s %8s %10s %7s\n" "build" "L1/L2" "L1 hit" "L1+L2" "wall s" "pages/s" "x sim"
for cap in "2000 8000" "5000 20000" "20000 80000"; do
  set -- $cap
  declare -A walls=()
  declare -A hits=()
  for ((k = 0; k < repeat; ++k)); do
    for i in "${!bins[@]}"; do
      # shellcheck disable=SC2086  # (extra: words)
      read -r wall loop l1 l2 < <(one "${bins[$i]}" 1 "${exps[$i]}/policy_sim.toml" --set "cache.device_pages=$1" \
                                  --set "cache.host_pages=$2" ${extra[$i]})
      walls[$i]+="$wall "
      hits[$i]="$l1 $l2"
    done
  done
  for i in "${!bins[@]}"; do
    w=$(tr ' ' '\n' <<<"${walls[$i]}" | grep . | median)
    read -r l1 l2 <<<"${hits[$i]}"
    printf "  %-18s %-11s %8s %8s %8.2f %10.0f %7.2f\n" "${names[$i]}" "$1/$2" "$l1" "$l2" "$w" \
      "$(awk "BEGIN {print $pages / $w}")" "$(awk "BEGIN {print $pages / $w / ${sim[$1]}}")"
  done
  unset walls hits
done
# Per decode step (the issue's per-token targets): policy_sim on the trace's first 200 requests
# with 3,000 output tokens each, minus the same requests with one output token (no decode step),
# divided by the 599,800 decode steps; the serving loop's wall time, helper threads off (a decode
# step has nothing for them), the periodic check every 4,096 steps included; median of REPEAT runs.
/usr/bin/python3 - experiments/traces/mooncake_synthetic_trace.jsonl "$out/decode.jsonl" "$out/prefill.jsonl" <<'PY'
import json, sys
src, dec, pre = sys.argv[1:4]
with open(src) as f, open(dec, "w") as d, open(pre, "w") as p:
    for i, line in enumerate(f):
        if i == 200:
            break
        j = json.loads(line)
        for out_len, o in ((3000, d), (1, p)):
            j["output_length"] = out_len
            o.write(json.dumps(j) + "\n")
PY
echo "# per decode step: policy_sim, first 200 requests, (loop with 3,000 output tokens - loop with 1) / 599,800 steps,"
echo "# helper threads off, median of $repeat runs"
for mode in step fused; do
  declare -A dl=() pl=()
  for ((k = 0; k < repeat; ++k)); do
    for i in "${!bins[@]}"; do
      [ "${names[$i]}" = "this tree" ] || [[ "${names[$i]}" == baseline* ]] || continue
      for t in decode prefill; do
        read -r wall loop l1 l2 < <(one "${bins[$i]}" 1 "${exps[$i]}/policy_sim.toml" --set "workload.mooncake.trace=$out/$t.jsonl" \
                                    --set "engine.decode=$mode" --set engine.helper_thread=false)
        if [ "$t" = decode ]; then dl[$i]+="$loop "; else pl[$i]+="$loop "; fi
      done
    done
  done
  for i in "${!bins[@]}"; do
    [ -n "${dl[$i]:-}" ] || continue
    d=$(tr ' ' '\n' <<<"${dl[$i]}" | grep . | median)
    p=$(tr ' ' '\n' <<<"${pl[$i]}" | grep . | median)
    printf "  %-18s %-6s loop %.3f s - %.3f s: %.3f us per step\n" "${names[$i]}" "$mode" "$d" "$p" \
      "$(awk "BEGIN {print ($d - $p) / 599800 * 1e6}")"
  done
  unset dl pl
done
if [ "$eight" = 1 ]; then
  echo "# mooncake_replay (8 ranks, TP2 x CP2 x PP2), one run each"
  for i in "${!bins[@]}"; do
    [ -n "${extra[$i]}" ] && continue  # (fused runs on one rank only)
    read -r wall loop l1 l2 < <(one "${bins[$i]}" 8 "${exps[$i]}/mooncake_replay.toml")
    printf "  %-18s wall %8.1f s (loop %.1f s)\n" "${names[$i]}" "$wall" "$loop"
  done
fi
