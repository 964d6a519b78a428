// Building blocks shared by every part of the network: CBA = Conv → BatchNorm → PReLU
// (docs/NETWORK.md notation). The process-wide hooks (MAC counter, SyncBN) are in src/model/hooks.h.
#pragma once

#include <array>
#include <cstdint>

#include <torch/torch.h>

namespace lightseg::model {

struct ConvSpec {
  int64_t in = 0, out = 0;
  std::array<int64_t, 2> kernel{3, 3};
  int64_t stride = 1;
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
  bool bias = false;
  // k×k, "same" padding, stride s, dilation d, groups g.
  static ConvSpec square(int64_t in, int64_t out, int64_t k, int64_t s = 1, int64_t d = 1,
                         int64_t g = 1, bool bias = false) {
    return ConvSpec{in, out, {k, k}, s, {d, d}, g, bias};
  }
  // Depthwise k×k (groups = channels).
  static ConvSpec depthwise(int64_t c, int64_t k = 3, int64_t s = 1, int64_t d = 1) {
    return ConvSpec{c, c, {k, k}, s, {d, d}, c, false};
  }
  static ConvSpec pointwise(int64_t in, int64_t out, bool bias = false) {
    return ConvSpec{in, out, {1, 1}, 1, {1, 1}, 1, bias};
  }
};

torch::nn::Conv2d make_conv(const ConvSpec& s);

// Runs a convolution (and counts its MACs while the MAC counter of src/model/hooks.h is on).
// A dilated depthwise convolution being trained on the CPU runs as phased_depthwise
// (src/model/phased_depthwise.h).
torch::Tensor conv(const torch::nn::Conv2d& c, const torch::Tensor& x);

// PReLU with one slope per channel: x > 0 ? x : slope_c · x. On the CPU (float32 or
// bfloat16 input, channels_last or NCHW) a fused forward and a one-pass backward (input
// gradient and per-channel slope gradient together); LibTorch 1.13's prelu_backward took a
// third of a CPU training step. Elsewhere torch::prelu.
torch::Tensor prelu(const torch::Tensor& x, const torch::Tensor& slopes);

// BatchNorm2d → PReLU (one slope per channel).
class BNActImpl : public torch::nn::Module {
 public:
  explicit BNActImpl(int64_t channels, bool act = true);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::PReLU act{nullptr};  // null when act == false
};
TORCH_MODULE(BNAct);

// CBA(k, s, d, g): Conv2d (no bias) → BatchNorm2d → PReLU (the PReLU is optional).
class ConvBNActImpl : public torch::nn::Module {
 public:
  explicit ConvBNActImpl(const ConvSpec& spec, bool act = true);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Conv2d conv{nullptr};
  BNAct bn_act{nullptr};
};
TORCH_MODULE(ConvBNAct);

}  // namespace lightseg::model
