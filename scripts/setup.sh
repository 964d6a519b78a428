#!/usr/bin/env bash
# Sets up everything lightseg needs on Debian 12 and builds it (Release, into build/).
# Idempotent and non-interactive: installs only missing Debian packages (apt-get update
# first), then configures and builds. Usage: scripts/setup.sh [extra cmake -D options]
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev                      # LibTorch 1.13 (CPU): tensors, autograd, training, inference
  libpng-dev libjpeg62-turbo-dev    # image codecs of the core library
  nlohmann-json3-dev                # configuration and weights headers (header-only)
  libcli11-dev                      # the CLI
  libcpp-httplib-dev                # lightseg serve
  libgtest-dev libgmock-dev         # tests
  libbenchmark-dev                  # benchmarks
  libonnx-dev protobuf-compiler     # ONNX export
  libopencv-dev                     # video files and cameras (front ends only)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$jobs"
echo "setup: built build/bin/lightseg" >&2
