#!/usr/bin/env bash
# Installs every missing build/test dependency from Debian's packages (idempotent, quiet),
# then configures and builds ddprun and libddp (Release) into build/.
#   scripts/setup.sh            install what is missing, build
#   DDP_BUILD_TYPE=Debug scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config
  libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libboost-dev libgtest-dev
  python3-torch        # real PyTorch for the integration tests and the anchors
  clang libclang-rt-dev  # libFuzzer target of the store's request parser
  iproute2 util-linux procps time
  slurmctld slurmd slurm-client munge  # a real Slurm cluster on one host for tests/slurm
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >/dev/null
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build "${gen[@]}" "${launcher[@]}" -DCMAKE_BUILD_TYPE="${DDP_BUILD_TYPE:-Release}" >/dev/null
fi
cmake --build build --parallel "$(nproc)"
