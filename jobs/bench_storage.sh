#!/usr/bin/env bash
# File backend throughput next to dd: 1,000 objects of 64 KiB written and read back by
# FileStorage (one file per object, temporary name + rename, validated reads) and by SegmentStorage
# (cache.storage_file_layout = segment: a batch's objects in one file), and dd writing and
# reading one file of the same 64 MiB with 64 KiB blocks, in the same directory (no fsync in
# either: both measure the path through the page cache).
# Also the storage tier's own write path (storage_writer.hpp): the same 1,000 objects handed over in
# batches of 8 (a node's pages) to 1, 2 and 4 writer threads and drained, over either layout, and
# its read path (batches of 128 read on threads of their own, as a threaded prefetch does); the writer's CPU time is what the
# serving loop itself spends. With redis-server installed, the Redis backend's writes and reads of
# the same objects on a private server (jobs/redis.sh) next to redis-benchmark's SET/GET of 64 KiB
# values on that server.
#   jobs/bench_storage.sh [DIR]      (default: results/bench/storage)
# SHM=1 repeats the file figures in /dev/shm (tmpfs): the code path without the disk.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/kvgrid_bench_storage ] || jobs/setup.sh >/dev/null
dir=${1:-results/bench/storage}
mkdir -p "$dir"
redis=$(jobs/redis.sh start "$dir/redis" 2>/dev/null || true)  # Redis backend next to redis-benchmark
url=${redis%% *}
KVGRID_BENCH_REDIS=${url:-} KVGRID_BENCH_DIR="$dir" build/kvgrid_bench_storage --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_format=console 2>/dev/null | grep -E "median"
dd_rate() { grep -oE '[0-9.,]+ [GMk]B/s' | tail -1; }
dd_pair() {  # dd writing and reading one file of the same bytes in directory $1
  local w r
  w=$(dd if=/dev/zero of="$1/dd.bin" bs=64k count=1000 2>&1 | dd_rate)
  r=$(dd if="$1/dd.bin" of=/dev/null bs=64k 2>&1 | dd_rate)
  rm -f "$1/dd.bin"
  echo "dd write 1000 x 64 KiB: $w"
  echo "dd read  1000 x 64 KiB: $r"
}
dd_pair "$dir"
if [ "${SHM:-0}" = 1 ] && [ -d /dev/shm ]; then
  shm=$(mktemp -d /dev/shm/kvgrid-bench.XXXXXX)
  echo "-- in $shm (tmpfs):"
  KVGRID_BENCH_DIR="$shm" build/kvgrid_bench_storage --benchmark_filter='File|Segment|Writer' --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_format=console 2>/dev/null | grep -E "median"
  dd_pair "$shm"
  rm -rf "$shm"
fi
if [ -n "$url" ]; then
  port=${url##*:}
  # redis-benchmark: 1,000 SETs and GETs of 64 KiB values from one client, one request at a time
  redis-benchmark -p "$port" -t set,get -n 1000 -d 65536 -c 1 -P 1 -q 2>/dev/null | tr '\r' '\n' | grep -E "^(SET|GET):.*requests per second" | sed 's/^/redis-benchmark /'
  jobs/redis.sh stop "$dir/redis"
fi
