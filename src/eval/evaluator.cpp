#include <chrono>
#include <cmath>
#include <filesystem>

#include "lightseg/engine.h"
#include "lightseg/eval.h"
#include "lightseg/image_io.h"
#include "lightseg/predictor.h"
#include "core/json_io.h"

namespace lightseg {

namespace fs = std::filesystem;

static nlohmann::json per_class(const ConfusionMatrix& m, const std::vector<std::string>& names) {
  nlohmann::json per = nlohmann::json::object();
  auto iou = m.iou();
  for (size_t c = 0; c < iou.size(); ++c) {
    const std::string name = c < names.size() ? names[c] : "class" + std::to_string(c);
    per[name] = std::isnan(iou[c]) ? nlohmann::json(nullptr) : nlohmann::json(iou[c]);
  }
  return per;
}

nlohmann::json to_json(const EvalResult& r) {
  nlohmann::json j{{"miou", r.miou()}, {"pixel_acc", r.pixel_accuracy()}, {"per_class", per_class(r.confusion, r.class_names)},
                   {"images", r.images}, {"backend", r.backend}};
  if (!r.by_group.empty()) {
    nlohmann::json g = nlohmann::json::object();
    for (const auto& s : r.by_group)
      g[s.group] = {{"miou", s.confusion.miou()}, {"pixel_acc", s.confusion.pixel_accuracy()},
                    {"per_class", per_class(s.confusion, r.class_names)}, {"images", s.images}};
    j["groups"] = g;
  }
  return j;
}

std::string EvalResult::to_json_string() const { return to_json(*this).dump(); }

EvalResult evaluate(const Network& net, const ModelMeta& meta, const SegDataset& data, const EvalOptions& o) {
  if (net->config().num_classes != data.num_classes())
    throw std::invalid_argument("the weights have " + std::to_string(net->config().num_classes) +
                                " classes but the dataset has " + std::to_string(data.num_classes()));
  torch::NoGradGuard ng;
  EvalResult r;
  r.confusion = ConfusionMatrix(data.num_classes(), kIgnore);
  r.class_names = data.meta().class_names;
  // The front door every image goes through (segment, serve, bench --input-size): one pass at
  // the image's own size, labels at that size.
  PredictorOptions po;
  po.engine = o.engine;
  const Predictor predictor(net, meta, po);
  r.backend = predictor.backend();
  if (!o.save_dir.empty()) fs::create_directories(o.save_dir);
  if (!o.groups.empty() && o.groups.size() != data.size())
    throw std::invalid_argument("EvalOptions::groups has " + std::to_string(o.groups.size()) + " entries but the dataset " +
                                std::to_string(data.size()) + " samples");
  std::vector<size_t> group_of(o.groups.size());  // sample → index in r.by_group
  for (size_t i = 0; i < o.groups.size(); ++i) {
    size_t g = 0;
    while (g < r.by_group.size() && r.by_group[g].group != o.groups[i]) ++g;
    if (g == r.by_group.size()) r.by_group.push_back({o.groups[i], ConfusionMatrix(data.num_classes(), kIgnore), 0});
    group_of[i] = g;
  }
  auto t0 = std::chrono::steady_clock::now();
  for (size_t i = static_cast<size_t>(o.rank); i < data.size(); i += static_cast<size_t>(o.world)) {
    auto [img, lab] = data.load(i);
    auto pred = predictor.predict(img).labels.to(torch::kLong);
    r.confusion.update(pred, lab);
    if (!group_of.empty()) {
      auto& g = r.by_group[group_of[i]];
      g.confusion.update(pred, lab);
      ++g.images;
    }
    if (!o.save_dir.empty()) {
      auto name = fs::path(data.sample(i).image).stem().string() + ".png";
      write_png((fs::path(o.save_dir) / name).string(), pred.to(torch::kUInt8));
    }
    ++r.images;
    if (o.progress) o.progress(i + 1, data.size());
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace lightseg
