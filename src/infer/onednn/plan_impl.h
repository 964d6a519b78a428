// The onednn backend's plans, for one channel-block width (internal). Included once per
// width by plan_b16.cpp (nChw16c: oneDNN's AVX-512 kernels) and plan_b8.cpp (nChw8c: its
// AVX2 and SSE4.1 kernels), each defining:
//   LIGHTSEG_ONEDNN_BLOCK    16 or 8 (kBlock: channels per block, floats per vector `vb`)
//   LIGHTSEG_ONEDNN_NS       the namespace of that width's plans (b16, b8)
//   LIGHTSEG_ONEDNN_X86_512  1 where the AVX-512 forms of the kernels (register epilogues,
//                            packed logits, bf16 tiles) are compiled: x86-64 GCC/Clang, 16 lanes
// See onednn_engine.cpp for what a plan is. Every vector type here is one channel block of
// one pixel (GCC/Clang vector extension: one zmm in the AVX-512 clone of a 16-lane plan, one
// ymm in the AVX2 clone of an 8-lane one, portable code elsewhere).
#pragma once

#if LIGHTSEG_ONEDNN_X86_512
#include <immintrin.h>
#endif

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <new>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "infer/onednn/blocked.h"

namespace lightseg::onednn::LIGHTSEG_ONEDNN_NS {


using tag = dnnl::memory::format_tag;
using dtype = dnnl::memory::data_type;
using dims = dnnl::memory::dims;
constexpr int64_t kBlock = LIGHTSEG_ONEDNN_BLOCK;
// oneDNN's blocked layout of that width: its AVX-512 kernels take nChw16c, its AVX2/SSE4.1 ones nChw8c.
constexpr tag kBlockedTag = kBlock == 16 ? tag::nChw16c : tag::nChw8c;

int64_t round_up(int64_t c) { return (c + kBlock - 1) / kBlock * kBlock; }

// Where a value lives: a buffer of `ctot` channels in nChw16c (or, for the normalised image,
// plain NCHW or NHWC, whichever the first convolution runs faster on), the value being
// channels [coff, coff + C) of it (coff > 0: a concat part written in place).
struct View {
  float* data = nullptr;  // the storage (of uint16_t elements when bf16)
  int64_t N = 0, C = 0, H = 0, W = 0;
  int64_t ctot = 0, coff = 0;
  enum class Fmt { Blocked, Nchw, Nhwc } fmt = Fmt::Blocked;  // plain formats: the normalised image only
  bool bf16 = false;  // elements are bf16 (bf16 plans: values only bf16-capable kernels read)
  int64_t pixels() const { return H * W; }
  int64_t offset(int64_t n, int64_t g) const {  // element index of pixel 0 of block g of image n
    return ((n * (round_up(ctot) / kBlock) + coff / kBlock + g) * pixels()) * kBlock;
  }
  // Pointer to pixel 0 of channel block g of image n (blocked views), f32 or bf16 storage.
  float* block(int64_t n, int64_t g) const { return data + offset(n, g); }
  uint16_t* blockh(int64_t n, int64_t g) const { return reinterpret_cast<uint16_t*>(data) + offset(n, g); }
  dnnl::memory::desc desc() const {
    return dnnl::memory::desc({N, C, H, W}, bf16 ? dtype::bf16 : dtype::f32,
                              fmt == Fmt::Nchw ? tag::nchw : fmt == Fmt::Nhwc ? tag::nhwc : kBlockedTag);
  }
  // Storage size in floats (bf16: half the elements, rounded up).
  size_t floats() const {
    const auto n = static_cast<size_t>(N * (fmt == Fmt::Blocked ? round_up(ctot) : ctot) * H * W);
    return bf16 ? (n + 1) / 2 : n;
  }
};

// PyTorch's bilinear source index (align_corners = false): i0, i1 and the weight of i1.
struct Taps {
  std::vector<int64_t> i0, i1;
  std::vector<float> w1;
};
Taps taps(int64_t in, int64_t out) {
  Taps t;
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  for (int64_t d = 0; d < out; ++d) {
    float s = scale * (static_cast<float>(d) + 0.5f) - 0.5f;
    if (s < 0.f) s = 0.f;
    int64_t a = std::min(static_cast<int64_t>(s), in - 1);
    t.i0.push_back(a);
    t.i1.push_back(a + (a < in - 1 ? 1 : 0));
    t.w1.push_back(s - static_cast<float>(a));
  }
  return t;
}

// The per-operation pass: out = Σ add + act(x·scale + shift + residual) ⊙ mul, on blocks of
// 16 channels. Per-channel arrays are padded to whole blocks with zeros; `valid` is 1 on real
// channels and 0 on the padding, so padded lanes stay zero (oneDNN's blocked layouts need it).
struct Epilogue {
  View src, dst;
  const float* scale = nullptr;  // with shift: the per-channel affine
  const float* shift = nullptr;
  const float* slopes = nullptr;  // PReLU
  Act act = Act::None;
  const View* residual = nullptr;
  const View* mul = nullptr;  // one channel, broadcast
  std::vector<const View*> adds;  // C or one channel (broadcast)
  // Bilinear upsamplings (align_corners = false) of smaller values with dst's channels, added
  // like `adds`: a resize whose only use is this addition is never stored (C1.9's ×2 of X3).
  struct Upsampled {
    const View* src;
    Taps th, tw;
  };
  std::vector<Upsampled> upsampled;
  const float* valid = nullptr;
  uint16_t* shadow = nullptr;  // bf16 copy of an f32 dst (its own nChw16c buffer), when a bf16 conv reads it
  bool write_dst = true;       // false: only the shadow is read later
};

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#undef LIGHTSEG_MULTIVERSION
#define LIGHTSEG_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#undef LIGHTSEG_MULTIVERSION
#define LIGHTSEG_MULTIVERSION
#endif
#if defined(__GNUC__) && defined(__x86_64__)
#undef LIGHTSEG_AVX512
#define LIGHTSEG_AVX512 __attribute__((target("avx512f")))
#else
#undef LIGHTSEG_AVX512
#define LIGHTSEG_AVX512
#endif

constexpr int64_t kTile = 64;  // pixels per tile: 64×16 floats stay in L1

// 16 floats: one channel block of one pixel (GCC/Clang vector extension; one zmm register in
// the AVX-512 clone, two ymm in the AVX2 one). The helpers are always inlined into the
// clones, so the ABI note GCC gives for 64-byte vector returns does not apply.
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
typedef float vb __attribute__((vector_size(kBlock * 4)));
typedef float vbu __attribute__((vector_size(kBlock * 4), aligned(4)));
inline __attribute__((always_inline)) vb load(const float* p) { return *reinterpret_cast<const vbu*>(p); }
inline __attribute__((always_inline)) void store(float* p, vb v) { *reinterpret_cast<vbu*>(p) = v; }
// 16 floats → 16 bf16, rounded to nearest even (activations are finite).
typedef uint32_t vbi __attribute__((vector_size(kBlock * 4)));
typedef uint16_t vbh __attribute__((vector_size(kBlock * 2)));
typedef uint16_t vbhu __attribute__((vector_size(kBlock * 2), aligned(2)));
inline __attribute__((always_inline)) void store_bf16(uint16_t* p, vb v) {
  vbi u = (vbi)v;  // a bit cast (same-size vector types)
  u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  *reinterpret_cast<vbhu*>(p) = __builtin_convertvector(u, vbh);
}
inline __attribute__((always_inline)) vb load(const uint16_t* p) {  // 16 bf16 → 16 floats
  const vbi u = __builtin_convertvector(*reinterpret_cast<const vbhu*>(p), vbi) << 16;
  return (vb)u;
}
// Loads of a kernel's input: floats as they are; bf16 with AVX-512 (the *_bf16 kernels, built
// for AVX-512 only: bf16 plans need AVX512-BF16) as vpmovzxwd + vpslld. GCC 12 lowers the
// generic conversion (load(const uint16_t*)) to five instructions per vector, which took
// ~45 % of the paired depthwise kernel's samples. Inline asm, so that it compiles inside
// functions of any target; the bf16 instantiations run only inside LIGHTSEG_AVX512 ones.
inline __attribute__((always_inline)) vb in_load(const float* p) { return load(p); }
inline __attribute__((always_inline)) vb in_load(const uint16_t* p) {
#if LIGHTSEG_ONEDNN_X86_512
  vb r;
  asm("vpmovzxwd %1, %0\n\tvpslld $16, %0, %0" : "=v"(r) : "m"(*reinterpret_cast<const char(*)[32]>(p)));
  return r;
#else
  return load(p);
#endif
}
inline __attribute__((always_inline)) float scalar(const float* p) { return *p; }
inline __attribute__((always_inline)) float scalar(const uint16_t* p) {
  const uint32_t u = static_cast<uint32_t>(*p) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
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

// np vectors of t → bf16 at d (16 per pixel). bf16 values exist only in bf16 plans, which
// need AVX512-BF16: one vcvtneps2bf16 per vector (round to nearest even, as store_bf16),
// instead of the seven instructions GCC makes of store_bf16.
#if LIGHTSEG_ONEDNN_X86_512
__attribute__((target("avx512f,avx512bf16"), noinline)) void store_tile_bf16(uint16_t* d, const vb* t, int64_t np) {
  for (int64_t i = 0; i < np; ++i)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i * kBlock),
                        (__m256i)_mm512_cvtneps_pbh(reinterpret_cast<const __m512*>(t)[i]));
}
// t[i] = (or +=) the bf16 vector at s + 16·i, likewise (vpmovzxwd + vpslld).
__attribute__((target("avx512f"), noinline)) void load_tile_bf16(vb* t, const uint16_t* s, int64_t np, bool add) {
  for (int64_t i = 0; i < np; ++i) {
    const vb v = in_load(s + i * kBlock);
    t[i] = add ? t[i] + v : v;
  }
}
#else
void store_tile_bf16(uint16_t* d, const vb* t, int64_t np) {
  for (int64_t i = 0; i < np; ++i) store_bf16(d + i * kBlock, t[i]);
}
void load_tile_bf16(vb* t, const uint16_t* s, int64_t np, bool add) {
  for (int64_t i = 0; i < np; ++i) t[i] = add ? t[i] + load(s + i * kBlock) : load(s + i * kBlock);
}
#endif

// The activation of an epilogue on a tile of block g.
inline __attribute__((always_inline)) void activate(const Epilogue& e, vb* t, int64_t g, int64_t np) {
  if (e.act == Act::PReLU) {
    const vb s = load(e.slopes + g * kBlock);
    for (int64_t i = 0; i < np; ++i) t[i] = t[i] > 0.f ? t[i] : t[i] * s;
  } else if (e.act == Act::ReLU) {
    for (int64_t i = 0; i < np; ++i) t[i] = t[i] > 0.f ? t[i] : vb{};
  } else if (e.act == Act::Sigmoid) {
    for (int64_t i = 0; i < np; ++i)
      for (int l = 0; l < kBlock; ++l) t[i][l] = 1.f / (1.f + std::exp(-t[i][l]));
  }
}

