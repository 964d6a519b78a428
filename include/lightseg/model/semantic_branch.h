// Claim 3: a semantic branch. Downsampling layer (C3.1) → FE layers (C3.2) → concat with the
// downsampled map (C3.3) → pointwise conv (C3.4).
#pragma once
#include "lightseg/config.h"
#include "lightseg/model/layers.h"

namespace lightseg::model {

// C3.1: Cout > Cin: concat(conv3×3 s2 Cin→Cout−Cin, MaxPool 2×2) → BN+PReLU; else CBA(3,2).
// MaxPool uses ceil_mode so both halves are ceil(H/2) × ceil(W/2) for odd sizes.
class DownsamplingImpl : public torch::nn::Module {
 public:
  DownsamplingImpl(int64_t in, int64_t out);
  torch::Tensor forward(const torch::Tensor& x);
  int64_t in_channels, out_channels;
  torch::nn::Conv2d conv{nullptr};
  BNAct bn_act{nullptr};
  ConvBNAct cba{nullptr};  // used when out <= in
};
TORCH_MODULE(Downsampling);

struct SemanticOutputs {
  torch::Tensor D, E, M;  // downsampled, enhanced (after the FE layers), branch output
};

class SemanticBranchImpl : public torch::nn::Module {
 public:
  SemanticBranchImpl(int64_t in, int64_t out, const StageConfig& stage, double feb_ratio);
  torch::Tensor forward(const torch::Tensor& x) { return forward_debug(x).M; }
  SemanticOutputs forward_debug(const torch::Tensor& x);

  Downsampling down{nullptr};          // C3.1
  torch::nn::Sequential layers{nullptr};  // C3.2: FEB | DAB | ResidualBlock, all C×h×w (C5.2)
  ConvBNAct fuse{nullptr};             // C3.4: CBA(1) 2C→C
};
TORCH_MODULE(SemanticBranch);

}  // namespace lightseg::model
