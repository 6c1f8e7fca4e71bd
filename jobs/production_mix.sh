#!/usr/bin/env bash
# The production mix (docs/performance.md "The production mix"): experiments/production_mix.toml
# at 8 ranks — P/D with CP-sharded PP2 prefill and TP2 x PP2 decode, an MTP-style draft, host and
# storage tiers, 512-token pages, 30M prompt tokens of long multi-turn prompts and one 1M-token
# request, every tier, transfer and P/D failpoint at a low probability. Reports wall time, peak
# RSS per rank, the modelled TTFT and throughput, the digest mode's memory per cached token, and
# whether the 1M-token request finished; writes a Perfetto timeline of a step window and of every
# 16th step. Fails (exit 1) when a bound does not hold: oracle or ranks not OK, the huge request
# not finished (at another seed an injected abort or broken transfer may fail it: the line names
# the fault), over 6 minutes of wall time or 1.5 GiB of peak RSS on a rank.
#
#   jobs/production_mix.sh [--total TOKENS --huge TOKENS] [--seed N] [--out DIR]
#
# --total/--huge: a smaller mix (a trace generated into the run directory by
# jobs/production_mix_trace.py; the test suite's smoke runs 2M tokens with a 200K request).
set -euo pipefail
cd "$(dirname "$0")/.."
total="" huge=1000000 seed=1 out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --total) total="$2"; shift 2 ;;
    --huge) huge="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "production_mix: unknown argument '$1' (--total N, --huge N, --seed N, --out DIR)" >&2; exit 2 ;;
  esac
done
bin=${KVGRID_BIN:-build/kvgrid}
[ -x "$bin" ] || jobs/setup.sh >/dev/null
. jobs/env.sh
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1} OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}  # one node: shared memory
out=${out:-results/production_mix/$(date +%Y%m%d-%H%M%S)}
[ ! -e "$out" ] || { echo "production_mix: $out already exists" >&2; exit 2; }
mkdir -p "$out"
sets=()
if [ -n "$total" ]; then
  /usr/bin/python3 jobs/production_mix_trace.py --out "$out/trace.jsonl" --total "$total" --huge "$huge"
  sets+=(--set "workload.mooncake.trace=$(realpath "$out/trace.jsonl")")
fi
np=$("$bin" run experiments/production_mix.toml --world-size)
start=$(date +%s.%N)
set +e
# each rank under /usr/bin/time: its peak RSS into rss.<world rank>
"${MPIEXEC:-mpirun}" -np "$np" bash -c '/usr/bin/time -f "# peak RSS %M KB" -o "$0/rss.$OMPI_COMM_WORLD_RANK" "$@"' "$out" \
  "$bin" run experiments/production_mix.toml --seed "$seed" --out "$out/run" "${sets[@]}" > "$out/run.log" 2>&1
rc=$?
set -e
wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.2f", b - a}')
tail -12 "$out/run.log"
[ "$rc" -eq 0 ] || { echo "production_mix: the run exited $rc (log: $out/run.log)" >&2; exit 1; }
steps=$(sed -nE 's/^# steps ([0-9]+),.*/\1/p' "$out/run.log")
from=$(( steps / 2 )); to=$(( steps / 2 + 100 ))
"$bin" timeline "$out/run" --from "$from" --to "$to" -o "$out/timeline-window.json"
"$bin" timeline "$out/run" --every 16 -o "$out/timeline-every16.json"
"$bin" report "$out/run" --json > "$out/report.json"
/usr/bin/python3 - "$out" "$wall" "$huge" <<'EOF'
import glob, json, os, sys
import h5py, numpy as np
out, wall, huge = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
rss = {}  # world rank -> peak RSS, MiB
for f in glob.glob(os.path.join(out, "rss.*")):
    for line in open(f):
        if line.startswith("# peak RSS"):
            rss[int(f.rsplit(".", 1)[1])] = int(line.split()[3]) / 1024
j = json.load(open(os.path.join(out, "report.json")))
with h5py.File(os.path.join(out, "run", "run.h5"), "r") as h:
    big = None
    for k in h["ranks"]:
        t = h["ranks"][k]["requests"]
        if t.shape[0]:
            p = t["prompt_tokens"][:]
            i = int(np.argmax(p))
            big = (int(p[i]), int(t["failed"][i]), int(t["oracle_ok"][i]), float(t["ttft_model_ns"][i]) / 1e6)
    rows = h["summary"]["ranks"][:]
    page = int(h["meta"].attrs["page_size"])
# Memory per cached token: a rank's whole peak RSS over the tokens its tree holds at the end
# (device and host pages): an upper bound on the digest mode's pool + tree bytes per token.
per_token = [rss[int(r["rank"])] * 2**20 / (int(r["tree_pages"]) * page) for r in rows if int(r["tree_pages"]) > 0 and int(r["rank"]) in rss]
cached = sum(j["cached_tokens"].values())
print(f"# production mix: wall {wall:.1f} s, peak RSS per rank {min(rss.values()):.0f}-{max(rss.values()):.0f} MiB ({len(rss)} ranks); "
      f"{min(per_token):.0f}-{max(per_token):.0f} bytes of RSS per token a rank's tree holds at the end")
print(f"# requests {j['requests']}: {j['finished']} finished, {j['failed']} failed; prompt tokens {j['prompt_tokens']:,}, "
      f"hit rate {j['hit_rate']['total']:.3f} (device {j['hit_rate']['device']:.3f}, host {j['hit_rate']['host']:.3f}, "
      f"storage {j['hit_rate']['storage']:.3f})")
t = j["ttft_model_ms"]
print(f"# modelled: TTFT mean {t['mean'] / 1e3:.1f} s, p50 {t['p50'] / 1e3:.1f} s, p99 {t['p99'] / 1e3:.1f} s; "
      f"input throughput {j['input_token_throughput']:,.0f} tokens/s")
if "spec" in j:
    print(f"# speculative decoding: acceptance length {j['spec']['acceptance_length_mean']:.3f}, "
          f"{j['spec']['draft_mismatch_steps']} draft mismatches")
print(f"# faults fired: {j['faults_injected']} ({', '.join(f'{k} {v}' for k, v in sorted(j['faults'].items()))})")
why = {0: "finished", 1: "FAILED (aborted: request.abort)", 2: "FAILED (broken transfer: pd.transfer.fail)",
       3: "FAILED (broken restore: pd.restore.fail)"}.get(big[1], f"FAILED ({big[1]})")
print(f"# largest request: {big[0]:,} tokens, {why}, oracle {'OK' if big[2] else 'WRONG'}, "
      f"TTFT {big[3] / 1e3:.1f} s (modelled)")
for name in ("timeline-window.json", "timeline-every16.json"):
    print(f"# {name}: {os.path.getsize(os.path.join(out, name)) / 2**20:.1f} MiB")
ok = j["verdict"] == "OK" and j["oracle_mismatches"] == 0 and j["divergences"] == 0
ok = ok and big[0] >= huge and big[1] == 0 and big[2] == 1 and wall <= 360 and max(rss.values()) <= 1536
print(f"# bounds (oracle OK, ranks agree, the {huge:,}-token request finished, wall <= 360 s, RSS <= 1536 MiB): "
      f"{'OK' if ok else 'NOT MET'}")
sys.exit(0 if ok else 1)
EOF
