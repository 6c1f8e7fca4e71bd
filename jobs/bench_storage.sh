#!/usr/bin/env bash
# File backend throughput next to dd: 1,000 objects of 64 KiB written and read back by
# FileStorage (one file per object, temporary name + rename, validated reads), and dd writing and
# reading one file of the same 64 MiB with 64 KiB blocks, in the same directory (no fsync in
# either: both measure the path through the page cache).
#   jobs/bench_storage.sh [DIR]      (default: results/bench/storage)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/kvgrid_bench_storage ] || jobs/setup.sh >/dev/null
dir=${1:-results/bench/storage}
mkdir -p "$dir"
KVGRID_BENCH_DIR="$dir" build/kvgrid_bench_storage --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_format=console 2>/dev/null | grep -E "median|mean"
dd_rate() { grep -oE '[0-9.,]+ [GMk]B/s' | tail -1; }
w=$(dd if=/dev/zero of="$dir/dd.bin" bs=64k count=1000 2>&1 | dd_rate)
r=$(dd if="$dir/dd.bin" of=/dev/null bs=64k 2>&1 | dd_rate)
rm -f "$dir/dd.bin"
echo "dd write 1000 x 64 KiB: $w"
echo "dd read  1000 x 64 KiB: $r"
