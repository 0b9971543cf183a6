#!/usr/bin/env bash
# Prints the path of a clean Debian 12 root (debootstrap --variant=minbase bookworm) that also
# carries PACKAGE..., building it first if the cache does not have it yet.
#   scripts/debian-root.sh PACKAGE...       e.g. scripts/debian-root.sh python3 procps
#   DDP_ROOT_SUITE=bullseye scripts/debian-root.sh python3    another release (older glibc)
# The cache lives outside any checkout: $DDP_TEST_CACHE (default /var/cache/ddprun-tests),
# one folder per package set (roots/bookworm-<hash>). A root is built in a scratch folder and
# renamed into place when complete, under a lock, so a half-built root is never used and two
# tests asking at once build it once. The mirror is read from apt's own sources at run time.
set -euo pipefail

cache=${DDP_TEST_CACHE:-/var/cache/ddprun-tests}
suite=${DDP_ROOT_SUITE:-bookworm}
recipe=1  # bump to rebuild every cached root
packages=$(printf '%s\n' "$@" | sort -u | paste -sd, -)
key=$(printf '%s %s minbase %s\n' "$recipe" "$suite" "$packages" | sha256sum | cut -c1-16)
root="$cache/roots/$suite-$key"

mirror() {
  local uri
  uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $2 !~ /^\[/ && $2 !~ /security/ {print $2; exit}' \
                           /etc/apt/sources.list 2>/dev/null || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

if [ ! -x "$root/bin/sh" ]; then
  command -v debootstrap >/dev/null || { echo "debian-root.sh: debootstrap is not installed" >&2; exit 1; }
  mkdir -p "$cache/roots" "$cache/debs"
  exec 9>"$root.lock"
  flock 9
  if [ ! -x "$root/bin/sh" ]; then
    tmp="$root.tmp.$$"
    rm -rf "$tmp"
    include=()
    [ -n "$packages" ] && include=(--include="$packages")
    echo "debian-root.sh: debootstrap $suite minbase ${packages:-(no extra packages)} from $(mirror)" >&2
    if ! debootstrap --variant=minbase --cache-dir="$cache/debs" "${include[@]}" \
           "$suite" "$tmp" "$(mirror)" >"$tmp.log" 2>&1; then
      echo "debian-root.sh: debootstrap failed; last lines of $tmp.log:" >&2
      tail -n 15 "$tmp.log" >&2
      rm -rf "$tmp"
      exit 1
    fi
    rm -f "$tmp"/var/cache/apt/archives/*.deb
    mv "$tmp.log" "$tmp/debootstrap.log"
    mv -T "$tmp" "$root"
  fi
fi
echo "$root"
