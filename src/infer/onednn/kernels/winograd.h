// Dense 3×3 stride-1 convolutions by Winograd F(4×4, 3×3) (Lavin & Gray 2016): 36 products
// per 4×4 outputs and channel pair instead of 144. oneDNN 2.6 has Winograd for AVX-512 only,
// where it is a candidate too; at AVX2 its direct kernels are at the FMA floor (init.conv2/3:
// 3.2 ms each at 360×480, 2 threads), so this one is the plans' own, in vector code of either
// width (one channel block of one pixel per vector), measured against oneDNN's kernels when a
// plan is built. C4.6's "3-D" convolutions and C1.1's second and third ones take it.
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.
//
// A strip of T tiles of one tile row at a time, in per-thread scratch that stays in L2:
//   1. input transform, V = Bᵀ d B, per channel block → V[36][T][Cin];
//   2. per position ξ, the product M[ξ] = V[ξ] · U[ξ] (tiles × Cin by Cin × Cout) in registers
//      (6 tiles × 2 output blocks of accumulators);
//   3. output transform, Y = Aᵀ M A, plus the bias, into the destination's blocks.
// fp32 only, channel counts whole blocks (so no padding lane is ever read). The pass after it
// stays a step of its own: run in the output transform (rows of a strip through the register
// epilogue) it measured no faster at AVX2 (init.conv2: 1.71 + 0.08 ms apart, 1.79 fused), the
// products being ~80 % of the time.

struct WinogradConv {
  View src, dst;             // blocked, fp32, Cin and Cout multiples of kBlock
  int64_t ph = 1, pw = 1;    // padding on the top and the left
  std::vector<float> u;      // U[36][Cout/kBlock][Cin][kBlock]: the transformed weights
  std::vector<float> bias;   // Cout
  int64_t strip = 16;        // tiles per strip
};

// Whether a convolution can take it: dense, 3×3, stride 1, no dilation, whole blocks, fp32.
bool winograd_fits(const View& x, const View& y, int64_t groups, int64_t kh, int64_t kw, int64_t stride_h,
                   int64_t stride_w, int64_t dil_h, int64_t dil_w) {
  return groups == 1 && kh == 3 && kw == 3 && stride_h == 1 && stride_w == 1 && dil_h == 1 && dil_w == 1 &&
         x.fmt == View::Fmt::Blocked && !x.bf16 && !y.bf16 && x.C % kBlock == 0 && y.C % kBlock == 0;
}

