// The Predictor's input-size path (PredictorOptions::input_size) without full-size float copies:
// a camera frame straight to the network's input size, and the labels straight back.
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace lightseg {

// An H×W×C uint8 image (C: 1 or 2 gray, 3 RGB, 4 RGBA; alpha ignored) as the network's input:
// 3×h×w float32, values 0..255, resized bilinearly as torch's interpolate does it
// (align_corners false, no antialiasing), read from the uint8 pixels directly.
torch::Tensor frame_to_network_input(const torch::Tensor& hwc_u8, int64_t h, int64_t w);

// Label maps N×h×w uint8 resized to N×H×W by nearest neighbour, index for index as torch's
// "nearest" interpolate picks them.
torch::Tensor labels_to_frame_size(const torch::Tensor& labels_u8, int64_t H, int64_t W);

}  // namespace lightseg
