#!/usr/bin/env bash
# The kernel table on an emulated CPU without AVX-512: QEMU's Haswell model (AVX2 + FMA,
# emulated by QEMU 7.2's TCG). What runs is what an AVX2 laptop runs: oneDNN's avx2 kernels, the
# avx2 clones of our kernels, the 8-channel plans; a stray AVX-512 instruction would stop it with
# SIGILL. Kernels.* builds a plan for every kernel (one row each) and checks it against the
# generic path and the kernels' portable forms, on maps of at most 41x57 (LIGHTSEG_TEST_MAX_MAP):
# TCG runs every FMA lane through softfloat (~1000x slower than the host on the Xeon CI
# machines: 97x131 maps and the engine tests took over 20 minutes there). The numbers at the
# AVX2 level on full-size maps, the engine tests and the eager comparisons are the native
# LIGHTSEG_MAX_ISA=avx2 run's (ctest EngineAt_avx2).
# Usage: avx2_emulated.sh LIGHTSEG_TESTS. Exit 77 (skipped) without qemu-user.
set -euo pipefail
command -v qemu-x86_64 >/dev/null 2>&1 || { echo "qemu-x86_64 (Debian's qemu-user) is not installed: skipped"; exit 77; }
FILTER='Kernels.*:Engine.PrecisionErrorsAreClear:Engine.Int8IsRefusedWithAReason'
# TCG lacks Haswell's TSX and INVPCID; qemu says so on every start: not our business.
# GOMP_SPINCOUNT set: lightseg_tests does not re-execute itself (natively) for its wait policy.
LIGHTSEG_TEST_MAX_MAP=41x57 OMP_NUM_THREADS=2 GOMP_SPINCOUNT=1000 qemu-x86_64 -cpu Haswell "$1" --gtest_filter="$FILTER" 2> >(grep -v "TCG doesn't support requested feature" >&2)
