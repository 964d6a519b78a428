// Training losses. Labels: N×H×W int64, 255 = ignore.
#pragma once

#include <vector>

#include <torch/torch.h>

namespace lightseg {

// Cross-entropy with optional class weights (empty = unweighted), ignoring 255.
torch::Tensor weighted_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                                     const torch::Tensor& weight = {});

// OHEM cross-entropy: mean loss over the pixels whose target-class probability is below
// `thresh`, but at least `min_kept_frac` of the valid pixels (the hardest ones).
torch::Tensor ohem_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target, double thresh = 0.7,
                                 double min_kept_frac = 1.0 / 16, const torch::Tensor& weight = {});

// Pixel-wise knowledge distillation: T² · the mean over labelled pixels (target != 255) of
// KL(softmax(teacher/T) ‖ softmax(student/T)); 0 when there are none. The teacher is a constant.
torch::Tensor distillation_loss(const torch::Tensor& student, const torch::Tensor& teacher, const torch::Tensor& target,
                                double temperature);

}  // namespace lightseg
