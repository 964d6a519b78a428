#!/usr/bin/env bash
# Runs a command in a brand-new minimal Debian 12 root that holds a clean clone of this
# repository's committed HEAD: what a new user with a new machine has.
#   scripts/fresh_root.sh 'scripts/setup.sh && scripts/test.sh'
#
# - The pristine root is made once with debootstrap (variant minbase, no compiler, no
#   python, no ca-certificates) and kept as a tarball in $FRESH_CACHE (default
#   /var/cache/fresh-debian); every run unpacks a new copy, so nothing leaks between runs.
# - Only what a new machine on this network has is copied in from the host: its apt
#   sources and settings, its extra CA certificates, its npm settings. ../shared (the
#   data sets), when present, is copied beside the clone.
# - The environment is emptied (HOME, PATH, LANG, TERM, and CI if set).
# - Exit status: the command's. 125 means the root could not be made (not root, no
#   debootstrap, no mounts): the command did not run, and the caller must say so.
set -uo pipefail
cache=${FRESH_CACHE:-/var/cache/fresh-debian}
cmd=${1:?usage: scripts/fresh_root.sh 'COMMAND'}
proj=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
cannot() { echo "fresh_root: cannot make a fresh Debian 12 root: $*" >&2; exit 125; }

[ "$(id -u)" -eq 0 ] || cannot "needs root (debootstrap, chroot, mounts)"
if ! command -v debootstrap >/dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap; } >/dev/null 2>&1 ||
    cannot "debootstrap is not installed and could not be installed"
fi
mkdir -p "$cache" || cannot "cannot create $cache"
mirror=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
[ -n "$mirror" ] || mirror=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null)
[ -n "$mirror" ] || mirror=http://deb.debian.org/debian
SECONDS=0
if [ ! -f "$cache/root.tar" ]; then
  rm -rf "$cache/pristine"
  debootstrap --variant=minbase bookworm "$cache/pristine" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
    cannot "debootstrap failed (see $cache/debootstrap.log)"
  tar -C "$cache/pristine" -cf "$cache/root.tar.tmp" . && mv "$cache/root.tar.tmp" "$cache/root.tar" ||
    cannot "cannot write $cache/root.tar"
  rm -rf "$cache/pristine"
fi

root=$(mktemp -d /var/tmp/fresh-root.XXXXXX) || cannot "mktemp failed"
cleanup() {
  # Everything mounted under the root (proc, dev, sys, and what the command mounted there,
  # e.g. /run/netns), deepest first, then the root itself.
  awk -v r="$root" '$2 == r || index($2, r "/") == 1 {print $2}' /proc/mounts | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null; done
  rm -rf --one-file-system "$root"
}
trap cleanup EXIT
tar -C "$root" -xf "$cache/root.tar" || cannot "cannot unpack $cache/root.tar"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null
if ls /etc/apt/sources.list.d/*.sources >/dev/null 2>&1; then
  cp /etc/apt/sources.list.d/*.sources "$root/etc/apt/sources.list.d/" && rm -f "$root/etc/apt/sources.list"
elif [ -f /etc/apt/sources.list ]; then
  cp /etc/apt/sources.list "$root/etc/apt/sources.list"
fi
cp -r /etc/apt/apt.conf.d/. "$root/etc/apt/apt.conf.d/" 2>/dev/null
mkdir -p "$root/usr/local/share/ca-certificates" "$root/usr/etc"
cp -r /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/" 2>/dev/null
for f in /etc/npmrc /usr/etc/npmrc /root/.npmrc; do [ -f "$f" ] && cp "$f" "$root$f"; done
mkdir -p "$root/root/work"
git clone -q "$proj" "$root/root/work/project" || cannot "git clone of $proj failed"
[ -d "$proj/../shared" ] && cp -r "$proj/../shared" "$root/root/work/shared"
# The root bound onto itself: "/" is then a mount point inside, as on a real machine (`ip netns
# exec` and `ip -n` remount it as a slave; on a plain directory that fails with EINVAL).
mount --bind "$root" "$root" && mount -t proc proc "$root/proc" && mount --rbind /dev "$root/dev" &&
  mount --rbind /sys "$root/sys" || cannot "mounting /, /proc, /dev, /sys in the root failed"
echo "fresh_root: root ready in ${SECONDS}s ($(git -C "$proj" rev-parse --short HEAD), $root)" >&2

SECONDS=0
chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 TERM=dumb ${CI:+CI=$CI} bash -c "cd /root/work/project && $cmd"
rc=$?
echo "fresh_root: exit $rc after ${SECONDS}s" >&2
exit $rc
