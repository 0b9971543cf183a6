#!/bin/sh
# Builds the store's request-parser fuzzer with clang in a scratch directory and runs it for
# a few seconds (ctest: store.fuzz_parser). Exits 77 (skipped) only if clang++ is missing.
#   run_fuzz.sh SCRATCH_DIR [SECONDS]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
scratch=${1:?usage: run_fuzz.sh SCRATCH_DIR [SECONDS]}
secs=${2:-10}

cxx=$(command -v clang++ || command -v clang++-14 || true)
if [ -z "$cxx" ]; then
  echo "SKIP: clang++ not found; the fuzzer needs clang's -fsanitize=fuzzer"
  exit 77
fi
gen=""
command -v ninja >/dev/null 2>&1 && gen="-G Ninja"
launcher=""
command -v ccache >/dev/null 2>&1 && launcher="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"

mkdir -p "$scratch/corpus"
# shellcheck disable=SC2086
cmake -S "$here" -B "$scratch/build" $gen $launcher -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$scratch/configure.log" 2>&1 ||
  { cat "$scratch/configure.log"; exit 1; }
cmake --build "$scratch/build" >"$scratch/build.log" 2>&1 || { cat "$scratch/build.log"; exit 1; }

# New inputs go to the scratch corpus; the checked-in seeds are read only.
exec "$scratch/build/fuzz_store_parser" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 "$scratch/corpus" "$here/seeds"
