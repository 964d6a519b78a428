#include "model/phased_depthwise.h"

#include "core/torch_compat.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <utility>

namespace lightseg::model {

namespace {
// LIGHTSEG_PHASED_DEPTHWISE=0 starts with it off: the trainer of the recipe study's arms, which
// began before the fix, for an arm to finish under the binary it started with.
bool phased_depthwise_from_env() {
  const char* v = std::getenv("LIGHTSEG_PHASED_DEPTHWISE");
  return v == nullptr || std::string(v) != "0";
}
std::atomic<bool> g_phased_depthwise{phased_depthwise_from_env()};

bool autocast_cpu_bf16() { return compat::autocast_cpu_bf16(); }
}  // namespace

void set_phased_depthwise(bool on) { g_phased_depthwise = on; }

bool phased_depthwise_wanted(const torch::nn::Conv2d& c, const torch::Tensor& x) {
  if (!g_phased_depthwise || !x.device().is_cpu() || x.dim() != 4 || !torch::GradMode::is_enabled()) return false;
  const auto& o = c->options;
  const int64_t dh = (*o.dilation())[0], dw = (*o.dilation())[1];
  const int64_t kh = (*o.kernel_size())[0], kw = (*o.kernel_size())[1];
  if (o.groups() != o.in_channels() || o.out_channels() != o.in_channels() || (dh == 1 && dw == 1)) return false;
  if ((*o.stride())[0] != 1 || (*o.stride())[1] != 1 || kh % 2 == 0 || kw % 2 == 0) return false;
  // "Same" padding only. (The padding is a c10::variant in LibTorch 1.13, a std::variant later:
  // `get` unqualified finds either.)
  using std::get;
  if (o.padding().index() != 0) return false;
  const auto& pad = *get<0>(o.padding());
  if (pad[0] != dh * (kh - 1) / 2 || pad[1] != dw * (kw - 1) / 2) return false;
  if (!x.requires_grad() && !c->weight.requires_grad()) return false;
  return x.scalar_type() == torch::kBFloat16 || autocast_cpu_bf16() || std::max(dh, dw) >= 16;
}

torch::Tensor phased_depthwise(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                               int64_t dh, int64_t dw) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t h = (H + dh - 1) / dh, w = (W + dw - 1) / dw;  // a phase's size
  const bool padded = h * dh != H || w * dw != W;
  // Zeros past the end stand for the dilated convolution's own zero padding there.
  torch::Tensor xp = padded ? torch::constant_pad_nd(x, {0, w * dw - W, 0, h * dh - H}) : x;
  // (N, C, h, dh, w, dw) → the phases as a batch of N·dh·dw images h×w, channels_last.
  torch::Tensor phases = xp.reshape({N, C, h, dh, w, dw})
                             .permute({0, 3, 5, 2, 4, 1})
                             .contiguous()
                             .view({N * dh * dw, h, w, C})
                             .permute({0, 3, 1, 2});
  const int64_t kh = weight.size(2), kw = weight.size(3);
  torch::Tensor y = torch::conv2d(phases, weight, bias, 1, {(kh - 1) / 2, (kw - 1) / 2}, 1, C);
  // And back: (N, dh, dw, h, w, C) → (N, h, dh, w, dw, C), i.e. N×C×(h·dh)×(w·dw) channels_last.
  y = y.permute({0, 2, 3, 1})
          .reshape({N, dh, dw, h, w, C})
          .permute({0, 3, 1, 4, 2, 5})
          .contiguous()
          .view({N, h * dh, w * dw, C})
          .permute({0, 3, 1, 2});
  return padded ? y.slice(2, 0, H).slice(3, 0, W).contiguous(torch::MemoryFormat::ChannelsLast) : y;
}

}  // namespace lightseg::model
