#include "model/score_upsample.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/Parallel.h>

#include "core/isa.h"
#include "core/simd.h"
#include "lightseg/features.h"

namespace lightseg::model {

namespace {

constexpr int64_t kLanes = 16;

// One axis of the resize. Forward form: output index o reads source indices i0[o] and i1[o]
// with weights l0[o] and l1[o], as torch's compute_source_index_and_lambda (align_corners =
// false, float). Gather form (backward): source index s was read by the output indices
// out[start[s] .. start[s+1]) with the weights weight[…], in output order (zero weights left out).
struct Axis {
  std::vector<int64_t> i0, i1;
  std::vector<float> l0, l1;
  std::vector<int64_t> start, out;
  std::vector<float> weight;
};

Axis make_axis(int64_t in, int64_t out) {
  Axis a;
  a.i0.resize(out), a.i1.resize(out), a.l0.resize(out), a.l1.resize(out);
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  for (int64_t o = 0; o < out; ++o) {
    if (in == out) {
      a.i0[o] = a.i1[o] = o, a.l0[o] = 1.f, a.l1[o] = 0.f;
      continue;
    }
    float real = scale * (static_cast<float>(o) + 0.5f) - 0.5f;
    if (real < 0.f) real = 0.f;
    const int64_t i = std::min<int64_t>(static_cast<int64_t>(real), in - 1);
    a.i0[o] = i;
    a.i1[o] = i + (i < in - 1 ? 1 : 0);
    a.l1[o] = std::min(std::max(real - static_cast<float>(i), 0.f), 1.f);
    a.l0[o] = 1.f - a.l1[o];
  }
  a.start.assign(in + 1, 0);
  for (int64_t o = 0; o < out; ++o) {
    if (a.l0[o] != 0.f) ++a.start[a.i0[o] + 1];
    if (a.l1[o] != 0.f) ++a.start[a.i1[o] + 1];
  }
  for (int64_t s = 0; s < in; ++s) a.start[s + 1] += a.start[s];
  a.out.resize(a.start[in]), a.weight.resize(a.start[in]);
  std::vector<int64_t> fill(a.start.begin(), a.start.end() - 1);
  for (int64_t o = 0; o < out; ++o) {
    if (a.l0[o] != 0.f) a.out[fill[a.i0[o]]] = o, a.weight[fill[a.i0[o]]++] = a.l0[o];
    if (a.l1[o] != 0.f) a.out[fill[a.i1[o]]] = o, a.weight[fill[a.i1[o]]++] = a.l1[o];
  }
  return a;
}

// One resize: big [N][H][W][C] (the output of forward, the incoming gradient of backward) and
// small [N][Hs][Ws][C] (the input of forward, its gradient), both dense channels_last; ay, ax
// map big indices to small ones. Cp: C rounded up to whole vectors. A pixel's C values are
// moved as Cp/16 vectors: a load may read past the pixel (into the next ones of the row, or a
// padded copy where that would leave the row), a store may write past it into pixels of the
// same row that are written after it (the row's last ones go through a padded copy).
struct Resize {
  const float* small_in;  // forward
  float* big_out;
  const float* big_in;  // backward
  float* small_out;
  int64_t C, Cp, H, W, Hs, Ws;
  const Axis *ay, *ax;
};

using vec = simd::vec<kLanes>;

// Output rows [r0, r1) of the N·H: the two source rows mixed into tmp (Ws·Cp), then each
// output pixel from two of tmp's pixels. pad: 2·Cp floats.
inline __attribute__((always_inline)) void forward_rows(const Resize& p, int64_t r0, int64_t r1, float* tmp, float* pad) {
  const int64_t C = p.C, Cp = p.Cp, rowC = p.Ws * C, outC = p.W * C;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / p.H, o = r % p.H;
    const float* a = p.small_in + (n * p.Hs + p.ay->i0[o]) * rowC;
    const float* b = p.small_in + (n * p.Hs + p.ay->i1[o]) * rowC;
    const vec la = vec{} + p.ay->l0[o], lb = vec{} + p.ay->l1[o];
    for (int64_t j = 0; j < p.Ws; ++j) {
      const float *pa = a + j * C, *pb = b + j * C;
      if (j * C + Cp > rowC) {  // the vectors would leave the row: a padded copy
        std::memcpy(pad, pa, C * sizeof(float));
        std::memcpy(pad + Cp, pb, C * sizeof(float));
        pa = pad, pb = pad + Cp;
      }
      for (int64_t c = 0; c < Cp; c += kLanes)
        simd::store<kLanes>(tmp + j * Cp + c, la * simd::load<kLanes>(pa + c) + lb * simd::load<kLanes>(pb + c));
    }
    float* y = p.big_out + r * outC;
    for (int64_t q = 0; q < p.W; ++q) {
      const float* ta = tmp + p.ax->i0[q] * Cp;
      const float* tb = tmp + p.ax->i1[q] * Cp;
      const vec ma = vec{} + p.ax->l0[q], mb = vec{} + p.ax->l1[q];
      const bool last = q * C + Cp > outC;
      float* dst = last ? pad : y + q * C;
      for (int64_t c = 0; c < Cp; c += kLanes)
        simd::store<kLanes>(dst + c, ma * simd::load<kLanes>(ta + c) + mb * simd::load<kLanes>(tb + c));
      if (last) std::memcpy(y + q * C, pad, C * sizeof(float));
    }
  }
}

// Source rows [r0, r1) of the N·Hs: the gradient rows they fed mixed into acc (W·C + Cp, flat),
// then each source pixel from the pixels of acc it fed. pad: Cp floats.
inline __attribute__((always_inline)) void backward_rows(const Resize& p, int64_t r0, int64_t r1, float* acc, float* pad) {
  const int64_t C = p.C, Cp = p.Cp, rowC = p.W * C, outC = p.Ws * C;
  const int64_t whole = rowC / kLanes * kLanes;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / p.Hs, s = r % p.Hs;
    std::fill(acc, acc + rowC + Cp, 0.f);
    for (int64_t k = p.ay->start[s]; k < p.ay->start[s + 1]; ++k) {
      const float* g = p.big_in + (n * p.H + p.ay->out[k]) * rowC;
      const float wk = p.ay->weight[k];
      const vec wv = vec{} + wk;
      for (int64_t f = 0; f < whole; f += kLanes)
        simd::store<kLanes>(acc + f, simd::load<kLanes>(acc + f) + wv * simd::load<kLanes>(g + f));
      for (int64_t f = whole; f < rowC; ++f) acc[f] += wk * g[f];
    }
    float* dx = p.small_out + r * outC;
    for (int64_t j = 0; j < p.Ws; ++j) {
      const bool last = j * C + Cp > outC;
      float* dst = last ? pad : dx + j * C;
      for (int64_t c = 0; c < Cp; c += kLanes) {
        vec v{};
        for (int64_t k = p.ax->start[j]; k < p.ax->start[j + 1]; ++k)
          v += p.ax->weight[k] * simd::load<kLanes>(acc + p.ax->out[k] * C + c);
        simd::store<kLanes>(dst + c, v);
      }
      if (last) std::memcpy(dx + j * C, pad, C * sizeof(float));
    }
  }
}

