// The class scores' bilinear resize on their way to the loss (C1.11's ×4 to the input size, the
// auxiliary heads' ×8) as one autograd operator of ours (internal): float32 channels_last on the
// CPU. Per resize of a training batch (8×11 scores to 360×480, from 90×120 or 45×60, 2 threads,
// the trainer's malloc settings, best of 7, Xeon with AMX): LibTorch 1.13's kernels 8.2–9.3 ms
// forward and 17.4–17.9 ms backward, these 2.5–3.2 and 2.2–2.7 ms. Forward: per
// output row, the two source rows mixed into one row (whole rows as vectors), then each
// output pixel from two of its pixels. Backward gathers instead of scattering: per source row,
// the output rows it fed mixed into one row, then each source pixel from the output pixels it
// fed; no two threads write the same value, so the result does not depend on the threads. The
// same weights as torch's align_corners = false bilinear (tests/test_score_upsample.cpp).
#pragma once

#include <torch/torch.h>

namespace lightseg::model {

// Whether score_upsample takes x: a CPU float32 N×C×H×W tensor dense in channels_last, not
// switched off by LIGHTSEG_SCORE_UPSAMPLE=0 (read once).
bool score_upsample_applies(const torch::Tensor& x);
// interpolate(x, {h, w}, bilinear, align_corners = false) in channels_last, differentiable in x.
// Throws std::invalid_argument unless score_upsample_applies(x) (the switch aside) and h, w ≥ 1.
torch::Tensor score_upsample(const torch::Tensor& x, int64_t h, int64_t w);

}  // namespace lightseg::model
