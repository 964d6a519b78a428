// The instruction-set cap, LIGHTSEG_MAX_ISA=generic|avx2|avx512|avx512_bf16 (internal): one
// switch that lowers what lightseg's own kernels and oneDNN may use, so that a lower level's
// path runs (and is tested) on a machine with a higher one. Unset: no cap.
#pragma once

namespace lightseg {

enum class IsaLevel { Generic = 0, Avx2 = 1, Avx512 = 2, Avx512Bf16 = 3 };

// The cap from LIGHTSEG_MAX_ISA (unset or empty: Avx512Bf16, i.e. none). Throws
// std::invalid_argument naming the variable on an unknown value.
IsaLevel max_isa_level();
const char* isa_level_name(IsaLevel level);
// The one CPU feature probe of lightseg's own kernels: the highest level this CPU runs, within
// the cap. Avx2: AVX2 + FMA; Avx512: AVX-512 F, BW, DQ and VL (oneDNN's avx512_core, what the
// 16-lane kernels are compiled for); Avx512Bf16: those and AVX512-BF16. Generic elsewhere than
// x86-64. The CPU is probed once; the cap is read on every call.
IsaLevel cpu_isa_level();
// Puts the cap into oneDNN's own variable ONEDNN_MAX_CPU_ISA (unless that is set): generic →
// SSE41, avx2 → AVX2, avx512 → AVX512_CORE. oneDNN reads it on first use: init_runtime() calls
// this first thing.
void apply_isa_cap_to_onednn();

}  // namespace lightseg
