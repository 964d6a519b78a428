// Claim 4 alternative: ResNet basic block (3×3 conv–BN–ReLU–3×3 conv–BN, + x, ReLU).
#pragma once
#include "lightseg/model/layers.h"

namespace lightseg::model {

class ResidualBlockImpl : public torch::nn::Module {
 public:
  ResidualBlockImpl(int64_t channels, int64_t dilation);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  BNAct bn1{nullptr}, bn2{nullptr};  // BatchNorm only (no PReLU)
};
TORCH_MODULE(ResidualBlock);

}  // namespace lightseg::model
