#!/usr/bin/env bash
# PyTorch 2.x for the tests and benchmarks: a Debian 13 ("trixie") chroot with Debian's
# python3-torch (2.6), built once per machine from the Debian archive and cached outside
# the checkout.
#
#   scripts/torch2-chroot.sh [ensure]     build it unless cached (2-4 min, 1.3 GB); print its path
#   scripts/torch2-chroot.sh status       "ready PATH (versions)" and exit 0, or "missing PATH" and exit 1
#   scripts/torch2-chroot.sh path         print where it is (or would be)
#   scripts/torch2-chroot.sh exec CMD...  run CMD in it: same environment, same working directory
#   scripts/torch2-chroot.sh shell        an interactive shell in it
#
# Where: $DDP_TORCH2_ROOT if set, else $XDG_CACHE_HOME/ddprun/torch2-trixie-vN if that
# variable is set, else /var/cache/ddprun/torch2-trixie-vN (vN: this recipe's version; a new
# recipe builds beside the old one, which `rm -rf` removes once nothing uses it).
# The mirror: $DDP_TORCH2_MIRROR, else the one apt itself uses for the host's release
# (`apt-get indextargets`), read at run time and written nowhere but inside the chroot.
#
# Building is atomic: debootstrap fills a temporary sibling folder that is renamed into
# place only when complete and smoke-tested, under a lock, so parallel callers wait for one
# build and an interrupted build is never taken for a good one (its leftover is removed by
# the next build). debootstrap runs in a private mount namespace, so the /proc, /sys and
# /dev mounts it makes vanish with it even when it is killed.
#
# exec: `unshare --mount` gives CMD a private mount namespace in which /proc (fresh), /sys,
# /dev (with /dev/pts, /dev/shm), /tmp, this checkout and the folders in $DDP_TORCH2_BIND
# (colon-separated) are mounted into the chroot at their host paths; they disappear with the
# last process of that namespace, so nothing leaks, whatever the command does, and any
# number of commands can use the chroot at once. The network (loopback included), name
# resolution (/etc/hosts, /etc/resolv.conf as the caller sees them), pids and users are the
# host's. unshare, the mounts and chroot each exec the next, so CMD keeps the
# pid the caller started (ddprun signals and reaps it as its worker). Needs root.
set -euo pipefail

readonly RECIPE=1          # bump when the packages or layout below change
readonly SUITE=trixie
readonly PACKAGES=python3-torch
readonly STAMP=.ddprun-torch2  # written last: its presence means "complete"
SELF=$(readlink -f "${BASH_SOURCE[0]}")
SRC=$(dirname "$(dirname "$SELF")")

die() { echo "torch2-chroot: $*" >&2; exit 1; }

chroot_dir() {
  if [[ -n ${DDP_TORCH2_ROOT:-} ]]; then echo "$DDP_TORCH2_ROOT"
  elif [[ -n ${XDG_CACHE_HOME:-} ]]; then echo "$XDG_CACHE_HOME/ddprun/torch2-$SUITE-v$RECIPE"
  else echo "/var/cache/ddprun/torch2-$SUITE-v$RECIPE"
  fi
}
ROOT=$(chroot_dir)

# The URI apt uses for the host's own release (not -updates, not -security).
mirror_from_apt() {
  local codename
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  apt-get indextargets --format '$(RELEASE) $(REPO_URI)' 2>/dev/null |
    awk -v c="$codename" '$1 == c { print $2; exit }'
}

is_ready() { [[ -f $ROOT/$STAMP ]]; }

# Removes a half-built folder left by an interrupted build (never one with a mount inside).
remove_partial() {
  local d=$1
  if awk -v d="$d/" '{ if (index($2 "/", d) == 1) found = 1 } END { exit !found }' /proc/self/mounts; then
    die "$d has mounts inside; not removing it (unmount them first)"
  fi
  rm -rf --one-file-system "$d"
}

