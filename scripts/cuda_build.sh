#!/usr/bin/env bash
# Builds the `lightseg` CLI against the CUDA LibTorch of a GPU machine (the one pip's torch
# ships), for scripts/cuda_bench.sh and scripts/cuda_train.sh. No OpenCV, ONNX, oneDNN, HTTP
# server, tests or benchmarks there; no unity build (more parallel compiles on many cores).
#
#   scripts/cuda_build.sh [build-folder]          # default: build-cuda; prints the binary's path
#
# Needs python3 with a CUDA torch, cmake >= 3.25, a C++ compiler and nvcc. The headers and
# libraries the core library needs (nlohmann-json, CLI11, libpng, libjpeg, zlib) come from the
# system, or from DEPS (default .carry/deps, made by scripts/pack_carry.sh from this machine's
# Debian packages) when the system lacks them. Environment: PYTHON, DEPS, JOBS, CXX_STANDARD,
# TESTS=1 (also build lightseg_cuda_tests, the Cuda.* tests, where GoogleTest is found: the
# system's or DEPS's; without it a message and no tests).
#
# A failed build is tried once more with -DLIGHTSEG_WITH_DISTRIBUTED=OFF (no c10d: one process
# only), so that a LibTorch whose distributed headers differ from the ones known here still
# gets a CLI; the build log of the first try stays in BUILD/lightseg-build-first.log.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-cuda}
py=${PYTHON:-python3}
DEPS=${DEPS:-.carry/deps}

say() { echo "cuda_build: $*" >&2; }
if ! "$py" -c 'import torch' 2>/dev/null; then
  say "error: '$py' cannot import torch"
  exit 1
fi
read -r prefix abi tv cu < <("$py" -c 'import torch; print(torch.utils.cmake_prefix_path, int(torch._C._GLIBCXX_USE_CXX11_ABI), torch.__version__.split("+")[0], torch.version.cuda)')
say "torch $tv (CUDA $cu, cxx11 ABI $abi) at $prefix; $(cmake --version | head -1); $(${CXX:-c++} --version | head -1)"

# The headers the core library and the CLI include, from the system or from DEPS.
extra=()
missing=()
for h in nlohmann/json.hpp CLI/CLI.hpp png.h jpeglib.h zlib.h; do
  printf '#include <cstdio>\n#include <%s>\n' "$h" | ${CXX:-c++} -std=c++17 -x c++ -fsyntax-only - 2>/dev/null ||
    missing+=("$h")  # (jpeglib.h needs FILE declared first)
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ ! -d "$DEPS/usr/include" ]; then
    say "error: missing headers: ${missing[*]} and no $DEPS (scripts/pack_carry.sh makes it; Debian: nlohmann-json3-dev libcli11-dev libpng-dev libjpeg-dev)"
    exit 1
  fi
  deps=$(cd "$DEPS/usr" && pwd)
  say "headers ${missing[*]} from $deps"
  extra+=("-DCMAKE_PREFIX_PATH=$prefix;$deps" "-DCMAKE_INCLUDE_PATH=$deps/include" "-DCMAKE_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu")
  export LD_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  extra+=("-DCMAKE_PREFIX_PATH=$prefix")
fi

# CUDA: the toolkit of the nvcc on PATH (or CUDA_HOME), the GPU's architecture for torch's CMake.
nvcc=$(command -v nvcc || { [ -n "${CUDA_HOME:-}" ] && echo "$CUDA_HOME/bin/nvcc"; } || true)
if [ -n "$nvcc" ] && [ -x "$nvcc" ]; then
  root=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
  say "nvcc: $nvcc ($root)"
  extra+=("-DCUDAToolkit_ROOT=$root" "-DCMAKE_CUDA_COMPILER=$nvcc" "-DLIGHTSEG_CUDA_NVTX3_SHIM=ON")
  if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
    arch=$("$py" -c 'import torch; c = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None; print(f"{c[0]}.{c[1]}" if c else "")')
    [ -n "$arch" ] && export TORCH_CUDA_ARCH_LIST="$arch"
  fi
