// C3.1's 2×2 max pooling with the pass of its half fused.
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.

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

void pool_row(const MaxPool2x2& c, int64_t n, int64_t g, int64_t y) { pool_row_impl(c, c.src.block(n, g), n, g, y); }
LIGHTSEG_AVX512
void pool_row_bf16(const MaxPool2x2& c, int64_t n, int64_t g, int64_t y) {
  pool_row_impl(c, c.src.blockh(n, g), n, g, y);
}

void run_pool(const MaxPool2x2& c) {
  const int64_t blocks = round_up(c.e.dst.C) / kBlock, OH = c.e.dst.H;
  parallel_steps(0, c.e.dst.N * blocks * OH, 4, [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) {
      if (c.src.bf16)
        pool_row_bf16(c, i / (blocks * OH), (i / OH) % blocks, i % OH);
      else
        pool_row(c, i / (blocks * OH), (i / OH) % blocks, i % OH);
    }
  });
}
