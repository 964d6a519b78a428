// TrainState ↔ the "train" entry of a weights file's extra JSON (see train.h). The keys are
// those every checkpoint since the first has used, so old run folders still resume.
#include "core/json_io.h"
#include "core/json_number.h"
#include "lightseg/train.h"
#include "lightseg/weights.h"

namespace lightseg {

using nlohmann::json;

std::optional<TrainState> train_state(const WeightsFile& w) {
  const json extra = parse_json(w.extra.empty() ? std::string("{}") : w.extra, "the weights' extra JSON");
  if (!extra.is_object() || !extra.contains("train")) return std::nullopt;
  const json& t = extra.at("train");
  TrainState s;
  try {
    if (!t.is_object()) throw std::invalid_argument("it is not an object");
    auto num = [&](const char* key, auto def) {
      return t.contains(key) ? json_number<decltype(def)>(t.at(key), std::string("train.") + key) : def;
    };
    auto real = [&](const char* key, double def) {
      return t.contains(key) && !t.at(key).is_null() ? t.at(key).get<double>() : def;
    };
    s.epoch = num("epoch", 0);
    s.batch = num("batch", int64_t(0));
    s.global_step = num("global_step", int64_t(0));
    s.world = num("world", 1);
    s.best_miou = real("best_miou", -1);
    s.val_miou = real("val_miou", -1);
    s.part_loss = real("part_loss", 0);
    s.part_seconds = real("part_seconds", 0);
    s.part_wait = real("part_wait", 0);
    s.part_count = num("part_count", int64_t(0));
    s.part_images = num("part_images", int64_t(0));
    s.part_skipped = num("part_skipped", int64_t(0));
    s.ema_steps = num("ema_steps", int64_t(0));
    if (t.contains("options")) apply_json(s.options, t.at("options"));
    if (t.contains("history"))
      for (const auto& r : t.at("history")) s.history.push_back(epoch_record_from_json(r));
  } catch (const json::exception& e) {
    throw std::invalid_argument(std::string("the training state of the weights file: ") + e.what());
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("the training state of the weights file: ") + e.what());
  }
  return s;
}

void set_train_state(WeightsFile& w, const TrainState& s) {
  json extra = parse_json(w.extra.empty() ? std::string("{}") : w.extra, "the weights' extra JSON");
  if (!extra.is_object()) extra = json::object();
  json t{{"epoch", s.epoch}, {"batch", s.batch}, {"global_step", s.global_step}, {"world", s.world},
         {"best_miou", s.best_miou}, {"part_loss", s.part_loss}, {"part_count", s.part_count},
         {"part_images", s.part_images}, {"part_skipped", s.part_skipped}, {"part_seconds", s.part_seconds},
         {"part_wait", s.part_wait}, {"ema_steps", s.ema_steps}, {"options", to_json(s.options)},
         {"history", json::array()}};
  if (s.val_miou >= 0) t["val_miou"] = s.val_miou;
  for (const auto& r : s.history) t["history"].push_back(to_json(r));
  extra["train"] = std::move(t);
  w.extra = extra.dump();
}

}  // namespace lightseg
