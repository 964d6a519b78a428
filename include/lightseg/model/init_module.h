// C1.1 Initialization module: image → first feature map F1 (C0 channels, H/2).
#pragma once
#include "lightseg/model/layers.h"

namespace lightseg::model {

class InitModuleImpl : public torch::nn::Module {
 public:
  InitModuleImpl(int64_t in_channels, int64_t c0);
  torch::Tensor forward(const torch::Tensor& image);
  ConvBNAct conv1{nullptr}, conv2{nullptr}, conv3{nullptr};  // CBA(3,2), CBA(3,1), CBA(3,1)
};
TORCH_MODULE(InitModule);

}  // namespace lightseg::model