using RowsFn = void (*)(const Resize&, int64_t, int64_t, float*, float*);
#define LIGHTSEG_SCORE_UPSAMPLE_SET(NAME, ATTR)                                                                     \
  ATTR void NAME##_forward(const Resize& p, int64_t r0, int64_t r1, float* t, float* pad) { forward_rows(p, r0, r1, t, pad); } \
  ATTR void NAME##_backward(const Resize& p, int64_t r0, int64_t r1, float* t, float* pad) { backward_rows(p, r0, r1, t, pad); }
LIGHTSEG_SCORE_UPSAMPLE_SET(generic, )
#if LIGHTSEG_NATIVE_KERNELS && defined(__GNUC__) && defined(__x86_64__)
#define LIGHTSEG_SCORE_UPSAMPLE_X86 1
LIGHTSEG_SCORE_UPSAMPLE_SET(avx2, __attribute__((target("avx2,fma"))))
LIGHTSEG_SCORE_UPSAMPLE_SET(avx512, __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))))
#else
#define LIGHTSEG_SCORE_UPSAMPLE_X86 0
#endif

// This CPU's form (within LIGHTSEG_MAX_ISA, read at every call like the other kernels' cap).
RowsFn rows_here(bool backward) {
#if LIGHTSEG_SCORE_UPSAMPLE_X86
  const IsaLevel cpu = cpu_isa_level();
  if (cpu >= IsaLevel::Avx512) return backward ? avx512_backward : avx512_forward;
  if (cpu >= IsaLevel::Avx2) return backward ? avx2_backward : avx2_forward;
#endif
  return backward ? generic_backward : generic_forward;
}

