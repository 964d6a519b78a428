// Claim 4 alternative: DAB, DABNet's depth-wise asymmetric bottleneck.
#pragma once
#include "lightseg/model/layers.h"

namespace lightseg::model {

class DABImpl : public torch::nn::Module {
 public:
  DABImpl(int64_t channels, int64_t dilation);
  torch::Tensor forward(const torch::Tensor& x);

  BNAct pre{nullptr};                       // BN+PReLU on x
  ConvBNAct reduce{nullptr};                // CBA(3) C→C/2
  ConvBNAct dw31{nullptr}, dw13{nullptr};   // DW 3×1 → DW 1×3
  ConvBNAct ddw31{nullptr}, ddw13{nullptr}; // dilated (d,1) → (1,d)
  BNAct post{nullptr};                      // after the add
  torch::nn::Conv2d expand{nullptr};        // PW C/2→C
};
TORCH_MODULE(DAB);

}  // namespace lightseg::model
