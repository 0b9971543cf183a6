#!/usr/bin/env bash
# ctest fixture: the .debs the packaging and container tests install, in OUT.
#   build_debs.sh BUILD_DIR OUT
# Packages for a plain Debian system carry a libddp without NCCL (Debian has no CUDA). When
# BUILD_DIR was configured with NCCL, a CPU-only sibling build (BUILD_DIR-pkg) makes them: at
# the same depth as BUILD_DIR, so ccache serves every object the two builds share.
set -euo pipefail
build=$(cd "$1" && pwd)
out=$2
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
pkgbuild=$build
if readelf -d "$build/lib/libddp.so" 2>/dev/null | grep -q 'NEEDED.*libnccl'; then
  pkgbuild=$build-pkg
  gen=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$build/CMakeCache.txt")
  launcher=$(sed -n 's/^CMAKE_CXX_COMPILER_LAUNCHER:[A-Z]*=//p' "$build/CMakeCache.txt")
  if [ ! -f "$pkgbuild/CMakeCache.txt" ]; then
    cmake -S "$src" -B "$pkgbuild" -G "$gen" -DCMAKE_BUILD_TYPE=Release ${launcher:+-DCMAKE_CXX_COMPILER_LAUNCHER=$launcher} \
      -DDDP_WITH_NCCL=OFF -DDDP_BUILD_TESTS=OFF -DDDP_BUILD_BENCH=OFF >/dev/null
  fi
  cmake --build "$pkgbuild" --parallel 2 --target ddprun ddp-store-server ddp ddprun_docs
fi
rm -rf "$pkgbuild/packages"
(cd "$pkgbuild" && cpack -G DEB >/dev/null)
rm -rf "$out"
mkdir -p "$out"
cp "$pkgbuild"/packages/*.deb "$out/"
ls "$out"
