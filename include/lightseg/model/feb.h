// Claim 4: FEB, the feature-enhancement block (C4.1 … C4.8).
//   x ─DW3×3─PW(C→Cm)─▶ P ─┬─ DW3×3 ──────────▶ Q1 ─┐
//                          ├─ DW3×3 dilated d ─▶ Q2 ─┼─ U = P+Q1+Q2 ─ conv3×3 ─ PW(Cm→C) ─ +x ─ PReLU
//                          └─────────────────────────┘
#pragma once
#include "lightseg/model/layers.h"

namespace lightseg::model {

struct FEBOutputs {
  torch::Tensor P, Q1, Q2, U, V, W, out;
};

class FEBImpl : public torch::nn::Module {
 public:
  FEBImpl(int64_t channels, int64_t dilation, double ratio = 0.5);
  torch::Tensor forward(const torch::Tensor& x);
  FEBOutputs forward_debug(const torch::Tensor& x);

  ConvBNAct dw1{nullptr};       // C4.1 first depthwise conv
  ConvBNAct pw1{nullptr};       // C4.2 first pointwise conv C→Cm → P
  ConvBNAct dw2{nullptr};       // C4.3 second depthwise conv on P → Q1
  ConvBNAct dw_dilated{nullptr};// C4.4 depthwise dilated conv on P → Q2
  ConvBNAct conv3d{nullptr};    // C4.6 full ("3-D") conv 3×3 Cm→Cm → V
  ConvBNAct pw2{nullptr};       // C4.7 second pointwise conv Cm→C (BN, no PReLU) → W
  torch::nn::PReLU act{nullptr};// after C4.8
};
TORCH_MODULE(FEB);

}  // namespace lightseg::model
