// Dense 3×3 stride-1 convolutions by Winograd F(m×m, 3×3) (Lavin & Gray 2016), m = 4 or 6:
// (m + 2)² products per m×m outputs and channel pair instead of 9·m² (F(4×4): 36 for 144;
// F(6×6): 64 for 324, 21 % fewer products per output than F(4×4)). oneDNN 2.6 has Winograd for
// AVX-512 only, where it is a candidate too; at AVX2 its direct kernels are at the FMA floor
// (init.conv2/3: 3.2 ms each at 360×480, 2 threads), so this one is the plans' own, in vector
// code of either width (one channel block of one pixel per vector). Both tile sizes are measured
// against oneDNN's kernels when a plan is built. C4.6's "3-D" convolutions and C1.1's second
// and third ones take it.
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.
//
// A strip of T tiles of one tile row at a time, in per-thread scratch that stays in L2:
//   1. input transform, V = Bᵀ d B, per channel block → V[ξ][T][Cin], ξ < (m + 2)²;
//   2. per position ξ, the product M[ξ] = V[ξ] · U[ξ] (tiles × Cin by Cin × Cout) in registers
//      (6 tiles × 2 output blocks of accumulators);
//   3. output transform, Y = Aᵀ M A, plus the bias, into the destination's blocks.
// fp32 only, channel counts whole blocks (so no padding lane is ever read). F(6×6)'s larger
// transform constants cost some precision: logits within 7e-7 of the training graph's on the
// test networks, where F(4×4) gives 4e-7 and oneDNN's direct kernels 3e-7
// (Engine.WinogradConvolutionsMatchTheTrainingGraph prints them). The pass after it stays a step of its
// own: run in the output transform (rows of a strip through the register epilogue) it measured
// no faster at AVX2 (init.conv2: 1.71 + 0.08 ms apart, 1.79 fused).

struct WinogradConv {
  View src, dst;             // blocked, fp32, Cin and Cout multiples of kBlock
  int64_t ph = 1, pw = 1;    // padding on the top and the left
  int m = 4;                 // output tile: F(m×m, 3×3), m = 4 or 6
  std::vector<float> u;      // U[ξ][Cout/kBlock][Cin][kBlock]: the transformed weights
  std::vector<float> bias;   // Cout
  int64_t strip = 16;        // tiles per strip at most (a tile row splits into strips of equal size)
};

// Whether a convolution can take it: dense, 3×3, stride 1, no dilation, whole blocks, fp32.
bool winograd_fits(const View& x, const View& y, int64_t groups, int64_t kh, int64_t kw, int64_t stride_h,
                   int64_t stride_w, int64_t dil_h, int64_t dil_w) {
  return groups == 1 && kh == 3 && kw == 3 && stride_h == 1 && stride_w == 1 && dil_h == 1 && dil_w == 1 &&
         x.fmt == View::Fmt::Blocked && !x.bf16 && !y.bf16 && x.C % kBlock == 0 && y.C % kBlock == 0;
}

