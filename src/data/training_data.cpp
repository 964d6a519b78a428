#include "lightseg/training_data.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "lightseg/weights.h"
#include "core/json_io.h"

namespace lightseg {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
std::vector<std::string> training_split_names(const std::string& split) {
  std::vector<std::string> out;
  const std::string pooled = pool_splits(split, split);
  for (size_t p = 0, q; p <= pooled.size(); p = q + 1) {
    q = pooled.find(',', p);
    if (q == std::string::npos) q = pooled.size();
    if (q > p) out.push_back(pooled.substr(p, q - p));
  }
  return out;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}
}  // namespace

std::string folder_name(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  std::string n = p.filename().string();
  if (n.empty() || n == "." || n == "..") n = fs::absolute(p).lexically_normal().filename().string();
  return n;
}

std::string TrainingData::to_json_string(int indent) const {
  json g = json::array();
  for (const auto& [name, n] : groups) g.push_back({name, n});
  json j{{"dataset", dataset}, {"root", root}, {"splits", splits}, {"group_by", group_by},
         {"groups", g},        {"images", images}, {"stems", stems}};
  if (!val_groups.empty()) j["val_groups"] = val_groups;
  return j.dump(indent);
}

TrainingData TrainingData::from_json_string(const std::string& text, const std::string& what) {
  const json j = parse_json(text, what);
  TrainingData d;
  try {
    if (!j.is_object()) throw std::invalid_argument("not a JSON object");
    d.dataset = j.at("dataset").get<std::string>();
    d.root = j.value("root", std::string());
    d.splits = j.at("splits").get<std::vector<std::string>>();
    d.group_by = j.value("group_by", std::string());
    if (j.contains("groups"))
      for (const auto& g : j.at("groups")) d.groups.emplace_back(g.at(0).get<std::string>(), g.at(1).get<size_t>());
    d.val_groups = j.value("val_groups", std::vector<std::string>{});
    d.images = j.value("images", size_t(0));
    d.stems = j.value("stems", std::vector<std::string>{});
  } catch (const json::exception& e) {
    throw std::invalid_argument(what + ": " + e.what());
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(what + ": " + e.what());
  }
  return d;
}

TrainingData describe_training_data(const SegDataset& trained, const std::string& kind, const std::string& root,
                                    const std::string& split, const std::string& group_by,
                                    const std::vector<std::string>& val_groups) {
  TrainingData d;
  d.dataset = kind;
  d.root = folder_name(root);
  d.splits = training_split_names(split);
  d.group_by = group_by;
  try {
    d.groups = group_counts(trained.groups(group_by));
  } catch (const std::exception&) {  // names without groups under this rule: none recorded
  }
  d.val_groups = val_groups;
  d.images = trained.size();
  for (const auto& s : trained.samples()) d.stems.push_back(fs::path(s.image).stem().string());
  return d;
}

std::optional<TrainingData> training_data(const WeightsFile& w) {
  const json extra = parse_json(w.extra.empty() ? std::string("{}") : w.extra, "the weights' extra JSON");
  if (!extra.is_object() || !extra.contains("training_data")) return std::nullopt;
  return TrainingData::from_json_string(extra.at("training_data").dump(), "the weights' training_data");
}

void set_training_data(WeightsFile& w, const TrainingData& d) {
  json extra = parse_json(w.extra.empty() ? std::string("{}") : w.extra, "the weights' extra JSON");
  if (!extra.is_object()) extra = json::object();
  extra["training_data"] = json::parse(d.to_json_string());
  w.extra = extra.dump();
}

std::optional<TrainingData> training_data_of(const std::string& path, const WeightsFile& w, std::string* source) {
  if (auto d = training_data(w)) {
    if (source) *source = "the weights";
    return d;
  }
  fs::path card = fs::path(path);
  card.replace_extension(".json");
  if (!fs::exists(card)) return std::nullopt;
  const json j = read_json_file(card.string());
  if (!j.is_object() || !j.contains("training_data_record")) return std::nullopt;
  if (source) *source = "its model card " + card.string();
  return TrainingData::from_json_string(j.at("training_data_record").dump(), card.string() + ": training_data_record");
}

std::string trained_on_warning(const TrainingData& d, const SegDataset& evaluated, const std::string& kind,
                               const std::string& root, const std::string& split) {
  if (d.dataset != kind || evaluated.size() == 0) return "";
  const std::string here = folder_name(root);
  const std::string what = kind + " '" + here + "' " + split;
  const std::string trained = d.dataset + " '" + d.root + "' " + joined(d.splits) +
                              (d.val_groups.empty() ? "" : " less groups " + joined(d.val_groups)) + " (" +
                              std::to_string(d.images) + " images)";
  if (!d.stems.empty()) {
    const std::set<std::string> seen(d.stems.begin(), d.stems.end());
    size_t n = 0;
    for (const auto& s : evaluated.samples()) n += seen.count(fs::path(s.image).stem().string());
    if (n == 0) return "";
    return "warning: " + std::to_string(n) + " of the " + std::to_string(evaluated.size()) + " images of " + what +
           " were in these weights' training data, " + trained + ": " +
           (n == evaluated.size() ? "this is not a held-out score" : "this score is not a held-out one") +
           (d.root == here ? "" : " (same file names, data folder '" + d.root + "' then)");
  }
  if (d.root != here) return "";
  std::vector<std::string> shared;
  for (const auto& s : training_split_names(split))
    if (std::find(d.splits.begin(), d.splits.end(), s) != d.splits.end()) shared.push_back(s);
  if (shared.empty()) return "";
  return "warning: " + joined(shared) + " " + (shared.size() == 1 ? "was" : "were") + " in these weights' training data, " +
         trained + (d.val_groups.empty() ? "" : " (by split name; its groups were not recorded per image)") +
         ": this is not a held-out score";
}

}  // namespace lightseg
