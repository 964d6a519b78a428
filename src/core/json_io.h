// The JSON forms of the public types, for the library's own files (weights headers,
// checkpoints, configs, logs, the HTTP API). Internal: the public headers speak JSON text
// (to_json_string / from_json_string) so that nlohmann's header stays out of them.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lightseg/config.h"

namespace lightseg {

struct TrainOptions;
struct EpochRecord;
struct EvalResult;
struct LegendEntry;

// config.cpp
nlohmann::json to_json(const NetworkConfig& c);
// The "network" object of j, or j itself when it has no "network" key; validated.
NetworkConfig network_config_from_json(const nlohmann::json& j);
nlohmann::json to_json(const ModelMeta& m);
ModelMeta model_meta_from_json(const nlohmann::json& j);
// Parses text; `what` names it in the error (std::invalid_argument).
nlohmann::json parse_json(const std::string& text, const std::string& what);
nlohmann::json read_json_file(const std::string& path);

// train_options.cpp
nlohmann::json to_json(const TrainOptions& o);
// Applies the keys of j (a "train" object) onto o; unknown keys are an error.
void apply_json(TrainOptions& o, const nlohmann::json& j);
nlohmann::json to_json(const EpochRecord& r);
EpochRecord epoch_record_from_json(const nlohmann::json& j);

// evaluator.cpp: {"miou", "pixel_acc", "per_class": {name: iou}, "images", "backend"}
nlohmann::json to_json(const EvalResult& r);

// palette.cpp: [{"id", "name", "color": [r, g, b], "pixels", "share"}...]
nlohmann::json to_json(const std::vector<LegendEntry>& entries);

}  // namespace lightseg
