// Claims 6–7: spatial attention on X1. C7.1 PW (CBA(1) C1→C1) → C7.2 single-channel full
// 3×3 conv → C7.3 sigmoid mask → C7.4 SA = X1 ⊙ mask.
#pragma once
#include "lightseg/model/layers.h"

namespace lightseg::model {

struct AttentionOutputs {
  torch::Tensor mask, SA;
};

class SpatialAttentionImpl : public torch::nn::Module {
 public:
  explicit SpatialAttentionImpl(int64_t c1);
  torch::Tensor forward(const torch::Tensor& X1) { return forward_debug(X1).SA; }
  AttentionOutputs forward_debug(const torch::Tensor& X1);
  ConvBNAct pw7{nullptr};             // C7.1 seventh pointwise conv
  torch::nn::Conv2d conv3d{nullptr};  // C7.2 single-channel "3-D" conv, 3×3, C1→1
};
TORCH_MODULE(SpatialAttention);

}  // namespace lightseg::model
