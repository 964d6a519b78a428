#include "model/bn_prelu.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <ATen/Parallel.h>

#include "core/isa.h"
#include "lightseg/features.h"
#include "core/simd.h"

namespace lightseg::model {

namespace {

// Rows [m0, m1) of x viewed as [rows][C], C a multiple of 16; per-channel float partials (the
// callers add them into double every ≤ 64 rows). k: a per-channel shift (the first row) that
// keeps Σ(x−k)² free of cancellation.
template <class T>
inline __attribute__((always_inline)) void stats_rows(const T* x, const float* k, float* s1, float* s2, int64_t m0,
                                                      int64_t m1, int64_t C) {
  for (int64_t c = 0; c < C; c += 16) {
    const simd::vec<16> kc = simd::load<16>(k + c);
    simd::vec<16> a1 = simd::load<16>(s1 + c), a2 = simd::load<16>(s2 + c);
    for (int64_t m = m0; m < m1; ++m) {
      const simd::vec<16> v = simd::load<16>(x + m * C + c) - kc;
      a1 += v;
      a2 += v * v;
    }
    simd::store<16>(s1 + c, a1);
    simd::store<16>(s2 + c, a2);
  }
}

// y = PReLU(z), z = x·scale + shift (the batch-normalised x).
template <class T>
inline __attribute__((always_inline)) void forward_rows(const T* x, const float* scale, const float* shift,
                                                        const float* slope, T* y, int64_t m0, int64_t m1, int64_t C) {
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t c = 0; c < C; c += 16) {
      const simd::vec<16> z = simd::load<16>(x + m * C + c) * simd::load<16>(scale + c) + simd::load<16>(shift + c);
      simd::store<16>(y + m * C + c, z > 0.f ? z : z * simd::load<16>(slope + c));
    }
}

// dz = g·PReLU'(z); Σ dz into s1, Σ dz·(x−μ) into s2, Σ g·z over z ≤ 0 (the slope's gradient) into sa.
template <class T>
inline __attribute__((always_inline)) void reduce_rows(const T* g, const T* x, const float* scale, const float* shift,
                                                       const float* slope, const float* mean, float* s1, float* s2,
                                                       float* sa, int64_t m0, int64_t m1, int64_t C) {
  for (int64_t c = 0; c < C; c += 16) {
    const simd::vec<16> sc = simd::load<16>(scale + c), sh = simd::load<16>(shift + c), a = simd::load<16>(slope + c), mu = simd::load<16>(mean + c);
    simd::vec<16> a1 = simd::load<16>(s1 + c), a2 = simd::load<16>(s2 + c), aa = simd::load<16>(sa + c);
    for (int64_t m = m0; m < m1; ++m) {
      const simd::vec<16> v = simd::load<16>(x + m * C + c), d = simd::load<16>(g + m * C + c);
      const simd::vec<16> z = v * sc + sh;
      const auto pos = z > 0.f;
      const simd::vec<16> dz = pos ? d : d * a;
      a1 += dz;
      a2 += dz * (v - mu);
      aa += pos ? simd::vec<16>{} : d * z;
    }
    simd::store<16>(s1 + c, a1);
    simd::store<16>(s2 + c, a2);
    simd::store<16>(sa + c, aa);
  }
}

// dx = k1·dz + k2·(x−μ) + k3 (BatchNorm's input gradient with the batch statistics).
template <class T>
inline __attribute__((always_inline)) void input_grad_rows(const T* g, const T* x, const float* scale,
                                                           const float* shift, const float* slope, const float* mean,
                                                           const float* k1, const float* k2, const float* k3, T* dx,
                                                           int64_t m0, int64_t m1, int64_t C) {
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t c = 0; c < C; c += 16) {
      const simd::vec<16> v = simd::load<16>(x + m * C + c), d = simd::load<16>(g + m * C + c);
      const simd::vec<16> z = v * simd::load<16>(scale + c) + simd::load<16>(shift + c);
      const simd::vec<16> dz = z > 0.f ? d : d * simd::load<16>(slope + c);
      simd::store<16>(dx + m * C + c, dz * simd::load<16>(k1 + c) + (v - simd::load<16>(mean + c)) * simd::load<16>(k2 + c) + simd::load<16>(k3 + c));
    }
}

