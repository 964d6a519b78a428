#include "lightseg/model/layers.h"
#include "model/hooks.h"
#include "model/bn_prelu.h"
#include "model/phased_depthwise.h"
#include "core/simd.h"

#include "lightseg/features.h"
#include "core/isa.h"

namespace lightseg::model {

bool& MacCounter::enabled() {
  thread_local bool on = false;
  return on;
}

uint64_t& MacCounter::total() {
  thread_local uint64_t n = 0;
  return n;
}

torch::nn::Conv2d make_conv(const ConvSpec& s) {
  // "same" padding for odd kernels: d·(k−1)/2
  const int64_t ph = s.dilation[0] * (s.kernel[0] - 1) / 2;
  const int64_t pw = s.dilation[1] * (s.kernel[1] - 1) / 2;
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(s.in, s.out, {s.kernel[0], s.kernel[1]})
                               .stride(s.stride)
                               .padding({ph, pw})
                               .dilation({s.dilation[0], s.dilation[1]})
                               .groups(s.groups)
                               .bias(s.bias));
}

namespace {

// x and g viewed as [rows][C] (channels_last) or [N][C][P] (NCHW), computed in float.
// Channels_last with C a multiple of 16 (every PReLU of the default network) runs 16
// channels at a time (src/core/simd.h); the rest element by element.
template <class T>
inline __attribute__((always_inline)) void prelu_rows_fwd(const T* x, const float* w, T* y, int64_t m0, int64_t m1,
                                                          int64_t C) {
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t c = 0; c < C; c += 16) {
      const simd::vec<16> v = simd::load<16>(x + m * C + c), s = simd::load<16>(w + c);
      simd::store<16>(y + m * C + c, v > 0.f ? v : v * s);
    }
}

// Rows [m0, m1): dx, and Σ g·x over x ≤ 0 added into acc (C floats).
template <class T>
inline __attribute__((always_inline)) void prelu_rows_bwd(const T* g, const T* x, const float* w, T* dx, float* acc,
                                                          int64_t m0, int64_t m1, int64_t C) {
  for (int64_t c = 0; c < C; c += 16) {
    const simd::vec<16> s = simd::load<16>(w + c);
    simd::vec<16> a = simd::load<16>(acc + c);
    for (int64_t m = m0; m < m1; ++m) {
      const simd::vec<16> v = simd::load<16>(x + m * C + c), d = simd::load<16>(g + m * C + c);
      const auto pos = v > 0.f;
      simd::store<16>(dx + m * C + c, pos ? d : d * s);
      a += pos ? simd::vec<16>{} : d * v;
    }
    simd::store<16>(acc + c, a);
  }
}

// The row kernels compiled once per ISA and chosen once, from the CPU and LIGHTSEG_MAX_ISA
// (no target_clones: those follow CPUID alone, past the cap).
#define LIGHTSEG_PRELU_SET(NAME, ATTR)                                                                             \
  ATTR void NAME##_fwd_f32(const float* x, const float* w, float* y, int64_t m0, int64_t m1, int64_t C) {          \
    prelu_rows_fwd(x, w, y, m0, m1, C);                                                                            \
  }                                                                                                                \
  ATTR void NAME##_fwd_bf16(const at::BFloat16* x, const float* w, at::BFloat16* y, int64_t m0, int64_t m1,        \
                            int64_t C) {                                                                           \
    prelu_rows_fwd(x, w, y, m0, m1, C);                                                                            \
  }                                                                                                                \
  ATTR void NAME##_bwd_f32(const float* g, const float* x, const float* w, float* dx, float* acc, int64_t m0,      \
                           int64_t m1, int64_t C) {                                                                \
    prelu_rows_bwd(g, x, w, dx, acc, m0, m1, C);                                                                   \
  }                                                                                                                \
  ATTR void NAME##_bwd_bf16(const at::BFloat16* g, const at::BFloat16* x, const float* w, at::BFloat16* dx,        \
                            float* acc, int64_t m0, int64_t m1, int64_t C) {                                       \
    prelu_rows_bwd(g, x, w, dx, acc, m0, m1, C);                                                                   \
  }
