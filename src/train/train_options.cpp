#include <cmath>
#include "core/json_number.h"
#include <stdexcept>

#include "lightseg/train.h"

namespace lightseg {

using nlohmann::json;

json TrainOptions::to_json() const {
  return json{{"data", data}, {"dataset", dataset}, {"train_split", train_split}, {"val_split", val_split},
              {"out_dir", out_dir}, {"epochs", epochs}, {"batch", batch}, {"crop", {crop_h, crop_w}},
              {"optimizer", optimizer}, {"lr", lr}, {"weight_decay", weight_decay}, {"momentum", momentum},
              {"nesterov", nesterov}, {"bn_weight_decay", bn_weight_decay}, {"warmup_epochs", warmup_epochs},
              {"warmup_start", warmup_start}, {"poly_power", poly_power}, {"scale_min", scale_min},
              {"scale_max", scale_max}, {"jitter", jitter}, {"flip", flip}, {"loss", loss},
              {"ohem_thresh", ohem_thresh}, {"ohem_min_kept", ohem_min_kept}, {"class_weights", class_weights},
              {"aux_weight", aux_weight}, {"ema_decay", ema_decay},
              {"time_limit_min", time_limit_min}, {"device", device}, {"val_every", val_every}, {"seed", seed},
              {"workers", workers}, {"prefetch", prefetch}, {"channels_last", channels_last}, {"amp", amp}, {"amp_cpu", amp_cpu},
              {"max_iters", max_iters}, {"sync_bn", sync_bn}, {"overlap_allreduce", overlap_allreduce},
              {"bucket_mb", bucket_mb}, {"init_weights", init_weights}, {"network", network.to_json()}};
}

void TrainOptions::apply_json(const json& j) {
  if (!j.is_object()) throw std::invalid_argument("train options must be a JSON object");
  try {
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& k = it.key();
      const json& v = it.value();
      if (k == "data") data = v.get<std::string>();
      else if (k == "dataset") dataset = v.get<std::string>();
      else if (k == "train_split") train_split = v.get<std::string>();
      else if (k == "val_split") val_split = v.get<std::string>();
      else if (k == "out_dir") out_dir = v.get<std::string>();
      else if (k == "epochs") epochs = json_number<int>(v, "train." + k);
      else if (k == "batch") batch = json_number<int>(v, "train." + k);
      else if (k == "crop") { auto c = json_numbers<int64_t>(v, "train." + k); if (c.size() != 2) throw std::invalid_argument("train.crop must be [h, w]"); crop_h = c[0]; crop_w = c[1]; }
      else if (k == "optimizer") optimizer = v.get<std::string>();
      else if (k == "lr") lr = v.get<double>();
      else if (k == "weight_decay") weight_decay = v.get<double>();
      else if (k == "momentum") momentum = v.get<double>();
      else if (k == "nesterov") nesterov = v.get<bool>();
      else if (k == "bn_weight_decay") bn_weight_decay = v.get<bool>();
      else if (k == "warmup_epochs") warmup_epochs = v.get<double>();
      else if (k == "warmup_start") warmup_start = v.get<double>();
      else if (k == "poly_power") poly_power = v.get<double>();
      else if (k == "scale_min") scale_min = v.get<double>();
      else if (k == "scale_max") scale_max = v.get<double>();
      else if (k == "jitter") jitter = v.get<double>();
      else if (k == "flip") flip = v.get<bool>();
      else if (k == "loss") loss = v.get<std::string>();
      else if (k == "ohem_thresh") ohem_thresh = v.get<double>();
      else if (k == "ohem_min_kept") ohem_min_kept = v.get<double>();
      else if (k == "class_weights") class_weights = json_numbers<float>(v, "train." + k);
      else if (k == "aux_weight") aux_weight = v.get<double>();
      else if (k == "ema_decay") ema_decay = v.get<double>();
      else if (k == "time_limit_min") time_limit_min = v.get<double>();
      else if (k == "device") device = v.get<std::string>();
      else if (k == "val_every") val_every = json_number<int>(v, "train." + k);
      else if (k == "seed") seed = json_number<uint64_t>(v, "train." + k);
      else if (k == "workers") workers = json_number<int>(v, "train." + k);
      else if (k == "prefetch") prefetch = json_number<int>(v, "train." + k);
      else if (k == "channels_last") channels_last = v.get<bool>();
      else if (k == "amp") amp = v.get<bool>();
      else if (k == "amp_cpu") amp_cpu = v.get<bool>();
      else if (k == "max_iters") max_iters = json_number<int64_t>(v, "train." + k);
      else if (k == "sync_bn") sync_bn = v.get<bool>();
      else if (k == "overlap_allreduce") overlap_allreduce = v.get<bool>();
      else if (k == "bucket_mb") bucket_mb = v.get<double>();
      else if (k == "verify_sync") verify_sync = v.get<bool>();
      else if (k == "init_weights") init_weights = v.get<std::string>();
      else if (k == "network") network = NetworkConfig::from_json(v);
      else throw std::invalid_argument("unknown key '" + k + "' in train options");
    }
  } catch (const json::exception& e) {
    throw std::invalid_argument(std::string("train options: ") + e.what());
  }
}