// The pass on one tile already in `t` (pixels [p, p + np) of block g of image n): affine,
// residual, activation, product, additions, padding lanes to zero; then the store.
LIGHTSEG_MULTIVERSION
void finish_tile(const Epilogue& e, vb* t, int64_t n, int64_t g, int64_t p, int64_t np, const vb* extra = nullptr) {
  const int64_t c0 = g * kBlock;
  if (e.scale) {
    const vb sc = load(e.scale + c0), sh = load(e.shift + c0);
    for (int64_t i = 0; i < np; ++i) t[i] = t[i] * sc + sh;
  }
  if (e.residual) {
    if (e.residual->bf16)
      load_tile_bf16(t, e.residual->blockh(n, g) + p * kBlock, np, true);
    else
      accumulate(t, e.residual->block(n, g) + p * kBlock, np, false);
  }
  activate(e, t, g, np);
  if (e.mul) {  // lane 0 of the one-channel value
    if (e.mul->bf16) {
      const uint16_t* q = e.mul->blockh(n, 0) + p * kBlock;
      for (int64_t i = 0; i < np; ++i) t[i] *= scalar(q + i * kBlock);
    } else {
      const float* q = e.mul->block(n, 0) + p * kBlock;
      for (int64_t i = 0; i < np; ++i) t[i] *= q[i * kBlock];
    }
  }
  for (const View* a : e.adds) {
    const int64_t ga = a->C == 1 ? 0 : g;
    if (a->bf16 && a->C != 1)
      load_tile_bf16(t, a->blockh(n, ga) + p * kBlock, np, true);
    else if (a->bf16)
      accumulate(t, a->blockh(n, ga) + p * kBlock, np, true);
    else
      accumulate(t, a->block(n, ga) + p * kBlock, np, a->C == 1);
  }
  for (const auto& u : e.upsampled) {
    if (u.src->bf16)
      add_upsampled(u, u.src->blockh(n, g), t, p, np, e.dst.W);
    else
      add_upsampled(u, u.src->block(n, g), t, p, np, e.dst.W);
  }
  if (extra)  // a tile computed alongside (paired depthwise convolutions)
    for (int64_t i = 0; i < np; ++i) t[i] += extra[i];
  if (c0 + kBlock > e.dst.C) {  // a block with padding lanes: keep them zero
    const vb v = load(e.valid + c0);
    for (int64_t i = 0; i < np; ++i) t[i] *= v;
  }
  if (e.write_dst && e.dst.bf16) {
    uint16_t* d = e.dst.blockh(n, g) + p * kBlock;
    store_tile_bf16(d, t, np);
  } else if (e.write_dst) {
    float* d = e.dst.block(n, g) + p * kBlock;
    for (int64_t i = 0; i < np; ++i) store(d + i * kBlock, t[i]);
  }
  if (e.shadow) {
    uint16_t* h = e.shadow + ((n * (round_up(e.dst.C) / kBlock) + g) * e.dst.pixels() + p) * kBlock;
    store_tile_bf16(h, t, np);
  }
}

LIGHTSEG_MULTIVERSION
void epilogue_tile(const Epilogue& e, int64_t n, int64_t g, int64_t p, int64_t np) {
  vb t[kTile];
  if (e.src.bf16) {
    load_tile_bf16(t, e.src.blockh(n, g) + p * kBlock, np, false);
  } else {
    const float* s = e.src.block(n, g) + p * kBlock;
    for (int64_t i = 0; i < np; ++i) t[i] = load(s + i * kBlock);
  }
  finish_tile(e, t, n, g, p, np);
}

// Register epilogues: the usual epilogue, act(x + residual) [⊙ m] + additions [+ an upsampled
// value] (+ a paired tile) with PReLU or no activation, into f32 and/or bf16 (the value and/or
// its bf16 copy), eight vectors at a time kept in registers from their loads to their stores,
// instead of finish_tile's one loop per step over a tile in L1. Measured (360x480, alternated):
// the passes after oneDNN convolutions 2.4 -> 1.3 ms in bf16, the depthwise kernels ~10 %
// faster, all our kernels 6.5 -> 4.9 ms in fp32. AVX-512 (x86-64 GCC/Clang) and whole channel
// blocks only; everything else, and every CPU without AVX-512, takes finish_tile (the same
// arithmetic in the same order: tests/test_engine.cpp compares them).
#if LIGHTSEG_ONEDNN_X86_512
// One addition: a vector per pixel (bf16 or f32) or a one-channel value's lane 0, broadcast.
struct Operand {
  const void* p = nullptr;
  int kind = 0;  // 0 none, 1 bf16 vector, 2 f32 vector, 3 f32 broadcast, 4 bf16 broadcast
};
Operand operand(const View* a, int64_t n, int64_t g, int64_t p) {
  Operand o;
  if (!a) return o;
  const int64_t ga = a->C == 1 ? 0 : g;
  o.p = a->bf16 ? static_cast<const void*>(a->blockh(n, ga) + p * kBlock)
                : static_cast<const void*>(a->block(n, ga) + p * kBlock);
  o.kind = a->C != 1 ? (a->bf16 ? 1 : 2) : (a->bf16 ? 4 : 3);
  return o;
}
// v[j] += operand a at vector i0 + j, j < M (one dispatch per M vectors).
template <int M>
inline __attribute__((always_inline)) void add_operand(vb* v, const Operand& a, int64_t i0) {
  switch (a.kind) {
    case 1:
      for (int j = 0; j < M; ++j) v[j] += in_load(static_cast<const uint16_t*>(a.p) + (i0 + j) * kBlock);
      break;
    case 2:
      for (int j = 0; j < M; ++j) v[j] += load(static_cast<const float*>(a.p) + (i0 + j) * kBlock);
      break;
    case 3:
      for (int j = 0; j < M; ++j) v[j] += static_cast<const float*>(a.p)[(i0 + j) * kBlock];
      break;
    case 4:
      for (int j = 0; j < M; ++j) v[j] += scalar(static_cast<const uint16_t*>(a.p) + (i0 + j) * kBlock);
      break;
    default:
      break;
  }
}
inline __attribute__((always_inline)) vb fetch(const vb* t, int64_t i) { return t[i]; }
inline __attribute__((always_inline)) vb fetch(const float* s, int64_t i) { return load(s + i * kBlock); }
inline __attribute__((always_inline)) vb fetch(const uint16_t* s, int64_t i) { return in_load(s + i * kBlock); }
// f32 → bf16 rounded to nearest even (vcvtneps2bf16; asm, so that it compiles in an AVX-512F
// function: it only runs where a bf16 value exists, i.e. in bf16 plans on AVX512-BF16 CPUs).
inline __attribute__((always_inline)) void out_bf16(uint16_t* d, vb v) {
  vbh h;
  asm("vcvtneps2bf16 %1, %0" : "=v"(h) : "v"(v));
  *reinterpret_cast<vbhu*>(d) = h;
}

bool register_epilogue_fits(const Epilogue& e) {
  if (!avx512_kernels() || (e.act != Act::PReLU && e.act != Act::None) || e.scale || (e.mul && e.mul->C != 1) ||
      e.upsampled.size() > 1 || e.adds.size() > 2 || e.dst.C % kBlock != 0 || (!e.write_dst && !e.shadow) ||
      (e.residual && e.residual->C != e.dst.C))
    return false;
  return std::all_of(e.adds.begin(), e.adds.end(), [&](const View* a) { return a->C == 1 || a->C == e.dst.C; }) &&
         std::all_of(e.upsampled.begin(), e.upsampled.end(), [&](const auto& u) { return u.src->C == e.dst.C; });
}

// The bilinear upsampling (Epilogue::Upsampled) added to M vectors: pixels p, p + 1, ... of a
// W-wide map, block g of image n.
struct UpsampledAt {
  const Epilogue::Upsampled* u = nullptr;
  int64_t n = 0, g = 0, W = 0;
  int64_t p = 0;  // the chunk's first pixel
};
template <int M, class T>
inline __attribute__((always_inline)) void add_upsampled_chunk(vb* v, const UpsampledAt& a, const T* base) {
  const auto& u = *a.u;
  const int64_t sw = u.src->W;
  int64_t y = a.p / a.W, x = a.p % a.W;
  for (int j = 0; j < M; ++j) {
    const float wy1 = u.th.w1[y], wy0 = 1.f - wy1, wx1 = u.tw.w1[x], wx0 = 1.f - wx1;
    const T* r0 = base + u.th.i0[y] * sw * kBlock;
    const T* r1 = base + u.th.i1[y] * sw * kBlock;
    const int64_t i0 = u.tw.i0[x] * kBlock, i1 = u.tw.i1[x] * kBlock;
    v[j] += wy0 * (wx0 * in_load(r0 + i0) + wx1 * in_load(r0 + i1)) +
            wy1 * (wx0 * in_load(r1 + i0) + wx1 * in_load(r1 + i1));
    if (++x == a.W) {
      x = 0;
      ++y;
    }
  }
}

// M vectors from vector i0 on, in registers from their loads to their stores (Full: with the
// product and the upsampled addition, C6.1's fusion; its own instance keeps the others lean).
template <int M, bool Full, class S>
inline __attribute__((always_inline)) void register_chunk(const S* s, int64_t i0, const Operand& res,
                                                          const Operand& mul, const Operand& a0, const Operand& a1,
                                                          const UpsampledAt& up, vb slope, const vb* extra,
                                                          float* d32, uint16_t* d16, uint16_t* h) {
  vb v[M];
  for (int j = 0; j < M; ++j) v[j] = fetch(s, i0 + j);
  add_operand<M>(v, res, i0);
  for (int j = 0; j < M; ++j) v[j] = v[j] < 0.f ? v[j] * slope : v[j];
  if constexpr (Full) {
    if (mul.kind == 3)
      for (int j = 0; j < M; ++j) v[j] *= static_cast<const float*>(mul.p)[(i0 + j) * kBlock];
    else if (mul.kind == 4)
      for (int j = 0; j < M; ++j) v[j] *= scalar(static_cast<const uint16_t*>(mul.p) + (i0 + j) * kBlock);
  }
  add_operand<M>(v, a0, i0);
  add_operand<M>(v, a1, i0);
  if constexpr (Full) {
    if (up.u) {
      UpsampledAt at = up;
      at.p += i0;
      if (up.u->src->bf16)
        add_upsampled_chunk<M>(v, at, up.u->src->blockh(up.n, up.g));
      else
        add_upsampled_chunk<M>(v, at, up.u->src->block(up.n, up.g));
    }
  }
  if (extra)
    for (int j = 0; j < M; ++j) v[j] += extra[i0 + j];
  if (d32)
    for (int j = 0; j < M; ++j) store(d32 + (i0 + j) * kBlock, v[j]);
  if (d16)
    for (int j = 0; j < M; ++j) out_bf16(d16 + (i0 + j) * kBlock, v[j]);
  if (h)
    for (int j = 0; j < M; ++j) out_bf16(h + (i0 + j) * kBlock, v[j]);
}

// The epilogue of pixels [p, p + np) of block g of image n, the convolution's result coming from
// a tile (S = vb) or from the source value's block (S = float or uint16_t).
template <class S>
__attribute__((target("avx512f"), noinline)) void register_epilogue(const Epilogue& e, const S* s, int64_t n,
                                                                    int64_t g, int64_t p, int64_t np,
                                                                    const vb* extra) {
  const Operand res = operand(e.residual, n, g, p);
  const Operand a0 = operand(e.adds.size() > 0 ? e.adds[0] : nullptr, n, g, p);
  const Operand a1 = operand(e.adds.size() > 1 ? e.adds[1] : nullptr, n, g, p);
  const Operand mul = operand(e.mul, n, g, p);
  UpsampledAt up;
  if (!e.upsampled.empty()) up = {&e.upsampled[0], n, g, e.dst.W, p};
  uint16_t* d16 = e.write_dst && e.dst.bf16 ? e.dst.blockh(n, g) + p * kBlock : nullptr;
  float* d32 = e.write_dst && !e.dst.bf16 ? e.dst.block(n, g) + p * kBlock : nullptr;
  uint16_t* h = e.shadow ? e.shadow + ((n * (e.dst.C / kBlock) + g) * e.dst.pixels() + p) * kBlock : nullptr;
  const vb slope = e.act == Act::PReLU ? load(e.slopes + g * kBlock) : vb{} + 1.f;
  int64_t i = 0;
  if (e.mul || up.u) {
    for (; i + 8 <= np; i += 8) register_chunk<8, true>(s, i, res, mul, a0, a1, up, slope, extra, d32, d16, h);
    for (; i < np; ++i) register_chunk<1, true>(s, i, res, mul, a0, a1, up, slope, extra, d32, d16, h);
  } else {
    for (; i + 8 <= np; i += 8) register_chunk<8, false>(s, i, res, mul, a0, a1, up, slope, extra, d32, d16, h);
    for (; i < np; ++i) register_chunk<1, false>(s, i, res, mul, a0, a1, up, slope, extra, d32, d16, h);
  }
}
#else
bool register_epilogue_fits(const Epilogue&) { return false; }
template <class S>
void register_epilogue(const Epilogue&, const S*, int64_t, int64_t, int64_t, int64_t, const vb*) {}
#endif

