// Shared by the engine and kernel tests: a network whose folding and kernels have something to
// get wrong.
#pragma once

#include <string>

#include "lightseg/network.h"

namespace lightseg::fixtures {

// Non-trivial BN statistics, affine parameters and PReLU slopes, so that folding errors, slope
// mix-ups, a skipped per-channel parameter or a missed BN would show.
inline Network random_net(const NetworkConfig& cfg = NetworkConfig{}, uint64_t seed = 3) {
  torch::manual_seed(seed);
  Network net(cfg);
  {
    torch::NoGradGuard ng;
    for (auto& p : net->named_parameters()) {
      const auto& k = p.key();
      if (k.find("bn.weight") != std::string::npos || k.find("bn1.") != std::string::npos ||
          k.find("bn2.") != std::string::npos)
        p.value().uniform_(0.5, 1.5);
      else if (k.find("bn.bias") != std::string::npos)
        p.value().uniform_(-0.3, 0.3);
      else if (k.find("act.weight") != std::string::npos)
        p.value().uniform_(-0.2, 0.6);
    }
    net->train();
    for (int i = 0; i < 3; ++i) net->forward(torch::randn({2, 3, 64, 96}) * 2 + 0.5);
  }
  net->eval();
  return net;
}

}  // namespace lightseg::fixtures
