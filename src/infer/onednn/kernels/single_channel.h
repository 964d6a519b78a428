// Convolutions with one output channel (oneDNN would pad them to a whole block).
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.

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

void single_channel_row(const SingleChannelConv& c, int64_t n, int64_t y) {
  single_channel_row_impl(c, c.src.block(n, 0), n, y);
}
LIGHTSEG_AVX512
void single_channel_row_bf16(const SingleChannelConv& c, int64_t n, int64_t y) {
  single_channel_row_impl(c, c.src.blockh(n, 0), n, y);
}

void run_single_channel(const SingleChannelConv& c) {
  parallel_steps(0, c.dst.N * c.dst.H, 4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (c.src.bf16)
        single_channel_row_bf16(c, i / c.dst.H, i % c.dst.H);
      else
        single_channel_row(c, i / c.dst.H, i % c.dst.H);
    }
  });
}
