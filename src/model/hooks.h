// The process-wide hooks of the network's layers (internal): the convolution MAC counter of
// `lightseg info` (profile()) and the SyncBN all-reduce of distributed training.
#pragma once

#include <cstdint>
#include <functional>

#include <torch/torch.h>

namespace lightseg::model {

// Counts multiply-accumulates of every convolution run through conv() on this thread
// while enabled: (k_h·k_w·C_in/groups) per output element.
struct MacCounter {
  static bool& enabled();
  static uint64_t& total();
};

// SyncBN hook: when set, BNAct in training mode sums its batch statistics (forward) and
// its gradient sums (backward) over all ranks with this function (an in-place all-reduce).
using AllReduceFn = std::function<void(torch::Tensor&)>;
void set_batchnorm_allreduce(AllReduceFn fn);
// Batch normalisation in training mode with statistics reduced through `reduce`.
torch::Tensor sync_batch_norm(const torch::Tensor& x, torch::nn::BatchNorm2d& bn, const AllReduceFn& reduce);

}  // namespace lightseg::model