LIGHTSEG_PRELU_SET(prelu_generic, )
#if LIGHTSEG_NATIVE_KERNELS && defined(__GNUC__) && defined(__x86_64__)
#define LIGHTSEG_PRELU_X86 1
#else
#define LIGHTSEG_PRELU_X86 0
#endif
#if LIGHTSEG_PRELU_X86
LIGHTSEG_PRELU_SET(prelu_avx2, __attribute__((target("avx2,fma"))))
LIGHTSEG_PRELU_SET(prelu_avx512, __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))))
#endif
struct PreluKernels {
  decltype(&prelu_generic_fwd_f32) fwd_f32;
  decltype(&prelu_generic_fwd_bf16) fwd_bf16;
  decltype(&prelu_generic_bwd_f32) bwd_f32;
  decltype(&prelu_generic_bwd_bf16) bwd_bf16;
};
const PreluKernels& prelu_kernels() {
  static const PreluKernels k = [] {
#if LIGHTSEG_PRELU_X86
    const IsaLevel cpu = cpu_isa_level();
    if (cpu >= IsaLevel::Avx512)
      return PreluKernels{prelu_avx512_fwd_f32, prelu_avx512_fwd_bf16, prelu_avx512_bwd_f32, prelu_avx512_bwd_bf16};
    if (cpu >= IsaLevel::Avx2)
      return PreluKernels{prelu_avx2_fwd_f32, prelu_avx2_fwd_bf16, prelu_avx2_bwd_f32, prelu_avx2_bwd_bf16};
#endif
    return PreluKernels{prelu_generic_fwd_f32, prelu_generic_fwd_bf16, prelu_generic_bwd_f32, prelu_generic_bwd_bf16};
  }();
  return k;
}
void prelu_fwd_rows(const float* x, const float* w, float* y, int64_t m0, int64_t m1, int64_t C) {
  prelu_kernels().fwd_f32(x, w, y, m0, m1, C);
}
void prelu_fwd_rows(const at::BFloat16* x, const float* w, at::BFloat16* y, int64_t m0, int64_t m1, int64_t C) {
  prelu_kernels().fwd_bf16(x, w, y, m0, m1, C);
}
void prelu_bwd_rows(const float* g, const float* x, const float* w, float* dx, float* acc, int64_t m0, int64_t m1,
                    int64_t C) {
  prelu_kernels().bwd_f32(g, x, w, dx, acc, m0, m1, C);
}
void prelu_bwd_rows(const at::BFloat16* g, const at::BFloat16* x, const float* w, at::BFloat16* dx, float* acc,
                    int64_t m0, int64_t m1, int64_t C) {
  prelu_kernels().bwd_bf16(g, x, w, dx, acc, m0, m1, C);
}

template <class T>
void prelu_forward_kernel(const T* x, const float* w, T* y, int64_t N, int64_t C, int64_t P, bool cl) {
  if (cl && C % 16 == 0) {
    at::parallel_for(0, N * P, 64, [&](int64_t b, int64_t e) { prelu_fwd_rows(x, w, y, b, e, C); });
  } else if (cl) {
    at::parallel_for(0, N * P, 256, [&](int64_t b, int64_t e) {
      for (int64_t m = b; m < e; ++m)
        for (int64_t c = 0; c < C; ++c) {
          const float v = static_cast<float>(x[m * C + c]);
          y[m * C + c] = static_cast<T>(v > 0.f ? v : v * w[c]);
        }
    });
  } else {
    at::parallel_for(0, N * C, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const float s = w[i % C];
        const T* xp = x + i * P;
        T* yp = y + i * P;
        for (int64_t p = 0; p < P; ++p) {
          const float v = static_cast<float>(xp[p]);
          yp[p] = static_cast<T>(v > 0.f ? v : v * s);
        }
      }
    });
  }
}

