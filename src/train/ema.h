// The exponential moving average of the weights (internal; TrainOptions::ema_decay).
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "lightseg/network.h"

namespace lightseg {

// avg = d·avg + (1−d)·src over the parameters and floating-point buffers (BatchNorm running
// statistics), d = min(decay, (1+n)/(10+n)) after n updates (the warm-up keeps the average
// from clinging to the random initialisation); integer buffers (counters) are copied.
class WeightsEma {
 public:
  WeightsEma(Network avg, Network src, double decay, int64_t steps);
  void update();
  int64_t steps() const { return steps_; }
  // dst := src, parameters and buffers (a new average starts from the weights).
  static void copy_weights(Network& dst, Network& src);

 private:
  double decay_;
  int64_t steps_;
  std::vector<torch::Tensor> avg_, src_, copy_, copy_src_;
};

}  // namespace lightseg
