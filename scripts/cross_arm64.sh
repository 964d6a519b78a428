#!/usr/bin/env bash
# Cross-builds lightseg for 64-bit ARM (aarch64) on a Debian 12 x86-64 host, and optionally runs
# it under qemu-aarch64 (user-mode emulation):
#   scripts/cross_arm64.sh              the CLI (build-arm64/bin/lightseg)
#   scripts/cross_arm64.sh --check      + segment the bundled example under qemu-aarch64 and
#                                       compare its label PNG with the x86 build's fused
#                                       backend (X86_CLI, default build/bin/lightseg, when present)
#   scripts/cross_arm64.sh --tests      + lightseg_tests, run under qemu-aarch64 with
#                                       TEST_FILTER (default: the engine, predictor, eval, CLI
#                                       and segment tests)
# scripts/setup_arm64.sh makes the arm64 sysroot of Debian's packages first (once); the build
# uses cmake/aarch64-linux-gnu.cmake (g++-aarch64-linux-gnu, -march=armv8-a: NEON), without
# OpenCV (no video or camera input), the benchmarks or x86's native kernels. Emulated run
# times say nothing about an ARM board's speed.
# Environment: BUILD (default build-arm64), SYSROOT (default .cache/sysroot-arm64), JOBS
# (default nproc), X86_CLI, TEST_FILTER, LIGHTSEG_TEST_CLI_TIMEOUT (default 900: the tests' CLI
# runs are emulated too, `bench` takes minutes).
# Do not edit the tree while it builds: objects compiled against a header that changed under
# them are not rebuilt by the next call (a mixed build that crashed under qemu, 2026-12-05);
# rm -rf the build folder to be sure.
set -euo pipefail
cd "$(dirname "$0")/.."
check=0 tests=0
for a in "$@"; do
  case $a in
    --check) check=1 ;;
    --tests) tests=1 ;;
    *) echo "usage: scripts/cross_arm64.sh [--check] [--tests]" >&2; exit 2 ;;
  esac
done
BUILD=${BUILD:-build-arm64}
export SYSROOT=${SYSROOT:-$PWD/.cache/sysroot-arm64}
JOBS=${JOBS:-$(nproc)}
X86_CLI=${X86_CLI:-build/bin/lightseg}
TEST_FILTER=${TEST_FILTER:-Engine.*:Predictor.*:Eval.*:Fused.*:Cli.*:SegmentCli.*}

scripts/setup_arm64.sh

SECONDS=0
tests_opt=OFF
[ $tests -eq 1 ] && tests_opt=ON
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DLIGHTSEG_ARM64_SYSROOT="$SYSROOT" \
  -DLIGHTSEG_WITH_OPENCV=OFF -DLIGHTSEG_BUILD_BENCH=OFF -DLIGHTSEG_BUILD_TESTS=$tests_opt >/dev/null
targets=(lightseg)
[ $tests -eq 1 ] && targets+=(lightseg_tests)
cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"
# ELF e_machine 183: AArch64.
[ "$(od -An -tu2 -j18 -N2 "$BUILD/bin/lightseg" | tr -d ' ')" = 183 ] || { echo "cross_arm64: $BUILD/bin/lightseg is not an aarch64 binary" >&2; exit 1; }
echo "cross_arm64: built $BUILD/bin/lightseg (aarch64) in ${SECONDS} s" >&2

qemu=(qemu-aarch64 -L "$SYSROOT")
if [ $check -eq 1 ]; then
  SECONDS=0
  out=$BUILD/out
  rm -rf "$out"
  # The README's first command, emulated (auto is the fused backend on ARM: said and checked).
  "${qemu[@]}" "$BUILD/bin/lightseg" segment examples/0016E5_07959.png --out "$out" --format all
  python3 scripts/check_main_job.py "$out"
  echo "cross_arm64: segment under qemu-aarch64 took ${SECONDS} s (emulated: not a speed figure)" >&2
  if [ -x "$X86_CLI" ]; then
    rm -rf "$BUILD/out-x86"
    "$X86_CLI" segment examples/0016E5_07959.png --out "$BUILD/out-x86" --format ids --backend fused >/dev/null
    if cmp -s "$out/0016E5_07959.png" "$BUILD/out-x86/0016E5_07959.png"; then
      echo "cross_arm64: label PNG byte-identical to x86's fused backend" >&2
    else
      echo "cross_arm64: label PNG differs from x86's fused backend:" \
        "$(python3 scripts/compare_label_pngs.py "$out/0016E5_07959.png" "$BUILD/out-x86/0016E5_07959.png")" >&2
    fi
  else
    echo "cross_arm64: no x86 build at $X86_CLI: labels not compared" >&2
  fi
fi

if [ $tests -eq 1 ]; then
  SECONDS=0
  # The tests run the CLI through build-arm64/bin/lightseg-emulated (qemu as well).
  # (GOMP_SPINCOUNT set: the tests do not re-execute themselves for their wait policy.)
  LIGHTSEG_TEST_CLI_TIMEOUT=${LIGHTSEG_TEST_CLI_TIMEOUT:-900} GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-1000} \
    "${qemu[@]}" "$BUILD/bin/lightseg_tests" --gtest_filter="$TEST_FILTER" --gtest_brief=1
  echo "cross_arm64: lightseg_tests ($TEST_FILTER) under qemu-aarch64 took ${SECONDS} s" >&2
fi