// dx = g · (x > 0 ? 1 : slope_c); dslope_c = Σ g · x over x ≤ 0. Per-chunk partial sums in
// double, a fixed number of chunks: the result does not depend on scheduling.
template <class T>
void prelu_backward_kernel(const T* g, const T* x, const float* w, T* dx, double* dw, int64_t N, int64_t C,
                           int64_t P, bool cl) {
  if (cl) {
    const int64_t M = N * P, chunks = std::min<int64_t>(64, std::max<int64_t>(1, M / 256));
    std::vector<double> part(static_cast<size_t>(chunks * C), 0.0);
    at::parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
      std::vector<float> acc(static_cast<size_t>(C));
      for (int64_t k = b; k < e; ++k) {
        const int64_t m0 = M * k / chunks, m1 = M * (k + 1) / chunks;
        double* out = part.data() + k * C;
        for (int64_t m = m0; m < m1;) {
          const int64_t m_end = std::min(m1, m + 64);  // float partials over ≤ 64 rows, then double
          std::fill(acc.begin(), acc.end(), 0.f);
          if (C % 16 == 0) {
            prelu_bwd_rows(g, x, w, dx, acc.data(), m, m_end, C);
            m = m_end;
          } else {
            for (; m < m_end; ++m)
              for (int64_t c = 0; c < C; ++c) {
                const float v = static_cast<float>(x[m * C + c]), d = static_cast<float>(g[m * C + c]);
                const bool pos = v > 0.f;
                dx[m * C + c] = static_cast<T>(pos ? d : d * w[c]);
                acc[c] += pos ? 0.f : d * v;
              }
          }
          for (int64_t c = 0; c < C; ++c) out[c] += acc[c];
        }
      }
    });
    for (int64_t k = 0; k < chunks; ++k)
      for (int64_t c = 0; c < C; ++c) dw[c] += part[k * C + c];
  } else {
    std::vector<double> part(static_cast<size_t>(N * C), 0.0);
    at::parallel_for(0, N * C, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const float s = w[i % C];
        const T* xp = x + i * P;
        const T* gp = g + i * P;
        T* dp = dx + i * P;
        double sum = 0;
        for (int64_t p0 = 0; p0 < P; p0 += 1024) {
          float acc = 0.f;
          for (int64_t p = p0; p < std::min(P, p0 + 1024); ++p) {
            const float v = static_cast<float>(xp[p]), d = static_cast<float>(gp[p]);
            const bool pos = v > 0.f;
            dp[p] = static_cast<T>(pos ? d : d * s);
            acc += pos ? 0.f : d * v;
          }
          sum += acc;
        }
        part[i] = sum;
      }
    });
    for (int64_t i = 0; i < N * C; ++i) dw[i % C] += part[i];
  }
}

bool fast_prelu_ok(const torch::Tensor& x, const torch::Tensor& w) {
  return x.device().is_cpu() && x.dim() == 4 && w.dim() == 1 && w.size(0) == x.size(1) && w.size(0) > 1 &&
         (x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16);
}

// The layout the kernels see: channels_last when x is, else NCHW (made contiguous).
bool channels_last(const torch::Tensor& x) {
  return x.is_contiguous(torch::MemoryFormat::ChannelsLast) && !x.is_contiguous();
}

torch::Tensor prelu_forward_cpu(const torch::Tensor& x_in, const torch::Tensor& w_in) {
  const bool cl = channels_last(x_in);
  auto x = cl ? x_in : x_in.contiguous();
  auto w = w_in.detach().to(torch::kFloat32).contiguous();
  auto y = torch::empty_like(x, cl ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous);
  const int64_t N = x.size(0), C = x.size(1), P = x.size(2) * x.size(3);
  if (x.scalar_type() == torch::kBFloat16)
    prelu_forward_kernel(x.data_ptr<at::BFloat16>(), w.data_ptr<float>(), y.data_ptr<at::BFloat16>(), N, C, P, cl);
  else
    prelu_forward_kernel(x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), N, C, P, cl);
  return y;
}

