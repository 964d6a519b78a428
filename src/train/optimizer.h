// The optimizer of a run (internal): Adam, AdamW or SGD over two parameter groups.
#pragma once

#include <memory>

#include <torch/torch.h>

#include "lightseg/train.h"
#include "train/aux_heads.h"

namespace lightseg {

// Group 0: convolution weights (dim > 1), with weight_decay; group 1: BatchNorm/PReLU
// parameters and biases, with bn_weight_decay ? weight_decay : 0. The auxiliary heads'
// parameters (when aux is set) follow the network's, so the network's order is that of a run
// without them.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainOptions& o, Network& net, const AuxHeads& aux);

// Sets every group's learning rate.
void set_learning_rate(torch::optim::Optimizer& opt, double lr);

}  // namespace lightseg
