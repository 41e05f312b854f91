#!/usr/bin/env bash
# Sets up a fresh Debian machine for meshtrain, builds it, then runs one job.
#
#   ./setup.sh                          install dependencies, build, run the default job
#   ./setup.sh test                     install dependencies, build, run the whole test suite
#   ./setup.sh test --sanitize          the whole suite under ASan + UBSan (build-sanitize/)
#   ./setup.sh test --sanitize thread   the ranks-as-threads tests under TSan (build-tsan/)
#
# Dependencies come from Debian's packages only. The CUDA Toolkit and NCCL are
# not installed here: the cuda backend is built when they are found (as under
# /usr/local/cuda) and skipped, with a configure message, when they are not.
set -euo pipefail
cd "$(dirname "$0")"

packages=(cmake ninja-build g++ pkg-config catch2 libtbb-dev libboost-graph-dev libopenmpi-dev openmpi-bin
          nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev libopenblas-dev zlib1g-dev libsentencepiece-dev
          dataset-fashion-mnist python3-torch python3-numpy)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

jobs=$(nproc)

# Sanitized builds live in their own folders, configured by CMakePresets.json.
if [ "${1:-}" = "test" ] && [ "${2:-}" = "--sanitize" ]; then
  case "${3:-address}" in
    address|address,undefined) preset=sanitize ;;
    thread) preset=tsan ;;
    *) echo "usage: ./setup.sh test --sanitize [address|thread]" >&2; exit 2 ;;
  esac
  cmake --preset "$preset"
  cmake --build --preset "$preset" -j "$jobs"
  ctest --preset "$preset" -j "$jobs"
  exit
fi

# Our own code builds without a warning, and CI keeps it so (-Werror on our
# targets only; CMakeLists.txt, MESHTRAIN_WERROR).
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMESHTRAIN_WERROR=ON
cmake --build build -j "$jobs"

case "${1:-run}" in
  run)
    ./build/engine/meshtrain simulate
    ;;
  test)
    # Open MPI refuses to run as root without these; CI runs as root.
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    ctest --test-dir build --output-on-failure -j "$jobs"
    ;;
  *)
    echo "usage: ./setup.sh [run|test [--sanitize [address|thread]]]" >&2
    exit 2
    ;;
esac