struct PReLUFn : torch::autograd::Function<PReLUFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& w) {
    ctx->save_for_backward({channels_last(x) ? x : x.contiguous(), w});
    return prelu_forward_cpu(x, w);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& w_in = saved[1];
    const bool cl = channels_last(x);
    auto g = grads[0].to(x.scalar_type()).contiguous(cl ? torch::MemoryFormat::ChannelsLast
                                                        : torch::MemoryFormat::Contiguous);
    auto w = w_in.detach().to(torch::kFloat32).contiguous();
    auto dx = torch::empty_like(x, cl ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous);
    const int64_t N = x.size(0), C = x.size(1), P = x.size(2) * x.size(3);
    auto dw = torch::zeros({C}, torch::kFloat64);
    if (x.scalar_type() == torch::kBFloat16)
      prelu_backward_kernel(g.data_ptr<at::BFloat16>(), x.data_ptr<at::BFloat16>(), w.data_ptr<float>(),
                            dx.data_ptr<at::BFloat16>(), dw.data_ptr<double>(), N, C, P, cl);
    else
      prelu_backward_kernel(g.data_ptr<float>(), x.data_ptr<float>(), w.data_ptr<float>(), dx.data_ptr<float>(),
                            dw.data_ptr<double>(), N, C, P, cl);
    return {dx, dw.to(w_in.scalar_type())};
  }
};

}  // namespace

torch::Tensor prelu(const torch::Tensor& x, const torch::Tensor& slopes) {
  if (!fast_prelu_ok(x, slopes)) return torch::prelu(x, slopes);
  if (!torch::GradMode::is_enabled() || (!x.requires_grad() && !slopes.requires_grad()))
    return prelu_forward_cpu(x, slopes);
  return PReLUFn::apply(x, slopes);
}

torch::Tensor conv(const torch::nn::Conv2d& c, const torch::Tensor& x) {
  torch::Tensor y = phased_depthwise_wanted(c, x)
                        ? phased_depthwise(x, c->weight, c->bias, (*c->options.dilation())[0], (*c->options.dilation())[1])
                        : c.ptr()->forward(x);
  if (MacCounter::enabled()) {
    const auto& o = c->options;
    const int64_t per_out = (*o.kernel_size())[0] * (*o.kernel_size())[1] * o.in_channels() / o.groups();
    MacCounter::total() += static_cast<uint64_t>(y.numel()) * static_cast<uint64_t>(per_out);
  }
  return y;
}

BNActImpl::BNActImpl(int64_t channels, bool with_act)
    : bn(register_module("bn", torch::nn::BatchNorm2d(channels))) {
  if (with_act) act = register_module("act", torch::nn::PReLU(torch::nn::PReLUOptions().num_parameters(channels)));
}

