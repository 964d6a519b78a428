// 16 floats at a time with GCC vector extensions (internal; src/model's CPU kernels): loads
// and stores of float and bf16 (bf16 ⇄ float by bit shifts, rounding to nearest even). Compiled
// by each kernel set at its own target ISA; no intrinsics, so the generic build takes it too.
#pragma once

#include <cstdint>

#include <c10/util/BFloat16.h>

#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace lightseg::model {

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef uint32_t v16i __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32), aligned(2)));
inline __attribute__((always_inline)) v16 ld16(const float* p) { return *reinterpret_cast<const v16u*>(p); }
inline __attribute__((always_inline)) v16 ld16(const c10::BFloat16* p) {
  const v16i u = __builtin_convertvector(*reinterpret_cast<const v16h*>(p), v16i) << 16;
  return (v16)u;
}
inline __attribute__((always_inline)) void st16(float* p, v16 v) { *reinterpret_cast<v16u*>(p) = v; }
inline __attribute__((always_inline)) void st16(c10::BFloat16* p, v16 v) {
  v16i u = (v16i)v;
  u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  *reinterpret_cast<v16h*>(p) = __builtin_convertvector(u, v16h);
}

}  // namespace lightseg::model
