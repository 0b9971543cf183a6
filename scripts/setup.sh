#!/usr/bin/env bash
# Installs every missing build/test dependency from Debian's packages (idempotent, quiet),
# then configures and builds ddprun and libddp (Release) into build/.
#   scripts/setup.sh            install what is missing, build
#   DDP_BUILD_TYPE=Debug scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config ccache
  libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libboost-dev libgtest-dev
  libssl-dev openssl    # https to etcd; the etcd tests make their certificates
  etcd-server etcd-client  # a real etcd for the etcd rendezvous tests
  python3-torch        # real PyTorch for the integration tests and the anchors
  clang libclang-rt-dev  # libFuzzer target of the store's request parser
  iproute2 util-linux procps time
  # packaging and container tests (tests/packaging): cpack's .debs, a clean Debian root,
  # rootful podman with runc (crun refuses this kind of hybrid-cgroup host), inits, completions
  dpkg-dev file git man-db zsh python3-yaml debootstrap
  podman runc conmon netavark aardvark-dns iptables catatonit tini
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
# A compiler cache keyed on paths relative to the checkout: another clone (CI's), the tests'
# CPU-only package build (build-pkg) and a rebuild reuse every object whose inputs are the same
# (a Debug build's objects only within one build folder: their debug info names it).
# Not where the cache folder cannot be written (a read-only home): ccache would fail every compile.
ccache_dir=$(ccache -k cache_dir 2>/dev/null) && mkdir -p "$ccache_dir" 2>/dev/null && [ -w "$ccache_dir" ] &&
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="/usr/bin/env;CCACHE_BASEDIR=$PWD;ccache")
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build "${gen[@]}" "${launcher[@]}" -DCMAKE_BUILD_TYPE="${DDP_BUILD_TYPE:-Release}" >/dev/null
fi
cmake --build build --parallel "$(nproc)"
