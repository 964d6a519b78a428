// Process-wide settings every lightseg binary applies at start-up.
#pragma once

#include <string>

namespace lightseg {

// - glibc malloc: keep big activation buffers (mmap threshold 1 GiB, no trimming), which
//   otherwise go back to the OS every iteration and make training 5–30× slower;
// - LibTorch intra-op threads: `threads` if > 0, else OMP_NUM_THREADS if set, else the
//   number of cores (LibTorch's default of 1 thread wastes the machine).
// - LIGHTSEG_MAX_ISA=generic|avx2|avx512|avx512_bf16 (if set): the instruction-set cap of
//   lightseg's kernels and of oneDNN (passed on as ONEDNN_MAX_CPU_ISA unless that is set);
//   an unknown value throws std::invalid_argument.
// Returns the thread count in effect.
int init_runtime(int threads = 0);

// OpenMP threads (LibTorch's and oneDNN's) spin while they wait for work: GNU OpenMP's default
// spins ~300,000 rounds, which is fast on an idle machine and collapses (4-8x slower measured)
// when another process wants the same cores, as on a robot. lightseg's programs run with a
// short spin instead (kDefaultSpinCount, then the threads sleep). GNU OpenMP reads its variables
// once, when it is loaded, before main(): so a program sets them in its environment, or calls
// set_thread_wait_defaults() first thing in main() and, when it returns true, re-executes itself:
// reexec_with_thread_wait_defaults(argv) does both (the CLI and lightseg_tests call it). Nothing
// is changed when the user set any of OMP_WAIT_POLICY, GOMP_SPINCOUNT or KMP_BLOCKTIME (LLVM
// OpenMP), or LIGHTSEG_SPIN=default.
constexpr const char* kDefaultSpinCount = "1000";
// Sets GOMP_SPINCOUNT (and KMP_BLOCKTIME) in this process's environment when the user set none
// of the wait variables; true when it changed something (the caller must re-execute itself to
// make the OpenMP runtime read them). LIGHTSEG_SPIN=N sets the spin count, LIGHTSEG_SPIN=default
// leaves the runtime's default.
bool set_thread_wait_defaults();
// First thing in main(): set_thread_wait_defaults() and, when it changed something, execv() of
// /proc/self/exe with the same arguments. Returns only when nothing was to be done or the exec
// failed (the program then runs with the runtime's default); throws std::invalid_argument for a
// bad LIGHTSEG_SPIN. Under an emulator that does not follow exec (qemu-user without binfmt), set
// GOMP_SPINCOUNT yourself: the new image would run natively.
void reexec_with_thread_wait_defaults(char** argv);
// One line for `info` and `bench`: the OpenMP wait policy in effect and who set it.
std::string thread_wait_policy();

// Whether this CPU computes bfloat16 natively (AVX512-BF16; every AMX CPU has it too) and the cap
// allows it. Without it, bf16 autocast in training is emulated by oneDNN's and LibTorch's
// conversion paths: measured 10× slower than float32 on an AVX2 AMD EPYC (54.5 vs 5.7 s per batch-8
// step, 2 threads), so `train --precision auto` picks float32 there and an explicit bf16 warns.
bool cpu_has_native_bf16();

}  // namespace lightseg
