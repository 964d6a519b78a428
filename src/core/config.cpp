#include "lightseg/config.h"
#include "core/json_io.h"
#include "core/json_number.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace lightseg {

using nlohmann::json;

std::string to_string(FELayerType t) {
  switch (t) {
    case FELayerType::FEB: return "FEB";
    case FELayerType::DAB: return "DAB";
    case FELayerType::ResNet: return "ResNet";
  }
  return "?";
}

FELayerType fe_layer_type_from_string(const std::string& s) {
  std::string u;
  for (char c : s) u += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (u == "FEB") return FELayerType::FEB;
  if (u == "DAB") return FELayerType::DAB;
  if (u == "RESNET" || u == "RES" || u == "BASIC") return FELayerType::ResNet;
  throw std::invalid_argument("unknown feature-enhancement layer type '" + s +
                              "' (expected FEB, DAB or ResNet)");
}

static void check_keys(const json& j, const std::vector<std::string>& allowed,
                       const std::string& where) {
  if (!j.is_object()) throw std::invalid_argument(where + " must be a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool ok = false;
    for (const auto& a : allowed) ok = ok || a == it.key();
    if (!ok) throw std::invalid_argument("unknown key '" + it.key() + "' in " + where);
  }
}

static json stage_to_json(const StageConfig& s) {
  return json{{"layers", s.layers}, {"type", to_string(s.type)}, {"dilations", s.dilations}};
}

static StageConfig stage_from_json(const json& j, StageConfig s, const std::string& where) {
  check_keys(j, {"layers", "type", "dilations"}, where);
  if (j.contains("layers")) s.layers = json_number<int>(j.at("layers"), where + ".layers");
  if (j.contains("type")) s.type = fe_layer_type_from_string(j.at("type").get<std::string>());
  if (j.contains("dilations")) {
    s.dilations = json_numbers<int>(j.at("dilations"), where + ".dilations");
  } else if (j.contains("layers") && static_cast<int>(s.dilations.size()) != s.layers) {
    // layer count changed without a schedule: repeat/trim the default schedule
    std::vector<int> d;
    for (int i = 0; i < s.layers; ++i)
      d.push_back(s.dilations.empty() ? 1 : s.dilations[std::min<size_t>(i, s.dilations.size() - 1)]);
    s.dilations = d;
  }
  return s;
}

void NetworkConfig::validate() const {
  auto positive = [](const char* name, long v) {
    if (v <= 0) throw std::invalid_argument(std::string("network.") + name + " must be > 0, got " + std::to_string(v));
  };
  positive("in_channels", in_channels);
  positive("c0", c0);
  positive("c1", c1);
  positive("c2", c2);
  positive("num_classes", num_classes);
  positive("stage1.layers", stage1.layers);
  positive("stage2.layers", stage2.layers);
  // Upper bounds: a typo (or a crafted weights header) must not ask for terabytes of weights.
  auto at_most = [](const char* name, long v, long max) {
    if (v > max)
      throw std::invalid_argument(std::string("network.") + name + " must be <= " + std::to_string(max) + ", got " +
                                  std::to_string(v));
  };
  at_most("in_channels", in_channels, 64);
  at_most("c0", c0, 4096);
  at_most("c1", c1, 4096);
  at_most("c2", c2, 4096);
  at_most("num_classes", num_classes, 255);  // class ids are 8-bit and 255 is "ignore"
  at_most("stage1.layers", stage1.layers, 64);
  at_most("stage2.layers", stage2.layers, 64);
  if (stage1.layers == stage2.layers)
    throw std::invalid_argument("C5.1: the two semantic branches must have different numbers of FE layers (stage1.layers = " +
                                std::to_string(stage1.layers) + ", stage2.layers = " + std::to_string(stage2.layers) + ")");
  const StageConfig* st[2] = {&stage1, &stage2};
  for (int i = 0; i < 2; ++i) {
    const auto& s = *st[i];
    std::string n = "network.stage" + std::to_string(i + 1);
    if (!s.dilations.empty() && static_cast<int>(s.dilations.size()) != s.layers)
      throw std::invalid_argument(n + ".dilations has " + std::to_string(s.dilations.size()) +
                                  " entries but " + n + ".layers is " + std::to_string(s.layers));
    for (int d : s.dilations)
      if (d <= 0 || d > 1024) throw std::invalid_argument(n + ".dilations must be in 1..1024, got " + std::to_string(d));
  }
  if (!(feb_ratio > 0.0 && feb_ratio <= 1.0))
    throw std::invalid_argument("network.feb_ratio must be in (0, 1], got " + std::to_string(feb_ratio));
  if (c1 < c0) throw std::invalid_argument("network.c1 (" + std::to_string(c1) + ") must be >= c0 (" + std::to_string(c0) + ")");
  if (c2 < c1) throw std::invalid_argument("network.c2 (" + std::to_string(c2) + ") must be >= c1 (" + std::to_string(c1) + ")");
  for (auto [name, c] : {std::pair<const char*, int>{"c1", c1}, {"c2", c2}}) {
    if ((stage1.type == FELayerType::DAB || stage2.type == FELayerType::DAB) && c % 2)
      throw std::invalid_argument(std::string("network.") + name + " must be even for DAB layers");
  }
}