// Depthwise k×k convolution (any stride, dilation, padding) on blocks of 16 channels with the
// epilogue fused: oneDNN 2.6's JIT depthwise kernels refuse large dilations on small maps
// (its reference kernel is ~500× slower) and cannot fuse PReLU.
struct DepthwiseConv {
  Epilogue e;            // e.src: the convolution's input
  torch::Tensor weight;  // [blocks][kh][kw][16], zero on padding lanes
  torch::Tensor bias;    // [blocks·16]
  int64_t kh = 3, kw = 3, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
};

// R output pixels from x0 on, every tap inside the input: accumulators in registers.
template <int R, class T>
inline __attribute__((always_inline)) void depthwise_run(const DepthwiseConv& c, const T* const* rowp,
                                                         const int64_t* rows, int nrows, const float* w, vb b,
                                                         int64_t xo, vb* out) {
  const int64_t xs = c.sw * kBlock;
  vb acc[R];
  for (int j = 0; j < R; ++j) acc[j] = b;
  for (int r = 0; r < nrows; ++r) {
    const int64_t ky = rows[r];
    for (int64_t kx = 0; kx < c.kw; ++kx) {
      const vb wk = load(w + (ky * c.kw + kx) * kBlock);
      const T* s = rowp[r] + (xo * c.sw - c.pw + kx * c.dw) * kBlock;
      for (int j = 0; j < R; ++j) acc[j] += wk * in_load(s + j * xs);
    }
  }
  for (int j = 0; j < R; ++j) out[j] = acc[j];
}

// The same for 3-wide kernels at stride 1 and dilation D (1 or 2): each input vector of a
// kernel row is loaded (and, for bf16, converted) once and used by up to three taps.
template <int R, int D, class T>
inline __attribute__((always_inline)) void depthwise_run3(const DepthwiseConv& c, const T* const* rowp,
                                                          const int64_t* rows, int nrows, const float* w, vb b,
                                                          int64_t xo, vb* out) {
  vb acc[R];
  for (int j = 0; j < R; ++j) acc[j] = b;
  for (int r = 0; r < nrows; ++r) {
    const float* wr = w + rows[r] * 3 * kBlock;
    const vb w0 = load(wr), w1 = load(wr + kBlock), w2 = load(wr + 2 * kBlock);
    const T* s = rowp[r] + (xo - c.pw) * kBlock;
    vb win[R + 2 * D];
    for (int j = 0; j < R + 2 * D; ++j) win[j] = in_load(s + j * kBlock);
    for (int j = 0; j < R; ++j) acc[j] += w0 * win[j];  // three FMAs (one sum would be mul + 2 FMA + add)
    for (int j = 0; j < R; ++j) acc[j] += w1 * win[j + D];
    for (int j = 0; j < R; ++j) acc[j] += w2 * win[j + 2 * D];
  }
  for (int j = 0; j < R; ++j) out[j] = acc[j];
}

// One output row of a depthwise convolution: the kernel rows inside the input and the
// output columns [in_lo, in_hi) whose every tap is inside.
template <class T>
struct DwRow {
  int64_t rows[16];
  const T* rowp[16];
  int nrows = 0;
  int64_t in_lo = 0, in_hi = 0;
  const float* w = nullptr;
  vb b;
};

template <class T>
inline __attribute__((always_inline)) DwRow<T> dw_row(const DepthwiseConv& c, const T* src, int64_t g, int64_t y) {
  const View& x = c.e.src;
  const int64_t OW = c.e.dst.W, IH = x.H, IW = x.W;
  DwRow<T> r;
  r.w = c.weight.data_ptr<float>() + g * c.kh * c.kw * kBlock;
  r.b = load(c.bias.data_ptr<float>() + g * kBlock);
  for (int64_t ky = 0; ky < c.kh && ky < 16; ++ky) {
    const int64_t iy = y * c.sh - c.ph + ky * c.dh;
    if (iy >= 0 && iy < IH) {
      r.rows[r.nrows] = ky;
      r.rowp[r.nrows++] = src + iy * IW * kBlock;
    }
  }
  r.in_lo = std::min(OW, (c.pw + c.sw - 1) / c.sw);
  const int64_t last = IW - 1 - (c.kw - 1) * c.dw + c.pw;  // x·sw ≤ last
  r.in_hi = std::max(r.in_lo, std::min(OW, last >= 0 ? last / c.sw + 1 : 0));
  return r;
}

// Output pixels [x0, x0 + np) of the row: convolution plus bias into t.
template <class T>
inline __attribute__((always_inline)) void dw_tile(const DepthwiseConv& c, const DwRow<T>& r, int64_t x0, int64_t np,
                                                   vb* t) {
  const int64_t IW = c.e.src.W;
  // interior pixels: runs of 8, then 4, 2, 1, in registers
  const int64_t a = std::clamp(r.in_lo, x0, x0 + np), e = std::clamp(r.in_hi, a, x0 + np);
  int64_t xo = a;
  if (c.kw == 3 && c.sw == 1 && c.dw == 1)
    for (; xo + 8 <= e; xo += 8) depthwise_run3<8, 1>(c, r.rowp, r.rows, r.nrows, r.w, r.b, xo, t + (xo - x0));
  else if (c.kw == 3 && c.sw == 1 && c.dw == 2)
    for (; xo + 8 <= e; xo += 8) depthwise_run3<8, 2>(c, r.rowp, r.rows, r.nrows, r.w, r.b, xo, t + (xo - x0));
  for (; xo + 8 <= e; xo += 8) depthwise_run<8>(c, r.rowp, r.rows, r.nrows, r.w, r.b, xo, t + (xo - x0));
  if (xo + 4 <= e) {
    depthwise_run<4>(c, r.rowp, r.rows, r.nrows, r.w, r.b, xo, t + (xo - x0));
    xo += 4;
  }
  if (xo + 2 <= e) {
    depthwise_run<2>(c, r.rowp, r.rows, r.nrows, r.w, r.b, xo, t + (xo - x0));
    xo += 2;
  }
  if (xo < e) depthwise_run<1>(c, r.rowp, r.rows, r.nrows, r.w, r.b, xo, t + (xo - x0));
  // border pixels [x0, a) and [e, x0 + np): tap by tap over the pixels where the tap is inside
  for (auto [lo, hi] : {std::pair<int64_t, int64_t>{x0, a}, std::pair<int64_t, int64_t>{e, x0 + np}}) {
    if (lo >= hi) continue;
    for (int64_t p = lo; p < hi; ++p) t[p - x0] = r.b;
    for (int k = 0; k < r.nrows; ++k) {
      const int64_t ky = r.rows[k];
      for (int64_t kx = 0; kx < c.kw; ++kx) {
        const int64_t off = kx * c.dw - c.pw;  // ix = xo·sw + off ∈ [0, IW)
        const int64_t tlo = std::max(lo, off >= 0 ? 0 : (-off + c.sw - 1) / c.sw);
        const int64_t thi = std::min(hi, IW - 1 - off >= 0 ? (IW - 1 - off) / c.sw + 1 : 0);
        const vb wk = load(r.w + (ky * c.kw + kx) * kBlock);
        for (int64_t p = tlo; p < thi; ++p) t[p - x0] += wk * in_load(r.rowp[k] + (p * c.sw + off) * kBlock);
      }
    }
  }
}

template <class T>
inline __attribute__((always_inline)) void depthwise_row_impl(const DepthwiseConv& c, const T* src, int64_t n,
                                                              int64_t g, int64_t y) {
  const int64_t OW = c.e.dst.W;
  const DwRow<T> r = dw_row(c, src, g, y);
  const bool fast = register_epilogue_fits(c.e);
  vb t[kTile];
  for (int64_t x0 = 0; x0 < OW; x0 += kTile) {
    const int64_t np = std::min(kTile, OW - x0);
    dw_tile(c, r, x0, np, t);
    if (fast)
      register_epilogue(c.e, static_cast<const vb*>(t), n, g, y * OW + x0, np, nullptr);
    else
      finish_tile(c.e, t, n, g, y * OW + x0, np);
  }
}

// Two depthwise convolutions of the same input whose sums meet (FEB's C4.3 + C4.4 + C4.5:
// U = act(B(P)) + P + act(A(P))): one pass over P, A's output never stored.
struct PairedDepthwise {
  DepthwiseConv a, b;  // b.e: the epilogue of the sum (its additions, destination)
};


template <class T>
inline __attribute__((always_inline)) void paired_row_impl(const PairedDepthwise& c, const T* src, int64_t n,
                                                           int64_t g, int64_t y) {
  const int64_t OW = c.b.e.dst.W;
  const DwRow<T> ra = dw_row(c.a, src, g, y), rb = dw_row(c.b, src, g, y);
  const bool fast = register_epilogue_fits(c.b.e);
  vb ta[kTile], t[kTile];
  for (int64_t x0 = 0; x0 < OW; x0 += kTile) {
    const int64_t np = std::min(kTile, OW - x0);
    dw_tile(c.a, ra, x0, np, ta);
    activate(c.a.e, ta, g, np);
    dw_tile(c.b, rb, x0, np, t);
    if (fast)
      register_epilogue(c.b.e, static_cast<const vb*>(t), n, g, y * OW + x0, np, ta);
    else
      finish_tile(c.b.e, t, n, g, y * OW + x0, np, ta);
  }
}

LIGHTSEG_MULTIVERSION
void paired_row(const PairedDepthwise& c, int64_t n, int64_t g, int64_t y) {
  paired_row_impl(c, c.b.e.src.block(n, g), n, g, y);
}
LIGHTSEG_AVX512
void paired_row_bf16(const PairedDepthwise& c, int64_t n, int64_t g, int64_t y) {
  paired_row_impl(c, c.b.e.src.blockh(n, g), n, g, y);
}

void run_paired(const PairedDepthwise& c) {
  const int64_t blocks = round_up(c.b.e.dst.C) / kBlock, OH = c.b.e.dst.H;
  const bool b16 = c.b.e.src.bf16;
  at::parallel_for(0, c.b.e.dst.N * blocks * OH, 4, [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) {
      if (b16)
        paired_row_bf16(c, i / (blocks * OH), (i / OH) % blocks, i % OH);
      else
        paired_row(c, i / (blocks * OH), (i / OH) % blocks, i % OH);
    }
  });
}

LIGHTSEG_MULTIVERSION
void depthwise_row(const DepthwiseConv& c, int64_t n, int64_t g, int64_t y) {
  depthwise_row_impl(c, c.e.src.block(n, g), n, g, y);
}
LIGHTSEG_AVX512
void depthwise_row_bf16(const DepthwiseConv& c, int64_t n, int64_t g, int64_t y) {
  depthwise_row_impl(c, c.e.src.blockh(n, g), n, g, y);
}

void run_depthwise(const DepthwiseConv& c) {
  const int64_t blocks = round_up(c.e.dst.C) / kBlock, OH = c.e.dst.H;
  const bool b16 = c.e.src.bf16;
  at::parallel_for(0, c.e.dst.N * blocks * OH, 4, [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) {
      if (b16)
        depthwise_row_bf16(c, i / (blocks * OH), (i / OH) % blocks, i % OH);
      else
        depthwise_row(c, i / (blocks * OH), (i / OH) % blocks, i % OH);
    }
  });
}

// 2×2 stride-2 max pooling in ceil mode (C3.1's pooled half), with the pass of the operation
// that reads it fused (the BN + PReLU of that half, written into its concat half): the pooled
// map is never stored. A window cut by the right/bottom edge takes the max of what is inside.
struct MaxPool2x2 {
  View src;
  Epilogue e;  // e.dst: the pooled value, or the fused affine's output
};

