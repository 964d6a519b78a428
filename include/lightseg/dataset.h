// Datasets: CamVid (SegNet layout), Cityscapes (leftImg8bit/gtFine, labelIds → 19 trainIds)
// and a generic list-file dataset for users' own data. A dataset is its file layout, class
// names, palette and a 256-entry table mapping stored label values to train ids (255 = ignore).
//
// List datasets: DIR/{split}.txt with "image label" lines (paths relative to DIR) and
// DIR/dataset.json: {"classes": [...], "palette": [[r,g,b], ...], "ignore_index": 255}.
//
// Groups (sequence-disjoint validation): every sample belongs to a group, the drive, video or
// scene it was taken from, named by a `group_by` rule:
//   "prefix"       the image file name up to its first '_' (CamVid's drives: 0001TP_006690.png)
//   "dir"          the image's parent folder name (Cityscapes' city: leftImg8bit/train/aachen/...)
//   "regex:PAT"    the first capture group of PAT searched in the image file name (the whole
//                  match if PAT has no group), e.g. "regex:^(.*)_frame"
//   "file:PATH"    PATH lists "image group" lines (image as in a list file, relative to the
//                  dataset folder, or just its file name)
//   ""             the dataset's default: "dir" for Cityscapes, "prefix" otherwise.
// split_by_groups() then holds out whole groups: neighbouring video frames in both training and
// validation make the validation score a measure of memory, not of generalisation.
#pragma once

#include <array>
#include <string>
#include <utility>
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
  const std::string& root() const { return root_; }  // the dataset folder

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

  // The same dataset with only the samples at `indices`, in that order.
  SegDataset subset(const std::vector<size_t>& indices) const;
  // The group of every sample under the rule `group_by` (see the top of this file). Throws
  // std::invalid_argument for an unknown rule and std::runtime_error naming the image when a
  // sample has no group (a regex that does not match, an image missing from the group file).
  std::vector<std::string> groups(const std::string& group_by = "") const;

 private:
  std::string kind_, root_;
  std::vector<Sample> samples_;
  ModelMeta meta_;
  std::array<int, 256> lut_{};  // stored value → train id, 255 ignore, -1 invalid
};

// "train,val" and "val" → "train,val": the splits of both, each once, in order ("trainval" is
// expanded as open() does). What a sequence-disjoint run pools before it splits by group.
std::string pool_splits(const std::string& a, const std::string& b);

// Each group and its number of samples, in order of first appearance.
std::vector<std::pair<std::string, size_t>> group_counts(const std::vector<std::string>& groups);
// "0001TP 62, 0016E5 305"
std::string describe_groups(const std::vector<std::pair<std::string, size_t>>& counts);

// A sequence-disjoint split of `pooled`: the samples whose group is in val_groups become `val`,
// the others `train` (each in pooled's order). Throws std::invalid_argument naming the groups
// that exist (with their counts) when a listed group has no sample, and when either side is empty.
struct GroupSplit {
  SegDataset train, val;
  std::vector<std::pair<std::string, size_t>> train_groups, val_groups;  // group, images
  // "train 367 images (0001TP 62, 0016E5 305), val 101 images (0006R0 101)"
  std::string describe() const;
};
GroupSplit split_by_groups(const SegDataset& pooled, const std::string& group_by,
                           const std::vector<std::string>& val_groups);

// Class weights 1 / ln(c + p_class) (ENet/DABNet), from pixel counts.
std::vector<float> enet_class_weights(const std::vector<int64_t>& counts, double c = 1.10);
// Median-frequency balancing (SegNet): median(p) / p_class with p a class's share of the pixels
// (the median over the classes present); stronger than ENet's for thin and rare classes. A class
// with no pixels gets weight 0 (it has no pixel to weigh).
std::vector<float> median_frequency_class_weights(const std::vector<int64_t>& counts);
// method: "enet" or "median"; throws std::invalid_argument for another.
std::vector<float> class_weights_from_counts(const std::vector<int64_t>& counts, const std::string& method);

}  // namespace lightseg