void TrainOptions::set(const std::string& kv) {
  const size_t eq = kv.find('=');
  if (eq == std::string::npos || eq == 0)
    throw std::invalid_argument("override '" + kv + "': expected KEY=VALUE (e.g. lr=5e-4, network.c0=16)");
  std::string key = kv.substr(0, eq);
  const std::string text = kv.substr(eq + 1);
  json value = json::parse(text, nullptr, false);
  if (value.is_discarded()) value = text;  // a bare word: a string
  if (key.rfind("network.", 0) == 0) {
    json net = network.to_json();
    json* at = &net;
    std::string rest = key.substr(8);
    for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1)) {
      const std::string part = rest.substr(0, dot);
      if (!at->is_object() || !at->contains(part))
        throw std::invalid_argument("override '" + kv + "': unknown key '" + part + "' in the network config");
      at = &(*at)[part];
    }
    if (!at->is_object() || !at->contains(rest))
      throw std::invalid_argument("override '" + kv + "': unknown key '" + rest + "' in the network config");
    (*at)[rest] = value;
    // A new layer count without a new schedule: the schedule follows (as in a config file).
    if (rest == "layers" && at != &net) at->erase("dilations");
    network = NetworkConfig::from_json(net);
    return;
  }
  if (key.rfind("train.", 0) == 0) key = key.substr(6);
  if (key.empty() || key.find('.') != std::string::npos)
    throw std::invalid_argument("override '" + kv + "': unknown key '" + key + "' in train options");
  apply_json(json{{key, value}});
}

void TrainOptions::validate() const {
  auto need = [](bool ok, const std::string& m) {
    if (!ok) throw std::invalid_argument(m);
  };
  need(!data.empty(), "train: data (the dataset folder) is required");
  need(!out_dir.empty(), "train: out_dir (the run folder) is required");
  need(epochs > 0, "train: epochs must be > 0, got " + std::to_string(epochs));
  need(batch > 0, "train: batch must be > 0, got " + std::to_string(batch));
  need(crop_h >= 32 && crop_w >= 32 && crop_h <= 16384 && crop_w <= 16384,
       "train: crop must be 32x32 .. 16384x16384, got " + std::to_string(crop_h) + "x" + std::to_string(crop_w));
  need(optimizer == "adam" || optimizer == "adamw" || optimizer == "sgd", "train: optimizer must be adam, adamw or sgd, got '" + optimizer + "'");
  need(loss == "wce" || loss == "ce" || loss == "ohem", "train: loss must be wce, ce or ohem, got '" + loss + "'");
  need(lr > 0, "train: lr must be > 0");
  need(weight_decay >= 0, "train: weight_decay must be >= 0");
  need(scale_min > 0 && scale_max >= scale_min, "train: need 0 < scale_min <= scale_max");
  need(aux_weight >= 0 && std::isfinite(aux_weight), "train: aux_weight must be >= 0 (0: no auxiliary heads)");
  need(ema_decay >= 0 && ema_decay < 1, "train: ema_decay must be in [0, 1) (0: no EMA)");
  need(val_every >= 0, "train: val_every must be >= 0");
  need(device == "cpu" || device == "cuda" || device.rfind("cuda:", 0) == 0, "train: device must be cpu or cuda, got '" + device + "'");
  need(world >= 1 && rank >= 0 && rank < world, "train: rank must be in 0..world-1");
  network.validate();
}

json EpochRecord::to_json() const {
  json j{{"epoch", epoch}, {"loss", loss}, {"lr", lr}, {"seconds", seconds}, {"images_per_s", images_per_s},
         {"data_wait_share", data_wait_share}, {"allreduce_share", allreduce_share}};
  j["val_miou"] = miou >= 0 ? json(miou) : json(nullptr);
  j["val_pixel_acc"] = pixel_acc >= 0 ? json(pixel_acc) : json(nullptr);
  if (skipped_steps > 0) j["skipped_steps"] = skipped_steps;
  return j;
}

EpochRecord EpochRecord::from_json(const json& j) {
  EpochRecord r;
  r.epoch = json_number<int>(j.at("epoch"), "epoch");
  r.loss = j.at("loss").get<double>();
  r.lr = j.at("lr").get<double>();
  r.seconds = j.value("seconds", 0.0);
  r.images_per_s = j.value("images_per_s", 0.0);
  r.data_wait_share = j.value("data_wait_share", 0.0);
  r.allreduce_share = j.value("allreduce_share", 0.0);
  r.miou = j.at("val_miou").is_null() ? -1 : j.at("val_miou").get<double>();
  r.pixel_acc = j.at("val_pixel_acc").is_null() ? -1 : j.at("val_pixel_acc").get<double>();
  r.skipped_steps = j.value("skipped_steps", int64_t(0));
  return r;
}

double poly_lr(double base, int64_t step, int64_t total, int64_t warmup, double warmup_start, double power) {
  if (warmup > 0 && step < warmup) {
    const double a = static_cast<double>(step) / static_cast<double>(warmup);
    return base * (warmup_start + (1.0 - warmup_start) * a);
  }
  const double frac = total > 0 ? std::min(1.0, static_cast<double>(step) / static_cast<double>(total)) : 0.0;
  return base * std::pow(1.0 - frac, power);
}

}  // namespace lightseg
