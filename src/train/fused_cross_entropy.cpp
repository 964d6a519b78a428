#include "train/fused_cross_entropy.h"

#include "core/isa.h"
#include "core/simd.h"
#include "lightseg/features.h"  // LIGHTSEG_NATIVE_KERNELS

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace lightseg {

namespace {

std::atomic<bool> g_fused{true};

// Pixels per work item: a fixed split, so that the loss is summed in the same order whatever
// the number of threads.
constexpr int64_t kChunk = 4096;

struct Sums {
  double loss = 0, weight = 0;
  bool has_bad = false;  // a label out of range: the first one in bad
  int64_t bad = 0;
};

// exp(x) for x <= 0 in every lane (the logits less their maximum): 2^n · e^r with
// r = x − n·ln 2 in [−ln2/2, ln2/2] and e^r to degree 7 (relative error ~1e-7, what expf gives);
// x under −80 counts as −80 (e^−80 ~ 2e-35: nothing beside the maximum's 1).
template <int N>
LIGHTSEG_SIMD_INLINE simd::vec<N> exp_nonpositive(simd::vec<N> x) {
  using V = simd::vec<N>;
  using I = typename simd::Lanes<N>::i32;
  x = x < -80.f ? V{} - 80.f : x;
  const I n = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, I);  // round(x/ln2), x <= 0
  const V nf = __builtin_convertvector(n, V);
  const V r = x - nf * 0.693145751953125f - nf * 1.428606765330187e-06f;  // ln 2 in two parts
  V p = r * (1.f / 5040) + 1.f / 720;
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  return (V)((I)p + (n << 23));  // times 2^n: n added to the exponent
}

// The pass's pixels p0..p1 (one work item) in groups of kLanes: each group's logits are copied
// to a class-major tile (from either layout), the group's max, exponentials and sum are vectors,
// and its gradient is written back from the tile. The loss is summed pixel by pixel in order.
template <int N>
LIGHTSEG_SIMD_INLINE Sums chunk_pass(const float* zp, const int64_t* yp, const float* wp, int64_t ignore,
                                     float inv_total, float* g, int64_t p0, int64_t p1, int64_t C, int64_t HW,
                                     int64_t sN, int64_t sP, int64_t sC, float* tile) {
  using V = simd::vec<N>;
  Sums s;
  for (int64_t p = p0; p < p1;) {
    const int64_t n = p / HW, q = p % HW;
    const int64_t lanes = std::min<int64_t>({N, p1 - p, HW - q});  // within one image
    const int64_t base = n * sN + q * sP;
    int64_t t[N];
    float wt[N];
    bool used[N];
    for (int64_t i = 0; i < N; ++i) {
      t[i] = 0, wt[i] = 0.f, used[i] = false;
      if (i >= lanes) continue;
      const int64_t label = yp[p + i];
      if (label == ignore) continue;
      if (label < 0 || label >= C) {
        if (!s.has_bad) s.has_bad = true, s.bad = label;
        continue;
      }
      t[i] = label, wt[i] = wp[label], used[i] = true;
    }
    for (int64_t c = 0; c < C; ++c) {
      float* row = tile + c * N;
      const float* src = zp + base + c * sC;
      for (int64_t i = 0; i < lanes; ++i) row[i] = src[i * sP];
      for (int64_t i = lanes; i < N; ++i) row[i] = 0.f;
    }
    V m = simd::load<N>(tile);
    for (int64_t c = 1; c < C; ++c) {
      const V v = simd::load<N>(tile + c * N);
      m = v > m ? v : m;
    }
    V sum{};
    for (int64_t c = 0; c < C; ++c) {
      const V e = exp_nonpositive<N>(simd::load<N>(tile + c * N) - m);
      if (g) simd::store<N>(tile + c * N, e);  // the tile now holds the exponentials
      sum += e;
    }
    for (int64_t i = 0; i < lanes; ++i) {
      if (!used[i]) continue;
      const float zt = zp[base + i * sP + t[i] * sC];
      s.loss += static_cast<double>(wt[i]) * (m[i] + std::log(sum[i]) - zt);
      s.weight += wt[i];
    }
    if (g) {
      V scale{};
      for (int64_t i = 0; i < N; ++i) scale[i] = wt[i] * inv_total;  // 0 where ignored
      const V k = scale / sum;
      for (int64_t c = 0; c < C; ++c) simd::store<N>(tile + c * N, simd::load<N>(tile + c * N) * k);
      for (int64_t i = 0; i < lanes; ++i)
        if (used[i]) tile[t[i] * N + i] -= scale[i];
      for (int64_t c = 0; c < C; ++c) {
        float* dst = g + base + c * sC;
        const float* row = tile + c * N;
        for (int64_t i = 0; i < lanes; ++i) dst[i * sP] = row[i];
      }
    }
    p += lanes;
  }
  return s;
}

constexpr int kLanes = 16;
using ChunkPass = Sums (*)(const float*, const int64_t*, const float*, int64_t, float, float*, int64_t, int64_t,
                           int64_t, int64_t, int64_t, int64_t, int64_t, float*);
#define LIGHTSEG_CE_CHUNK(NAME, ATTR)                                                                              \
  ATTR Sums NAME(const float* zp, const int64_t* yp, const float* wp, int64_t ignore, float inv_total, float* g, \
                 int64_t p0, int64_t p1, int64_t C, int64_t HW, int64_t sN, int64_t sP, int64_t sC, float* tile) { \
    return chunk_pass<kLanes>(zp, yp, wp, ignore, inv_total, g, p0, p1, C, HW, sN, sP, sC, tile);                \
  }
LIGHTSEG_CE_CHUNK(chunk_generic, )
#if LIGHTSEG_NATIVE_KERNELS && defined(__GNUC__) && defined(__x86_64__)
LIGHTSEG_CE_CHUNK(chunk_avx2, __attribute__((target("avx2,fma"))))
LIGHTSEG_CE_CHUNK(chunk_avx512, __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))))
#endif