template <class T>
inline __attribute__((always_inline)) void pool_row_impl(const MaxPool2x2& c, const T* src, int64_t n, int64_t g,
                                                         int64_t y) {
  const int64_t OW = c.e.dst.W, IW = c.src.W;
  const T* r0 = src + 2 * y * IW * kBlock;
  const T* r1 = 2 * y + 1 < c.src.H ? r0 + IW * kBlock : r0;
  vb t[kTile];
  for (int64_t x0 = 0; x0 < OW; x0 += kTile) {
    const int64_t np = std::min(kTile, OW - x0);
    for (int64_t i = 0; i < np; ++i) {
      const int64_t a = 2 * (x0 + i) * kBlock, b = std::min(2 * (x0 + i) + 1, IW - 1) * kBlock;
      const vb u0 = in_load(r0 + a), u1 = in_load(r0 + b), u2 = in_load(r1 + a), u3 = in_load(r1 + b);
      const vb m0 = u0 > u1 ? u0 : u1, m1 = u2 > u3 ? u2 : u3;
      t[i] = m0 > m1 ? m0 : m1;
    }
    finish_tile(c.e, t, n, g, y * OW + x0, np);
  }
}

LIGHTSEG_MULTIVERSION
void pool_row(const MaxPool2x2& c, int64_t n, int64_t g, int64_t y) { pool_row_impl(c, c.src.block(n, g), n, g, y); }
LIGHTSEG_AVX512
void pool_row_bf16(const MaxPool2x2& c, int64_t n, int64_t g, int64_t y) {
  pool_row_impl(c, c.src.blockh(n, g), n, g, y);
}

void run_pool(const MaxPool2x2& c) {
  const int64_t blocks = round_up(c.e.dst.C) / kBlock, OH = c.e.dst.H;
  at::parallel_for(0, c.e.dst.N * blocks * OH, 4, [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) {
      if (c.src.bf16)
        pool_row_bf16(c, i / (blocks * OH), (i / OH) % blocks, i % OH);
      else
        pool_row(c, i / (blocks * OH), (i / OH) % blocks, i % OH);
    }
  });
}

// A convolution with one output channel (C2.2/C2.4's compressions, C7.2's attention conv):
// oneDNN pads the output to 16 channels and runs 16× the work; here each output pixel is a
// dot product over the input blocks, then bias and activation; lanes 1..15 are written 0.
struct SingleChannelConv {
  View src, dst;
  torch::Tensor weight;  // [kh][kw][blocks][16]
  float bias = 0.f;
  Act act = Act::None;
  float slope = 0.f;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
};

template <class T>
inline __attribute__((always_inline)) void single_channel_row_impl(const SingleChannelConv& c, const T* src,
                                                                   int64_t n, int64_t y) {
  const View& x = c.src;
  const int64_t blocks = round_up(x.C) / kBlock, OW = c.dst.W, P = x.pixels();
  const float* w = c.weight.data_ptr<float>();
  float* d = c.dst.block(n, 0) + y * OW * kBlock;
  vb t[kTile];
  for (int64_t x0 = 0; x0 < OW; x0 += kTile) {
    const int64_t np = std::min(kTile, OW - x0);
    for (int64_t i = 0; i < np; ++i) t[i] = vb{};
    for (int64_t ky = 0; ky < c.kh; ++ky) {
      const int64_t iy = y * c.sh - c.ph + ky * c.dh;
      if (iy < 0 || iy >= x.H) continue;
      for (int64_t kx = 0; kx < c.kw; ++kx) {
        const int64_t off = kx * c.dw - c.pw;  // ix = xo·sw + off ∈ [0, W)
        int64_t lo = off >= 0 ? 0 : (-off + c.sw - 1) / c.sw;
        int64_t hi = x.W - 1 - off >= 0 ? (x.W - 1 - off) / c.sw + 1 : 0;
        lo = std::max(lo, x0);
        hi = std::min(hi, x0 + np);
        const float* wk = w + (ky * c.kw + kx) * blocks * kBlock;
        for (int64_t g = 0; g < blocks; ++g) {
          const vb wg = load(wk + g * kBlock);
          const T* s = src + (g * P + iy * x.W + off) * kBlock;
          for (int64_t xo = lo; xo < hi; ++xo) t[xo - x0] += wg * in_load(s + xo * c.sw * kBlock);
        }
      }
    }
    for (int64_t i = 0; i < np; ++i) {
      float v = c.bias;
      for (int l = 0; l < kBlock; ++l) v += t[i][l];
      switch (c.act) {
        case Act::None: break;
        case Act::PReLU: v = v > 0.f ? v : v * c.slope; break;
        case Act::ReLU: v = v > 0.f ? v : 0.f; break;
        case Act::Sigmoid: v = 1.f / (1.f + std::exp(-v)); break;
      }
      vb out{};
      out[0] = v;
      store(d + (x0 + i) * kBlock, out);
    }
  }
}

LIGHTSEG_MULTIVERSION
void single_channel_row(const SingleChannelConv& c, int64_t n, int64_t y) {
  single_channel_row_impl(c, c.src.block(n, 0), n, y);
}
LIGHTSEG_AVX512
void single_channel_row_bf16(const SingleChannelConv& c, int64_t n, int64_t y) {
  single_channel_row_impl(c, c.src.blockh(n, 0), n, y);
}

void run_single_channel(const SingleChannelConv& c) {
  at::parallel_for(0, c.dst.N * c.dst.H, 4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (c.src.bf16)
        single_channel_row_bf16(c, i / c.dst.H, i % c.dst.H);
      else
        single_channel_row(c, i / c.dst.H, i % c.dst.H);
    }
  });
}

void run_epilogue(const Epilogue& e) {
  const int64_t blocks = round_up(e.dst.C) / kBlock, P = e.dst.pixels();
  const int64_t tiles = (P + kTile - 1) / kTile;
  const int64_t items = e.dst.N * blocks * tiles;
  const bool fast = register_epilogue_fits(e) && e.src.fmt == View::Fmt::Blocked;
  at::parallel_for(0, items, 16, [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) {
      const int64_t tile = i % tiles, g = (i / tiles) % blocks, n = i / (tiles * blocks);
      const int64_t p = tile * kTile, np = std::min(kTile, P - p);
      if (fast && e.src.bf16)
        register_epilogue(e, e.src.blockh(n, g) + p * kBlock, n, g, p, np, nullptr);
      else if (fast)
        register_epilogue(e, e.src.block(n, g) + p * kBlock, n, g, p, np, nullptr);
      else
        epilogue_tile(e, n, g, p, np);
    }
  });
}

// Image (N×3×H×W, NCHW, 0..255) → normalised image (plain NCHW or NHWC): one pass.
void run_normalize(const float* x, const View& out, const float* scale, const float* shift) {
  const int64_t P = out.pixels(), C = out.C;
  if (out.fmt == View::Fmt::Nchw) {
    at::parallel_for(0, out.N * C, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const float s = scale[i % C], h = shift[i % C];
        const float* src = x + i * P;
        float* dst = out.data + i * P;
        for (int64_t p = 0; p < P; ++p) dst[p] = src[p] * s + h;
      }
    });
    return;
  }
  at::parallel_for(0, out.N * out.H, 8, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t n = r / out.H, y = r % out.H;
      float* dst = out.data + (n * P + y * out.W) * C;
      for (int64_t c = 0; c < C; ++c) {
        const float* src = x + (n * C + c) * P + y * out.W;
        const float s = scale[c], h = shift[c];
        for (int64_t p = 0; p < out.W; ++p) dst[p * C + c] = src[p] * s + h;
      }
    }
  });
}

// Final bilinear resize, blocked value → N×K×H×W logits in channels_last (NHWC) memory.
struct OutputResize {
  View src;
  int64_t H = 0, W = 0;
  Taps th, tw;
};

// One output pixel's 16 channels of a block, from source rows row0/row1 (shared by the
// logits and the labels kernels, so both see the same values).
inline __attribute__((always_inline)) vb interpolate(const OutputResize& r, const float* row0, const float* row1,
                                                      float wy0, float wy1, int64_t x) {
  const float wx1 = r.tw.w1[x], wx0 = 1.f - wx1;
  const int64_t i0 = r.tw.i0[x] * kBlock, i1 = r.tw.i1[x] * kBlock;
  return wy0 * (wx0 * load(row0 + i0) + wx1 * load(row0 + i1)) + wy1 * (wx0 * load(row1 + i0) + wx1 * load(row1 + i1));
}

// Labels straight from the H/4 logits: the ×4 upsampling and the argmax in one pass (first
// maximum, as torch::argmax), without the full-size logits.
LIGHTSEG_MULTIVERSION
void label_row(const OutputResize& r, int64_t* out, int64_t n, int64_t y) {
  const int64_t K = r.src.C, blocks = round_up(K) / kBlock, sw = r.src.W;
  const float wy1 = r.th.w1[y], wy0 = 1.f - wy1;
  int64_t* o = out + (n * r.H + y) * r.W;
  for (int64_t x = 0; x < r.W; ++x) {
    float best = 0.f;
    int64_t arg = -1;
    for (int64_t g = 0; g < blocks; ++g) {
      const float* base = r.src.block(n, g);
      const vb v = interpolate(r, base + r.th.i0[y] * sw * kBlock, base + r.th.i1[y] * sw * kBlock, wy0, wy1, x);
      const int64_t nc = std::min<int64_t>(kBlock, K - g * kBlock);
      for (int64_t l = 0; l < nc; ++l)
        if (arg < 0 || v[l] > best) {
          best = v[l];
          arg = g * kBlock + l;
        }
    }
    o[x] = arg;
  }
}

#if LIGHTSEG_ONEDNN_X86_512
// One block of classes (K ≤ 16) with AVX-512: the argmax of a pixel as a vector max, a compare
// and the lowest set bit (the first maximum, as the scalar loop and torch::argmax).
__attribute__((target("avx512f"))) void label_row_avx512(const OutputResize& r, int64_t* out, int64_t n, int64_t y) {
  const int64_t K = r.src.C, sw = r.src.W;
  const float wy1 = r.th.w1[y], wy0 = 1.f - wy1;
  int64_t* o = out + (n * r.H + y) * r.W;
  const float* base = r.src.block(n, 0);
  const float* row0 = base + r.th.i0[y] * sw * kBlock;
  const float* row1 = base + r.th.i1[y] * sw * kBlock;
  const __mmask16 valid = static_cast<__mmask16>(K >= kBlock ? 0xffffu : (1u << K) - 1);
  const __m512 low = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t x = 0; x < r.W; ++x) {
    const vb v = interpolate(r, row0, row1, wy0, wy1, x);
    const __m512 z = _mm512_mask_blend_ps(valid, low, reinterpret_cast<const __m512&>(v));
    // the maximum in every lane, by halving shuffles (GCC 12's intrinsics for this, which use
    // an "undefined" register, draw -Wmaybe-uninitialized)
    vb m = reinterpret_cast<const vb&>(z), h;
    h = __builtin_shufflevector(m, m, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    m = m > h ? m : h;
    h = __builtin_shufflevector(m, m, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    m = m > h ? m : h;
    h = __builtin_shufflevector(m, m, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    m = m > h ? m : h;
    h = __builtin_shufflevector(m, m, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    m = m > h ? m : h;
    const __mmask16 at = _mm512_mask_cmp_ps_mask(valid, z, reinterpret_cast<const __m512&>(m), _CMP_EQ_OQ);
    o[x] = at ? __builtin_ctz(at) : 0;
  }
}
#endif

void run_labels(const OutputResize& r, int64_t* out) {
#if LIGHTSEG_ONEDNN_X86_512
  if (avx512_kernels() && r.src.C <= kBlock) {
    at::parallel_for(0, r.src.N * r.H, 8, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) label_row_avx512(r, out, i / r.H, i % r.H);
    });
    return;
  }
#endif
  at::parallel_for(0, r.src.N * r.H, 8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) label_row(r, out, i / r.H, i % r.H);
  });
}

