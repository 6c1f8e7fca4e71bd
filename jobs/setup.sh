#!/usr/bin/env bash
# Installs what kvgrid needs (Debian 12 packages), skipping what is installed, then configures and
# builds into build/. Idempotent: a second run only rebuilds what changed.
#   jobs/setup.sh                     # Release-with-debug-info build in build/
#   KVGRID_CMAKE_ARGS="-DKVGRID_SANITIZE=ON" KVGRID_BUILD_DIR=build-asan jobs/setup.sh
#   jobs/setup.sh --slurm             # also Slurm 22.05 and munge (a local cluster: jobs/slurm/cluster.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
with_slurm=0
if [ "${1:-}" = "--slurm" ]; then with_slurm=1; shift; fi

packages=(
  g++ make cmake git pkg-config
  openmpi-bin libopenmpi-dev
  libhdf5-openmpi-dev hdf5-tools
  libtrilinos-kokkos-dev
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev libssl-dev
  redis-server libhiredis-dev
  libgtest-dev libbenchmark-dev
  python3-matplotlib python3-h5py python3-numpy python3-jsonschema
  time  # GNU time: jobs/production_mix.sh reads each rank's peak RSS from it
)
((with_slurm)) && packages+=(slurmctld slurmd slurm-client munge slurm-wlm-basic-plugins)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "# setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null; then SUDO=sudo; else
      echo "setup: need root (or sudo) to install: ${missing[*]}" >&2
      exit 2
    fi
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "# setup: all ${#packages[@]} packages present"
fi

build_dir=${KVGRID_BUILD_DIR:-build}
jobs=$(nproc 2>/dev/null || echo 2)
if [ ! -f "$build_dir/CMakeCache.txt" ] || [ -n "${KVGRID_CMAKE_ARGS:-}" ]; then
  # shellcheck disable=SC2086
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo ${KVGRID_CMAKE_ARGS:-} >"$build_dir.configure.log" 2>&1 \
    || { cat "$build_dir.configure.log"; exit 1; }
fi
cmake --build "$build_dir" -j "$jobs" 2>&1 | grep -Ev '^\[ *[0-9]+%\]' || true
test "${PIPESTATUS[0]}" -eq 0
[ -x "$build_dir/kvgrid" ] || { echo "setup: build failed ($build_dir/kvgrid missing)" >&2; exit 1; }
echo "# setup: built $build_dir/kvgrid"
# The CUDA build (tests/cuda/build_check.sh, a ctest entry) is compiled here, as set-up: the test
# then only checks it is up to date and runs its tests. KVGRID_CUDA_CHECK=0 skips it.
if [ "${KVGRID_CUDA_CHECK:-1}" != 0 ] && { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  cuda_start=$(date +%s)
  if tests/cuda/build_check.sh "$(cd "$build_dir" && pwd)/cuda-check" >"$build_dir.cuda-check.log" 2>&1; then
    echo "# setup: built the CUDA check build in $(( $(date +%s) - cuda_start )) s ($build_dir/cuda-check)"
  else
    cat "$build_dir.cuda-check.log" >&2
    echo "setup: the CUDA build failed (log above; KVGRID_CUDA_CHECK=0 skips it)" >&2
    exit 1
  fi
fi
