// lightseg: configuration of the network (docs/NETWORK.md defaults) and the model's metadata.
//
// A configuration is a small JSON file. Every key is optional; missing keys keep the
// defaults below, unknown keys are an error (so typos do not silently fall back).
//
//   { "network": { "c0": 32, "c1": 64, "c2": 128,
//                  "stage1": {"layers": 3, "type": "FEB", "dilations": [2,2,2]},
//                  "stage2": {"layers": 6, "type": "FEB", "dilations": [4,4,8,8,16,16]},
//                  "feb_ratio": 0.5, "spatial_attention": true, "num_classes": 11 } }
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace lightseg {

// C4: a feature-enhancement layer is a DAB, a FEB or a ResNet basic block.
enum class FELayerType { FEB, DAB, ResNet };
std::string to_string(FELayerType t);
FELayerType fe_layer_type_from_string(const std::string& s);

// C3: one semantic branch (downsampling, FE layers, concat, pointwise conv).
struct StageConfig {
  int layers = 3;                 // C3.2: number of FE layers
  FELayerType type = FELayerType::FEB;
  std::vector<int> dilations;     // one per layer (empty: dilation 1 everywhere)
};

struct NetworkConfig {
  int in_channels = 3;
  int c0 = 32;    // C1.1: channels of F1 (H/2)
  int c1 = 64;    // C1.3: channels of M1/A1 (H/4)
  int c2 = 128;   // C1.5: channels of M2/A2 (H/8)
  StageConfig stage1{3, FELayerType::FEB, {2, 2, 2}};
  StageConfig stage2{6, FELayerType::FEB, {4, 4, 8, 8, 16, 16}};
  double feb_ratio = 0.5;          // FEB: Cm = round(C * feb_ratio)
  bool spatial_attention = true;   // C6.1
  int num_classes = 11;            // C1.11

  // Throws std::invalid_argument naming the offending key and value.
  void validate() const;
  // The JSON text of the "network" object (indent < 0: one line).
  std::string to_json_string(int indent = -1) const;
  // Reads the "network" object (or the whole object when it has no "network" key) of JSON
  // text, validated; `what` names the text in errors (std::invalid_argument).
  static NetworkConfig from_json_string(const std::string& text, const std::string& what = "network config");
  static NetworkConfig from_file(const std::string& path);
  bool operator==(const NetworkConfig& o) const;
  bool operator!=(const NetworkConfig& o) const { return !(*this == o); }
};

using RGB = std::array<uint8_t, 3>;

// What travels with the weights besides the tensors: classes, palette, normalisation.
struct ModelMeta {
  std::string arch = "lightseg";   // the architecture name stored in every weights file
  std::vector<std::string> class_names;
  std::vector<RGB> palette;
  // Input normalisation on 0..255 RGB: (x - mean) / std.
  std::array<float, 3> mean{123.675f, 116.28f, 103.53f};
  std::array<float, 3> std{58.395f, 57.12f, 57.375f};
  int ignore_index = 255;          // label value ignored in loss and metrics
  std::string dataset;             // free text, e.g. "camvid"
  // int8 inference (EngineOptions::dtype = kQInt8): a bound of |x| for the input of every dense
  // convolution, by the name of the operation of the folded network that produces it
  // (`lightseg calibrate` measures them on training images); empty: not calibrated.
  // `int8_calibration` says how ("32 images of camvid train, 99.99th percentile of |x|").
  std::map<std::string, float> int8_absmax;
  std::string int8_calibration;

  std::string to_json_string(int indent = -1) const;
  static ModelMeta from_json_string(const std::string& text, const std::string& what = "model meta");
  // CamVid's 11 classes and the palette everyone uses.
  static ModelMeta camvid();
  // Cityscapes' 19 train classes.
  static ModelMeta cityscapes();
  // Generic names "class0".. and a distinct palette for n classes.
  static ModelMeta generic(int num_classes);
  // Throws when the class/colour count differs from num_classes (shows both numbers).
  void check(int num_classes) const;
};

}  // namespace lightseg