json to_json(const NetworkConfig& n) {
  return json{{"in_channels", n.in_channels}, {"c0", n.c0}, {"c1", n.c1}, {"c2", n.c2},
              {"stage1", stage_to_json(n.stage1)}, {"stage2", stage_to_json(n.stage2)},
              {"feb_ratio", n.feb_ratio}, {"spatial_attention", n.spatial_attention},
              {"num_classes", n.num_classes}};
}

std::string NetworkConfig::to_json_string(int indent) const { return to_json(*this).dump(indent); }

bool NetworkConfig::operator==(const NetworkConfig& o) const { return to_json(*this) == to_json(o); }

json parse_json(const std::string& text, const std::string& what) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) throw std::invalid_argument(what + " is not valid JSON");
  return j;
}

NetworkConfig NetworkConfig::from_json_string(const std::string& text, const std::string& what) {
  return network_config_from_json(parse_json(text, what));
}

NetworkConfig network_config_from_json(const json& jin) {
  const json& j = jin.contains("network") ? jin.at("network") : jin;
  check_keys(j, {"in_channels", "c0", "c1", "c2", "stage1", "stage2", "feb_ratio",
                 "spatial_attention", "num_classes"}, "network config");
  NetworkConfig c;
  try {
    if (j.contains("in_channels")) c.in_channels = json_number<int>(j.at("in_channels"), "network.in_channels");
    if (j.contains("c0")) c.c0 = json_number<int>(j.at("c0"), "network.c0");
    if (j.contains("c1")) c.c1 = json_number<int>(j.at("c1"), "network.c1");
    if (j.contains("c2")) c.c2 = json_number<int>(j.at("c2"), "network.c2");
    if (j.contains("stage1")) c.stage1 = stage_from_json(j.at("stage1"), c.stage1, "network.stage1");
    if (j.contains("stage2")) c.stage2 = stage_from_json(j.at("stage2"), c.stage2, "network.stage2");
    if (j.contains("feb_ratio")) c.feb_ratio = j.at("feb_ratio").get<double>();
    if (j.contains("spatial_attention")) c.spatial_attention = j.at("spatial_attention").get<bool>();
    if (j.contains("num_classes")) c.num_classes = json_number<int>(j.at("num_classes"), "network.num_classes");
  } catch (const json::exception& e) {
    throw std::invalid_argument(std::string("network config: ") + e.what());
  }
  c.validate();
  return c;
}

json read_json_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open '" + path + "'");
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    throw std::runtime_error("'" + path + "' is not valid JSON: " + e.what());
  }
}

