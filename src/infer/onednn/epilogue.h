// The per-operation pass on tiles (finish_tile, epilogue_tile), its register form (AVX-512,
// x86/register_epilogue.h) and the pass as a plan step (run_epilogue), with the input normalisation.
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.

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
  if (e.q8) {
    const int64_t C = e.dst.C;
    const int lanes = static_cast<int>(std::min<int64_t>(kBlock, C - c0));
    int8_t* q = e.q8 + (n * e.dst.pixels() + p) * C + c0;
    for (int64_t i = 0; i < np; ++i) store_s8(q + i * C, t[i], e.q8_inv, lanes);
  }
}

void epilogue_tile(const Epilogue& e, int64_t n, int64_t g, int64_t p, int64_t np) {
  vb t[kTile];
  if (e.src.fmt == View::Fmt::Nhwc && e.src.bf16) {  // a bf16 convolution's NHWC result: gathered
    const int64_t C = e.src.C, c0 = g * kBlock, lanes = std::min<int64_t>(kBlock, C - c0);
    const uint16_t* s = reinterpret_cast<const uint16_t*>(e.src.data) + (n * e.src.pixels() + p) * C + c0;
    for (int64_t i = 0; i < np; ++i) {
      if (lanes == kBlock) {
        t[i] = load(s + i * C);
      } else {
        t[i] = vb{};
        for (int64_t l = 0; l < lanes; ++l) t[i][l] = scalar(s + i * C + l);
      }
    }
  } else if (e.src.fmt == View::Fmt::Nhwc) {  // an int8 or bf16 convolution's result (f32, NHWC): gathered
    const int64_t C = e.src.C, c0 = g * kBlock, lanes = std::min<int64_t>(kBlock, C - c0);
    const float* s = e.src.data + (n * e.src.pixels() + p) * C + c0;
    if (lanes == kBlock) {
      for (int64_t i = 0; i < np; ++i) t[i] = load(s + i * C);
    } else {
      for (int64_t i = 0; i < np; ++i) {
        t[i] = vb{};
        for (int64_t l = 0; l < lanes; ++l) t[i][l] = s[i * C + l];
      }
    }
  } else if (e.src.bf16) {
    load_tile_bf16(t, e.src.blockh(n, g) + p * kBlock, np, false);
  } else {
    const float* s = e.src.block(n, g) + p * kBlock;
    for (int64_t i = 0; i < np; ++i) t[i] = load(s + i * kBlock);
  }
  finish_tile(e, t, n, g, p, np);
}
// A source whose pixels are `stride` elements apart: an int8 or bf16 convolution's NHWC result
// (f32, or bf16: T = uint16_t), whole channel blocks only (the register epilogue's source
// besides tiles and blocked values).
template <class T>
struct PixelStrided {
  const T* p;
  int64_t stride;
};
#if LIGHTSEG_ONEDNN_X86_512 || LIGHTSEG_ONEDNN_X86_256
#include "infer/onednn/x86/register_epilogue.h"
#else
bool register_epilogue_fits(const Epilogue&) { return false; }
template <class S>
void register_epilogue(const Epilogue&, const S*, int64_t, int64_t, int64_t, int64_t, const vb*) {}
#endif

// The pass's items: (image, block, tile of kTile pixels), block-major (a block's tiles in a
// row: blocked values are contiguous per block), but pixel-major where NHWC data is read or
// written (int8 plans): a tile's blocks in a row share their cache lines.
struct EpilogueItems {
  explicit EpilogueItems(const Epilogue& e)
      : blocks(round_up(e.dst.C) / kBlock),
        P(e.dst.pixels()),
        tiles((P + kTile - 1) / kTile),
        count(e.dst.N * blocks * tiles),
        nhwc(e.src.fmt == View::Fmt::Nhwc && e.src.C == e.dst.C),  // int8 plans, bf16 NHWC convolutions
        fast(register_epilogue_fits(e) && (e.src.fmt == View::Fmt::Blocked || nhwc)),
        pixel_major(e.src.fmt == View::Fmt::Nhwc || e.q8) {}
  void run(const Epilogue& e, int64_t i) const {
    const int64_t tile = pixel_major ? (i / blocks) % tiles : i % tiles;
    const int64_t g = pixel_major ? i % blocks : (i / tiles) % blocks, n = i / (tiles * blocks);
    const int64_t p = tile * kTile, np = std::min(kTile, P - p);
    if (fast && nhwc && e.src.bf16) {
      const PixelStrided<uint16_t> s{reinterpret_cast<const uint16_t*>(e.src.data) + (n * P + p) * e.src.C + g * kBlock,
                                     e.src.C};
      register_epilogue(e, &s, n, g, p, np, nullptr);
    } else if (fast && nhwc) {
      const PixelStrided<float> s{e.src.data + (n * P + p) * e.src.C + g * kBlock, e.src.C};
      register_epilogue(e, &s, n, g, p, np, nullptr);
    } else if (fast && e.src.bf16)
      register_epilogue(e, e.src.blockh(n, g) + p * kBlock, n, g, p, np, nullptr);
    else if (fast)
      register_epilogue(e, e.src.block(n, g) + p * kBlock, n, g, p, np, nullptr);
    else
      epilogue_tile(e, n, g, p, np);
  }
  const int64_t blocks, P, tiles, count;
  const bool nhwc, fast, pixel_major;
};

void run_epilogue(const Epilogue& e) {
  const EpilogueItems items(e);
  parallel_steps(0, items.count, 16, [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) items.run(e, i);
  });
}

// The pass on blocks [g0, g1) of image n only, on this thread (a sliced convolution's piece,
// sliced_conv.h); block-major passes only.
void run_epilogue_blocks(const Epilogue& e, int64_t n, int64_t g0, int64_t g1) {
  const EpilogueItems items(e);
  if (items.pixel_major) throw std::logic_error("onednn: a pixel-major pass cut by blocks");
  for (int64_t i = (n * items.blocks + g0) * items.tiles; i < (n * items.blocks + g1) * items.tiles; ++i) items.run(e, i);
}

// Image (N×3×H×W, NCHW, 0..255) → normalised image (plain NCHW or NHWC): one pass.
void run_normalize(const float* x, const View& out, const float* scale, const float* shift) {
  const int64_t P = out.pixels(), C = out.C;
  if (out.fmt == View::Fmt::Nchw) {
    parallel_steps(0, out.N * C, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const float s = scale[i % C], h = shift[i % C];
        const float* src = x + i * P;
        float* dst = out.data + i * P;
        for (int64_t p = 0; p < P; ++p) dst[p] = src[p] * s + h;
      }
    });
    return;
  }
  parallel_steps(0, out.N * out.H, 8, [&](int64_t b, int64_t e) {
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
