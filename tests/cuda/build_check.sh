#!/usr/bin/env bash
# Configures and compiles the CUDA (+NCCL when found) build in a scratch folder and runs its tests,
# which skip without a GPU. Exit 77 (ctest: skipped) when nvcc is not installed. jobs/setup.sh
# builds <build>/cuda-check ahead (set-up, not test time), so under ctest this is an up-to-date
# check plus the tests; a folder configured before is only rebuilt.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
nvcc=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$nvcc" ] || { echo "nvcc not found: CUDA build check skipped"; exit 77; }
nccl=OFF
if [ -f /usr/local/cuda/include/nccl.h ] || [ -f /usr/include/nccl.h ]; then nccl=ON; fi
dir=${1:-$(mktemp -d /tmp/kvgrid-cuda-build.XXXXXX)}
if [ ! -f "$dir/CMakeCache.txt" ]; then
  CUDACXX=$nvcc cmake -S "$src" -B "$dir" -DKVGRID_CUDA=ON -DKVGRID_NCCL=$nccl -DKVGRID_BENCH=OFF >"$dir.log" 2>&1 \
    || { cat "$dir.log"; exit 1; }
fi
cmake --build "$dir" -j "$(nproc)" --target kvgrid_cuda_tests kvgrid 2>&1 | grep -Ev '^\[ *[0-9]+%\]' || true
test "${PIPESTATUS[0]}" -eq 0
"$dir/src/cuda/kvgrid_cuda_tests"
# The CUDA kvgrid at one rank with engine.transfer = cuda: without a GPU it refuses at start-up with
# exit 2 and the driver's reason; with one it runs.
run_dir=$(mktemp -d /tmp/kvgrid-cuda-run.XXXXXX)
set +e
"$dir/kvgrid" run "$src/experiments/policy_sim.toml" --set engine.transfer=cuda \
  --out "$run_dir/run" >"$run_dir/log" 2>&1
rc=$?
set -e
if [ $rc -eq 2 ] && grep -q 'engine.transfer = "cuda": no usable GPU' "$run_dir/log"; then
  echo "cuda build check: kvgrid refuses engine.transfer = cuda without a GPU: $(grep -o 'no usable GPU.*' "$run_dir/log" | head -1)"
elif [ $rc -eq 0 ]; then
  echo "cuda build check: kvgrid ran policy_sim with engine.transfer = cuda"
else
  cat "$run_dir/log"; echo "cuda build check: kvgrid with engine.transfer = cuda exited $rc"; exit 1
fi
rm -rf "$run_dir"
echo "cuda build check: configured and compiled with NCCL=$nccl"