// Each set compiled once per ISA and chosen once, from the CPU and LIGHTSEG_MAX_ISA (as the
// PReLU kernels of layers.cpp).
#define LIGHTSEG_BN_PRELU_SET(NAME, ATTR, T)                                                                        \
  ATTR void NAME##_stats(const T* x, const float* k, float* s1, float* s2, int64_t m0, int64_t m1, int64_t C) {    \
    stats_rows(x, k, s1, s2, m0, m1, C);                                                                           \
  }                                                                                                                \
  ATTR void NAME##_forward(const T* x, const float* sc, const float* sh, const float* a, T* y, int64_t m0,          \
                           int64_t m1, int64_t C) {                                                                \
    forward_rows(x, sc, sh, a, y, m0, m1, C);                                                                      \
  }                                                                                                                \
  ATTR void NAME##_reduce(const T* g, const T* x, const float* sc, const float* sh, const float* a, const float* mu, \
                          float* s1, float* s2, float* sa, int64_t m0, int64_t m1, int64_t C) {                    \
    reduce_rows(g, x, sc, sh, a, mu, s1, s2, sa, m0, m1, C);                                                       \
  }                                                                                                                \
  ATTR void NAME##_input_grad(const T* g, const T* x, const float* sc, const float* sh, const float* a,             \
                              const float* mu, const float* k1, const float* k2, const float* k3, T* dx, int64_t m0, \
                              int64_t m1, int64_t C) {                                                             \
    input_grad_rows(g, x, sc, sh, a, mu, k1, k2, k3, dx, m0, m1, C);                                               \
  }
#define LIGHTSEG_BN_PRELU_SETS(NAME, ATTR) \
  LIGHTSEG_BN_PRELU_SET(NAME##_f32, ATTR, float) LIGHTSEG_BN_PRELU_SET(NAME##_bf16, ATTR, c10::BFloat16)
LIGHTSEG_BN_PRELU_SETS(generic, )
#if LIGHTSEG_NATIVE_KERNELS && defined(__GNUC__) && defined(__x86_64__)
#define LIGHTSEG_BN_PRELU_X86 1
LIGHTSEG_BN_PRELU_SETS(avx2, __attribute__((target("avx2,fma"))))
LIGHTSEG_BN_PRELU_SETS(avx512, __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))))
#else
#define LIGHTSEG_BN_PRELU_X86 0
#endif

template <class T>
struct Kernels {
  void (*stats)(const T*, const float*, float*, float*, int64_t, int64_t, int64_t);
  void (*forward)(const T*, const float*, const float*, const float*, T*, int64_t, int64_t, int64_t);
  void (*reduce)(const T*, const T*, const float*, const float*, const float*, const float*, float*, float*, float*,
                 int64_t, int64_t, int64_t);
  void (*input_grad)(const T*, const T*, const float*, const float*, const float*, const float*, const float*,
                     const float*, const float*, T*, int64_t, int64_t, int64_t);
};
#define LIGHTSEG_BN_PRELU_KERNELS(NAME) \
  { NAME##_stats, NAME##_forward, NAME##_reduce, NAME##_input_grad }

#if LIGHTSEG_BN_PRELU_X86
enum class Level { Generic, Avx2, Avx512 };
Level level() {
  static const Level l = [] {
    const IsaLevel cpu = cpu_isa_level();
    return cpu >= IsaLevel::Avx512 ? Level::Avx512 : cpu >= IsaLevel::Avx2 ? Level::Avx2 : Level::Generic;
  }();
  return l;
}
#endif
template <class T>
const Kernels<T>& kernels();
template <>
const Kernels<float>& kernels<float>() {
  static const Kernels<float> g = LIGHTSEG_BN_PRELU_KERNELS(generic_f32);
#if LIGHTSEG_BN_PRELU_X86
  static const Kernels<float> a2 = LIGHTSEG_BN_PRELU_KERNELS(avx2_f32), a5 = LIGHTSEG_BN_PRELU_KERNELS(avx512_f32);
  if (level() == Level::Avx512) return a5;
  if (level() == Level::Avx2) return a2;
#endif
  return g;
}
template <>
const Kernels<c10::BFloat16>& kernels<c10::BFloat16>() {
  static const Kernels<c10::BFloat16> g = LIGHTSEG_BN_PRELU_KERNELS(generic_bf16);
#if LIGHTSEG_BN_PRELU_X86
  static const Kernels<c10::BFloat16> a2 = LIGHTSEG_BN_PRELU_KERNELS(avx2_bf16),
                                      a5 = LIGHTSEG_BN_PRELU_KERNELS(avx512_bf16);
  if (level() == Level::Avx512) return a5;
  if (level() == Level::Avx2) return a2;
#endif
  return g;
}

// Sums over all M rows in a fixed number of chunks (float over ≤ 64 rows, then double), so
// the result does not depend on the threads: `rows(m0, m1, acc...)` adds rows into n_acc float
// arrays of C; the per-channel totals come back as n_acc double arrays of C.
template <class F>
std::vector<std::vector<double>> chunked_sums(int64_t M, int64_t C, int n_acc, const F& rows) {
  const int64_t chunks = std::min<int64_t>(64, std::max<int64_t>(1, M / 256));
  std::vector<double> part(static_cast<size_t>(chunks * n_acc * C), 0.0);
  at::parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
    std::vector<float> acc(static_cast<size_t>(n_acc * C));
    for (int64_t k = b; k < e; ++k) {
      const int64_t m0 = M * k / chunks, m1 = M * (k + 1) / chunks;
      double* out = part.data() + k * n_acc * C;
      for (int64_t m = m0; m < m1; m += 64) {
        std::fill(acc.begin(), acc.end(), 0.f);
        rows(m, std::min(m1, m + 64), acc.data());
        for (int64_t i = 0; i < n_acc * C; ++i) out[i] += acc[i];
      }
    }
  });
  std::vector<std::vector<double>> total(static_cast<size_t>(n_acc), std::vector<double>(static_cast<size_t>(C), 0.0));
  for (int64_t k = 0; k < chunks; ++k)
    for (int j = 0; j < n_acc; ++j)
      for (int64_t c = 0; c < C; ++c) total[j][c] += part[(k * n_acc + j) * C + c];
  return total;
}