fi
# LibTorch 2.12 on needs C++20 in every TU that includes ATen.
IFS=. read -r tv_major tv_minor _ <<<"$tv"
std=17
[ "$tv_major" -gt 2 ] || { [ "$tv_major" -eq 2 ] && [ "$tv_minor" -ge 12 ]; } && std=20
std=${CXX_STANDARD:-$std}

mkdir -p "$BUILD"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
tests=OFF
targets=(lightseg)
if [ "${TESTS:-0}" = 1 ]; then
  gdir=$DEPS/usr/lib/x86_64-linux-gnu/cmake/GTest
  if printf '#include <gtest/gtest.h>\n' | ${CXX:-c++} -std=c++17 -x c++ -fsyntax-only - 2>/dev/null; then
    tests=ON
  elif [ -f "$gdir/GTestConfig.cmake" ]; then
    tests=ON
    extra+=("-DGTest_DIR=$(cd "$gdir" && pwd)")
  fi
  if [ "$tests" = ON ]; then
    targets+=(lightseg_cuda_tests)
  else
    say "no GoogleTest headers (system or $DEPS): the Cuda.* tests are not built"
  fi
fi
configure() {  # extra -D options
  cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "${extra[@]}" \
    -DCMAKE_CXX_STANDARD="$std" -DCMAKE_CXX_FLAGS="-D_GLIBCXX_USE_CXX11_ABI=$abi" \
    -DLIGHTSEG_WITH_OPENCV=OFF -DLIGHTSEG_WITH_ONNX=OFF -DLIGHTSEG_WITH_SERVER=OFF -DLIGHTSEG_WITH_DNNL=OFF \
    -DLIGHTSEG_BUILD_TESTS=OFF -DLIGHTSEG_BUILD_CUDA_TESTS=$tests -DLIGHTSEG_BUILD_BENCH=OFF \
    -DLIGHTSEG_USE_CCACHE=OFF -DLIGHTSEG_UNITY=OFF "$@" >"$BUILD/lightseg-cmake.log" 2>&1
}
build() {
  cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target "${targets[@]}" >"$BUILD/lightseg-build.log" 2>&1
}
show_errors() {
  grep -m 20 -B 2 -A 8 "error" "$BUILD/lightseg-build.log" >&2 || tail -40 "$BUILD/lightseg-build.log" >&2
}
if ! configure -DLIGHTSEG_WITH_DISTRIBUTED=ON; then
  tail -40 "$BUILD/lightseg-cmake.log" >&2
  [ "$tests" = ON ] || exit 1
  say "configure failed with the Cuda.* tests (GoogleTest's CMake package?): without them"
  tests=OFF
  targets=(lightseg)
  configure -DLIGHTSEG_WITH_DISTRIBUTED=ON || { tail -40 "$BUILD/lightseg-cmake.log" >&2; exit 1; }
fi
grep -q "define LIGHTSEG_HAVE_TORCH_CUDA 1" "$BUILD/generated/lightseg/features.h" ||
  say "warning: this LibTorch was not detected as a CUDA build (no CUDA graphs)"
t0=$SECONDS
# Tries in order: everything; without c10d; the CLI alone (the tests' failure must not cost it),
# with c10d and without.
all=("${targets[@]}")
tries=("ON all" "OFF all")
[ "$tests" = ON ] && tries+=("ON cli" "OFF cli")
built=0
for t in "${tries[@]}"; do
  read -r dist which <<<"$t"
  if [ "$which" = cli ]; then
    targets=(lightseg)
    tests=OFF
  else
    targets=("${all[@]}")
  fi
  if [ "$t" != "${tries[0]}" ]; then
    say "build failed (log: $BUILD/lightseg-build-failed.log); once more: distributed $dist, targets ${targets[*]}"
  fi
  if configure -DLIGHTSEG_WITH_DISTRIBUTED="$dist" && build; then
    built=1
    break
  fi
  show_errors
  cp "$BUILD/lightseg-build.log" "$BUILD/lightseg-build-failed.log" 2>/dev/null || true
done
[ "$built" = 1 ] || exit 1
say "built ${targets[*]} in $BUILD/bin in $((SECONDS - t0)) s"
echo "$BUILD/bin/lightseg"