build() {
  [[ $(id -u) -eq 0 ]] || die "building the chroot needs root (debootstrap, chroot)"
  command -v debootstrap >/dev/null || die "debootstrap is missing (scripts/setup.sh installs it)"
  [[ -e /usr/share/debootstrap/scripts/$SUITE ]] || die "this debootstrap has no script for $SUITE"
  local mirror=${DDP_TORCH2_MIRROR:-$(mirror_from_apt)}
  [[ -n $mirror ]] || die "no Debian mirror in apt's sources (set DDP_TORCH2_MIRROR)"
  local parent tmp t0=$SECONDS
  parent=$(dirname "$ROOT")
  mkdir -p "$parent"
  local d
  for d in "$ROOT".partial.*; do
    if [[ -d $d ]]; then remove_partial "$d"; fi
    rm -f "$d.log"
  done
  tmp=$(mktemp -d "$ROOT.partial.XXXXXX")
  chmod 755 "$tmp"
  echo "torch2-chroot: building $ROOT: debootstrap $SUITE with $PACKAGES (2-4 minutes, once per machine)" >&2
  if ! unshare --mount --propagation private \
       debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$tmp" "$mirror" >"$tmp.log" 2>&1; then
    tail -n 20 "$tmp.log" >&2
    die "debootstrap failed (log: $tmp.log)"
  fi
  # apt inside the chroot (for a person adding packages by hand) uses the same mirror.
  echo "deb $mirror $SUITE main" >"$tmp/etc/apt/sources.list"
  chroot "$tmp" apt-get clean  # the .deb cache: 200 MB nobody needs again
  cp /etc/hosts "$tmp/etc/hosts"
  local versions
  versions=$(DDP_TORCH2_ROOT=$tmp unshare --mount --propagation private -- "$SELF" __enter / /usr/bin/python3 -c \
    'import sys, torch, torch.distributed as d; assert d.is_gloo_available(); print("python", sys.version.split()[0], "torch", torch.__version__)' \
    2>>"$tmp.log" | tail -n 1) || die "the new chroot cannot import torch (log: $tmp.log)"
  [[ $versions == python*torch* ]] || die "the new chroot cannot import torch (log: $tmp.log)"
  echo "recipe=$RECIPE suite=$SUITE $versions built=$(date -u +%FT%TZ)" >"$tmp/$STAMP"
  mv -T "$tmp" "$ROOT"
  rm -f "$tmp.log"
  echo "torch2-chroot: ready in $((SECONDS - t0)) s: $ROOT ($versions, $(du -sh "$ROOT" | cut -f1))" >&2
}

ensure() {
  is_ready && return 0
  mkdir -p "$(dirname "$ROOT")"
  # One build at a time; whoever waited finds it done.
  exec {lock}>"$ROOT.lock"
  flock "$lock"
  is_ready || build
  exec {lock}>&-
}

# Mounts what a command in the chroot needs, then runs it there; only ever inside a private
# mount namespace (see the header): by `exec`, and by build's smoke test.
enter() {
  local cwd=$1; shift
  mount -t proc proc "$ROOT/proc"
  mount --bind /sys "$ROOT/sys"
  mount --rbind /dev "$ROOT/dev"
  mount --bind /tmp "$ROOT/tmp"
  # Names resolve as they do outside: the /etc/hosts and resolv.conf this namespace sees (a
  # Slurm node's own /etc/hosts, say), not the copies made when the chroot was built.
  local f
  for f in /etc/hosts /etc/resolv.conf; do
    if [[ -f $f && -f $ROOT$f ]]; then mount --bind "$f" "$ROOT$f"; fi
  done
  local IFS=: p
  for p in $SRC ${DDP_TORCH2_BIND:-}; do
    [[ -d $p && $p != /tmp/* ]] || continue
    mkdir -p "$ROOT$p"
    mount --bind "$p" "$ROOT$p"
  done
  # The host's preloads and library paths would mix two glibcs.
  unset LD_PRELOAD LD_LIBRARY_PATH
  exec chroot "$ROOT" /usr/bin/env --chdir="$cwd" "$@"
}

case ${1:-ensure} in
  ensure) ensure; echo "$ROOT" ;;
  path) echo "$ROOT" ;;
  status)
    if is_ready; then echo "ready $ROOT ($(cat "$ROOT/$STAMP"))"; else echo "missing $ROOT"; exit 1; fi ;;
  exec)
    shift
    (($#)) || die "exec needs a command"
    is_ready || die "no chroot at $ROOT (run scripts/torch2-chroot.sh)"
    [[ $(id -u) -eq 0 ]] || die "entering the chroot needs root"
    exec unshare --mount --propagation private -- "$SELF" __enter "$PWD" "$@" ;;
  __enter) shift; enter "$@" ;;
  shell)
    is_ready || die "no chroot at $ROOT (run scripts/torch2-chroot.sh)"
    exec "$SELF" exec /bin/bash ;;
  *) sed -n '2,12p' "$SELF" >&2; exit 2 ;;
esac
