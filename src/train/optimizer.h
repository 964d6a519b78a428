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

// The optimizer's state as archive bytes in compact form, for a checkpoint that enters version
// control (issue 36: at most 4 MB): Adam/AdamW's second moments in bf16, their first moments
// left out (0-element tensors; they rebuild within about 1/(1-beta1) = 10 steps), step counts
// kept. opt is unchanged. SGD's state is written as it is.
std::string compact_optimizer_bytes(torch::optim::Optimizer& opt);
// After loading either form: moments back in float32 on their parameters' device, a left-out
// first moment as zeros. Returns the number of first moments restarted at zero.
int64_t expand_optimizer_state(torch::optim::Optimizer& opt);

}  // namespace lightseg
