// Process-wide settings every lightseg binary applies at start-up.
#pragma once

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

// Whether this CPU computes bfloat16 natively (AVX512-BF16; every AMX CPU has it too) and the cap
// allows it. Without it, bf16 autocast in training is emulated by oneDNN's and LibTorch's
// conversion paths: measured 10× slower than float32 on an AVX2 AMD EPYC (54.5 vs 5.7 s per batch-8
// step, 2 threads), so `train --precision auto` picks float32 there and an explicit bf16 warns.
bool cpu_has_native_bf16();

}  // namespace lightseg
