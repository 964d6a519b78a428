// lightseg: showing label maps — colour masks, overlays and the legend that explains them.
//
//   auto mask = lightseg::colorize(labels, meta.palette);           // H×W×3 uint8
//   auto over = lightseg::overlay(image, labels, meta.palette, 0.5); // image blended with mask
//   for (auto& e : lightseg::legend(labels, meta)) ...               // name, colour, pixel share
//   std::string png = lightseg::render(image, labels, meta.palette, lightseg::Render::Overlay);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "lightseg/config.h"

namespace lightseg {

// labels: H×W uint8 (or any integer type) class ids → H×W×3 uint8 colours. Ids without a
// colour (e.g. 255, the ignore id) are black.
torch::Tensor colorize(const torch::Tensor& labels, const std::vector<RGB>& palette);

// image: H×W×{1,3,4} uint8 (or H×W) of the labels' size → H×W×3 uint8:
// (1 − alpha)·image + alpha·colour where the id has a colour, the image elsewhere.
// alpha ∈ [0, 1] (throws otherwise, and when the sizes differ, showing both).
torch::Tensor overlay(const torch::Tensor& image, const torch::Tensor& labels, const std::vector<RGB>& palette,
                      double alpha = 0.5);

// What `segment` writes and `serve` answers: the label ids (8-bit PNG, values = class ids),
// the colour mask, or the overlay on the image.
enum class Render { Ids, Color, Overlay };
// "ids", "color", "overlay" → Render; anything else throws std::invalid_argument naming it.
Render render_from_string(const std::string& name);
// The PNG bytes of one rendering (image is used by Overlay only; see overlay for alpha).
std::string render(const torch::Tensor& image, const torch::Tensor& labels, const std::vector<RGB>& palette,
                   Render what, double alpha = 0.5);

struct LegendEntry {
  int id = 0;
  std::string name;
  RGB color{};
  int64_t pixels = 0;  // pixels labelled with this class
  double share = 0;    // pixels / all pixels
};
// One entry per class of the model, in class-id order.
std::vector<LegendEntry> legend(const torch::Tensor& labels, const ModelMeta& meta);

}  // namespace lightseg
