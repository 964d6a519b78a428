// The training augmentation of a whole batch in a few tensor operations on the data's device
// (the GPU, where the data set is cached there): augment()'s scale, pad, crop, flip and colour
// jitter with the same random parameters (draw_augment, one per sample, drawn on the host).
//
// Images are sampled with one bilinear grid_sample (align_corners false, border clamping: the
// same source positions and edge handling as augment()'s resize); pixels outside the scaled
// image take the mean colour, as augment()'s padding. Labels are gathered with the exact
// nearest-neighbour index map of resize_label; outside the scaled image they are 255 (ignore).
// So labels equal augment()'s exactly, images to float rounding.
#pragma once

#include <vector>

#include <torch/torch.h>

#include "data/transforms.h"
#include "lightseg/config.h"

namespace lightseg {

// images: N×3×H×W uint8, labels: N×H×W uint8 (train ids), on one device; index: the batch's
// samples (rows of both); draws: one per index, for H×W images. Returns the batch on that
// device: images B×3×crop_h×crop_w float, normalised with meta's mean and std; labels
// B×crop_h×crop_w int64.
std::pair<torch::Tensor, torch::Tensor> augment_batch(const torch::Tensor& images, const torch::Tensor& labels,
                                                      const std::vector<int64_t>& index,
                                                      const std::vector<AugmentDraw>& draws, const AugmentOptions& o,
                                                      const ModelMeta& meta);

}  // namespace lightseg
