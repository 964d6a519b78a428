// Evaluation over a whole split: one confusion matrix, per-class IoU, mIoU, pixel accuracy.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "lightseg/dataset.h"
#include "lightseg/engine.h"
#include "lightseg/metrics.h"
#include "lightseg/network.h"

namespace lightseg {

struct EvalOptions {
  // What computes the predictions (make_engine): by default the "eager" backend, the training
  // graph in eval mode (the reference); or auto, onednn, fused on engine.device in engine.dtype.
  EngineOptions engine{"eager"};
  std::string save_dir;  // if set: each prediction as an 8-bit label-id PNG named after its image
  // called after each image: (done, total)
  std::function<void(size_t, size_t)> progress;
  // evaluate only images i with i % world == rank (distributed evaluation)
  int rank = 0, world = 1;
  // if set: the group of every sample (SegDataset::groups), scored apart as well (by_group)
  std::vector<std::string> groups;
};

struct GroupScore {
  std::string group;
  ConfusionMatrix confusion{1};
  size_t images = 0;
};

struct EvalResult {
  ConfusionMatrix confusion{1};
  std::vector<std::string> class_names;
  size_t images = 0;
  double seconds = 0;
  std::string backend;  // what computed the predictions
  std::vector<GroupScore> by_group;  // with EvalOptions::groups: one per group, in order of first appearance
  double miou() const { return confusion.miou(); }
  double pixel_accuracy() const { return confusion.pixel_accuracy(); }
  // {"miou": x, "pixel_acc": y, "per_class": {name: iou, ...}, "images": n, "backend": b}, and with
  // groups "groups": {group: {"miou", "pixel_acc", "per_class", "images"}, ...}
  std::string to_json_string() const;
};

// Full resolution, single scale, no flip. The network's class count must match the dataset's.
EvalResult evaluate(const Network& net, const ModelMeta& meta, const SegDataset& data, const EvalOptions& o = {});

}  // namespace lightseg
