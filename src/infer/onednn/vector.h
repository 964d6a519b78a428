// One channel block of one pixel as a vector (`vb`), bound to the one SIMD helper set
// (src/core/simd.h); the plans' tile helpers built on it.
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.

#if LIGHTSEG_NATIVE_KERNELS && defined(__GNUC__) && defined(__x86_64__)
#undef LIGHTSEG_AVX512
#define LIGHTSEG_AVX512 __attribute__((target("avx512f")))
#else
#undef LIGHTSEG_AVX512
#define LIGHTSEG_AVX512
#endif

constexpr int64_t kTile = 64;  // pixels per tile: 64×16 floats stay in L1

// One channel block of one pixel: kBlock floats (one zmm register in a 16-lane plan, one ymm
// in an 8-lane one). The helpers are src/core/simd.h's, bound to this width.
typedef simd::vec<kBlock> vb;
typedef simd::Lanes<kBlock>::u16 vbh;
typedef simd::Lanes<kBlock>::u16_unaligned vbhu;
inline __attribute__((always_inline)) vb load(const float* p) { return simd::load<kBlock>(p); }
inline __attribute__((always_inline)) void store(float* p, vb v) { simd::store<kBlock>(p, v); }
// kBlock floats → kBlock bf16, rounded to nearest even (activations are finite).
inline __attribute__((always_inline)) void store_bf16(uint16_t* p, vb v) { simd::store<kBlock>(p, v); }
inline __attribute__((always_inline)) vb load(const uint16_t* p) { return simd::load<kBlock>(p); }  // bf16 → floats
// Loads of a kernel's input: floats as they are; bf16 with AVX-512 (the *_bf16 kernels, built
// for AVX-512 only: bf16 plans need AVX512-BF16) as vpmovzxwd + vpslld. GCC 12 lowers the
// generic conversion (load(const uint16_t*)) to five instructions per vector, which took
// ~45 % of the paired depthwise kernel's samples. Inline asm, so that it compiles inside
// functions of any target; the bf16 instantiations run only inside LIGHTSEG_AVX512 ones.
inline __attribute__((always_inline)) vb in_load(const float* p) { return load(p); }
#if LIGHTSEG_ONEDNN_X86_512
#include "infer/onednn/x86/bf16.h"  // bf16 loads (vpmovzxwd + vpslld), tiles to and from bf16
#else
inline __attribute__((always_inline)) vb in_load(const uint16_t* p) { return load(p); }
void store_tile_bf16(uint16_t* d, const vb* t, int64_t np) {
  for (int64_t i = 0; i < np; ++i) store_bf16(d + i * kBlock, t[i]);
}
void load_tile_bf16(vb* t, const uint16_t* s, int64_t np, bool add) {
  for (int64_t i = 0; i < np; ++i) t[i] = add ? t[i] + load(s + i * kBlock) : load(s + i * kBlock);
}
#endif
using simd::scalar;  // one element of a float or bf16 view as a float
// One block of one pixel into an int8 NHWC copy (Epilogue::q8): `lanes` channels (< kBlock: the
// last block of a channel count that is not a multiple of it).
inline __attribute__((always_inline)) void store_s8(int8_t* p, vb v, float inv, int lanes) {
  simd::store_s8<kBlock>(p, v, inv, lanes);
}
// t[i] += v(pixel p + i of block g of image n), for f32 or bf16 views; C == 1 views broadcast lane 0.
template <class T>
inline __attribute__((always_inline)) void accumulate(vb* t, const T* q, int64_t np, bool broadcast) {
  if (broadcast)
    for (int64_t i = 0; i < np; ++i) t[i] += scalar(q + i * kBlock);
  else
    for (int64_t i = 0; i < np; ++i) t[i] += load(q + i * kBlock);
}

// t[i] += the bilinear upsampling of u.src at pixel p + i of a W-wide map (block base `base`).
template <class T>
inline __attribute__((always_inline)) void add_upsampled(const Epilogue::Upsampled& u, const T* base, vb* t,
                                                         int64_t p, int64_t np, int64_t W) {
  const int64_t sw = u.src->W;
  int64_t y = p / W, x = p % W;
  for (int64_t i = 0; i < np; ++i) {
    const float wy1 = u.th.w1[y], wy0 = 1.f - wy1, wx1 = u.tw.w1[x], wx0 = 1.f - wx1;
    const T* r0 = base + u.th.i0[y] * sw * kBlock;
    const T* r1 = base + u.th.i1[y] * sw * kBlock;
    const int64_t a = u.tw.i0[x] * kBlock, b = u.tw.i1[x] * kBlock;
    t[i] += wy0 * (wx0 * load(r0 + a) + wx1 * load(r0 + b)) + wy1 * (wx0 * load(r1 + a) + wx1 * load(r1 + b));
    if (++x == W) {
      x = 0;
      ++y;
    }
  }
}
