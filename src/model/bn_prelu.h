// BatchNorm2d (training: batch statistics) → PReLU in one operator (internal): two passes over
// the input forward (statistics, then the normalised and activated output) and two backward
// (the per-channel sums, then the input gradient), where LibTorch runs BatchNorm and PReLU as
// two operators of two to three passes each and keeps both outputs for backward. Only the
// input and per-channel statistics are saved. The same running statistics, num_batches_tracked
// and gradients as bn->forward followed by model::prelu (tests/test_bn_prelu.cpp).
#pragma once

#include <torch/torch.h>

namespace lightseg::model {

// Whether the fused operator takes this case: CPU, float32 or bfloat16, channels_last, channels
// a multiple of 16, bn training with affine parameters, running statistics and a momentum, and
// not switched off by LIGHTSEG_FUSED_BN_PRELU=0 (read once).
bool fused_bn_prelu_applies(const torch::Tensor& x, const torch::nn::BatchNorm2d& bn, const torch::Tensor& slopes);
// PReLU(BatchNorm(x)) with one slope per channel; updates bn's running statistics and count.
torch::Tensor fused_bn_prelu(const torch::Tensor& x, const torch::nn::BatchNorm2d& bn, const torch::Tensor& slopes);

}  // namespace lightseg::model
