#!/usr/bin/env bash
# The kernel table and the small-map engine tests on an emulated CPU without AVX-512: QEMU's
# Haswell model (AVX2 + FMA, emulated by QEMU 7.2's TCG). What runs is what an AVX2 laptop runs:
# oneDNN's avx2 kernels, the avx2 clones of our kernels, the 8-channel plans; a stray AVX-512
# instruction would stop it with SIGILL. Kernels.* runs every kernel of the plans (one row
# each, 97x131 maps); Engine.BackendsMatchTheTrainingGraph's 360x480 pass is left to the
# native and LIGHTSEG_MAX_ISA runs (under TCG it alone took 26 minutes on a CI machine).
# Usage: avx2_emulated.sh LIGHTSEG_TESTS. Exit 77 (skipped) without qemu-user.
set -euo pipefail
command -v qemu-x86_64 >/dev/null 2>&1 || { echo "qemu-x86_64 (Debian's qemu-user) is not installed: skipped"; exit 77; }
FILTER='Kernels.*:Engine.BatchesAndRepeatedCallsAgree:Engine.OtherConfigurations:Engine.PortableKernelsMatchTheNativeOnes:Engine.Bf16HandlesEveryConfigurationAndSize:Engine.PrecisionErrorsAreClear:Engine.Int8IsRefusedWithAReason'
# TCG lacks Haswell's TSX and INVPCID; qemu says so on every start: not our business.
# GOMP_SPINCOUNT set: lightseg_tests does not re-execute itself (natively) for its wait policy.
OMP_NUM_THREADS=2 GOMP_SPINCOUNT=1000 qemu-x86_64 -cpu Haswell "$1" --gtest_filter="$FILTER" 2> >(grep -v "TCG doesn't support requested feature" >&2)