LIGHTSEG_MULTIVERSION
void output_row(const OutputResize& r, float* out, int64_t n, int64_t y) {
  const int64_t K = r.src.C, blocks = round_up(K) / kBlock, sw = r.src.W;
  const float wy1 = r.th.w1[y], wy0 = 1.f - wy1;
  float* o = out + (n * r.H + y) * r.W * K;
  for (int64_t g = 0; g < blocks; ++g) {
    const float* base = r.src.block(n, g);
    const float* row0 = base + r.th.i0[y] * sw * kBlock;
    const float* row1 = base + r.th.i1[y] * sw * kBlock;
    const int64_t c0 = g * kBlock, nc = std::min<int64_t>(kBlock, K - c0);
    for (int64_t x = 0; x < r.W; ++x) {
      const vb v = interpolate(r, row0, row1, wy0, wy1, x);
      if (nc == kBlock || (blocks == 1 && x + 1 < r.W)) {
        store(o + x * K + c0, v);  // K < 16: the extra lanes land on the next pixel, written next
      } else {
        float tmp[kBlock];
        store(tmp, v);
        std::memcpy(o + x * K + c0, tmp, sizeof(float) * nc);
      }
    }
  }
}

#if LIGHTSEG_ONEDNN_X86_512
// 8 ≤ K < 16 classes with AVX-512: 16 pixels (16·K floats) are packed in registers into K whole
// vectors (vector k takes lanes of pixels p0[k] .. p0[k] + 2: two permutes) and streamed out
// with aligned non-temporal 64-byte stores, where the row starts 64-byte aligned; other pixels
// get a masked store of their K channels. Against one 64-byte store per pixel overlapping the
// next: up4 0.60 -> 0.50 ms (360x480, median of 5 alternated; aligned ordinary stores 0.70).
struct OutputPack {
  int64_t K = 0;
  int p0[kBlock];
  alignas(64) int32_t idx1[kBlock][kBlock], idx2[kBlock][kBlock];
  uint16_t mask2[kBlock];
};
OutputPack output_pack(int64_t K) {
  OutputPack q;
  q.K = K;
  for (int64_t k = 0; k < K; ++k) {
    q.p0[k] = static_cast<int>(16 * k / K);
    q.mask2[k] = 0;
    for (int l = 0; l < kBlock; ++l) {
      const int64_t f = 16 * k + l, px = f / K - q.p0[k], c = f % K;
      q.idx1[k][l] = static_cast<int32_t>(px == 0 ? c : 16 + c);
      q.idx2[k][l] = static_cast<int32_t>(c);
      if (px == 2) q.mask2[k] |= static_cast<uint16_t>(1u << l);
    }
  }
  return q;
}

__attribute__((target("avx512f"))) void output_row_packed(const OutputResize& r, const OutputPack& q, float* out,
                                                          int64_t n, int64_t y) {
  const int64_t K = r.src.C, sw = r.src.W;
  const float wy1 = r.th.w1[y], wy0 = 1.f - wy1;
  float* o = out + (n * r.H + y) * r.W * K;
  const float* base = r.src.block(n, 0);
  const float* row0 = base + r.th.i0[y] * sw * kBlock;
  const float* row1 = base + r.th.i1[y] * sw * kBlock;
  int64_t x = 0;
  if (reinterpret_cast<uintptr_t>(o) % 64 == 0)
    for (; x + 16 <= r.W; x += 16) {
      __m512 px[kBlock + 2];
      for (int j = 0; j < kBlock; ++j) {
        const vb v = interpolate(r, row0, row1, wy0, wy1, x + j);
        px[j] = reinterpret_cast<const __m512&>(v);
      }
      px[16] = px[17] = _mm512_setzero_ps();
      float* d = o + x * K;
      for (int64_t k = 0; k < K; ++k) {
        const int a = q.p0[k];
        __m512 v = _mm512_permutex2var_ps(px[a], _mm512_load_si512(q.idx1[k]), px[a + 1]);
        v = _mm512_mask_permutexvar_ps(v, q.mask2[k], _mm512_load_si512(q.idx2[k]), px[a + 2]);
        _mm512_stream_ps(d + k * kBlock, v);
      }
    }
  const __mmask16 m = static_cast<__mmask16>((1u << K) - 1);
  for (; x < r.W; ++x) {
    const vb v = interpolate(r, row0, row1, wy0, wy1, x);
    _mm512_mask_storeu_ps(o + x * K, m, reinterpret_cast<const __m512&>(v));
  }
  _mm_sfence();  // the streamed stores are weakly ordered
}
#endif

void run_output_resize(const OutputResize& r, float* out) {
#if LIGHTSEG_ONEDNN_X86_512
  if (avx512_kernels() && r.src.C >= 8 && r.src.C < kBlock) {
    const OutputPack q = output_pack(r.src.C);
    at::parallel_for(0, r.src.N * r.H, 8, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) output_row_packed(r, q, out, i / r.H, i % r.H);
    });
    return;
  }
#endif
  at::parallel_for(0, r.src.N * r.H, 8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) output_row(r, out, i / r.H, i % r.H);
  });
}

// A concat whose parts do not start on channel blocks (configurations with channel counts
// that are not multiples of the block): each pixel's channels gathered from the parts, the
// padding lanes of the last block zeroed (oneDNN's kernels read them).
struct ChannelConcat {
  std::vector<View> parts;  // f32, each in its own buffer
  View dst;                 // f32, the whole value
};

void run_channel_concat(const ChannelConcat& c) {
  const View& d = c.dst;
  const int64_t P = d.pixels(), blocks = round_up(d.C) / kBlock;
  at::parallel_for(0, d.N * P, 256, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t n = i / P, p = i % P;
      int64_t off = 0;
      for (const View& s : c.parts) {
        for (int64_t ch = 0; ch < s.C; ++ch) {
          const int64_t o = off + ch;
          d.block(n, o / kBlock)[p * kBlock + o % kBlock] = s.block(n, ch / kBlock)[p * kBlock + ch % kBlock];
        }
        off += s.C;
      }
      for (int64_t o = off; o < blocks * kBlock; ++o) d.block(n, o / kBlock)[p * kBlock + o % kBlock] = 0.f;
    }
  });
}

// The taps of one kernel dimension that read the input for some output position (the others
// only ever read padding): taps [first, first + count), and the padding that keeps the output
// where it was once the taps before `first` are gone.
struct Taps1 {
  int64_t first = 0, count = 0, padding = 0;
};
Taps1 live_taps(int64_t k, int64_t dilation, int64_t padding, int64_t stride, int64_t in, int64_t out) {
  int64_t first = -1, last = -1;
  for (int64_t t = 0; t < k; ++t) {
    bool live = false;
    for (int64_t o = 0; o < out && !live; ++o) {
      const int64_t i = o * stride + t * dilation - padding;
      live = i >= 0 && i < in;
    }
    if (live) {
      if (first < 0) first = t;
      last = t;
    }
  }
  const Taps1 all{0, k, padding};
  if (first < 0) return all;  // no tap reads anything (a degenerate shape): as it was
  const Taps1 live{first, last - first + 1, padding - first * dilation};
  const int64_t right = (out - 1) * stride + (live.count - 1) * (live.count > 1 ? dilation : 1) + 1 - in - live.padding;
  return live.padding >= 0 && right >= 0 ? live : all;  // oneDNN takes no negative padding
}

// Per-channel array padded to whole blocks with zeros.
torch::Tensor padded(const torch::Tensor& t, int64_t c) {
  auto r = torch::zeros({round_up(c)}, torch::kFloat32);
  if (t.defined()) r.slice(0, 0, c).copy_(t.to(torch::kCPU, torch::kFloat32).flatten());
  return r;
}

class Plan {
 public:
  Plan(const FusedNetwork& f, const dnnl::engine& eng, int64_t N, int64_t H, int64_t W, bool bf16);
  void set_profiling(bool on) { profile_ = on; }
  // The mean time of every step over the profiled calls ("" when none).
  std::string report() const;
  torch::Tensor run(const torch::Tensor& images, dnnl::stream& strm);
  // N×H×W int64 labels: every step but the output resize, then upsampling + argmax.
  torch::Tensor labels(const torch::Tensor& images, dnnl::stream& strm);

 private:
  using Step = std::function<void(dnnl::stream&)>;
  float* alloc(size_t floats);
  void release(float* p, size_t floats);

  const FusedNetwork& f_;
  const dnnl::engine& eng_;
  int64_t N_, H_, W_;
  std::vector<View> views_;
  std::vector<uint16_t*> shadow_;                      // per value: its bf16 copy (bf16 plans), or null
  std::vector<Step> steps_;
  std::vector<std::string> labels_;                    // what each step runs (op, kernel): for debuggers
  struct Buffer {
    std::unique_ptr<float, void (*)(void*)> data;
    size_t floats;
  };
  std::vector<Buffer> storage_;                        // every buffer, kept between calls
  std::multimap<size_t, float*> free_;                 // released buffers by size (in release order)
  std::vector<std::unique_ptr<Epilogue>> epilogues_;   // referenced by steps
  std::vector<torch::Tensor> params_;                  // padded per-channel arrays
  const float* input_ = nullptr;                       // set per call
  std::shared_ptr<OutputResize> output_resize_;        // the last step's (labels() runs it differently)
  bool profile_ = false;
  std::vector<double> step_seconds_;                   // profiling: time per step, summed
  int64_t profiled_runs_ = 0;
  float* output_ = nullptr;                            // set per call
};

// Reuses the smallest released buffer that is large enough (of those, the most recently
// released: the one most likely still in cache); else a new zeroed buffer in 2 MiB pages
// (transparent huge pages where the kernel offers them on request: fewer TLB misses).
float* Plan::alloc(size_t floats) {
  auto it = free_.lower_bound(floats);
  if (it != free_.end()) {
    auto last = free_.upper_bound(it->first);
    auto pick = std::prev(last);
    float* p = pick->second;
    free_.erase(pick);
    return p;
  }
  constexpr size_t kPage = size_t{2} << 20;
  const size_t bytes = (floats * sizeof(float) + kPage - 1) / kPage * kPage;
  void* p = std::aligned_alloc(kPage, bytes);
  if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  madvise(p, bytes, MADV_HUGEPAGE);
#endif
  std::memset(p, 0, bytes);
  storage_.push_back({std::unique_ptr<float, void (*)(void*)>(static_cast<float*>(p), std::free), bytes / sizeof(float)});
  return static_cast<float*>(p);
}

void Plan::release(float* p, size_t floats) {
  for (const auto& b : storage_)
    if (b.data.get() == p) floats = b.floats;  // its capacity
  free_.emplace(floats, p);
}

