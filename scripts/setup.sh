#!/usr/bin/env bash
# Sets up everything lightseg needs on Debian 12 and builds it (Release, into build/).
# Idempotent and non-interactive: installs only missing Debian packages (apt-get update
# first), then configures and builds. Usage: scripts/setup.sh [extra cmake -D options]
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  ca-certificates                   # https for npm (tests/web)
  libtorch-dev                      # LibTorch 1.13 (CPU): tensors, autograd, training, inference
  libgloo-dev                       # headers of LibTorch's c10d Gloo backend (src/distributed: data-parallel training)
  libdnnl-dev                       # oneDNN (the library LibTorch runs on): the fast CPU inference backend
  libpng-dev libjpeg62-turbo-dev    # image codecs of the core library
  nlohmann-json3-dev                # configuration and weights headers (header-only)
  libcli11-dev                      # the CLI
  libcpp-httplib-dev                # lightseg serve
  libgtest-dev libgmock-dev         # tests
  libbenchmark-dev                  # benchmarks
  libonnx-dev protobuf-compiler     # ONNX export
  libopencv-dev                     # video files and cameras (front ends only)
  chromium                          # the web page test (headless; tests/web)
  iproute2                          # `ip netns`: the two-machine distributed test
  python3                           # scripts/check_main_job.py and the test helpers
  python3-pil                       # scripts/pack_carry.sh, scripts/make_class_subset.py (JPEG copies, remapped labels)
  clang libclang-rt-14-dev libomp-dev  # the fuzz targets (libFuzzer, ASan, UBSan; omp.h for clang): scripts/fuzz.sh
  qemu-user                         # an emulated AVX2 CPU (Haswell) for the test of the non-AVX-512 path
)
# node runs the web page test, npm installs its one package: Debian's unless already present
# (NodeSource's nodejs bundles npm and conflicts with Debian's npm package).
command -v node >/dev/null 2>&1 || PACKAGES+=(nodejs)
command -v npm >/dev/null 2>&1 || PACKAGES+=(npm)

SECONDS=0
. scripts/apt_install.sh
apt_install_missing setup "${PACKAGES[@]}"
echo "setup: packages ready (${SECONDS} s)" >&2

# playwright-core for the web page test (pinned in tests/web/package-lock.json, installed into
# the git-ignored tests/web/node_modules; it drives Debian's chromium, downloads no browser).
# Offline afterwards. Without it the web page test skips with a message.
SECONDS=0
if [ ! -d tests/web/node_modules/playwright-core ]; then
  (cd tests/web && npm ci --no-audit --no-fund --loglevel=error) ||
    echo "setup: npm ci in tests/web failed; the web page test will skip" >&2
fi
echo "setup: npm ready (${SECONDS} s)" >&2

SECONDS=0
jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$jobs"
echo "setup: built build/bin/lightseg (${SECONDS} s)" >&2
