// C1.2 / claim 2: the two-step spatial branch. F1 → S1 → S2 (multi-channel convs, C2.1/C2.3),
// each compressed to one channel (C2.2/C2.4): s1 at H/4, s2 at H/8.
#pragma once
#include "lightseg/model/layers.h"

namespace lightseg::model {

struct SpatialOutputs {
  torch::Tensor S1, s1, S2, s2;
};

class SpatialBranchImpl : public torch::nn::Module {
 public:
  explicit SpatialBranchImpl(int64_t c0);
  SpatialOutputs forward(const torch::Tensor& F1);
  // First spatial sub-branch: C2.1 multi-channel conv, C2.2 single-channel conv.
  ConvBNAct conv1{nullptr};
  torch::nn::Conv2d compress1{nullptr};
  // Second spatial sub-branch: C2.3 (reads S1, not s1), C2.4.
  ConvBNAct conv2{nullptr};
  torch::nn::Conv2d compress2{nullptr};
};
TORCH_MODULE(SpatialBranch);

}  // namespace lightseg::model