// The weights' transform U = G g Gᵀ (in double), laid out for the products. The matrices
// (G here, Bᵀ and Aᵀ in the transforms below): scripts/winograd_matrices.py.
std::vector<float> winograd_weights(const torch::Tensor& weight, int m) {  // O×I×3×3, f32, contiguous
  const int64_t O = weight.size(0), I = weight.size(1);
  const float* w = weight.data_ptr<float>();
  static const double G4[6][3] = {{1.0 / 4, 0, 0},
                                  {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                  {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                  {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                  {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                  {0, 0, 1}};
  static const double G6[8][3] = {{1, 0, 0},
                                  {-2.0 / 9, -2.0 / 9, -2.0 / 9},
                                  {-2.0 / 9, 2.0 / 9, -2.0 / 9},
                                  {1.0 / 90, 1.0 / 45, 2.0 / 45},
                                  {1.0 / 90, -1.0 / 45, 2.0 / 45},
                                  {32.0 / 45, 16.0 / 45, 8.0 / 45},
                                  {32.0 / 45, -16.0 / 45, 8.0 / 45},
                                  {0, 0, 1}};
  const int A = m + 2;
  auto G = [&](int a, int c) { return m == 6 ? G6[a][c] : G4[a][c]; };
  std::vector<float> u(static_cast<size_t>(A * A * O * I));
  const int64_t ob = O / kBlock;
  for (int64_t o = 0; o < O; ++o)
    for (int64_t i = 0; i < I; ++i) {
      const float* g = w + (o * I + i) * 9;
      double t[8][3];  // G g
      for (int a = 0; a < A; ++a)
        for (int c = 0; c < 3; ++c) t[a][c] = G(a, 0) * g[0 * 3 + c] + G(a, 1) * g[1 * 3 + c] + G(a, 2) * g[2 * 3 + c];
      for (int a = 0; a < A; ++a)
        for (int b = 0; b < A; ++b) {
          const double v = t[a][0] * G(b, 0) + t[a][1] * G(b, 1) + t[a][2] * G(b, 2);
          const int64_t xi = a * A + b;
          u[static_cast<size_t>(((xi * ob + o / kBlock) * I + i) * kBlock + o % kBlock)] = static_cast<float>(v);
        }
    }
  return u;
}

// Floats between positions ξ in V and M: T·C plus one cache line. Unpadded, the stride is a
// multiple of 2 KB for the usual counts (16 tiles × 32 or 64 channels), so the 36 positions of
// one tile fall into one or two L1 sets and evict each other on every store and load (the
// input and output transforms took half of init.conv2's time at AVX2).
inline int64_t winograd_stride(int64_t T, int64_t C) { return T * C + 16; }

// Bᵀ z for m + 2 vectors (into r).
template <int M>
inline __attribute__((always_inline)) void winograd_bt(const vb* z, vb* r) {
  if constexpr (M == 4) {
    r[0] = 4.f * z[0] - 5.f * z[2] + z[4];
    r[1] = -4.f * (z[1] + z[2]) + z[3] + z[4];
    r[2] = 4.f * (z[1] - z[2]) - z[3] + z[4];
    r[3] = 2.f * (z[3] - z[1]) - z[2] + z[4];
    r[4] = 2.f * (z[1] - z[3]) - z[2] + z[4];
    r[5] = 4.f * z[1] - 5.f * z[3] + z[5];
  } else {
    r[0] = z[0] - z[6] + 5.25f * (z[4] - z[2]);
    r[7] = z[7] - z[1] + 5.25f * (z[3] - z[5]);
    vb a = z[2] + z[6] - 4.25f * z[4], b = z[1] + z[5] - 4.25f * z[3];
    r[1] = a + b;
    r[2] = a - b;
    a = 0.25f * z[2] + z[6] - 1.25f * z[4];
    b = 0.5f * z[1] - 2.5f * z[3] + 2.f * z[5];
    r[3] = a + b;
    r[4] = a - b;
    a = 4.f * z[2] + z[6] - 5.f * z[4];
    b = 2.f * z[1] - 2.5f * z[3] + 0.5f * z[5];
    r[5] = a + b;
    r[6] = a - b;
  }
}
// Aᵀ m for m + 2 vectors → m.
template <int M>
inline __attribute__((always_inline)) void winograd_at(const vb* m, vb* o) {
  const vb s12 = m[1] + m[2], d12 = m[1] - m[2], s34 = m[3] + m[4], d34 = m[3] - m[4];
  if constexpr (M == 4) {
    o[0] = m[0] + s12 + s34;
    o[1] = d12 + 2.f * d34;
    o[2] = s12 + 4.f * s34;
    o[3] = d12 + 8.f * d34 + m[5];
  } else {
    const vb s56 = m[5] + m[6], d56 = m[5] - m[6];
    o[0] = m[0] + s12 + s34 + s56;
    o[1] = d12 + 2.f * d34 + 0.5f * d56;
    o[2] = s12 + 4.f * s34 + 0.25f * s56;
    o[3] = d12 + 8.f * d34 + 0.125f * d56;
    o[4] = s12 + 16.f * s34 + 0.0625f * s56;
    o[5] = d12 + 32.f * d34 + 0.03125f * d56 + m[7];
  }
}

// Step 1 for tiles [tx0, tx0 + T) of tile row ty, channel block cb: V[ξ][t][cb·kBlock ..].
template <int M>
inline void winograd_input(const WinogradConv& c, int64_t n, int64_t ty, int64_t tx0, int64_t T, int64_t cb,
                           float* V) {
  constexpr int A = M + 2;
  const View& x = c.src;
  const int64_t Cin = x.C, H = x.H, W = x.W, vs = winograd_stride(T, Cin);
  const float* base = x.block(n, cb);
  const int64_t y0 = ty * M - c.ph;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t x0 = (tx0 + t) * M - c.pw;
    const bool inside = y0 >= 0 && y0 + A <= H && x0 >= 0 && x0 + A <= W;
    vb r[A][A];
    for (int j = 0; j < A; ++j) {  // Bᵀ d, column by column
      vb z[A], col[A];
      const int64_t xx = x0 + j;
      for (int i = 0; i < A; ++i) {
        const int64_t yy = y0 + i;
        z[i] = inside || (yy >= 0 && yy < H && xx >= 0 && xx < W) ? load(base + (yy * W + xx) * kBlock) : vb{};
      }
      winograd_bt<M>(z, col);
      for (int i = 0; i < A; ++i) r[i][j] = col[i];
    }
    for (int i = 0; i < A; ++i) {  // (Bᵀ d) B, row by row
      vb v[A];
      winograd_bt<M>(r[i], v);
      for (int j = 0; j < A; ++j) store(V + (i * A + j) * vs + t * Cin + cb * kBlock, v[j]);
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
  const float* Vx = V + xi * winograd_stride(T, Cin);
  const float* Ux = c.u.data() + xi * ob * Cin * kBlock;
  float* Mx = M + xi * winograd_stride(T, Cout);
  int64_t b = 0;
  for (; b + 2 <= ob; b += 2) winograd_rows<2>(Vx, Ux + b * Cin * kBlock, Mx + b * kBlock, T, Cin, Cout);
  if (b < ob) winograd_rows<1>(Vx, Ux + b * Cin * kBlock, Mx + b * kBlock, T, Cin, Cout);
}

// Step 3 for tiles [tx0, tx0 + T) of tile row ty, output block ob.
template <int M>
inline void winograd_output(const WinogradConv& c, int64_t n, int64_t ty, int64_t tx0, int64_t T, int64_t ob,
                            const float* Mv) {
  constexpr int A = M + 2;
  const View& y = c.dst;
  const int64_t Cout = y.C, OH = y.H, OW = y.W, ms = winograd_stride(T, Cout);
  float* base = y.block(n, ob);
  const vb bias = load(c.bias.data() + ob * kBlock);
  for (int64_t t = 0; t < T; ++t) {
    vb r[M][A];
    for (int j = 0; j < A; ++j) {  // Aᵀ m, column by column
      vb m[A], o[M];
      for (int i = 0; i < A; ++i) m[i] = load(Mv + (i * A + j) * ms + t * Cout + ob * kBlock);
      winograd_at<M>(m, o);
      for (int i = 0; i < M; ++i) r[i][j] = o[i];
    }
    const int64_t oy0 = ty * M, ox0 = (tx0 + t) * M;
    for (int i = 0; i < M && oy0 + i < OH; ++i) {
      vb o[M];
      winograd_at<M>(r[i], o);
      for (int j = 0; j < M && ox0 + j < OW; ++j) store(base + ((oy0 + i) * OW + ox0 + j) * kBlock, o[j] + bias);
    }
  }
}

template <int M>
void run_winograd_m(const WinogradConv& c) {
  constexpr int A = M + 2;
  const int64_t th = (c.dst.H + M - 1) / M, tw = (c.dst.W + M - 1) / M;
  const int64_t nstrips = (tw + c.strip - 1) / c.strip;  // strips of at most c.strip tiles,
  const int64_t T = (tw + nstrips - 1) / nstrips;          // all of one size but the last
  const int64_t strips = (tw + T - 1) / T, items = c.dst.N * th * strips;
  const int64_t Cin = c.src.C, Cout = c.dst.C;
  parallel_steps(0, items, 1, [&](int64_t b, int64_t e) {
    // Per-thread scratch, kept between calls: a fresh zeroed vector per call cost more than the
    // products on small maps (page faults of ~150 KB).
    static thread_local std::vector<float> scratch;
    const size_t need = static_cast<size_t>(A * A * (winograd_stride(T, Cin) + winograd_stride(T, Cout)));
    if (scratch.size() < need) scratch.resize(need);
    float* V = scratch.data();
    float* Mv = V + A * A * winograd_stride(T, Cin);
    for (int64_t i = b; i < e; ++i) {
      const int64_t s = i % strips, ty = (i / strips) % th, n = i / (strips * th);
      const int64_t tx0 = s * T, nt = std::min(T, tw - tx0);
      for (int64_t cb = 0; cb < Cin / kBlock; ++cb) winograd_input<M>(c, n, ty, tx0, nt, cb, V);
      for (int xi = 0; xi < A * A; ++xi) winograd_product(c, xi, nt, V, Mv);
      for (int64_t ob = 0; ob < Cout / kBlock; ++ob) winograd_output<M>(c, n, ty, tx0, nt, ob, Mv);
    }
  });
}
void run_winograd(const WinogradConv& c) { c.m == 6 ? run_winograd_m<6>(c) : run_winograd_m<4>(c); }

// The faster tile for this convolution (or the one `mode`, 4 or 6, forces), built and timed
// here; its best time of three runs in *seconds.
std::shared_ptr<WinogradConv> fastest_winograd(const View& x, const View& y, int64_t ph, int64_t pw,
                                               const torch::Tensor& weight, const torch::Tensor& bias, int mode,
                                               double* seconds) {
  const auto b = bias.to(torch::kCPU, torch::kFloat32).contiguous();
  std::shared_ptr<WinogradConv> best;
  *seconds = 1e30;
  for (int m : {4, 6}) {
    if ((mode == 4 || mode == 6) && m != mode) continue;
    auto w = std::make_shared<WinogradConv>();
    w->src = x;
    w->dst = y;
    w->ph = ph;
    w->pw = pw;
    w->m = m;
    w->strip = m == 4 ? 16 : 12;  // tiles per strip at most (measured at AVX2 and AVX-512)
    w->u = winograd_weights(weight, m);
    w->bias.assign(b.data_ptr<float>(), b.data_ptr<float>() + y.C);
    run_winograd(*w);
    double sec = 1e30;
    for (int r = 0; r < 3; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      run_winograd(*w);
      sec = std::min(sec, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    if (sec < *seconds) {
      *seconds = sec;
      best = w;
    }
  }
  return best;
}