NetworkConfig NetworkConfig::from_file(const std::string& path) {
  try {
    return network_config_from_json(read_json_file(path));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
}

json to_json(const ModelMeta& m) {
  json pal = json::array();
  for (const auto& c : m.palette) pal.push_back({c[0], c[1], c[2]});
  json j{{"arch", m.arch}, {"classes", m.class_names}, {"palette", pal},
         {"mean", m.mean}, {"std", m.std}, {"ignore_index", m.ignore_index},
         {"dataset", m.dataset}};
  if (!m.int8_absmax.empty()) j["int8"] = json{{"calibration", m.int8_calibration}, {"absmax", m.int8_absmax}};
  return j;
}

static std::array<float, 3> three_floats(const json& v, const std::string& what) {
  const auto x = json_numbers<float>(v, what);
  if (x.size() != 3) throw std::invalid_argument(what + " must have 3 entries, got " + std::to_string(x.size()));
  return {x[0], x[1], x[2]};
}

std::string ModelMeta::to_json_string(int indent) const { return to_json(*this).dump(indent); }

ModelMeta ModelMeta::from_json_string(const std::string& text, const std::string& what) {
  return model_meta_from_json(parse_json(text, what));
}

ModelMeta model_meta_from_json(const json& j) {
  ModelMeta m;
  try {
    if (j.contains("arch")) m.arch = j.at("arch").get<std::string>();
    if (j.contains("classes")) m.class_names = j.at("classes").get<std::vector<std::string>>();
    if (j.contains("palette")) {
      m.palette.clear();
      for (const auto& c : j.at("palette")) {
        auto v = json_numbers<int>(c, "palette entry");
        if (v.size() != 3) throw std::invalid_argument("palette entries must be [r, g, b]");
        RGB rgb;
        for (int k = 0; k < 3; ++k) {
          if (v[k] < 0 || v[k] > 255) throw std::invalid_argument("palette values must be 0..255");
          rgb[k] = static_cast<uint8_t>(v[k]);
        }
        m.palette.push_back(rgb);
      }
    }
    if (j.contains("mean")) m.mean = three_floats(j.at("mean"), "mean");
    if (j.contains("std")) m.std = three_floats(j.at("std"), "std");
    for (float x : m.std)
      if (!(x > 0)) throw std::invalid_argument("std entries must be > 0 (the input is divided by them)");
    if (j.contains("ignore_index")) m.ignore_index = json_number<int>(j.at("ignore_index"), "ignore_index");
    if (j.contains("dataset")) m.dataset = j.at("dataset").get<std::string>();
    if (j.contains("int8")) {
      const json& q = j.at("int8");
      if (q.contains("calibration")) m.int8_calibration = q.at("calibration").get<std::string>();
      for (const auto& [name, v] : q.at("absmax").items()) {
        const float b = json_number<float>(v, "int8 absmax of " + name);
        if (!(b > 0) || !std::isfinite(b))
          throw std::invalid_argument("int8 absmax of " + name + " must be a finite number > 0");
        m.int8_absmax[name] = b;
      }
    }
  } catch (const json::exception& e) {
    throw std::invalid_argument(std::string("model metadata: ") + e.what());
  }
  return m;
}

ModelMeta ModelMeta::camvid() {
  ModelMeta m;
  m.dataset = "camvid";
  m.class_names = {"Sky", "Building", "Pole", "Road", "Sidewalk", "Tree",
                   "SignSymbol", "Fence", "Car", "Pedestrian", "Bicyclist"};
  m.palette = {{128, 128, 128}, {128, 0, 0}, {192, 192, 128}, {128, 64, 128},
               {60, 40, 222},   {128, 128, 0}, {192, 128, 128}, {64, 64, 128},
               {64, 0, 128},    {64, 64, 0},   {0, 128, 192}};
  m.ignore_index = 11;
  return m;
}

ModelMeta ModelMeta::cityscapes() {
  ModelMeta m;
  m.dataset = "cityscapes";
  m.class_names = {"road", "sidewalk", "building", "wall", "fence", "pole", "traffic light",
                   "traffic sign", "vegetation", "terrain", "sky", "person", "rider", "car",
                   "truck", "bus", "train", "motorcycle", "bicycle"};
  m.palette = {{128, 64, 128}, {244, 35, 232}, {70, 70, 70},   {102, 102, 156}, {190, 153, 153},
               {153, 153, 153}, {250, 170, 30}, {220, 220, 0},  {107, 142, 35},  {152, 251, 152},
               {70, 130, 180},  {220, 20, 60},  {255, 0, 0},    {0, 0, 142},     {0, 0, 70},
               {0, 60, 100},    {0, 80, 100},   {0, 0, 230},    {119, 11, 32}};
  m.ignore_index = 255;
  return m;
}

ModelMeta ModelMeta::generic(int n) {
  ModelMeta m;
  for (int i = 0; i < n; ++i) {
    m.class_names.push_back("class" + std::to_string(i));
    // bit-interleaved palette (as in PASCAL VOC): distinct colours for any n
    int r = 0, g = 0, b = 0, c = i;
    for (int k = 0; k < 8; ++k) {
      r |= ((c >> 0) & 1) << (7 - k);
      g |= ((c >> 1) & 1) << (7 - k);
      b |= ((c >> 2) & 1) << (7 - k);
      c >>= 3;
    }
    m.palette.push_back({static_cast<uint8_t>(r), static_cast<uint8_t>(g), static_cast<uint8_t>(b)});
  }
  return m;
}

void ModelMeta::check(int num_classes) const {
  if (static_cast<int>(class_names.size()) != num_classes)
    throw std::invalid_argument("the model has " + std::to_string(num_classes) + " classes but " +
                                std::to_string(class_names.size()) + " class names are given");
  if (static_cast<int>(palette.size()) != num_classes)
    throw std::invalid_argument("the model has " + std::to_string(num_classes) + " classes but the palette has " +
                                std::to_string(palette.size()) + " colours");
  for (float s : std)
    if (!(s > 0)) throw std::invalid_argument("normalisation std must be > 0");
}

}  // namespace lightseg
