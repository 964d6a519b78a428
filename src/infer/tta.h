// Test-time augmentation (internal): an engine that averages another engine's softmax
// probabilities over resized and mirrored copies of its input (EngineOptions::scales, flip).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lightseg/engine.h"

namespace lightseg {

// Throws std::invalid_argument naming the fault: no scale, or one not in [0.25, 4].
void check_tta(const std::vector<double>& scales);
// True when scales/flip ask for more than the single plain pass.
bool tta_requested(const std::vector<double>& scales, bool flip);
// "scales 0.75,1,1.25 + flip": the augmentation in words (backend() names).
std::string tta_description(const std::vector<double>& scales, bool flip);
// The size a pass at scale s runs at: round(h·s) × round(w·s), at least 32 a side (the network's
// smallest input; Predictor upscales below that).
std::pair<int64_t, int64_t> tta_size(int64_t h, int64_t w, double s);
// inner's logits averaged over the passes: the log of the mean softmax probability at the
// images' size (N×K×H×W float32 on inner's device). Checks the scales (check_tta).
torch::Tensor tta_logits(InferenceEngine& inner, const torch::Tensor& images, const std::vector<double>& scales,
                         bool flip);
// `inner` run once per scale (and once more, mirrored, per scale with flip).
std::unique_ptr<InferenceEngine> make_tta_engine(std::unique_ptr<InferenceEngine> inner, std::vector<double> scales,
                                                 bool flip);

}  // namespace lightseg