Plan::Plan(const FusedNetwork& f, const dnnl::engine& eng, int64_t N, int64_t H, int64_t W, bool bf16)
    : f_(f), eng_(eng), N_(N), H_(H), W_(W) {
  const auto sizes = f.value_sizes(H, W);
  const int nv = static_cast<int>(f.num_values);
  const int nops = static_cast<int>(f.ops.size());
  views_.resize(nv);
  shadow_.assign(nv, nullptr);
  for (int v = 0; v < nv; ++v) {
    views_[v].N = N;
    views_[v].C = views_[v].ctot = f.channels[v];
    views_[v].H = sizes[v][0];
    views_[v].W = sizes[v][1];
  }
  // Producer and last reader of every value.
  std::vector<int> producer(nv, -1), last(nv, -1), readers(nv, 0);
  for (int i = 0; i < nops; ++i) {
    const auto& op = f.ops[i];
    producer[op.out] = i;
    std::vector<int> reads = op.in;
    reads.insert(reads.end(), op.add.begin(), op.add.end());
    if (op.residual >= 0) reads.push_back(op.residual);
    for (int v : reads) {
      last[v] = i;
      ++readers[v];
    }
  }
  // A max pooling whose only reader is the affine right after it: one kernel for both (the
  // pooled map is never stored); what the pooling reads stays live until then.
  std::vector<bool> pool_fused_next(nops, false);
  for (int i = 1; i + 1 < nops; ++i) {
    const auto &p = f.ops[i], &a = f.ops[i + 1];
    if (p.kind != FusedOp::Kind::MaxPool || a.kind != FusedOp::Kind::Affine || a.in[0] != p.out ||
        readers[p.out] != 1 || !p.add.empty() || p.out == f.output)
      continue;
    pool_fused_next[i] = true;
    for (int v : p.in)
      if (last[v] == i) last[v] = i + 1;
  }
  // A bilinear resize whose only use is as an addition of a MulAdd (C6.1's X3, the ×2 of
  // C1.9): added on the fly by that MulAdd's pass from the small map, never stored.
  std::vector<int> upsampled_src(nv, -1);  // per folded resize output: the value it resizes
  std::vector<bool> resize_folded(nops, false);
  for (int i = 1; i < nops; ++i) {
    const auto& op = f.ops[i];
    if (op.kind != FusedOp::Kind::Resize || op.out == f.output || !op.add.empty() || readers[op.out] != 1) continue;
    const int j = last[op.out];
    const auto& r = f.ops[j];
    if (r.kind != FusedOp::Kind::MulAdd || std::count(r.add.begin(), r.add.end(), op.out) != 1 ||
        std::count(r.in.begin(), r.in.end(), op.out) != 0 || f.channels[op.in[0]] != f.channels[r.out])
      continue;
    resize_folded[i] = true;
    upsampled_src[op.out] = op.in[0];
    last[op.in[0]] = std::max(last[op.in[0]], j);
  }
  // Concat parts written in place by their producer's pass (block-aligned offsets).
  // (Only when every part starts on a 16-channel block; otherwise oneDNN's concat copies.)
  std::vector<int> alias_of(nv, -1);
  std::vector<bool> unaligned(nops, false);
  for (int i = 0; i < nops; ++i) {
    const auto& op = f.ops[i];
    if (op.kind != FusedOp::Kind::Concat) continue;
    int64_t off = 0;
    for (int part : op.in) {
      if (off % kBlock) unaligned[i] = true;
      off += f.channels[part];
    }
    if (unaligned[i]) continue;
    off = 0;
    for (int part : op.in) {
      const int p = producer[part];
      const bool pass = p >= 0 && (f.ops[p].kind == FusedOp::Kind::Conv || f.ops[p].kind == FusedOp::Kind::Affine);
      if (pass && readers[part] == 1 && off % kBlock == 0) {  // read by the concat only
        alias_of[part] = op.out;
        views_[part].coff = off;
        views_[part].ctot = f.channels[op.out];
      }
      off += f.channels[part];
    }
  }
  // A concat whose every part is written in place by its producer (no copy, no concat step).
  auto all_in_place = [&](int i) {
    const auto& op = f.ops[i];
    return op.kind == FusedOp::Kind::Concat && !unaligned[i] && op.add.empty() &&
           std::all_of(op.in.begin(), op.in.end(), [&](int part) { return alias_of[part] == op.out; });
  };
  // bf16 plans: the convolutions that read bf16 (dense ones, but not on the image and not
  // with one output channel: those run our kernel), the values they need a shadow of, and
  // the values something else reads in f32.
  const int normalised = f.ops.front().out;
  auto single_channel = [&](const FusedOp& op) {
    return op.kind == FusedOp::Kind::Conv && op.weight.size(0) == 1 && op.groups == 1 && op.in[0] != normalised &&
           op.residual < 0 && op.add.empty() && alias_of[op.out] < 0;
  };
  auto depthwise = [&](const FusedOp& op) {  // our depthwise kernel
    return op.kind == FusedOp::Kind::Conv && op.groups > 1 && op.groups == op.weight.size(0) &&
           op.groups == f.channels[op.in[0]] && op.weight.size(1) == 1 && op.weight.size(2) <= 16 &&
           op.in[0] != normalised;
  };
  auto reads_bf16 = [&](const FusedOp& op) {
    return bf16 && op.kind == FusedOp::Kind::Conv && op.groups == 1 && op.in[0] != normalised && !single_channel(op);
  };
  // Values stored in bf16 only: those whose producer is one of our passes or a bf16
  // convolution, and that nothing reads but bf16 convolutions and our kernels (not oneDNN's
  // pooling, resampling or concat, not the output). The others stay f32, with a bf16 copy
  // (shadow) where a bf16 convolution reads them.
  std::vector<bool> need_shadow(nv, false), need_f32(nv, false), f32_only(nv, false), conv_reader(nv, false);
  std::vector<bool> store_bf16(nv, false);
  need_f32[f.output] = f32_only[f.output] = f32_only[normalised] = true;
  for (int i = 1; i < nops; ++i) {
    const auto& op = f.ops[i];
    for (size_t k = 0; k < op.in.size(); ++k) (k == 0 && reads_bf16(op) ? conv_reader : need_f32)[op.in[k]] = true;
    for (int v : op.add) need_f32[v] = true;
    if (op.residual >= 0) need_f32[op.residual] = true;
    const bool ours = op.kind == FusedOp::Kind::Affine || op.kind == FusedOp::Kind::MulAdd ||
                      op.kind == FusedOp::Kind::MaxPool || (op.kind == FusedOp::Kind::Resize && resize_folded[i]) ||
                      (op.kind == FusedOp::Kind::Conv && (reads_bf16(op) || depthwise(op) || single_channel(op))) ||
                      (op.kind == FusedOp::Kind::Concat && all_in_place(i));
    if (!ours)
      for (int v : op.in) f32_only[v] = true;
  }
  for (int i = 1; i < nops; ++i) {
    const auto& op = f.ops[i];
    const int v = op.out;
    const bool writer = op.kind == FusedOp::Kind::Affine || op.kind == FusedOp::Kind::MulAdd ||
                        op.kind == FusedOp::Kind::MaxPool ||
                        (op.kind == FusedOp::Kind::Conv && (reads_bf16(op) || depthwise(op))) ||
                        (op.kind == FusedOp::Kind::Concat && all_in_place(i));
    store_bf16[v] = bf16 && writer && !f32_only[v] && alias_of[v] < 0;
    views_[v].bf16 = store_bf16[v];
    need_shadow[v] = conv_reader[v] && !store_bf16[v];
  }
  // The parts of a concat stored in bf16 are written in bf16 by their producers' passes.
  for (int v = 0; v < nv; ++v)
    if (alias_of[v] >= 0) {
      views_[v].bf16 = store_bf16[v] = store_bf16[alias_of[v]];
      if (store_bf16[v]) need_shadow[v] = false;
    }
  // Paired depthwise convolutions: op i (A) and op i + 1 (B) read the same value, same
  // output size, B adds A's result and nothing else reads A's result.
  std::vector<bool> paired_with_next(nops, false), paired_with_prev(nops, false);
  auto plain_depthwise = [&](const FusedOp& op) { return depthwise(op) && op.residual < 0 && alias_of[op.out] < 0; };
  for (int i = 1; i + 1 < nops; ++i) {
    const auto &a = f.ops[i], &b = f.ops[i + 1];
    if (!plain_depthwise(a) || !plain_depthwise(b) || !a.add.empty() || b.in[0] != a.in[0] || readers[a.out] != 1 ||
        std::count(b.add.begin(), b.add.end(), a.out) != 1 || sizes[a.out] != sizes[b.out] ||
        paired_with_prev[i] || a.act == Act::Sigmoid)
      continue;
    paired_with_next[i] = paired_with_prev[i + 1] = true;
  }
  auto shadow_floats = [&](int v) {
    const View& w = views_[v];
    return static_cast<size_t>(w.N * round_up(w.C) * w.H * w.W + 1) / 2;
  };
  Epilogue* final_pass = nullptr;  // the last pass added: it may write the shadow too

  auto place = [&](int v) {  // gives value v its storage (a concat part: its concat's)
    View& w = views_[v];
    if (alias_of[v] >= 0) {
      View& c = views_[alias_of[v]];
      if (!c.data) c.data = alloc(c.floats());
      w.data = c.data;
    } else if (!w.data) {
      w.data = alloc(w.floats());
    }
  };
  auto param = [&](const torch::Tensor& t, int64_t c) {
    params_.push_back(padded(t, c));
    return params_.back().data_ptr<float>();
  };
  auto valid = [&](int64_t c) { return param(torch::ones({c}), c); };
  auto add_step = [&](const std::string& label, Step fn) {
    // No step may run one of oneDNN's reference kernels (they are hundreds of times slower):
    // the plans' layouts are those oneDNN's JIT kernels take on this CPU; should one not be,
    // the engine refuses rather than run at reference speed.
    if (label.find("(ref") != std::string::npos)
      throw BackendUnsuitable("onednn: step " + label + " would run oneDNN's reference kernel on this CPU");
    steps_.push_back(std::move(fn));
    labels_.push_back(label);
  };
  auto add_epilogue = [&](std::unique_ptr<Epilogue> e, const std::string& label) {
    Epilogue* p = e.get();
    final_pass = p;
    epilogues_.push_back(std::move(e));
    add_step(label, [p](dnnl::stream&) { run_epilogue(*p); });
  };
  auto views_of = [&](const std::vector<int>& vs) {
    std::vector<const View*> r;
    for (int v : vs) r.push_back(&views_[v]);
    return r;
  };

  for (int i = 0; i < nops; ++i) {
    const auto& op = f.ops[i];
    const int out = op.out;
    const View& x = views_[op.in[0]];
    final_pass = nullptr;
    if (need_shadow[out]) {  // allocated first: it must not share memory with this op's scratch
      if (alias_of[out] >= 0 || out == f.input) throw std::logic_error("onednn: no bf16 copy of " + op.name);
      shadow_[out] = reinterpret_cast<uint16_t*>(alloc(shadow_floats(out)));
    }
    if (i == 0) {  // normalisation: image → plain NCHW (or NHWC, see the first convolution)
      if (op.kind != FusedOp::Kind::Affine || op.in[0] != f.input || op.act != Act::None || !op.add.empty())
        throw std::logic_error("onednn: the operation list must start with the normalisation");
      views_[out].fmt = View::Fmt::Nchw;
      place(out);
      const float* sc = param(op.weight, f.channels[out]);
      const float* sh = param(op.bias, f.channels[out]);
      const View* o = &views_[out];
      add_step(op.name, [this, o, sc, sh](dnnl::stream&) { run_normalize(input_, *o, sc, sh); });
      continue;
    }
    switch (op.kind) {
      case FusedOp::Kind::Conv: {
        const int64_t O = op.weight.size(0), I = op.weight.size(1), kh = op.weight.size(2), kw = op.weight.size(3);
        const int64_t G = op.groups;
        if (O == 1 && G == 1 && x.fmt == View::Fmt::Blocked && op.residual < 0 && op.add.empty() &&
            alias_of[out] < 0) {  // one output channel: ours
          place(out);
          auto c = std::make_shared<SingleChannelConv>();
          c->src = x;
          c->dst = views_[out];
          const int64_t blocks = round_up(I) / kBlock;
          auto t = torch::zeros({kh, kw, blocks * kBlock});
          t.slice(2, 0, I).copy_(op.weight.to(torch::kCPU, torch::kFloat32)[0].permute({1, 2, 0}));
          c->weight = t.contiguous();
          c->bias = op.bias.to(torch::kCPU, torch::kFloat32).item<float>();
          c->act = op.act;
          if (op.act == Act::PReLU) c->slope = op.slopes.to(torch::kCPU, torch::kFloat32).flatten()[0].item<float>();
          c->kh = kh;
          c->kw = kw;
          c->sh = op.stride[0];
          c->sw = op.stride[1];
          c->ph = op.padding[0];
          c->pw = op.padding[1];
          c->dh = op.dilation[0];
          c->dw = op.dilation[1];
          add_step(op.name + " (one channel)", [c](dnnl::stream&) { run_single_channel(*c); });
          break;
        }
        if (depthwise(op)) {  // depthwise: ours
          auto fill = [&](DepthwiseConv& c, const FusedOp& o, std::vector<int> adds) {
            c.e.src = x;
            c.e.act = o.act;
            if (o.act == Act::PReLU) c.e.slopes = param(o.slopes, O);
            if (o.residual >= 0) c.e.residual = &views_[o.residual];
            c.e.adds = views_of(adds);
            c.e.valid = valid(O);
            const int64_t okh = o.weight.size(2), okw = o.weight.size(3);
            const int64_t blocks = round_up(O) / kBlock;
            auto w = o.weight.to(torch::kCPU, torch::kFloat32).reshape({O, okh, okw});
            {  // [blocks·16][kh][kw] → [blocks][kh][kw][16]
              auto t = torch::zeros({blocks * kBlock, okh, okw});
              t.slice(0, 0, O).copy_(w);
              c.weight = t.view({blocks, kBlock, okh, okw}).permute({0, 2, 3, 1}).contiguous();
            }
            c.bias = padded(o.bias, O);
            c.kh = okh;
            c.kw = okw;
            c.sh = o.stride[0];
            c.sw = o.stride[1];
            c.ph = o.padding[0];
            c.pw = o.padding[1];
            c.dh = o.dilation[0];
            c.dw = o.dilation[1];
          };
          // A depthwise convolution of the same input whose result only this one adds:
          // the pair runs as one kernel (see PairedDepthwise).
          if (paired_with_next[i]) break;  // built with the next operation
          if (paired_with_prev[i]) {
            const FusedOp& a = f.ops[i - 1];
            place(out);
            auto c = std::make_shared<PairedDepthwise>();
            fill(c->a, a, {});
            std::vector<int> adds;
            for (int v : op.add)
              if (v != a.out) adds.push_back(v);
            fill(c->b, op, adds);
            c->a.e.dst = c->b.e.dst = views_[out];
            add_step(a.name + " + " + op.name + " (paired depthwise+pass)", [c](dnnl::stream&) { run_paired(*c); });
            final_pass = &c->b.e;
            break;
          }
          place(out);
          auto c = std::make_shared<DepthwiseConv>();
          fill(*c, op, op.add);
          c->e.dst = views_[out];
          add_step(op.name + " (depthwise+pass)", [c](dnnl::stream&) { run_depthwise(*c); });
          final_pass = &c->e;
          break;
        }
        const bool pass = op.act == Act::PReLU || op.residual >= 0 || !op.add.empty() || alias_of[out] >= 0;
        place(out);
        View& y = views_[out];
        // Destination of the convolution itself: the value's buffer (the pass then runs in
        // place), or a scratch buffer when the value is a concat part at an offset.
        View cdst = y;
        cdst.coff = 0;
        cdst.ctot = y.C;
        float* scratch = nullptr;
        if (alias_of[out] >= 0) cdst.data = scratch = alloc(cdst.floats());
        // Taps that only ever read padding (a dilation as large as the map: C3's deep
        // dilations on small inputs) are dropped: the same sums, and oneDNN's AVX2 kernels
        // refuse such shapes (its reference kernel would run).
        const Taps1 th = live_taps(kh, op.dilation[0], op.padding[0], op.stride[0], x.H, y.H);
        const Taps1 tw = live_taps(kw, op.dilation[1], op.padding[1], op.stride[1], x.W, y.W);
        const int64_t ekh = th.count, ekw = tw.count;
        const int64_t dh = ekh > 1 ? op.dilation[0] : 1, dw = ekw > 1 ? op.dilation[1] : 1;
        dims wd = G == 1 ? dims{O, I, ekh, ekw} : dims{G, O / G, I, ekh, ekw};
        dnnl::memory::desc wmd(wd, dtype::f32, G == 1 ? tag::oihw : tag::goihw);
        const int64_t ph = th.padding, pw = tw.padding;
        const int64_t rh = (y.H - 1) * op.stride[0] + (ekh - 1) * dh + 1 - x.H - ph;
        const int64_t rw = (y.W - 1) * op.stride[1] + (ekw - 1) * dw + 1 - x.W - pw;
        dnnl::primitive_attr attr;
        if (!pass && (op.act == Act::ReLU || op.act == Act::Sigmoid)) {
          dnnl::post_ops po;
          po.append_eltwise(1.f, op.act == Act::ReLU ? dnnl::algorithm::eltwise_relu : dnnl::algorithm::eltwise_logistic,
                            0.f, 0.f);
          attr.set_post_ops(po);
        }
        auto w_plain =
            op.weight.to(torch::kCPU, torch::kFloat32).slice(2, th.first, th.first + ekh).slice(3, tw.first, tw.first + ekw).contiguous();
        dnnl::memory wsrc(wmd, eng_, w_plain.data_ptr());
        params_.push_back(op.bias.to(torch::kCPU, torch::kFloat32).contiguous().clone());
        dnnl::memory bmem(dnnl::memory::desc({O}, dtype::f32, tag::x), eng_, params_.back().data_ptr());
        dnnl::memory dmem(cdst.desc(), eng_, cdst.data);
        // Candidates, chosen by measuring them here once: the direct algorithm; Winograd for
        // dense 3×3 stride-1 convolutions; for the first convolution also an NHWC input.
        struct Candidate {
          dnnl::convolution_forward prim;
          dnnl::memory src, weights;
          torch::Tensor wbuf;
          View::Fmt fmt;
          std::string impl;
          double seconds = 1e30;
        };
        std::vector<Candidate> cands;
        const bool use_bf16 = reads_bf16(op);
        auto add_candidate = [&](dnnl::algorithm alg, View::Fmt fmt) {
          View xs = x;
          xs.fmt = fmt;
          dnnl::memory::desc sd = xs.desc();
          if (use_bf16 && !x.bf16) {  // the input's shadow
            if (!shadow_[op.in[0]] || x.coff != 0) throw std::logic_error("onednn: no bf16 input for " + op.name);
            sd = dnnl::memory::desc({x.N, x.C, x.H, x.W}, dtype::bf16, kBlockedTag);
          }
          try {
            dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, alg, sd,
                                              dnnl::memory::desc(wd, use_bf16 ? dtype::bf16 : dtype::f32, tag::any),
                                              bmem.get_desc(),
                                              cdst.desc(), {op.stride[0], op.stride[1]},
                                              {dh - 1, dw - 1}, {ph, pw}, {rh, rw});
            dnnl::convolution_forward::primitive_desc pd(d, attr, eng_);
            Candidate c;
            c.impl = pd.impl_info_str();
            c.fmt = fmt;
            c.wbuf = torch::empty({static_cast<int64_t>(pd.weights_desc().get_size() / sizeof(float)) + 1});
            c.weights = dnnl::memory(pd.weights_desc(), eng_, c.wbuf.data_ptr());
            dnnl::stream s(eng_);
            dnnl::reorder(wsrc, c.weights).execute(s, wsrc, c.weights);
            s.wait();
            c.src = use_bf16 && !x.bf16 ? dnnl::memory(sd, eng_, shadow_[op.in[0]]) : dnnl::memory(sd, eng_, x.data);
            c.prim = dnnl::convolution_forward(pd);
            cands.push_back(std::move(c));
          } catch (const dnnl::error&) {
            // this algorithm / format is not offered for this shape
          }
        };
        add_candidate(dnnl::algorithm::convolution_direct, x.fmt);
        if (!use_bf16 && G == 1 && ekh == 3 && ekw == 3 && op.stride[0] == 1 && op.stride[1] == 1 && dh == 1 &&
            dw == 1 && x.fmt == View::Fmt::Blocked)
          add_candidate(dnnl::algorithm::convolution_winograd, x.fmt);
        if (!use_bf16 && x.fmt != View::Fmt::Blocked) add_candidate(dnnl::algorithm::convolution_direct, View::Fmt::Nhwc);
        if (cands.empty()) throw std::runtime_error("onednn: no convolution for " + op.name);
        // A reference (non-JIT) kernel is never the fastest; timing one can take a second.
        auto is_ref = [](const Candidate& c) { return c.impl.rfind("ref", 0) == 0; };
        if (std::any_of(cands.begin(), cands.end(), [&](const Candidate& c) { return !is_ref(c); }))
          cands.erase(std::remove_if(cands.begin(), cands.end(), is_ref), cands.end());
        // Only a reference kernel for the blocked layout (oneDNN's AVX2 kernels refuse some
        // dilated convolutions on small maps): the convolution in NHWC, between two reorders.
        if (is_ref(cands.front()) && !use_bf16 && x.fmt == View::Fmt::Blocked) {
          View xp = x, yp = cdst;
          xp.fmt = yp.fmt = View::Fmt::Nhwc;
          xp.data = alloc(xp.floats());
          yp.data = alloc(yp.floats());
          try {
            dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                              xp.desc(), dnnl::memory::desc(wd, dtype::f32, tag::any), bmem.get_desc(),
                                              yp.desc(), {op.stride[0], op.stride[1]}, {dh - 1, dw - 1}, {ph, pw},
                                              {rh, rw});
            dnnl::convolution_forward::primitive_desc pd(d, attr, eng_);
            const std::string impl = pd.impl_info_str();
            if (impl.rfind("ref", 0) != 0) {
              auto wbuf = torch::empty({static_cast<int64_t>(pd.weights_desc().get_size() / sizeof(float)) + 1});
              dnnl::memory wmem(pd.weights_desc(), eng_, wbuf.data_ptr());
              dnnl::stream s(eng_);
              dnnl::reorder(wsrc, wmem).execute(s, wsrc, wmem);
              s.wait();
              params_.push_back(wbuf);
              dnnl::memory xb(x.desc(), eng_, x.data), xn(xp.desc(), eng_, xp.data);
              dnnl::memory yn(yp.desc(), eng_, yp.data);
              dnnl::reorder to_plain(xb, xn), to_blocked(yn, dmem);
              dnnl::convolution_forward prim(pd);
              add_step(op.name + " (nhwc " + impl + ")", [=](dnnl::stream& st) mutable {
                to_plain.execute(st, xb, xn);
                prim.execute(st, {{DNNL_ARG_SRC, xn}, {DNNL_ARG_WEIGHTS, wmem}, {DNNL_ARG_BIAS, bmem}, {DNNL_ARG_DST, yn}});
                to_blocked.execute(st, yn, dmem);
              });
              cands.clear();
            }
          } catch (const dnnl::error&) {
          }
          release(xp.data, xp.floats());
          release(yp.data, yp.floats());
        }
        if (cands.size() > 1) {
          dnnl::stream s(eng_);
          for (auto& c : cands) {
            std::unordered_map<int, dnnl::memory> args{
                {DNNL_ARG_SRC, c.src}, {DNNL_ARG_WEIGHTS, c.weights}, {DNNL_ARG_BIAS, bmem}, {DNNL_ARG_DST, dmem}};
            c.prim.execute(s, args);
            s.wait();
            for (int r = 0; r < 3; ++r) {
              auto t0 = std::chrono::steady_clock::now();
              c.prim.execute(s, args);
              s.wait();
              c.seconds = std::min(c.seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            }
          }
        }
        if (!cands.empty()) {
          auto best = std::min_element(cands.begin(), cands.end(),
                                       [](const Candidate& a, const Candidate& b) { return a.seconds < b.seconds; });
          views_[op.in[0]].fmt = best->fmt;  // the first convolution picks the normalised image's format
          params_.push_back(best->wbuf);
          auto prim = best->prim;
          auto smem = best->src, wmem = best->weights;
          add_step(op.name + " (" + best->impl + ")", [prim, smem, wmem, bmem, dmem](dnnl::stream& s) {
            prim.execute(s, {{DNNL_ARG_SRC, smem}, {DNNL_ARG_WEIGHTS, wmem}, {DNNL_ARG_BIAS, bmem}, {DNNL_ARG_DST, dmem}});
          });
        }
        if (pass) {
          auto e = std::make_unique<Epilogue>();
          e->src = cdst;
          e->dst = y;
          e->act = op.act;
          if (op.act == Act::PReLU) e->slopes = param(op.slopes, O);
          if (op.residual >= 0) e->residual = &views_[op.residual];
          e->adds = views_of(op.add);
          e->valid = valid(O);
          add_epilogue(std::move(e), op.name + " (pass)");
        }
        if (scratch) release(scratch, cdst.floats());
        break;
      }
      case FusedOp::Kind::Affine: {
        place(out);
        auto e = std::make_unique<Epilogue>();
        e->src = x;
        e->dst = views_[out];
        e->scale = param(op.weight, x.C);
        e->shift = param(op.bias, x.C);
        e->act = op.act;
        if (op.act == Act::PReLU) e->slopes = param(op.slopes, x.C);
        e->adds = views_of(op.add);
        e->valid = valid(x.C);
        if (i > 0 && pool_fused_next[i - 1]) {  // the max pooling before it, then this pass
          const FusedOp& pool = f.ops[i - 1];
          auto c = std::make_shared<MaxPool2x2>();
          c->src = views_[pool.in[0]];
          c->e = *e;
          add_step(pool.name + " + " + op.name + " (max pool+pass)", [c](dnnl::stream&) { run_pool(*c); });
          final_pass = &c->e;
          break;
        }
        add_epilogue(std::move(e), op.name + " (pass)");
        break;
      }
      case FusedOp::Kind::MaxPool: {  // 2×2 stride 2, ceil mode: ours, with the next affine fused
        if (pool_fused_next[i]) break;  // built with the affine that reads it
        place(out);
        auto c = std::make_shared<MaxPool2x2>();
        c->src = x;
        c->e.dst = views_[out];
        c->e.adds = views_of(op.add);
        c->e.valid = valid(x.C);
        add_step(op.name + " (max pool+pass)", [c](dnnl::stream&) { run_pool(*c); });
        final_pass = &c->e;
        break;
      }
      case FusedOp::Kind::Concat: {
        place(out);
        if (unaligned[i]) {  // oneDNN 2.6 copies such a concat with its reference kernel: ours
          auto c = std::make_shared<ChannelConcat>();
          for (int part : op.in) c->parts.push_back(views_[part]);
          c->dst = views_[out];
          add_step(op.name + " (concat)", [c](dnnl::stream&) { run_channel_concat(*c); });
        }
        int64_t off = 0;
        for (int part : op.in) {
          if (!unaligned[i] && alias_of[part] != out) {  // copy this part into its channels
            auto e = std::make_unique<Epilogue>();
            e->src = views_[part];
            e->dst = views_[out];
            e->dst.C = views_[part].C;
            e->dst.coff = off;
            e->valid = valid(views_[part].C);
            add_epilogue(std::move(e), op.name + " (pass)");
          }
          off += f.channels[part];
        }
        if (!op.add.empty()) {
          auto e = std::make_unique<Epilogue>();
          e->src = e->dst = views_[out];
          e->adds = views_of(op.add);
          e->valid = valid(views_[out].C);
          add_epilogue(std::move(e), op.name + " (pass)");
        }
        break;
      }
      case FusedOp::Kind::Resize: {
        if (resize_folded[i]) break;  // added by its reader's pass
        if (out == f.output) {  // straight into the caller's logits (channels_last)
          if (!op.add.empty()) throw std::logic_error("onednn: additions on the output resize");
          auto r = std::make_shared<OutputResize>();
          r->src = x;
          r->H = views_[out].H;
          r->W = views_[out].W;
          r->th = taps(x.H, r->H);
          r->tw = taps(x.W, r->W);
          add_step(op.name, [this, r](dnnl::stream&) { run_output_resize(*r, output_); });
          output_resize_ = r;
          break;
        }
        place(out);
        const View& y = views_[out];
        if (y.H == x.H && y.W == x.W) {
          auto e = std::make_unique<Epilogue>();
          e->src = x;
          e->dst = y;
          e->adds = views_of(op.add);
          e->valid = valid(y.C);
          add_epilogue(std::move(e), op.name + " (pass)");
          break;
        }
        View ry = y;
        ry.coff = 0;
        ry.ctot = y.C;
        float* scratch = nullptr;
        if (alias_of[out] >= 0) ry.data = scratch = alloc(ry.floats());
        dnnl::resampling_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::resampling_linear,
                                         x.desc(), ry.desc());
        dnnl::resampling_forward::primitive_desc pd(d, eng_);
        dnnl::memory smem(x.desc(), eng_, x.data), dmem(ry.desc(), eng_, ry.data);
        dnnl::resampling_forward prim(pd);
        add_step(op.name + " (" + pd.impl_info_str() + ")", [prim, smem, dmem](dnnl::stream& s) {
          prim.execute(s, {{DNNL_ARG_SRC, smem}, {DNNL_ARG_DST, dmem}});
        });
        if (!op.add.empty() || scratch) {
          auto e = std::make_unique<Epilogue>();
          e->src = ry;
          e->dst = y;
          e->adds = views_of(op.add);
          e->valid = valid(y.C);
          add_epilogue(std::move(e), op.name + " (pass)");
        }
        if (scratch) release(scratch, ry.floats());
        break;
      }
      case FusedOp::Kind::MulAdd: {
        place(out);
        auto e = std::make_unique<Epilogue>();
        e->src = x;
        e->dst = views_[out];
        e->mul = &views_[op.in[1]];
        if (e->mul->C != 1) throw std::logic_error("onednn: MulAdd expects a one-channel multiplier");
        for (int v : op.add) {
          if (upsampled_src[v] < 0) {
            e->adds.push_back(&views_[v]);
            continue;
          }
          const View& s = views_[upsampled_src[v]];
          e->upsampled.push_back({&s, taps(s.H, views_[out].H), taps(s.W, views_[out].W)});
        }
        e->valid = valid(x.C);
        add_epilogue(std::move(e), op.name + " (pass)");
        break;
      }
    }
    // The shadow: written by this op's last pass when that pass writes the whole value,
    // else converted from the f32 value by a oneDNN reorder.
    if (shadow_[out]) {
      const View& v = views_[out];
      Epilogue* p = final_pass;
      if (p && p->dst.data == v.data && p->dst.coff == 0 && p->dst.C == v.C && p->dst.ctot == v.ctot) {
        p->shadow = shadow_[out];
        p->write_dst = need_f32[out];
      } else {
        dnnl::memory src(v.desc(), eng_, v.data);
        dnnl::memory dst(dnnl::memory::desc({v.N, v.C, v.H, v.W}, dtype::bf16, kBlockedTag), eng_, shadow_[out]);
        dnnl::reorder r(src, dst);
        add_step(op.name + " (to bf16)", [r, src, dst](dnnl::stream& s) mutable { r.execute(s, src, dst); });
      }
    }
    // Release what this operation read for the last time (concat parts go with their concat).
    auto drop = [&](int v) {
      if (last[v] != i || v == f.input || alias_of[v] >= 0 || !views_[v].data) return;
      release(views_[v].data, views_[v].floats());
      if (shadow_[v]) release(reinterpret_cast<float*>(shadow_[v]), shadow_floats(v));
    };
    std::vector<int> reads = op.in;
    reads.insert(reads.end(), op.add.begin(), op.add.end());
    if (op.residual >= 0) reads.push_back(op.residual);
    if (i > 0 && pool_fused_next[i - 1]) reads.insert(reads.end(), f.ops[i - 1].in.begin(), f.ops[i - 1].in.end());
    for (int v : op.add)
      if (upsampled_src[v] >= 0) reads.push_back(upsampled_src[v]);
    std::sort(reads.begin(), reads.end());
    reads.erase(std::unique(reads.begin(), reads.end()), reads.end());
    for (int v : reads) drop(v);
  }
  if (f.ops.back().out != f.output || f.ops.back().kind != FusedOp::Kind::Resize)
    throw std::logic_error("onednn: the operation list must end with the output resize");
}