std::vector<float> floats(const torch::Tensor& t) {
  auto f = t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  return std::vector<float>(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
}

// What the backward pass needs of the forward's batch statistics, per channel.
struct Stats {
  std::vector<float> mean, invstd, scale, shift;  // z = x·scale + shift
};

template <class T>
torch::Tensor forward_impl(const torch::Tensor& x, const std::vector<float>& gamma, const std::vector<float>& beta,
                           const std::vector<float>& slope, torch::Tensor& running_mean, torch::Tensor& running_var,
                           double momentum, double eps, Stats& st) {
  const int64_t C = x.size(1), M = x.numel() / C;
  const T* xp = x.data_ptr<T>();
  std::vector<float> k(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) k[c] = static_cast<float>(xp[c]);
  const auto& kern = kernels<T>();
  auto sums = chunked_sums(M, C, 2, [&](int64_t m0, int64_t m1, float* acc) {
    kern.stats(xp, k.data(), acc, acc + C, m0, m1, C);
  });
  std::vector<float>&scale = st.scale, &shift = st.shift;
  scale.assign(C, 0.f);
  shift.assign(C, 0.f);
  st.mean.assign(C, 0.f);
  st.invstd.assign(C, 0.f);
  std::vector<float> new_var(C);
  for (int64_t c = 0; c < C; ++c) {
    const double d = sums[0][c] / M;                            // mean of x − k
    const double var = std::max(0.0, sums[1][c] / M - d * d);  // biased
    const double mu = k[c] + d, r = 1.0 / std::sqrt(var + eps);
    st.mean[c] = static_cast<float>(mu);
    st.invstd[c] = static_cast<float>(r);
    scale[c] = static_cast<float>(gamma[c] * r);
    shift[c] = static_cast<float>(beta[c] - mu * gamma[c] * r);
    new_var[c] = static_cast<float>(M > 1 ? var * M / (M - 1) : var);  // the running variance is unbiased
  }
  {
    torch::NoGradGuard ng;
    auto opts = torch::TensorOptions().dtype(torch::kFloat32);
    running_mean.mul_(1 - momentum).add_(torch::from_blob(st.mean.data(), {C}, opts).to(running_mean.dtype()), momentum);
    running_var.mul_(1 - momentum).add_(torch::from_blob(new_var.data(), {C}, opts).to(running_var.dtype()), momentum);
  }
  auto y = torch::empty_like(x, torch::MemoryFormat::ChannelsLast);
  T* yp = y.data_ptr<T>();
  at::parallel_for(0, M, 64, [&](int64_t b, int64_t e) {
    kern.forward(xp, scale.data(), shift.data(), slope.data(), yp, b, e, C);
  });
  return y;
}

template <class T>
void backward_impl(const torch::Tensor& g, const torch::Tensor& x, const std::vector<float>& gamma,
                   const std::vector<float>& slope, const Stats& st, torch::Tensor& dx, std::vector<float>& dgamma,
                   std::vector<float>& dbeta, std::vector<float>& dslope) {
  const int64_t C = x.size(1), M = x.numel() / C;
  const T* xp = x.data_ptr<T>();
  const T* gp = g.data_ptr<T>();
  const std::vector<float>&scale = st.scale, &shift = st.shift, &mean = st.mean, &invstd = st.invstd;
  const auto& kern = kernels<T>();
  auto sums = chunked_sums(M, C, 3, [&](int64_t m0, int64_t m1, float* acc) {
    kern.reduce(gp, xp, scale.data(), shift.data(), slope.data(), mean.data(), acc, acc + C, acc + 2 * C, m0, m1, C);
  });
  std::vector<float> k1(C), k2(C), k3(C);
  dgamma.assign(C, 0.f);
  dbeta.assign(C, 0.f);
  dslope.assign(C, 0.f);
  for (int64_t c = 0; c < C; ++c) {
    const double r = invstd[c], s1 = sums[0][c], s2 = sums[1][c];
    dgamma[c] = static_cast<float>(r * s2);  // Σ dz·x̂
    dbeta[c] = static_cast<float>(s1);
    dslope[c] = static_cast<float>(sums[2][c]);
    k1[c] = static_cast<float>(gamma[c] * r);
    k2[c] = static_cast<float>(-gamma[c] * r * r * r * s2 / M);
    k3[c] = static_cast<float>(-gamma[c] * r * s1 / M);
  }
  T* dp = dx.data_ptr<T>();
  at::parallel_for(0, M, 64, [&](int64_t b, int64_t e) {
    kern.input_grad(gp, xp, scale.data(), shift.data(), slope.data(), mean.data(), k1.data(), k2.data(), k3.data(), dp,
                    b, e, C);
  });
}

torch::Tensor vec_tensor(std::vector<float> v, const torch::Tensor& like) {
  return torch::from_blob(v.data(), {static_cast<int64_t>(v.size())}, torch::kFloat32).clone().to(like.dtype());
}

struct BnPreluFn : torch::autograd::Function<BnPreluFn> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x_in,
                               const torch::Tensor& gamma, const torch::Tensor& beta, const torch::Tensor& slope,
                               torch::Tensor running_mean, torch::Tensor running_var, double momentum, double eps) {
    const auto x = x_in.contiguous(torch::MemoryFormat::ChannelsLast);
    Stats st;
    const auto gv = floats(gamma), bv = floats(beta), av = floats(slope);
    torch::Tensor y = x.scalar_type() == torch::kBFloat16
                          ? forward_impl<c10::BFloat16>(x, gv, bv, av, running_mean, running_var, momentum, eps, st)
                          : forward_impl<float>(x, gv, bv, av, running_mean, running_var, momentum, eps, st);
    ctx->save_for_backward({x, gamma, beta, slope});
    const auto f32 = torch::empty({0});
    ctx->saved_data["mean"] = vec_tensor(st.mean, f32);
    ctx->saved_data["invstd"] = vec_tensor(st.invstd, f32);
    ctx->saved_data["scale"] = vec_tensor(st.scale, f32);
    ctx->saved_data["shift"] = vec_tensor(st.shift, f32);
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto g = grads[0].to(x.scalar_type()).contiguous(torch::MemoryFormat::ChannelsLast);
    Stats st;
    st.mean = floats(ctx->saved_data["mean"].toTensor());
    st.invstd = floats(ctx->saved_data["invstd"].toTensor());
    st.scale = floats(ctx->saved_data["scale"].toTensor());
    st.shift = floats(ctx->saved_data["shift"].toTensor());
    auto dx = torch::empty_like(x, torch::MemoryFormat::ChannelsLast);
    std::vector<float> dgamma, dbeta, dslope;
    const auto gv = floats(saved[1]), av = floats(saved[3]);
    if (x.scalar_type() == torch::kBFloat16)
      backward_impl<c10::BFloat16>(g, x, gv, av, st, dx, dgamma, dbeta, dslope);
    else
      backward_impl<float>(g, x, gv, av, st, dx, dgamma, dbeta, dslope);
    return {dx, vec_tensor(dgamma, saved[1]), vec_tensor(dbeta, saved[2]), vec_tensor(dslope, saved[3]),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool fused_bn_prelu_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("LIGHTSEG_FUSED_BN_PRELU");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

bool fused_bn_prelu_applies(const torch::Tensor& x, const torch::nn::BatchNorm2d& bn, const torch::Tensor& slopes) {
  const auto& o = bn->options;
  return fused_bn_prelu_enabled() && bn->is_training() && x.device().is_cpu() && x.dim() == 4 &&
         (x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16) && x.size(1) % 16 == 0 &&
         x.size(0) * x.size(2) * x.size(3) > 1 && x.is_contiguous(torch::MemoryFormat::ChannelsLast) && o.affine() &&
         o.track_running_stats() && o.momentum().has_value() && slopes.dim() == 1 && slopes.size(0) == x.size(1);
}

torch::Tensor fused_bn_prelu(const torch::Tensor& x, const torch::nn::BatchNorm2d& bn, const torch::Tensor& slopes) {
  {
    torch::NoGradGuard ng;
    bn->num_batches_tracked.add_(1);
  }
  return BnPreluFn::apply(x, bn->weight, bn->bias, slopes, bn->running_mean, bn->running_var, *bn->options.momentum(),
                          bn->options.eps());
}

}  // namespace lightseg::model
