// Auxiliary deep-supervision heads (lightseg train --aux-weight): training only.
//
// One small head per semantic branch, on its output before the adder (M1 of C1.3 at H/4, M2
// of C1.5 at H/8): a 3×3 CBA to kHidden channels and a 1×1 classifier, upsampled bilinearly
// to the label size. They live outside Network, so the inference weights, the exported
// graphs and the network's speed are those of claims 1–7 alone; the trainer keeps them in
// the checkpoint as a blob ("aux_heads") that weights loaders never read.
#pragma once

#include <string>
#include <utility>

#include "lightseg/model/layers.h"

namespace lightseg {

class AuxHeadsImpl : public torch::nn::Module {
 public:
  static constexpr int64_t kHidden = 32;  // keeps them tiny next to the network
  AuxHeadsImpl(int64_t c1, int64_t c2, int64_t num_classes);
  // Logits of both heads at h×w (the labels' size).
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& M1, const torch::Tensor& M2, int64_t h,
                                                  int64_t w);

  model::ConvBNAct cba1{nullptr}, cba2{nullptr};
  torch::nn::Conv2d cls1{nullptr}, cls2{nullptr};
};
TORCH_MODULE(AuxHeads);

}  // namespace lightseg