torch::Tensor Plan::run(const torch::Tensor& images, dnnl::stream& strm) {
  const int64_t K = f_.channels[f_.output];
  auto out = torch::empty({N_, K, H_, W_}, torch::TensorOptions().dtype(torch::kFloat32).memory_format(
                                               torch::MemoryFormat::ChannelsLast));
  input_ = images.data_ptr<float>();
  output_ = out.data_ptr<float>();
  if (!profile_) {
    for (auto& s : steps_) s(strm);
    strm.wait();
    return out;
  }
  step_seconds_.resize(steps_.size());
  for (size_t i = 0; i < steps_.size(); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    steps_[i](strm);
    strm.wait();
    step_seconds_[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  ++profiled_runs_;
  return out;
}

torch::Tensor Plan::labels(const torch::Tensor& images, dnnl::stream& strm) {
  auto out = torch::empty({N_, H_, W_}, torch::kInt64);
  input_ = images.data_ptr<float>();
  for (size_t i = 0; i + 1 < steps_.size(); ++i) steps_[i](strm);
  strm.wait();
  run_labels(*output_resize_, out.data_ptr<int64_t>());
  return out;
}

std::string Plan::report() const {
  if (profiled_runs_ == 0) return "";
  double total = 0;
  for (double s : step_seconds_) total += s;
  char b[512];
  std::snprintf(b, sizeof b, "onednn plan %lldx%lldx%lld: %lld calls, %.3f ms per call\n", static_cast<long long>(N_),
                static_cast<long long>(H_), static_cast<long long>(W_), static_cast<long long>(profiled_runs_),
                1e3 * total / profiled_runs_);
  std::string r = b;
  for (size_t i = 0; i < steps_.size(); ++i) {
    std::snprintf(b, sizeof b, "  %7.3f ms %5.1f%%  %s\n", 1e3 * step_seconds_[i] / profiled_runs_,
                  100.0 * step_seconds_[i] / total, labels_[i].c_str());
    r += b;
  }
  return r;
}

class Engine : public InferenceEngine {
 public:
  Engine(const FusedNetwork& f, bool bf16, bool profile)
      : f_(to(f, torch::kCPU)), bf16_(bf16), profile_(profile), eng_(dnnl::engine::kind::cpu, 0), strm_(eng_) {
    if (bf16_) {
      if (!onednn_bf16_available())
        throw std::invalid_argument(
            "bf16 inference on the CPU needs AVX512-BF16 or AMX instructions, which this CPU does not have "
            "(use fp32)");
    }
    for (auto& op : f_.ops)  // the plans read plain OIHW weights
      if (op.weight.defined()) op.weight = op.weight.contiguous();
  }
  torch::Tensor logits(const torch::Tensor& images) override { return call(images, false); }
  torch::Tensor labels(const torch::Tensor& images) override { return call(images, true); }
  torch::Tensor call(const torch::Tensor& images, bool labels) {
    if (images.dim() != 4 || images.size(1) != f_.channels[f_.input])
      throw std::invalid_argument("network input must be N×3×H×W, got " + c10::str(images.sizes()));
    if (images.size(2) < 32 || images.size(3) < 32)
      throw std::invalid_argument("network input must be at least 32×32, got " + std::to_string(images.size(2)) +
                                  "×" + std::to_string(images.size(3)));
    c10::InferenceMode guard;
    auto x = images.to(torch::kCPU, torch::kFloat32).contiguous();
    const auto key = std::make_tuple(x.size(0), x.size(2), x.size(3));
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      if (plans_.size() >= 4) plans_.clear();  // a few shapes at a time (each holds its buffers)
      it = plans_.emplace(key, std::make_unique<Plan>(f_, eng_, x.size(0), x.size(2), x.size(3), bf16_)).first;
      it->second->set_profiling(profile_);
    }
    return labels ? it->second->labels(x, strm_) : it->second->run(x, strm_);
  }
  std::string backend() const override { return bf16_ ? "onednn-bf16" : "onednn"; }
  torch::Device device() const override { return torch::kCPU; }
  std::string profile() const override {
    std::string r;
    for (const auto& [key, plan] : plans_) r += plan->report();
    return r;
  }

 private:
  FusedNetwork f_;
  bool bf16_, profile_;
  dnnl::engine eng_;
  dnnl::stream strm_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<Plan>> plans_;
};

std::unique_ptr<InferenceEngine> make_blocked_engine(const FusedNetwork& f, bool bf16, bool profile) {
  if (bf16 && kBlock != 16)
    throw std::invalid_argument("bf16 inference on the CPU needs 16-channel plans (AVX512-BF16 or AMX)");
  return std::make_unique<Engine>(f, bf16, profile);
}

}  // namespace lightseg::onednn::LIGHTSEG_ONEDNN_NS
