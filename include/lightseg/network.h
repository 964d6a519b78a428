// lightseg: the network of claims 1–7.
//
// Basic usage:
//   lightseg::Network net(lightseg::NetworkConfig{});        // docs/NETWORK.md defaults
//   torch::Tensor logits = net->forward(images);              // N×3×H×W → N×K×H×W
//   auto o = net->forward_debug(images);                      // every named intermediate
//
// Any H, W ≥ 32 works: strided layers round up (ceil), the decoder resizes to A1's size
// and the classifier output is resized to the input's H×W.
#pragma once

#include <string>
#include <vector>

#include "lightseg/config.h"
#include "lightseg/model/fusion_decoder.h"
#include "lightseg/model/init_module.h"
#include "lightseg/model/semantic_branch.h"
#include "lightseg/model/spatial_branch.h"

namespace lightseg {

// Every named intermediate of the data flow (claims 1–7).
struct NetworkOutputs {
  torch::Tensor F1;                 // C1.1 first feature map
  torch::Tensor S1, s1, S2, s2;     // C2.1–C2.4
  torch::Tensor D1, E1, M1, A1;     // C3 (branch 1), C1.3, C1.4
  torch::Tensor D2, E2, M2, A2;     // C3 (branch 2), C1.5, C1.6
  torch::Tensor X1, X2, X3, mask, SA, F;  // C1.7–C1.10, C6–C7
  torch::Tensor logits;             // C1.11
};

// forward_with_branches: the logits and the two semantic branches' outputs before the adders
// (M1 of C1.3, M2 of C1.5), for auxiliary deep-supervision heads during training.
struct BranchOutputs {
  torch::Tensor logits, M1, M2;
};

class NetworkImpl : public torch::nn::Module {
 public:
  explicit NetworkImpl(const NetworkConfig& config = NetworkConfig{});
  torch::Tensor forward(const torch::Tensor& images);
  NetworkOutputs forward_debug(const torch::Tensor& images, const model::StageHook& hook = nullptr);
  // forward()'s computation, op for op, also returning M1 and M2 (one pass, not two).
  BranchOutputs forward_with_branches(const torch::Tensor& images);
  const NetworkConfig& config() const { return config_; }

  model::InitModule init{nullptr};          // C1.1
  model::SpatialBranch spatial{nullptr};    // C1.2, claim 2
  model::SemanticBranch semantic1{nullptr}; // C1.3, claim 3
  model::SemanticBranch semantic2{nullptr}; // C1.5, claim 3
  model::FusionDecoder decoder{nullptr};    // C1.7–C1.11, claims 6–7

 private:
  NetworkConfig config_;
};
TORCH_MODULE(Network);

// C1.4 / C1.6: an adder — element-wise M + s, s (N×1×h×w) broadcast over M's channels.
torch::Tensor adder(const torch::Tensor& M, const torch::Tensor& s);

// One row of `lightseg info`.
struct ModuleCost {
  std::string name;      // e.g. "semantic1"
  std::string claim;     // e.g. "C1.3"
  std::vector<int64_t> out;  // output shape (batch 1)
  int64_t params = 0;
  uint64_t macs = 0;
};
// Runs one 1×C×H×W forward in eval mode and attributes parameters and conv MACs per part.
std::vector<ModuleCost> profile(Network& net, int64_t h, int64_t w);
int64_t count_parameters(const torch::nn::Module& m);

// Puts 4-D parameters/buffers in channels_last (2–3× faster depthwise convs on CPU).
void to_channels_last(torch::nn::Module& m);

}  // namespace lightseg