namespace {
AllReduceFn& bn_allreduce() {
  static AllReduceFn fn;
  return fn;
}

// y = (x − μ)/σ·γ + β with μ, σ² over the batch of ALL ranks (sums all-reduced).
class SyncBatchNormFn : public torch::autograd::Function<SyncBatchNormFn> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, torch::Tensor weight,
                               torch::Tensor bias, torch::Tensor running_mean, torch::Tensor running_var,
                               double eps, double momentum, const AllReduceFn* reduce) {
    const int64_t C = x.size(1);
    auto xd = x.to(torch::kDouble);
    auto stats = torch::cat({xd.sum({0, 2, 3}), (xd * xd).sum({0, 2, 3}),
                             torch::full({1}, static_cast<double>(x.numel() / C), xd.options())});
    (*reduce)(stats);
    const double n = stats[2 * C].item<double>();
    auto mean = stats.narrow(0, 0, C) / n;
    auto var = (stats.narrow(0, C, C) / n - mean * mean).clamp_min(0);
    auto invstd = (var + eps).rsqrt();
    {
      torch::NoGradGuard ng;
      running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()) * momentum);
      running_var.mul_(1 - momentum).add_(var.to(running_var.scalar_type()) * (momentum * n / std::max(1.0, n - 1)));
    }
    auto m = mean.to(x.scalar_type()).view({1, C, 1, 1}), is = invstd.to(x.scalar_type()).view({1, C, 1, 1});
    ctx->save_for_backward({x, m, is, weight});
    ctx->saved_data["n"] = n;
    ctx->saved_data["reduce"] = reinterpret_cast<int64_t>(reduce);
    return (x - m) * is * weight.view({1, C, 1, 1}) + bias.view({1, C, 1, 1});
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto x = saved[0], m = saved[1], is = saved[2], w = saved[3];
    const double n = ctx->saved_data["n"].toDouble();
    const auto* reduce = reinterpret_cast<const AllReduceFn*>(ctx->saved_data["reduce"].toInt());
    auto dy = grads[0];
    const int64_t C = x.size(1);
    auto xmu = x - m;
    auto sum_dy = dy.sum({0, 2, 3});
    auto sum_dy_xmu = (dy * xmu).sum({0, 2, 3});
    auto grad_weight = sum_dy_xmu * is.view({C});  // local: averaged with the other gradients
    auto grad_bias = sum_dy;
    auto both = torch::cat({sum_dy, sum_dy_xmu}).to(torch::kDouble);
    (*reduce)(both);
    auto mean_dy = (both.narrow(0, 0, C) / n).to(x.scalar_type()).view({1, C, 1, 1});
    auto mean_dy_xmu = (both.narrow(0, C, C) / n).to(x.scalar_type()).view({1, C, 1, 1});
    auto dx = (dy - mean_dy - xmu * is * is * mean_dy_xmu) * is * w.view({1, C, 1, 1});
    return {dx, grad_weight, grad_bias, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};
}  // namespace

void set_batchnorm_allreduce(AllReduceFn fn) { bn_allreduce() = std::move(fn); }

torch::Tensor sync_batch_norm(const torch::Tensor& x, torch::nn::BatchNorm2d& bn, const AllReduceFn& reduce) {
  const auto& o = bn->options;
  return SyncBatchNormFn::apply(x, bn->weight, bn->bias, bn->running_mean, bn->running_var, o.eps(),
                                o.momentum().value_or(0.1), &reduce);
}

torch::Tensor BNActImpl::forward(const torch::Tensor& x) {
  const AllReduceFn& reduce = bn_allreduce();
  if (act && !(reduce && is_training()) && fused_bn_prelu_applies(x, bn, act->weight))
    return fused_bn_prelu(x, bn, act->weight);
  if (!act && !(reduce && is_training()) && bn->is_training()) {
    // BatchNorm alone (C4.7's PW2 before the residual, the ResNet layers): the same operator
    // with every slope 1 (PReLU(z) = z exactly), 2 passes forward and 2 backward
    const auto ones = torch::ones({x.size(1)});
    if (fused_bn_prelu_applies(x, bn, ones)) return fused_bn_prelu(x, bn, ones);
  }
  torch::Tensor y = (reduce && is_training()) ? sync_batch_norm(x, bn, reduce) : bn->forward(x);
  return act ? model::prelu(y, act->weight) : y;
}

ConvBNActImpl::ConvBNActImpl(const ConvSpec& spec, bool with_act)
    : conv(register_module("conv", make_conv(spec))),
      bn_act(register_module("bn_act", BNAct(spec.out, with_act))) {}

torch::Tensor ConvBNActImpl::forward(const torch::Tensor& x) {
  return bn_act->forward(model::conv(conv, x));
}

}  // namespace lightseg::model
