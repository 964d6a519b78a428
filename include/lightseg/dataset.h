// Datasets: CamVid (SegNet layout), Cityscapes (leftImg8bit/gtFine, labelIds → 19 trainIds)
// and a generic list-file dataset for users' own data. A dataset is its file layout, class
// names, palette and a 256-entry table mapping stored label values to train ids (255 = ignore).
//
// List datasets: DIR/{split}.txt with "image label" lines (paths relative to DIR) and
// DIR/dataset.json: {"classes": [...], "palette": [[r,g,b], ...], "ignore_index": 255}.
#pragma once

#include <array>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "lightseg/config.h"

namespace lightseg {

constexpr int kIgnore = 255;  // ignore id used inside lightseg (loss, metrics)

struct Sample {
  std::string image, label;
};

class SegDataset {
 public:
  // kind: "camvid", "cityscapes" or "list". `split` is one split ("train", "val", "test", ...)
  // or several joined by commas ("train,val"), their samples in that order; "trainval" means
  // "train,val" unless the folder has a split of that name. Throws when a layout is not found.
  static SegDataset open(const std::string& kind, const std::string& root, const std::string& split);
  static SegDataset camvid(const std::string& root, const std::string& split);
  static SegDataset cityscapes(const std::string& root, const std::string& split);
  static SegDataset list(const std::string& root, const std::string& split);

  size_t size() const { return samples_.size(); }
  const Sample& sample(size_t i) const { return samples_.at(i); }
  const std::vector<Sample>& samples() const { return samples_; }
  const ModelMeta& meta() const { return meta_; }
  int num_classes() const { return static_cast<int>(meta_.class_names.size()); }
  const std::string& kind() const { return kind_; }

  // H×W×3 uint8 (gray/RGBA inputs are converted to RGB).
  torch::Tensor load_image(size_t i) const;
  // H×W uint8 train ids (255 = ignore). A stored value that is neither a class nor the
  // ignore id is an error naming the file and the value.
  torch::Tensor load_label(size_t i) const;
  // Maps a raw label (as stored) through the table; `what` names the source in errors.
  torch::Tensor map_label(const torch::Tensor& raw, const std::string& what) const;
  // Both, checked to have the same size.
  std::pair<torch::Tensor, torch::Tensor> load(size_t i) const;

  // Per-class pixel counts over all labels (ignore excluded).
  std::vector<int64_t> class_histogram() const;

 private:
  std::string kind_;
  std::vector<Sample> samples_;
  ModelMeta meta_;
  std::array<int, 256> lut_{};  // stored value → train id, 255 ignore, -1 invalid
};

// Class weights 1 / ln(c + p_class) (ENet/DABNet), from pixel counts.
std::vector<float> enet_class_weights(const std::vector<int64_t>& counts, double c = 1.10);

}  // namespace lightseg