// The weights' transform U = G g Gᵀ (in double), laid out for the products.
std::vector<float> winograd_weights(const torch::Tensor& weight) {  // O×I×3×3, f32, contiguous
  const int64_t O = weight.size(0), I = weight.size(1);
  const float* w = weight.data_ptr<float>();
  static const double G[6][3] = {{1.0 / 4, 0, 0},
                                 {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                 {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                 {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                 {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                 {0, 0, 1}};
  std::vector<float> u(static_cast<size_t>(36 * O * I));
  const int64_t ob = O / kBlock;
  for (int64_t o = 0; o < O; ++o)
    for (int64_t i = 0; i < I; ++i) {
      const float* g = w + (o * I + i) * 9;
      double t[6][3];  // G g
      for (int a = 0; a < 6; ++a)
        for (int c = 0; c < 3; ++c) t[a][c] = G[a][0] * g[0 * 3 + c] + G[a][1] * g[1 * 3 + c] + G[a][2] * g[2 * 3 + c];
      for (int a = 0; a < 6; ++a)
        for (int b = 0; b < 6; ++b) {
          const double v = t[a][0] * G[b][0] + t[a][1] * G[b][1] + t[a][2] * G[b][2];
          const int64_t xi = a * 6 + b;
          u[static_cast<size_t>(((xi * ob + o / kBlock) * I + i) * kBlock + o % kBlock)] = static_cast<float>(v);
        }
    }
  return u;
}

// Bᵀ z for six vectors (in place into r).
inline __attribute__((always_inline)) void winograd_bt(const vb* z, vb* r) {
  r[0] = 4.f * z[0] - 5.f * z[2] + z[4];
  r[1] = -4.f * (z[1] + z[2]) + z[3] + z[4];
  r[2] = 4.f * (z[1] - z[2]) - z[3] + z[4];
  r[3] = 2.f * (z[3] - z[1]) - z[2] + z[4];
  r[4] = 2.f * (z[1] - z[3]) - z[2] + z[4];
  r[5] = 4.f * z[1] - 5.f * z[3] + z[5];
}
// Aᵀ m for six vectors → four.
inline __attribute__((always_inline)) void winograd_at(const vb* m, vb* o) {
  const vb s12 = m[1] + m[2], d12 = m[1] - m[2], s34 = m[3] + m[4], d34 = m[3] - m[4];
  o[0] = m[0] + s12 + s34;
  o[1] = d12 + 2.f * d34;
  o[2] = s12 + 4.f * s34;
  o[3] = d12 + 8.f * d34 + m[5];
}

// Step 1 for tiles [tx0, tx0 + T) of tile row ty, channel block cb: V[ξ][t][cb·kBlock ..].
inline void winograd_input(const WinogradConv& c, int64_t n, int64_t ty, int64_t tx0, int64_t T, int64_t cb,
                           float* V) {
  const View& x = c.src;
  const int64_t Cin = x.C, H = x.H, W = x.W;
  const float* base = x.block(n, cb);
  const int64_t y0 = ty * 4 - c.ph;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t x0 = (tx0 + t) * 4 - c.pw;
    vb d[6][6];
    if (y0 >= 0 && y0 + 6 <= H && x0 >= 0 && x0 + 6 <= W) {
      for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 6; ++j) d[i][j] = load(base + ((y0 + i) * W + x0 + j) * kBlock);
    } else {
      for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 6; ++j) {
          const int64_t yy = y0 + i, xx = x0 + j;
          d[i][j] = yy >= 0 && yy < H && xx >= 0 && xx < W ? load(base + (yy * W + xx) * kBlock) : vb{};
        }
    }
    vb col[6], r[6][6];
    for (int j = 0; j < 6; ++j) {  // Bᵀ d, column by column
      vb z[6];
      for (int i = 0; i < 6; ++i) z[i] = d[i][j];
      winograd_bt(z, col);
      for (int i = 0; i < 6; ++i) r[i][j] = col[i];
    }
    for (int i = 0; i < 6; ++i) {  // (Bᵀ d) B, row by row
      vb v[6];
      winograd_bt(r[i], v);
      for (int j = 0; j < 6; ++j) store(V + ((i * 6 + j) * T + t) * Cin + cb * kBlock, v[j]);
    }
  }
}

// Step 2 for one position: R tiles × NB output blocks of accumulators.
template <int R, int NB>
inline __attribute__((always_inline)) void winograd_tile_product(const float* V, const float* U, float* M,
                                                                  int64_t Cin, int64_t Cout) {
  vb acc[R][NB];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < NB; ++b) acc[r][b] = vb{};
  for (int64_t ci = 0; ci < Cin; ++ci) {
    vb u[NB];
    for (int b = 0; b < NB; ++b) u[b] = load(U + (b * Cin + ci) * kBlock);
    for (int r = 0; r < R; ++r) {
      const float a = V[r * Cin + ci];
      for (int b = 0; b < NB; ++b) acc[r][b] += a * u[b];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < NB; ++b) store(M + r * Cout + b * kBlock, acc[r][b]);
}
template <int NB>
inline __attribute__((always_inline)) void winograd_rows(const float* V, const float* U, float* M, int64_t T,
                                                          int64_t Cin, int64_t Cout) {
  int64_t t = 0;
  for (; t + 6 <= T; t += 6) winograd_tile_product<6, NB>(V + t * Cin, U, M + t * Cout, Cin, Cout);
  switch (T - t) {
    case 5: winograd_tile_product<5, NB>(V + t * Cin, U, M + t * Cout, Cin, Cout); break;
    case 4: winograd_tile_product<4, NB>(V + t * Cin, U, M + t * Cout, Cin, Cout); break;
    case 3: winograd_tile_product<3, NB>(V + t * Cin, U, M + t * Cout, Cin, Cout); break;
    case 2: winograd_tile_product<2, NB>(V + t * Cin, U, M + t * Cout, Cin, Cout); break;
    case 1: winograd_tile_product<1, NB>(V + t * Cin, U, M + t * Cout, Cin, Cout); break;
    default: break;
  }
}
inline void winograd_product(const WinogradConv& c, int xi, int64_t T, const float* V, float* M) {
  const int64_t Cin = c.src.C, Cout = c.dst.C, ob = Cout / kBlock;
  const float* Vx = V + xi * T * Cin;
  const float* Ux = c.u.data() + xi * ob * Cin * kBlock;
  float* Mx = M + xi * T * Cout;
  int64_t b = 0;
  for (; b + 2 <= ob; b += 2) winograd_rows<2>(Vx, Ux + b * Cin * kBlock, Mx + b * kBlock, T, Cin, Cout);
  if (b < ob) winograd_rows<1>(Vx, Ux + b * Cin * kBlock, Mx + b * kBlock, T, Cin, Cout);
}

// Step 3 for tiles [tx0, tx0 + T) of tile row ty, output block ob.
inline void winograd_output(const WinogradConv& c, int64_t n, int64_t ty, int64_t tx0, int64_t T, int64_t ob,
                            const float* M) {
  const View& y = c.dst;
  const int64_t Cout = y.C, OH = y.H, OW = y.W;
  float* base = y.block(n, ob);
  const vb bias = load(c.bias.data() + ob * kBlock);
  for (int64_t t = 0; t < T; ++t) {
    vb r[4][6];
    for (int j = 0; j < 6; ++j) {  // Aᵀ m, column by column
      vb m[6], o[4];
      for (int i = 0; i < 6; ++i) m[i] = load(M + ((i * 6 + j) * T + t) * Cout + ob * kBlock);
      winograd_at(m, o);
      for (int i = 0; i < 4; ++i) r[i][j] = o[i];
    }
    const int64_t oy0 = ty * 4, ox0 = (tx0 + t) * 4;
    for (int i = 0; i < 4 && oy0 + i < OH; ++i) {
      vb o[4];
      winograd_at(r[i], o);
      for (int j = 0; j < 4 && ox0 + j < OW; ++j) store(base + ((oy0 + i) * OW + ox0 + j) * kBlock, o[j] + bias);
    }
  }
}

void run_winograd(const WinogradConv& c) {
  const int64_t th = (c.dst.H + 3) / 4, tw = (c.dst.W + 3) / 4, T = std::min<int64_t>(c.strip, tw);
  const int64_t strips = (tw + T - 1) / T, items = c.dst.N * th * strips;
  const int64_t Cin = c.src.C, Cout = c.dst.C;
  at::parallel_for(0, items, 1, [&](int64_t b, int64_t e) {
    // Per-thread scratch, kept between calls: a fresh zeroed vector per call cost more than the
    // products on small maps (page faults of ~150 KB).
    static thread_local std::vector<float> scratch;
    const size_t need = static_cast<size_t>(36 * T * (Cin + Cout));
    if (scratch.size() < need) scratch.resize(need);
    float* V = scratch.data();
    float* M = V + 36 * T * Cin;
    for (int64_t i = b; i < e; ++i) {
      const int64_t s = i % strips, ty = (i / strips) % th, n = i / (strips * th);
      const int64_t tx0 = s * T, nt = std::min(T, tw - tx0);
      for (int64_t cb = 0; cb < Cin / kBlock; ++cb) winograd_input(c, n, ty, tx0, nt, cb, V);
      for (int xi = 0; xi < 36; ++xi) winograd_product(c, xi, nt, V, M);
      for (int64_t ob = 0; ob < Cout / kBlock; ++ob) winograd_output(c, n, ty, tx0, nt, ob, M);
    }
  });
}
