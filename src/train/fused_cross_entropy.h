// The training loss's cross-entropy on the CPU in one pass over the logits (internal;
// weighted_cross_entropy calls it).
#pragma once

#include <torch/torch.h>

namespace lightseg {

// Mean cross-entropy over the pixels whose label is not `ignore`, each weighted by its class's
// weight (empty = 1), like torch's cross_entropy with ignore_index and weight; float32 logits
// N×C×H×W on the CPU in any dense layout, labels N×H×W int64. The forward pass writes the
// gradient as well (softmax − one-hot, times the weight over the total weight), in the logits'
// own layout, so backward is a copy or a scale: for channels-last logits, which torch's
// log_softmax + nll_loss2d walk across strides, it is about twice as fast. A label outside
// [0, C) other than `ignore` throws std::invalid_argument. No valid pixel: NaN, as torch.
torch::Tensor fused_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                                  const torch::Tensor& weight = {}, int64_t ignore = 255);

// Whether weighted_cross_entropy takes fused_cross_entropy where it can (default true;
// false: torch's cross_entropy everywhere, for A/B tests).
bool fused_cross_entropy_enabled();
void set_fused_cross_entropy(bool on);

}  // namespace lightseg
