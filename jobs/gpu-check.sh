#!/usr/bin/env bash
# The whole GPU check in one command, on a bare GPU machine (CUDA toolkit and CMake; no MPI, HDF5,
# Kokkos or package registry there): configures src/cuda as a project of its own, builds the CUDA
# test binary and the copy benchmark, runs both and prints a summary. About a minute of build on 16
# cores; the tests and the benchmark take seconds — well inside 5 minutes, so a rerun fits.
#
#   jobs/gpu-check.sh --prepare   # here, once: copies GoogleTest's sources into .gpu-bundle/ (git-ignored)
#   jobs/gpu-check.sh             # there, with .gpu-bundle carried along with the tree
#
# GoogleTest: an installed one, else .gpu-bundle/googletest, else /usr/src/googletest.
# NCCL: $NCCL_ROOT, else the nvidia-nccl-cu13 wheel's library (found through python3), else the CUDA
# toolkit's; without one the NCCL tests are not built (the summary says so).
# Exit: 0 when every test passed or skipped, 1 when one failed or the build broke.
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = --prepare ]; then
  [ -f /usr/src/googletest/CMakeLists.txt ] || { echo "gpu-check: /usr/src/googletest not found (apt install googletest)" >&2; exit 2; }
  rm -rf "$src/.gpu-bundle/googletest" && mkdir -p "$src/.gpu-bundle" && cp -r /usr/src/googletest "$src/.gpu-bundle/googletest"
  echo "gpu-check: GoogleTest sources in .gpu-bundle/googletest ($(du -sh "$src/.gpu-bundle" | cut -f1)); carry .gpu-bundle"
  exit 0
fi
build=${GPU_CHECK_BUILD:-/tmp/kvgrid-gpu-check}
t0=$(date +%s)
nvcc=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$nvcc" ] || { echo "gpu-check: nvcc not found"; exit 1; }
gtest=()
for g in "$src/.gpu-bundle/googletest" /usr/src/googletest; do
  [ -f "$g/CMakeLists.txt" ] && { gtest=(-DKVGRID_GTEST_SOURCE="$g"); break; }
done
nccl_root=${NCCL_ROOT:-}
if [ -z "$nccl_root" ]; then
  nccl_root=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
fi
nccl=OFF
if [ -n "$nccl_root" ] && [ -f "$nccl_root/include/nccl.h" ]; then
  nccl=ON
  export LD_LIBRARY_PATH="$nccl_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
elif [ -f "$(dirname "$nvcc")/../include/nccl.h" ]; then
  nccl=ON nccl_root=$(cd "$(dirname "$nvcc")/.." && pwd)
fi
arch=${CUDA_ARCH:-native}
echo "# gpu-check: nvcc $("$nvcc" --version | tail -1), NCCL $nccl${nccl_root:+ ($nccl_root)}, arch $arch, build $build"
CUDACXX=$nvcc cmake -S "$src/src/cuda" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DKVGRID_NCCL=$nccl ${nccl_root:+-DNCCL_ROOT="$nccl_root"} "${gtest[@]}" >"$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; echo "gpu-check: configure FAILED"; exit 1; }
cmake --build "$build" -j "$(nproc)" >"$build.build.log" 2>&1 || { tail -40 "$build.build.log"; echo "gpu-check: build FAILED"; exit 1; }
t1=$(date +%s)
"$build/kvgrid_cuda_tests" 2>&1 | tee "$build.tests.log" | grep -E '^\[  (FAILED|SKIPPED|PASSED) |^GPU|Failure|no CUDA device' | head -40
tests_rc=${PIPESTATUS[0]}
"$build/kvgrid_cuda_bench" 2>&1 | tee "$build.bench.log"
bench_rc=${PIPESTATUS[0]}
passed=$(grep -c '^\[       OK \]' "$build.tests.log"); skipped=$(grep -c '^\[  SKIPPED \] .*(' "$build.tests.log")
failed=$(grep -c '^\[  FAILED  \] .*(' "$build.tests.log")
echo "# gpu-check summary: build $((t1 - t0)) s; tests $passed passed, $skipped skipped, $failed failed (exit $tests_rc);" \
     "copy benchmark exit $bench_rc (77: no GPU); NCCL tests $([ $nccl = ON ] && echo built || echo 'not built: no NCCL')"
echo "# gpu-check: the quickstart with engine.transfer = cuda is not run here (kvgrid needs Open MPI and HDF5, which this machine lacks; see docs/gpu.md)"
[ "$tests_rc" -eq 0 ]
