#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "lightseg/train.h"
#include "core/json_io.h"
#include "core/json_number.h"

namespace lightseg {

using nlohmann::json;

namespace {
torch::Device device_from_string(const std::string& s) {
  if (s != "cpu" && s != "cuda" && s.rfind("cuda:", 0) != 0)
    throw std::invalid_argument("train option 'device' must be cpu, cuda or cuda:N, got '" + s + "'");
  try {
    return torch::Device(s);
  } catch (const c10::Error&) {
    throw std::invalid_argument("train option 'device' must be cpu, cuda or cuda:N, got '" + s + "'");
  }
}
// "val_groups": a list of names or one string of names joined by commas.
std::vector<std::string> group_list(const json& v) {
  std::vector<std::string> out;
  auto add = [&](const std::string& s) {
    std::string x;
    for (size_t i = 0; i <= s.size(); ++i) {
      if (i == s.size() || s[i] == ',') {
        const size_t a = x.find_first_not_of(" \t"), b = x.find_last_not_of(" \t");
        if (a != std::string::npos) out.push_back(x.substr(a, b - a + 1));
        x.clear();
      } else {
        x += s[i];
      }
    }
  };
  if (v.is_string()) add(v.get<std::string>());
  else if (v.is_array())
    for (const auto& e : v) {
      if (!e.is_string()) throw std::invalid_argument("train.val_groups must be a list of group names (strings)");
      add(e.get<std::string>());
    }
  else
    throw std::invalid_argument("train.val_groups must be a list of group names or a comma-separated string");
  for (size_t i = 0; i < out.size(); ++i)
    if (std::find(out.begin(), out.begin() + i, out[i]) != out.begin() + i)
      throw std::invalid_argument("train.val_groups names '" + out[i] + "' twice");
  return out;
}
}  // namespace

json to_json(const TrainOptions& o) {
  return json{{"data", o.data}, {"dataset", o.dataset}, {"train_split", o.train_split}, {"val_split", o.val_split},
              {"val_groups", o.val_groups}, {"group_by", o.group_by},
              {"out_dir", o.out_dir}, {"epochs", o.epochs}, {"batch", o.batch}, {"crop", {o.crop_h, o.crop_w}},
              {"optimizer", o.optimizer}, {"lr", o.lr}, {"weight_decay", o.weight_decay}, {"momentum", o.momentum},
              {"nesterov", o.nesterov}, {"bn_weight_decay", o.bn_weight_decay}, {"warmup_epochs", o.warmup_epochs},
              {"warmup_start", o.warmup_start}, {"poly_power", o.poly_power}, {"scale_min", o.scale_min},
              {"scale_max", o.scale_max}, {"jitter", o.jitter}, {"blur", o.blur}, {"noise", o.noise}, {"flip", o.flip}, {"loss", o.loss},
              {"ohem_thresh", o.ohem_thresh}, {"ohem_min_kept", o.ohem_min_kept}, {"class_weights", o.class_weights},
              {"class_weighting", o.class_weighting},
              {"aux_weight", o.aux_weight}, {"ema_decay", o.ema_decay},
              {"distill_from", o.distill_from}, {"distill_weight", o.distill_weight},
              {"distill_temperature", o.distill_temperature},
              {"time_limit_min", o.time_limit_min}, {"device", o.device.str()}, {"val_every", o.val_every}, {"seed", o.seed},
              {"workers", o.workers}, {"prefetch", o.prefetch}, {"channels_last", o.channels_last}, {"amp", o.amp}, {"amp_cpu", o.amp_cpu},
              {"max_iters", o.max_iters}, {"data_cache", o.data_cache}, {"fused_optimizer", o.fused_optimizer},
              {"sync_every", o.sync_every}, {"cuda_graph", o.cuda_graph}, {"sync_bn", o.sync_bn}, {"overlap_allreduce", o.overlap_allreduce},
              {"bucket_mb", o.bucket_mb}, {"init_weights", o.init_weights}, {"network", to_json(o.network)}};
}

void apply_json(TrainOptions& o, const json& j) {
  if (!j.is_object()) throw std::invalid_argument("train options must be a JSON object");
  std::string k;
  try {
    for (auto it = j.begin(); it != j.end(); ++it) {
      k = it.key();
      const json& v = it.value();
      if (k == "data") o.data = v.get<std::string>();
      else if (k == "dataset") o.dataset = v.get<std::string>();
      else if (k == "train_split") o.train_split = v.get<std::string>();
      else if (k == "val_split") o.val_split = v.get<std::string>();
      else if (k == "val_groups") o.val_groups = group_list(v);
      else if (k == "group_by") o.group_by = v.get<std::string>();
      else if (k == "out_dir") o.out_dir = v.get<std::string>();
      else if (k == "epochs") o.epochs = json_number<int>(v, "train." + k);
      else if (k == "batch") o.batch = json_number<int>(v, "train." + k);
      else if (k == "crop") { auto c = json_numbers<int64_t>(v, "train." + k); if (c.size() != 2) throw std::invalid_argument("train.crop must be [h, w]"); o.crop_h = c[0]; o.crop_w = c[1]; }
      else if (k == "optimizer") o.optimizer = v.get<std::string>();
      else if (k == "lr") o.lr = v.get<double>();
      else if (k == "weight_decay") o.weight_decay = v.get<double>();
      else if (k == "momentum") o.momentum = v.get<double>();
      else if (k == "nesterov") o.nesterov = v.get<bool>();
      else if (k == "bn_weight_decay") o.bn_weight_decay = v.get<bool>();
      else if (k == "warmup_epochs") o.warmup_epochs = v.get<double>();
      else if (k == "warmup_start") o.warmup_start = v.get<double>();
      else if (k == "poly_power") o.poly_power = v.get<double>();
      else if (k == "scale_min") o.scale_min = v.get<double>();
      else if (k == "scale_max") o.scale_max = v.get<double>();
      else if (k == "jitter") o.jitter = v.get<double>();
      else if (k == "blur") o.blur = v.get<double>();
      else if (k == "noise") o.noise = v.get<double>();
      else if (k == "flip") o.flip = v.get<bool>();
      else if (k == "loss") o.loss = v.get<std::string>();
      else if (k == "ohem_thresh") o.ohem_thresh = v.get<double>();
      else if (k == "ohem_min_kept") o.ohem_min_kept = v.get<double>();
      else if (k == "class_weights") o.class_weights = json_numbers<float>(v, "train." + k);
      else if (k == "class_weighting") o.class_weighting = v.get<std::string>();
      else if (k == "aux_weight") o.aux_weight = v.get<double>();
      else if (k == "ema_decay") o.ema_decay = v.get<double>();
      else if (k == "distill_from") o.distill_from = v.get<std::string>();
      else if (k == "distill_weight") o.distill_weight = v.get<double>();
      else if (k == "distill_temperature") o.distill_temperature = v.get<double>();
      else if (k == "time_limit_min") o.time_limit_min = v.get<double>();
      else if (k == "device") o.device = device_from_string(v.get<std::string>());
      else if (k == "val_every") o.val_every = json_number<int>(v, "train." + k);
      else if (k == "seed") o.seed = json_number<uint64_t>(v, "train." + k);
      else if (k == "workers") o.workers = json_number<int>(v, "train." + k);
      else if (k == "prefetch") o.prefetch = json_number<int>(v, "train." + k);
      else if (k == "channels_last") o.channels_last = v.get<bool>();
      else if (k == "amp") o.amp = v.get<bool>();
      else if (k == "amp_cpu") o.amp_cpu = v.get<bool>();
      else if (k == "max_iters") o.max_iters = json_number<int64_t>(v, "train." + k);
      else if (k == "data_cache") o.data_cache = v.get<std::string>();
      else if (k == "fused_optimizer") o.fused_optimizer = v.is_boolean() ? (v.get<bool>() ? "on" : "off") : v.get<std::string>();
      else if (k == "sync_every") o.sync_every = json_number<int>(v, "train." + k);
      else if (k == "cuda_graph") o.cuda_graph = v.is_boolean() ? (v.get<bool>() ? "on" : "off") : v.get<std::string>();
      else if (k == "sync_bn") o.sync_bn = v.get<bool>();
      else if (k == "overlap_allreduce") o.overlap_allreduce = v.get<bool>();
      else if (k == "bucket_mb") o.bucket_mb = v.get<double>();
      else if (k == "verify_sync") o.verify_sync = v.get<bool>();
      else if (k == "init_weights") o.init_weights = v.get<std::string>();
      else if (k == "network") o.network = network_config_from_json(v);
      else throw std::invalid_argument("unknown key '" + k + "' in train options");
    }
  } catch (const json::exception& e) {
    throw std::invalid_argument("train option '" + k + "': " + e.what());
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
    json net = to_json(network);
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
    network = network_config_from_json(net);
    return;
  }
  if (key.rfind("train.", 0) == 0) key = key.substr(6);
  if (key.empty() || key.find('.') != std::string::npos)
    throw std::invalid_argument("override '" + kv + "': unknown key '" + key + "' in train options");
  lightseg::apply_json(*this, json{{key, value}});
}

void TrainOptions::validate() const {
  auto need = [](bool ok, const std::string& m) {
    if (!ok) throw std::invalid_argument(m);
  };
  need(!data.empty(), "train: data (the dataset folder) is required");
  need(!out_dir.empty(), "train: out_dir (the run folder) is required");
  need(epochs > 0, "train: epochs must be > 0, got " + std::to_string(epochs));
  need(batch > 0, "train: batch must be > 0, got " + std::to_string(batch));
  need((crop_h == 0 && crop_w == 0) || (crop_h >= 32 && crop_w >= 32 && crop_h <= 16384 && crop_w <= 16384),
       "train: crop must be 32x32 .. 16384x16384 (or 0x0: from the images), got " + std::to_string(crop_h) + "x" +
           std::to_string(crop_w));
  need(optimizer == "adam" || optimizer == "adamw" || optimizer == "sgd", "train: optimizer must be adam, adamw or sgd, got '" + optimizer + "'");
  need(loss == "wce" || loss == "ce" || loss == "ohem", "train: loss must be wce, ce or ohem, got '" + loss + "'");
  need(class_weighting == "enet" || class_weighting == "median",
       "train: class_weighting must be enet or median, got '" + class_weighting + "'");
  need(group_by.empty() || group_by == "prefix" || group_by == "dir" || group_by.rfind("regex:", 0) == 0 ||
           group_by.rfind("file:", 0) == 0,
       "train: group_by must be prefix, dir, regex:PATTERN or file:PATH, got '" + group_by + "'");
  need(lr > 0, "train: lr must be > 0");
  need(weight_decay >= 0, "train: weight_decay must be >= 0");
  need(scale_min > 0 && scale_max >= scale_min, "train: need 0 < scale_min <= scale_max");
  need(blur >= 0 && blur <= 1, "train: blur is a probability, in [0, 1]");
  need(noise >= 0 && noise <= 64, "train: noise is a std in 0..255 units, in [0, 64]");
  need(aux_weight >= 0 && std::isfinite(aux_weight), "train: aux_weight must be >= 0 (0: no auxiliary heads)");
  need(ema_decay >= 0 && ema_decay < 1, "train: ema_decay must be in [0, 1) (0: no EMA)");
  need(distill_weight >= 0 && std::isfinite(distill_weight), "train: distill_weight must be >= 0");
  need(distill_temperature > 0 && std::isfinite(distill_temperature), "train: distill_temperature must be > 0");
  need(val_every >= 0, "train: val_every must be >= 0");
  need(data_cache == "auto" || data_cache == "off" || data_cache == "host" || data_cache == "device",
       "train: data_cache must be auto, off, host or device, got '" + data_cache + "'");
  need(fused_optimizer == "auto" || fused_optimizer == "on" || fused_optimizer == "off",
       "train: fused_optimizer must be auto, on or off, got '" + fused_optimizer + "'");
  need(sync_every >= 0, "train: sync_every must be >= 0 (0: auto)");
  need(cuda_graph == "on" || cuda_graph == "off", "train: cuda_graph must be on or off, got '" + cuda_graph + "'");
  need(device.is_cpu() || device.is_cuda(), "train: device must be cpu or cuda, got '" + device.str() + "'");
  need(world >= 1 && rank >= 0 && rank < world, "train: rank must be in 0..world-1");
  network.validate();
}

json to_json(const EpochRecord& r) {
  json j{{"epoch", r.epoch}, {"loss", r.loss}, {"lr", r.lr}, {"seconds", r.seconds}, {"images_per_s", r.images_per_s},
         {"data_wait_share", r.data_wait_share}, {"allreduce_share", r.allreduce_share}};
  j["val_miou"] = r.miou >= 0 ? json(r.miou) : json(nullptr);
  j["val_pixel_acc"] = r.pixel_acc >= 0 ? json(r.pixel_acc) : json(nullptr);
  if (r.skipped_steps > 0) j["skipped_steps"] = r.skipped_steps;
  return j;
}

EpochRecord epoch_record_from_json(const json& j) {
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

std::string TrainOptions::to_json_string(int indent) const { return to_json(*this).dump(indent); }

void TrainOptions::apply_json_string(const std::string& text, const std::string& what) {
  lightseg::apply_json(*this, parse_json(text, what));
}

void TrainOptions::apply_config_file(const std::string& path) {
  const json j = read_json_file(path);
  try {
    if (!j.is_object()) throw std::invalid_argument("a config must be a JSON object");
    if (!j.contains("network") && !j.contains("train")) {  // a bare network object
      network = network_config_from_json(j);
      return;
    }
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it.key() != "network" && it.key() != "train")
        throw std::invalid_argument("unknown key '" + it.key() + "' (a config has \"network\" and \"train\")");
    if (j.contains("network")) network = network_config_from_json(j.at("network"));
    if (j.contains("train")) lightseg::apply_json(*this, j.at("train"));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
}

std::string EpochRecord::to_json_string() const { return to_json(*this).dump(); }

EpochRecord EpochRecord::from_json_string(const std::string& text) {
  try {
    return epoch_record_from_json(parse_json(text, "epoch record"));
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("epoch record: ") + e.what());
  }
}

}  // namespace lightseg
