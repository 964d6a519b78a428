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

// Every lane holds the maximum (or minimum) of the vector's lanes: halving shuffles.
inline __attribute__((always_inline)) vb lanes_max(vb m) {
  vb h;
#if LIGHTSEG_ONEDNN_BLOCK == 16
  h = __builtin_shufflevector(m, m, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  m = m > h ? m : h;
  h = __builtin_shufflevector(m, m, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  m = m > h ? m : h;
  h = __builtin_shufflevector(m, m, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  m = m > h ? m : h;
  h = __builtin_shufflevector(m, m, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
#else
  h = __builtin_shufflevector(m, m, 4, 5, 6, 7, 0, 1, 2, 3);
  m = m > h ? m : h;
  h = __builtin_shufflevector(m, m, 2, 3, 0, 1, 6, 7, 4, 5);
  m = m > h ? m : h;
  h = __builtin_shufflevector(m, m, 1, 0, 3, 2, 5, 4, 7, 6);
#endif
  return m > h ? m : h;
}
inline __attribute__((always_inline)) vb lanes_min(vb m) { return -lanes_max(-m); }

// A row's source rows, one pair per channel block (K ≤ 255 classes: at most 32 blocks).
constexpr int64_t kMaxOutputBlocks = 32;
struct OutputRows {
  const float* row0[kMaxOutputBlocks];
  const float* row1[kMaxOutputBlocks];
  float wy0 = 0.f, wy1 = 0.f;
};
inline __attribute__((always_inline)) OutputRows output_rows(const OutputResize& r, int64_t n, int64_t y) {
  OutputRows q;
  const int64_t blocks = round_up(r.src.C) / kBlock, sw = r.src.W;
  q.wy1 = r.th.w1[y];
  q.wy0 = 1.f - q.wy1;
  for (int64_t g = 0; g < blocks && g < kMaxOutputBlocks; ++g) {
    const float* base = r.src.block(n, g);
    q.row0[g] = base + r.th.i0[y] * sw * kBlock;
    q.row1[g] = base + r.th.i1[y] * sw * kBlock;
  }
  return q;
}

// Labels straight from the H/4 logits: the ×4 upsampling and the argmax in one pass (first
// maximum, as torch::argmax), without the full-size logits. Vector code in any width: the
// maximum over the blocks and the lanes, then the lowest class index that holds it; the
// padding lanes of the last block are pushed to -inf. B: the number of blocks when known at
// compile time (1, 2), else 0.
template <int B>
inline __attribute__((always_inline)) void label_row_blocks(const OutputResize& r, int64_t* out, int64_t n,
                                                            int64_t y) {
  const int64_t K = r.src.C, blocks = B > 0 ? B : round_up(K) / kBlock;
  const OutputRows q = output_rows(r, n, y);
  int64_t* o = out + (n * r.H + y) * r.W;
  vb iota, pad;
  for (int64_t l = 0; l < kBlock; ++l) {
    iota[l] = static_cast<float>(l);
    pad[l] = l < K - (blocks - 1) * kBlock ? 0.f : -std::numeric_limits<float>::infinity();
  }
  const vb none = vb{} + static_cast<float>(kMaxOutputBlocks * kBlock);
  for (int64_t x = 0; x < r.W; ++x) {
    vb v[B > 0 ? B : kMaxOutputBlocks];
    vb m = vb{} - std::numeric_limits<float>::infinity();
    for (int64_t g = 0; g < blocks; ++g) {
      v[g] = interpolate(r, q.row0[g], q.row1[g], q.wy0, q.wy1, x);
      if (g == blocks - 1) v[g] = pad == 0.f ? v[g] : pad;  // whatever the padding lanes hold
      m = m > v[g] ? m : v[g];
    }
    m = lanes_max(m);
    vb first = none;
    for (int64_t g = 0; g < blocks; ++g) {
      const vb at = v[g] == m ? iota + static_cast<float>(g * kBlock) : none;
      first = first < at ? first : at;
    }
    o[x] = static_cast<int64_t>(lanes_min(first)[0]);
  }
}
void label_row(const OutputResize& r, int64_t* out, int64_t n, int64_t y) {
  const int64_t blocks = round_up(r.src.C) / kBlock;
  if (blocks == 1)
    label_row_blocks<1>(r, out, n, y);
  else if (blocks == 2)
    label_row_blocks<2>(r, out, n, y);
  else
    label_row_blocks<0>(r, out, n, y);
}

// The logits of one row, pixel by pixel: each block's vector stored whole where it stays
// inside the row (lanes past the pixel's K channels land on the next pixel, written next),
// the row's last partial block through a copy.
void output_row(const OutputResize& r, float* out, int64_t n, int64_t y) {
  const int64_t K = r.src.C, blocks = round_up(K) / kBlock, row = r.W * K;
  const OutputRows q = output_rows(r, n, y);
  float* o = out + (n * r.H + y) * row;
  for (int64_t x = 0; x < r.W; ++x)
    for (int64_t g = 0; g < blocks; ++g) {
      const vb v = interpolate(r, q.row0[g], q.row1[g], q.wy0, q.wy1, x);
      const int64_t at = x * K + g * kBlock;
      if (at + kBlock <= row) {
        store(o + at, v);
      } else {
        float tmp[kBlock];
        store(tmp, v);
        std::memcpy(o + at, tmp, sizeof(float) * static_cast<size_t>(std::min<int64_t>(kBlock, K - g * kBlock)));
      }
    }
}
#if LIGHTSEG_ONEDNN_X86_512
#include "infer/onednn/x86/output_resize.h"
#endif

void run_labels(const OutputResize& r, int64_t* out) {
#if LIGHTSEG_ONEDNN_X86_512
  if (avx512_kernels() && r.src.C <= kBlock) {
    parallel_steps(0, r.src.N * r.H, 8, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) label_row_avx512(r, out, i / r.H, i % r.H);
    });
    return;
  }
#endif
  parallel_steps(0, r.src.N * r.H, 8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) label_row(r, out, i / r.H, i % r.H);
  });
}

void run_output_resize(const OutputResize& r, float* out) {
#if LIGHTSEG_ONEDNN_X86_512
  if (avx512_kernels() && r.src.C >= 8 && r.src.C < kBlock) {
    const OutputPack q = output_pack(r.src.C);
    parallel_steps(0, r.src.N * r.H, 8, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) output_row_packed(r, q, out, i / r.H, i % r.H);
    });
    return;
  }
#endif
  parallel_steps(0, r.src.N * r.H, 8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) output_row(r, out, i / r.H, i % r.H);
  });
}
