#!/usr/bin/env bash
# Packs what experiments/gpu/check.sh needs to run on a bare GPU machine (one
# with only the NVIDIA driver, the CUDA runtime libraries and Python with
# PyTorch, none of our Debian packages) into one tarball:
#
#   experiments/gpu/pack.sh [BUILD_DIR] [TARBALL]
#       BUILD_DIR  a Release build with the cuda backend (default build-gpu;
#                  configured and built here for sm_90 if it does not exist)
#       TARBALL    default out/meshtrain-gpu.tar.gz
#
# Inside: bin/ (meshtrain and the gpu test binaries), lib/ (every shared
# library they load that is neither the C runtime nor part of CUDA, as ldd
# resolves them here), models/, the check script and the PyTorch peer. CUDA's
# own libraries (cudart, cuBLAS/cuBLASLt, NCCL) are NOT packed: they are
# hundreds of megabytes, and the GPU machine has its own of the same major
# version, which check.sh finds; a tarball under 50 MB is the aim.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD="${1:-build-gpu}"
TARBALL="${2:-out/meshtrain-gpu.tar.gz}"
BINS=(engine/meshtrain tests/cuda/test_cuda_host tests/cuda/test_cuda_backend tests/cuda/test_cuda_training)

if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90
fi
grep -q 'libmeshtrain_backend_cuda' "$BUILD/build.ninja" ||
  { echo "pack: $BUILD has no cuda backend (CUDA Toolkit or NCCL not found at configure)" >&2; exit 1; }
targets=()
for b in "${BINS[@]}"; do targets+=("$(basename "$b")"); done
cmake --build "$BUILD" -j "$(nproc)" --target "${targets[@]}"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/meshtrain-gpu"
mkdir -p "$root/bin" "$root/lib" "$root/experiments/gpu"
for b in "${BINS[@]}"; do
  cp "$BUILD/$b" "$root/bin/"
  strip --strip-unneeded "$root/bin/$(basename "$b")"
done
# Libraries: everything ldd resolves, less the C runtime (glibc's own
# libraries and the loader, which every Linux has in a compatible version)
# and CUDA's (the GPU machine's own are used; see above).
skip='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libcuda|libcudart|libcublas|libcublasLt|libnccl|libcudnn|libnvidia|libnvrtc|libnvJitLink)\.so'
for b in "$root"/bin/*; do
  ldd "$b" | awk '/=> \//{print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $skip ]] && continue
  cp -L "$path" "$root/lib/$name"
done
# Open MPI loads its components as plugins at MPI_Init; a run launched
# without mpirun is a singleton that needs none of them beyond the core libs.
cp experiments/gpu/check.sh experiments/gpu/torch_gpt.py "$root/experiments/gpu/"
[[ -f experiments/gpu/make_tokens.py ]] && cp experiments/gpu/make_tokens.py "$root/experiments/gpu/"
cp -r experiments/gpu/models "$root/experiments/gpu/"
cp README.md "$root/"
git rev-parse HEAD >"$root/COMMIT" 2>/dev/null || echo unknown >"$root/COMMIT"
git status --porcelain | grep -q . && echo "+ uncommitted changes" >>"$root/COMMIT"
mkdir -p "$(dirname "$TARBALL")"
tar -C "$stage" -czf "$TARBALL" meshtrain-gpu
size=$(stat -c %s "$TARBALL")
echo "pack: $TARBALL $((size / 1024 / 1024)) MB: $(ls "$root/bin" | tr '\n' ' ')+ $(ls "$root/lib" | wc -l) libraries"
if ((size > 50 * 1024 * 1024)); then
  echo "pack: the tarball is over 50 MB" >&2
  exit 1
fi