// The chunk pass for this CPU (within LIGHTSEG_MAX_ISA, read at every call like the other kernels' cap).
ChunkPass chunk_pass_here() {
#if LIGHTSEG_NATIVE_KERNELS && defined(__GNUC__) && defined(__x86_64__)
  const IsaLevel cpu = cpu_isa_level();
  if (cpu >= IsaLevel::Avx512) return chunk_avx512;
  if (cpu >= IsaLevel::Avx2) return chunk_avx2;
#endif
  return chunk_generic;
}

// One pass: per pixel, the log-sum-exp over the C logits, the weighted loss, and (with g) the
// gradient softmax − one-hot times weight / total.
Sums forward_pass(const torch::Tensor& z, const torch::Tensor& y, const torch::Tensor& w, int64_t ignore,
                  double total, float* g) {
  const int64_t N = z.size(0), C = z.size(1), H = z.size(2), W = z.size(3), HW = H * W, P = N * HW;
  // a dense layout (contiguous or channels-last): a pixel's offset in its image is q · stride(3)
  const int64_t sN = z.stride(0), sC = z.stride(1), sP = z.stride(3);
  if (z.stride(2) != W * sP) throw std::logic_error("fused_cross_entropy: logits in no dense layout");
  const float* zp = z.data_ptr<float>();
  const int64_t* yp = y.data_ptr<int64_t>();
  const float* wp = w.data_ptr<float>();
  const float inv_total = static_cast<float>(1.0 / total);
  const int64_t chunks = (P + kChunk - 1) / kChunk;
  const ChunkPass pass = chunk_pass_here();
  std::vector<Sums> part(static_cast<size_t>(chunks));
  at::parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
    std::vector<float> tile(static_cast<size_t>(C * kLanes));
    for (int64_t k = b; k < e; ++k)
      part[static_cast<size_t>(k)] =
          pass(zp, yp, wp, ignore, inv_total, g, k * kChunk, std::min(P, (k + 1) * kChunk), C, HW, sN, sP, sC, tile.data());
  });
  Sums all;
  for (const auto& s : part) {
    all.loss += s.loss;
    all.weight += s.weight;
    if (!all.has_bad && s.has_bad) all.has_bad = true, all.bad = s.bad;
  }
  return all;
}

