// The final ×4 bilinear upsampling straight into the caller's logits (channels_last), or
// fused with the argmax for labels().
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.

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
#include "infer/onednn/x86/output_resize.h"
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