// Runs rows [0, rows) on LibTorch's threads, each chunk with its own buffers.
void run_rows(const Resize& p, int64_t rows, int64_t buffer, int64_t pad, bool backward) {
  const RowsFn fn = rows_here(backward);
  at::parallel_for(0, rows, 4, [&](int64_t b, int64_t e) {
    std::vector<float> tmp(static_cast<size_t>(buffer)), padding(static_cast<size_t>(pad));
    fn(p, b, e, tmp.data(), padding.data());
  });
}

void check_input(const torch::Tensor& x, int64_t h, int64_t w) {
  if (!(x.defined() && x.dim() == 4 && x.device().is_cpu() && x.scalar_type() == torch::kFloat32 &&
        x.is_contiguous(at::MemoryFormat::ChannelsLast)))
    throw std::invalid_argument("score_upsample: a CPU float32 N×C×H×W tensor in channels_last expected");
  if (h < 1 || w < 1 || x.size(2) < 1 || x.size(3) < 1)
    throw std::invalid_argument("score_upsample: sizes must be positive (to " + std::to_string(h) + "×" +
                                std::to_string(w) + ")");
}

// Forward: src is x (N×C×Hs×Ws), the result N×C×H×W; backward: src is the incoming gradient
// (N×C×H×W), the result x's gradient (N×C×Hs×Ws). Both channels_last.
torch::Tensor resize(const torch::Tensor& src, int64_t Hs, int64_t Ws, int64_t H, int64_t W, bool backward) {
  const int64_t N = src.size(0), C = src.size(1);
  const std::vector<int64_t> sizes = backward ? std::vector<int64_t>{N, C, Hs, Ws} : std::vector<int64_t>{N, C, H, W};
  auto out = torch::empty(sizes, src.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (out.numel() == 0) return out;
  const Axis ay = make_axis(Hs, H), ax = make_axis(Ws, W);
  const int64_t Cp = (C + kLanes - 1) / kLanes * kLanes;
  Resize p{nullptr, nullptr, nullptr, nullptr, C, Cp, H, W, Hs, Ws, &ay, &ax};
  if (backward) {
    p.big_in = src.data_ptr<float>(), p.small_out = out.data_ptr<float>();
    run_rows(p, N * Hs, W * C + Cp, Cp, true);
  } else {
    p.small_in = src.data_ptr<float>(), p.big_out = out.data_ptr<float>();
    run_rows(p, N * H, Ws * Cp, 2 * Cp, false);
  }
  return out;
}

class ScoreUpsample : public torch::autograd::Function<ScoreUpsample> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, int64_t h, int64_t w) {
    ctx->saved_data["h"] = x.size(2);
    ctx->saved_data["w"] = x.size(3);
    return resize(x, x.size(2), x.size(3), h, w, false);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto g = grads[0].to(torch::kFloat32).contiguous(at::MemoryFormat::ChannelsLast);
    return {resize(g, ctx->saved_data["h"].toInt(), ctx->saved_data["w"].toInt(), g.size(2), g.size(3), true),
            torch::Tensor(), torch::Tensor()};
  }
};

bool score_upsample_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("LIGHTSEG_SCORE_UPSAMPLE");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

}  // namespace

bool score_upsample_applies(const torch::Tensor& x) {
  return score_upsample_enabled() && x.defined() && x.dim() == 4 && x.device().is_cpu() &&
         x.scalar_type() == torch::kFloat32 && x.is_contiguous(at::MemoryFormat::ChannelsLast) && x.size(2) > 0 &&
         x.size(3) > 0;
}

torch::Tensor score_upsample(const torch::Tensor& x, int64_t h, int64_t w) {
  check_input(x, h, w);
  return ScoreUpsample::apply(x, h, w);
}

}  // namespace lightseg::model
