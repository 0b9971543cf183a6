#!/usr/bin/env bash
# Stages what scripts/gpu-check.sh needs on a GPU machine that cannot install packages or
# build this project (no CLI11, spdlog, Boost or GoogleTest there): the built programs, libddp
# and the libfmt it links, in .gpu-kit/ (git-ignored). Run here after scripts/setup.sh; then
# on the device machine: carry [".gpu-kit"], command "scripts/gpu-check.sh".
#   scripts/gpu-kit.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
b=${1:-build}
kit=.gpu-kit
readelf -d "$b/lib/libddp.so.0" 2>/dev/null | grep -q libnccl || {
  echo "gpu-kit: $b/lib/libddp.so.0 is missing or was built without CUDA/NCCL" >&2; exit 1; }
rm -rf "$kit"
mkdir -p "$kit/bin" "$kit/lib"
for p in ddprun ddp-bench nccl-raw-bench test_nccl ddp-store-server store_client_check train_linear; do
  [[ -x $b/bin/$p ]] || { echo "gpu-kit: $b/bin/$p is missing: build first (scripts/setup.sh)" >&2; exit 1; }
  cp "$b/bin/$p" "$kit/bin/"
done
cp -L "$b/lib/libddp.so.0" "$kit/lib/"
# Only what the GPU machine's image lacks: CUDA's runtime and NCCL come from its own torch.
fmt=$(ldd "$b/lib/libddp.so.0" | awk '/libfmt/ {print $3}')
[[ -n $fmt ]] && cp -L "$fmt" "$kit/lib/"
du -sh "$kit"
