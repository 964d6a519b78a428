#include "train/fused_cross_entropy.h"

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

// One pass: per pixel, the log-sum-exp over the C logits, the weighted loss, and (with g) the
// gradient softmax − one-hot times weight / total.
Sums forward_pass(const torch::Tensor& z, const torch::Tensor& y, const torch::Tensor& w, int64_t ignore,
                  double total, float* g) {
  const int64_t N = z.size(0), C = z.size(1), H = z.size(2), W = z.size(3), HW = H * W, P = N * HW;
  const int64_t sN = z.stride(0), sC = z.stride(1), sH = z.stride(2), sW = z.stride(3);
  const float* zp = z.data_ptr<float>();
  const int64_t* yp = y.data_ptr<int64_t>();
  const float* wp = w.data_ptr<float>();
  const float inv_total = static_cast<float>(1.0 / total);
  const int64_t chunks = (P + kChunk - 1) / kChunk;
  std::vector<Sums> part(static_cast<size_t>(chunks));
  at::parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
    std::vector<float> ex(static_cast<size_t>(C));
    for (int64_t k = b; k < e; ++k) {
      Sums s;
      const int64_t p0 = k * kChunk, p1 = std::min(P, p0 + kChunk);
      int64_t n = p0 / HW, h = (p0 % HW) / W, x = p0 % W;
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t o = n * sN + h * sH + x * sW;
        if (++x == W) {
          x = 0;
          if (++h == H) h = 0, ++n;
        }
        const int64_t t = yp[p];
        if (t == ignore) {
          if (g)
            for (int64_t c = 0; c < C; ++c) g[o + c * sC] = 0.f;
          continue;
        }
        if (t < 0 || t >= C) {
          if (!s.has_bad) s.has_bad = true, s.bad = t;
          continue;
        }
        float m = zp[o];
        for (int64_t c = 1; c < C; ++c) m = std::max(m, zp[o + c * sC]);
        float sum = 0.f;
        for (int64_t c = 0; c < C; ++c) sum += (ex[c] = std::exp(zp[o + c * sC] - m));
        const float wt = wp[t];
        s.loss += static_cast<double>(wt) * (m + std::log(sum) - zp[o + t * sC]);
        s.weight += wt;
        if (g) {
          const float scale = wt * inv_total / sum;
          for (int64_t c = 0; c < C; ++c) g[o + c * sC] = ex[c] * scale;
          g[o + t * sC] -= wt * inv_total;
        }
      }
      part[static_cast<size_t>(k)] = s;
    }
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
