// x86 (AVX-512 in 16-lane plans, AVX2 + FMA in 8-lane ones): the register epilogues, eight
// vectors at a time in registers.
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.

// Register epilogues: the usual epilogue, act(x + residual) [⊙ m] + additions [+ an upsampled
// value] (+ a paired tile) with PReLU or no activation, into f32 and/or bf16 (the value and/or
// its bf16 copy), eight vectors at a time kept in registers from their loads to their stores,
// instead of finish_tile's one loop per step over a tile in L1. Measured (360x480, alternated):
// the passes after oneDNN convolutions 2.4 -> 1.3 ms in bf16, the depthwise kernels ~10 %
// faster, all our kernels 6.5 -> 4.9 ms in fp32. Compiled for AVX-512 in the 16-lane plans and
// for AVX2 + FMA in the 8-lane ones (x86-64 GCC/Clang), whole channel blocks only; everything
// else, and every CPU without these, takes finish_tile (the same arithmetic in the same order:
// tests/test_engine.cpp compares them).
#if LIGHTSEG_ONEDNN_X86_512
#define LIGHTSEG_REGISTER_TARGET "avx512f"
inline bool register_kernels() { return avx512_kernels(); }
#else
#define LIGHTSEG_REGISTER_TARGET "avx2,fma"
inline bool register_kernels() { return avx2_kernels(); }
#endif
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
inline __attribute__((always_inline)) vb fetch(const PixelStrided<float>* s, int64_t i) { return load(s->p + i * s->stride); }
inline __attribute__((always_inline)) vb fetch(const PixelStrided<uint16_t>* s, int64_t i) {
  return in_load(s->p + i * s->stride);
}
// f32 → bf16 rounded to nearest even (vcvtneps2bf16; asm, so that it compiles in an AVX-512F
// function: it only runs where a bf16 value exists, i.e. in bf16 plans on AVX512-BF16 CPUs).
inline __attribute__((always_inline)) void out_bf16(uint16_t* d, vb v) {
#if LIGHTSEG_ONEDNN_X86_512
  vbh h;
  asm("vcvtneps2bf16 %1, %0" : "=v"(h) : "v"(v));
  *reinterpret_cast<vbhu*>(d) = h;
#else
  store_bf16(d, v);  // 8-lane plans have no bf16 values (bf16 plans are 16-lane only)
#endif
}

bool register_epilogue_fits(const Epilogue& e) {
  if (!register_kernels() || (e.act != Act::PReLU && e.act != Act::None) || e.scale || (e.mul && e.mul->C != 1) ||
      e.upsampled.size() > 1 || e.adds.size() > 2 || e.dst.C % kBlock != 0 || (!e.write_dst && !e.shadow && !e.q8) ||
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
                                                          float* d32, uint16_t* d16, uint16_t* h, int8_t* q,
                                                          int64_t qs, float qinv) {
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
  if (q)
    for (int j = 0; j < M; ++j) store_s8(q + (i0 + j) * qs, v[j], qinv, kBlock);
}

// The epilogue of pixels [p, p + np) of block g of image n, the convolution's result coming from
// a tile (S = vb) or from the source value's block (S = float or uint16_t).
template <class S>
__attribute__((target(LIGHTSEG_REGISTER_TARGET), noinline)) void register_epilogue(const Epilogue& e, const S* s, int64_t n,
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
  const int64_t qs = e.dst.C;  // the int8 copy: NHWC
  int8_t* q = e.q8 ? e.q8 + (n * e.dst.pixels() + p) * qs + g * kBlock : nullptr;
  int64_t i = 0;
  if (e.mul || up.u) {
    for (; i + 8 <= np; i += 8) register_chunk<8, true>(s, i, res, mul, a0, a1, up, slope, extra, d32, d16, h, q, qs, e.q8_inv);
    for (; i < np; ++i) register_chunk<1, true>(s, i, res, mul, a0, a1, up, slope, extra, d32, d16, h, q, qs, e.q8_inv);
  } else {
    for (; i + 8 <= np; i += 8) register_chunk<8, false>(s, i, res, mul, a0, a1, up, slope, extra, d32, d16, h, q, qs, e.q8_inv);
    for (; i < np; ++i) register_chunk<1, false>(s, i, res, mul, a0, a1, up, slope, extra, d32, d16, h, q, qs, e.q8_inv);
  }
}