// Σ over the labelled pixels of their class's weight, from per-block class counts (labels out
// of range are left to forward_pass to report).
double total_weight(const torch::Tensor& y, const torch::Tensor& w, int64_t ignore) {
  const int64_t C = w.numel(), P = y.numel(), chunks = (P + kChunk - 1) / kChunk;
  const int64_t* yp = y.data_ptr<int64_t>();
  std::vector<int64_t> counts(static_cast<size_t>(chunks * C), 0);
  at::parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      int64_t* n = counts.data() + k * C;
      for (int64_t p = k * kChunk, p1 = std::min(P, p + kChunk); p < p1; ++p)
        if (yp[p] != ignore && yp[p] >= 0 && yp[p] < C) ++n[yp[p]];
    }
  });
  const float* wp = w.data_ptr<float>();
  double total = 0;
  for (int64_t c = 0; c < C; ++c) {
    int64_t n = 0;
    for (int64_t k = 0; k < chunks; ++k) n += counts[static_cast<size_t>(k * C + c)];
    total += static_cast<double>(wp[c]) * static_cast<double>(n);
  }
  return total;
}

class FusedCrossEntropy : public torch::autograd::Function<FusedCrossEntropy> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& target, const torch::Tensor& weight, int64_t ignore) {
    // The total weight first (one pass over the labels), so that the one pass over the logits
    // writes the finished gradient.
    const double total = total_weight(target, weight, ignore);
    const bool want_grad = logits.requires_grad();
    torch::Tensor grad;
    if (want_grad) grad = torch::empty_strided(logits.sizes(), logits.strides(), logits.options());
    Sums s = forward_pass(logits, target, weight, ignore, total, want_grad ? grad.data_ptr<float>() : nullptr);
    if (s.has_bad)
      throw std::invalid_argument("cross_entropy: label " + std::to_string(s.bad) + " is outside [0, " +
                                  std::to_string(logits.size(1)) + ") and is not the ignore label " +
                                  std::to_string(ignore));
    if (want_grad) ctx->save_for_backward({grad});
    const double loss = s.weight > 0 ? s.loss / s.weight : std::numeric_limits<double>::quiet_NaN();
    return torch::full({}, loss, logits.options().requires_grad(false));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    torch::Tensor grad = ctx->get_saved_variables()[0];
    const torch::Tensor& go = grad_out[0];
    torch::Tensor gl = go.item<double>() == 1.0 ? grad : grad * go;
    return {gl, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor fused_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                                  const torch::Tensor& weight, int64_t ignore) {
  if (logits.dim() != 4 || !logits.device().is_cpu() || logits.scalar_type() != torch::kFloat32)
    throw std::invalid_argument("fused_cross_entropy: float32 N×C×H×W logits on the CPU expected");
  if (target.dim() != 3 || target.size(0) != logits.size(0) || target.size(1) != logits.size(2) ||
      target.size(2) != logits.size(3) || target.scalar_type() != torch::kLong)
    throw std::invalid_argument("fused_cross_entropy: int64 N×H×W labels of the logits' size expected");
  torch::Tensor z = logits;
  if (!z.is_contiguous() && !z.is_contiguous(at::MemoryFormat::ChannelsLast)) z = z.contiguous();
  // (always a tensor: autograd::Function::apply takes no undefined tensor arguments)
  torch::Tensor w = torch::ones({logits.size(1)});
  if (weight.defined()) {
    if (weight.numel() != logits.size(1))
      throw std::invalid_argument("fused_cross_entropy: one class weight per channel expected");
    w = weight.to(torch::kCPU, torch::kFloat32).contiguous();
  }
  return FusedCrossEntropy::apply(z, target.contiguous(), w, ignore);
}

bool fused_cross_entropy_enabled() { return g_fused; }
void set_fused_cross_entropy(bool on) { g_fused = on; }

}  // namespace lightseg
