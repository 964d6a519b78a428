// Depthwise convolutions with their epilogue, and FEB's two depthwise branches paired (C4.3–C4.5).
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.

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

void paired_row(const PairedDepthwise& c, int64_t n, int64_t g, int64_t y) {
  paired_row_impl(c, c.b.e.src.block(n, g), n, g, y);
}
LIGHTSEG_AVX512
void paired_row_bf16(const PairedDepthwise& c, int64_t n, int64_t g, int64_t y) {
  paired_row_impl(c, c.b.e.src.blockh(n, g), n, g, y);
}

void run_paired(const PairedDepthwise& c) {
  const int64_t blocks = round_up(c.b.e.dst.C) / kBlock, OH = c.b.e.dst.H;
  const bool b16 = c.b.e.src.bf16, rows = c.b.e.q8 != nullptr;
  parallel_steps(0, c.b.e.dst.N * blocks * OH, 4, [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) {
      // row-major where an int8 copy (NHWC) is written: a row's blocks in a row share its lines
      const int64_t n = i / (blocks * OH), g = rows ? i % blocks : (i / OH) % blocks, y = rows ? (i / blocks) % OH : i % OH;
      if (b16)
        paired_row_bf16(c, n, g, y);
      else
        paired_row(c, n, g, y);
    }
  });
}

void depthwise_row(const DepthwiseConv& c, int64_t n, int64_t g, int64_t y) {
  depthwise_row_impl(c, c.e.src.block(n, g), n, g, y);
}
LIGHTSEG_AVX512
void depthwise_row_bf16(const DepthwiseConv& c, int64_t n, int64_t g, int64_t y) {
  depthwise_row_impl(c, c.e.src.blockh(n, g), n, g, y);
}

void run_depthwise(const DepthwiseConv& c) {
  const int64_t blocks = round_up(c.e.dst.C) / kBlock, OH = c.e.dst.H;
  const bool b16 = c.e.src.bf16, rows = c.e.q8 != nullptr;
  parallel_steps(0, c.e.dst.N * blocks * OH, 4, [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) {
      // row-major where an int8 copy (NHWC) is written: a row's blocks in a row share its lines
      const int64_t n = i / (blocks * OH), g = rows ? i % blocks : (i / OH) % blocks, y = rows ? (i / blocks) % OH : i % OH;
      if (b16)
        depthwise_row_bf16(c, n, g, y);
      else
        depthwise_row(c, n, g, y);
    }
  });
}
