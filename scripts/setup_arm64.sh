#!/usr/bin/env bash
# Sets up the ARM64 (aarch64) cross-build on a Debian 12 x86-64 host (scripts/cross_arm64.sh
# calls it; idempotent):
#   - host packages: g++-aarch64-linux-gnu (GCC 12 cross), mmdebstrap, qemu-user (runs the
#     aarch64 binaries), cmake, ninja;
#   - an arm64 sysroot of Debian 12's packages in SYSROOT (default .cache/sysroot-arm64,
#     git-ignored): LibTorch 1.13, oneDNN, libpng, libjpeg-turbo and the rest, with their
#     dependencies, unpacked by `mmdebstrap --variant=extract` (no maintainer scripts, no
#     chroot, no binfmt needed; ~1 GB, ~1 min).
# Why a sysroot and not multiarch (`dpkg --add-architecture arm64`): libtorch-dev is not
# Multi-Arch (libtorch-dev:arm64 cannot be installed beside the amd64 one setup.sh installs),
# nor is python3-dev, which it depends on.
set -euo pipefail
cd "$(dirname "$0")/.."
SYSROOT=${SYSROOT:-$PWD/.cache/sysroot-arm64}

HOST_PACKAGES=(g++-aarch64-linux-gnu mmdebstrap qemu-user cmake ninja-build ca-certificates)
ARM64_PACKAGES=(
  libc6-dev libstdc++-12-dev
  libtorch-dev libgloo-dev libdnnl-dev libpng-dev libjpeg62-turbo-dev
  nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libgtest-dev libgmock-dev libonnx-dev
)

SECONDS=0
. scripts/apt_install.sh
apt_install_missing setup_arm64 "${HOST_PACKAGES[@]}"

stamp="$SYSROOT/.lightseg-sysroot"
want="${ARM64_PACKAGES[*]}"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup_arm64: making the arm64 sysroot in $SYSROOT" >&2
  rm -rf "$SYSROOT"
  mkdir -p "$(dirname "$SYSROOT")"
  # The host's apt sources (its mirror, and the security updates), else Debian's mirror.
  sources=()
  for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list; do
    [ -s "$f" ] && sources+=("$f")
  done
  [ ${#sources[@]} -gt 0 ] || sources=(http://deb.debian.org/debian)
  include=$(IFS=,; echo "${ARM64_PACKAGES[*]}")
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO mmdebstrap --quiet --variant=extract --architectures=arm64 --include="$include" \
    bookworm "$SYSROOT" "${sources[@]}"
  [ "$(id -u)" -ne 0 ] && $SUDO chown -R "$(id -u):$(id -g)" "$SYSROOT"
  # Absolute symlinks (libm.so -> /lib/aarch64-linux-gnu/libm.so.6) would point into the host:
  # made relative, inside the sysroot.
  find "$SYSROOT/usr/lib" "$SYSROOT/lib" -type l -lname '/*' | while read -r l; do
    target=$(readlink "$l")
    ln -sfn "$(realpath -m --relative-to="$(dirname "$l")" "$SYSROOT$target")" "$l"
  done
  # What update-alternatives (a maintainer script, not run) would have linked: BLAS and LAPACK.
  lib="$SYSROOT/usr/lib/aarch64-linux-gnu"
  for a in blas lapack; do
    [ -e "$lib/lib$a.so.3" ] || ln -s "$a/lib$a.so.3" "$lib/lib$a.so.3"
  done
  echo "$want" >"$stamp"
fi
echo "setup_arm64: ready ($SYSROOT, $(du -sh "$SYSROOT" | cut -f1), ${SECONDS} s)" >&2
