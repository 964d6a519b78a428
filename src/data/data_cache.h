// A training set decoded once and kept as uint8 tensors on the training device (or in host
// memory), so that a batch is an index and a batched augmentation (data/batch_augment.h)
// instead of file reads, decoding and per-sample tensor work on loader threads.
// CamVid train+val (468 images of 360×480) is 243 MB.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "data/transforms.h"
#include "lightseg/dataset.h"

namespace lightseg {

class DataCache {
 public:
  // Decodes every sample of ds (on `threads` threads) to the device. All images must have one
  // size (a batch is one tensor): otherwise throws std::runtime_error naming the first that
  // differs.
  static DataCache build(const SegDataset& ds, torch::Device device, int threads);
  // From decoded tensors: images N×3×H×W uint8, labels N×H×W uint8 (tests).
  DataCache(torch::Tensor images, torch::Tensor labels);

  const torch::Tensor& images() const { return images_; }  // N×3×H×W uint8
  const torch::Tensor& labels() const { return labels_; }  // N×H×W uint8
  int64_t size() const { return images_.size(0); }
  int64_t height() const { return images_.size(2); }
  int64_t width() const { return images_.size(3); }
  double bytes() const { return static_cast<double>(images_.numel() + labels_.numel()); }

  // The augmented batch of these samples (data/batch_augment.h), draws one per sample.
  std::pair<torch::Tensor, torch::Tensor> batch(const std::vector<size_t>& samples, const std::vector<AugmentDraw>& draws,
                                                const AugmentOptions& o, const ModelMeta& meta) const;

 private:
  torch::Tensor images_, labels_;
};

}  // namespace lightseg
