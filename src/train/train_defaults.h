// Training defaults taken from the data, and the schedule stated at start (internal).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lightseg/dataset.h"
#include "lightseg/train.h"

namespace lightseg {

// The sizes (height, width) of up to `at_most` training images spread evenly over the set, from
// their file headers (no pixel is decoded).
std::vector<std::pair<int64_t, int64_t>> sample_image_sizes(const SegDataset& ds, size_t at_most = 32);

// The crop of a run: o's crop when set (crop_origin says where from), else from the images:
// each side the smallest image's, at most the default (kDefaultCropH x kDefaultCropW), rounded
// down to a multiple of 8, at least 32. `warning` is set when a set crop is larger than every
// sampled image (most of each crop would be padding).
struct CropChoice {
  int64_t h = 0, w = 0;
  std::string origin;   // "from the data: ...", "--crop", "config", ...
  std::string warning;  // empty, or one line naming both sizes
};
CropChoice choose_crop(const TrainOptions& o, const std::vector<std::pair<int64_t, int64_t>>& sizes, size_t images);

// "poly 0.9 from 1e-03 after 1 warm-up epoch from 10%, adam, weight decay 2e-04"
std::string describe_lr_schedule(const TrainOptions& o);

// The epoch ends from 1-based epoch `from` to `epochs` that validate (every val_every-th and the
// last; none when val_every is 0).
int64_t validations_left(int from, int epochs, int val_every);

// "3m20s", "1h05m", "12s" (the progress line's form).
std::string format_duration(double seconds);

}  // namespace lightseg
