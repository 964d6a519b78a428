// What weights were trained on, stored with them, so that `eval` can say when the images it
// scores were part of that training (a score on training data is not a held-out score).
//
// Stored as "training_data" in the weights' extra JSON (train() writes it into every checkpoint),
// or, for weights written before that existed (the shipped models/*.lsw), as
// "training_data_record" in the model card next to the weights (models/camvid.json for
// models/camvid.lsw), so that the binary in git is not rewritten. Weights with neither claim nothing.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lightseg/dataset.h"

namespace lightseg {

struct WeightsFile;

struct TrainingData {
  std::string dataset;               // the dataset kind: camvid, cityscapes or list
  std::string root;                  // the data folder's name (not its path)
  std::vector<std::string> splits;   // the splits opened for training ("trainval" expanded)
  std::string group_by;              // the rule of `groups` ("": the dataset's default)
  std::vector<std::pair<std::string, size_t>> groups;  // the trained-on groups and their images
  std::vector<std::string> val_groups;  // groups held out of those splits (--val-groups)
  size_t images = 0;                 // images trained on
  std::vector<std::string> stems;    // their file names without extension (empty: not recorded)

  std::string to_json_string(int indent = -1) const;
  // Throws std::invalid_argument naming `what` and the key when the record is malformed.
  static TrainingData from_json_string(const std::string& text, const std::string& what = "training data");
};

// The record of a training set: `trained` is what the run trained on, opened as kind/root/split
// (with val_groups held out by group_by, when set).
TrainingData describe_training_data(const SegDataset& trained, const std::string& kind, const std::string& root,
                                    const std::string& split, const std::string& group_by,
                                    const std::vector<std::string>& val_groups);

// The record in w's extra JSON, or nullopt.
std::optional<TrainingData> training_data(const WeightsFile& w);
// Stores d in w's extra JSON (its other keys are kept).
void set_training_data(WeightsFile& w, const TrainingData& d);
// The record of the weights file at `path` (already read as w): w's own, else its model card's
// (PATH without .lsw + ".json", key "training_data_record"); *source says which. nullopt: none.
std::optional<TrainingData> training_data_of(const std::string& path, const WeightsFile& w, std::string* source = nullptr);

// The name of a data folder ("../data/camvid/" -> "camvid").
std::string folder_name(const std::string& path);

// When images of `evaluated` (opened as kind/root/split) were trained on, one line saying so;
// else "". By file stem when the record has them (and the kinds agree), else by split name (when
// kind and folder name agree). Nothing is claimed from a record of another dataset.
std::string trained_on_warning(const TrainingData& d, const SegDataset& evaluated, const std::string& kind,
                               const std::string& root, const std::string& split);

}  // namespace lightseg
