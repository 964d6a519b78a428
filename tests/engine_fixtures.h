// Shared by the engine and kernel tests: a network whose folding and kernels have something to
// get wrong.
#pragma once

#include <string>

#include "lightseg/network.h"

namespace lightseg::fixtures {

// Non-trivial BN statistics, affine parameters and PReLU slopes, so that folding errors, slope
// mix-ups, a skipped per-channel parameter or a missed BN would show. The running statistics are
// drawn, not gathered by training-mode forwards: under QEMU's TCG (tests/avx2_emulated.sh) three
// such forwards took 40 s of each test.
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
    for (auto& b : net->named_buffers()) {
      if (b.key().find("running_mean") != std::string::npos) b.value().uniform_(-0.5, 0.5);
      else if (b.key().find("running_var") != std::string::npos) b.value().uniform_(0.5, 2.0);
    }
  }
  net->eval();
  return net;
}

// C1.1 with 20 channels (not whole blocks at either width) and 19 classes (two 16-lane blocks).
inline NetworkConfig unaligned_config() {
  NetworkConfig c;
  c.c0 = 20;
  c.num_classes = 19;
  return c;
}
// Odd widths everywhere (20, 40, 72: no whole 16-lane block), DAB layers in stage 2 (claim 4),
// 19 classes.
inline NetworkConfig odd_dab_config() {
  NetworkConfig c = unaligned_config();
  c.c1 = 40;
  c.c2 = 72;
  c.stage1 = {1, FELayerType::FEB, {2}};
  c.stage2 = {2, FELayerType::DAB, {4, 8}};
  return c;
}
// ResNet layers in stage 2 (claim 4) and no spatial attention (C6.1 off).
inline NetworkConfig residual_config() {
  NetworkConfig c;
  c.stage2 = {2, FELayerType::ResNet, {2, 4}};
  c.spatial_attention = false;
  return c;
}

}  // namespace lightseg::fixtures
