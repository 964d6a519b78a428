// The one SIMD helper set of lightseg's CPU kernels: the training ops (src/model: PReLU,
// BN + PReLU) and the inference plans (src/infer/onednn: one channel block of one pixel is one
// vector). N floats as a GCC/Clang vector-extension value, its loads and stores from float or
// bf16 storage (bf16 ⇄ float by bit shifts, rounding to nearest even), and scalar reads.
//
// No intrinsics: a kernel set compiles these at its own target ISA (its functions carry
// target("avx512f…") or target("avx2,fma"), or the build's baseline for the portable forms),
// and every helper is always inlined into the kernel, so one definition serves every ISA and
// no out-of-line copy is ever made at a newer ISA than the program's baseline. The x86-only
// forms (vcvtneps2bf16, vpmovzxwd loads, register epilogues) live under src/infer/onednn/x86/.
// bf16 storage is any 2-byte element type (uint16_t bits in the plans, c10::BFloat16 in the
// training ops), so this header needs no LibTorch include.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

// GCC notes that the ABI of 32- and 64-byte vector arguments changed in GCC 4.6; no vector here
// crosses a call (always inlined), and a pragma does not reach template instantiations, so the
// core library's targets build with -Wno-psabi (CMakeLists.txt).

#define LIGHTSEG_SIMD_INLINE inline __attribute__((always_inline))

namespace lightseg::simd {

// N floats (N = 8: one ymm register; 16: one zmm, or two ymm / four xmm in a narrower build).
template <int N>
struct Lanes {
  typedef float f32 __attribute__((vector_size(N * 4)));
  typedef float f32_unaligned __attribute__((vector_size(N * 4), aligned(4)));
  typedef uint32_t u32 __attribute__((vector_size(N * 4)));
  typedef uint16_t u16 __attribute__((vector_size(N * 2)));
  typedef uint16_t u16_unaligned __attribute__((vector_size(N * 2), aligned(2)));
  typedef int32_t i32 __attribute__((vector_size(N * 4)));
  typedef int8_t i8 __attribute__((vector_size(N)));
};
template <int N>
using vec = typename Lanes<N>::f32;

template <class T>
constexpr bool is_bf16_storage = !std::is_same_v<std::remove_cv_t<T>, float> && sizeof(T) == 2;

// N floats from p: float storage as it is, bf16 storage widened (bits << 16).
template <int N, class T>
LIGHTSEG_SIMD_INLINE vec<N> load(const T* p) {
  static_assert(std::is_same_v<std::remove_cv_t<T>, float> || is_bf16_storage<T>, "float or bf16 storage");
  if constexpr (std::is_same_v<std::remove_cv_t<T>, float>) {
    return *reinterpret_cast<const typename Lanes<N>::f32_unaligned*>(p);
  } else {
    const auto u = __builtin_convertvector(*reinterpret_cast<const typename Lanes<N>::u16_unaligned*>(p),
                                           typename Lanes<N>::u32) << 16;
    return (vec<N>)u;  // a bit cast (same-size vector types)
  }
}

// N floats to p: float storage as they are, bf16 storage rounded to nearest even (finite values).
template <int N, class T>
LIGHTSEG_SIMD_INLINE void store(T* p, vec<N> v) {
  static_assert(std::is_same_v<T, float> || is_bf16_storage<T>, "float or bf16 storage");
  if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<typename Lanes<N>::f32_unaligned*>(p) = v;
  } else {
    auto u = (typename Lanes<N>::u32)v;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    *reinterpret_cast<typename Lanes<N>::u16_unaligned*>(p) = __builtin_convertvector(u, typename Lanes<N>::u16);
  }
}

// N floats quantized to int8 (int8 plans): round(v · inv_scale) clamped to ±127 (symmetric,
// ties away from zero), the first `lanes` of them stored at p (lanes < N: a partial block).
template <int N>
LIGHTSEG_SIMD_INLINE void store_s8(int8_t* p, vec<N> v, float inv_scale, int lanes) {
  vec<N> r = v * inv_scale;
  r = r > 127.f ? vec<N>{} + 127.f : r;
  r = r < -127.f ? vec<N>{} - 127.f : r;
  r += r >= 0.f ? vec<N>{} + 0.5f : vec<N>{} - 0.5f;
  const auto q = __builtin_convertvector(__builtin_convertvector(r, typename Lanes<N>::i32), typename Lanes<N>::i8);
  if (lanes == N)
    std::memcpy(p, &q, N);
  else
    std::memcpy(p, &q, static_cast<size_t>(lanes));
}

// One element as a float (bf16 storage widened).
template <class T>
LIGHTSEG_SIMD_INLINE float scalar(const T* p) {
  if constexpr (std::is_same_v<std::remove_cv_t<T>, float>) {
    return *p;
  } else {
    static_assert(is_bf16_storage<T>, "float or bf16 storage");
    const uint32_t u = static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(p)) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
}

}  // namespace lightseg::simd
