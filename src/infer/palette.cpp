#include "lightseg/palette.h"

#include <stdexcept>

#include "lightseg/image_io.h"
#include "core/json_io.h"

namespace lightseg {

namespace {
// 256-entry RGB look-up table (ids beyond the palette: black) and, per id, whether it has a colour.
std::pair<torch::Tensor, torch::Tensor> palette_lut(const std::vector<RGB>& palette) {
  auto lut = torch::zeros({256, 3}, torch::kUInt8);
  auto has = torch::zeros({256}, torch::kBool);
  auto* l = lut.data_ptr<uint8_t>();
  auto* h = has.data_ptr<bool>();
  for (size_t i = 0; i < palette.size() && i < 256; ++i) {
    for (int c = 0; c < 3; ++c) l[i * 3 + c] = palette[i][c];
    h[i] = true;
  }
  return {lut, has};
}

torch::Tensor checked_ids(const torch::Tensor& labels) {
  if (!labels.defined() || labels.dim() != 2)
    throw std::invalid_argument("labels must be H×W, got " + (labels.defined() ? c10::str(labels.sizes()) : "none"));
  // ids outside 0..255 have no colour: map them to 255 (no palette has 256 colours)
  auto l = labels.to(torch::kCPU);
  if (l.scalar_type() != torch::kUInt8) l = l.clamp(0, 255).to(torch::kUInt8);
  return l.to(torch::kLong).flatten();
}
}  // namespace

torch::Tensor colorize(const torch::Tensor& labels, const std::vector<RGB>& palette) {
  auto ids = checked_ids(labels);
  auto [lut, has] = palette_lut(palette);
  return lut.index_select(0, ids).view({labels.size(0), labels.size(1), 3});
}

torch::Tensor overlay(const torch::Tensor& image, const torch::Tensor& labels, const std::vector<RGB>& palette,
                      double alpha) {
  if (!(alpha >= 0 && alpha <= 1)) throw std::invalid_argument("overlay alpha must be in [0, 1], got " + std::to_string(alpha));
  auto ids = checked_ids(labels);
  torch::Tensor img = image.dim() == 2 ? image.unsqueeze(2) : image;
  if (img.dim() != 3 || img.scalar_type() != torch::kUInt8)
    throw std::invalid_argument("overlay: image must be H×W×C uint8, got " + c10::str(image.sizes()));
  if (img.size(0) != labels.size(0) || img.size(1) != labels.size(1))
    throw std::invalid_argument("overlay: image is " + std::to_string(img.size(1)) + "×" + std::to_string(img.size(0)) +
                                " but the labels are " + std::to_string(labels.size(1)) + "×" +
                                std::to_string(labels.size(0)));
  const int64_t c = img.size(2);
  if (c == 1) img = img.expand({img.size(0), img.size(1), 3});
  else if (c == 4) img = img.narrow(2, 0, 3);
  else if (c != 3) throw std::invalid_argument("overlay: image must have 1, 3 or 4 channels, got " + std::to_string(c));
  auto [lut, has] = palette_lut(palette);
  const int64_t H = labels.size(0), W = labels.size(1);
  auto colour = lut.index_select(0, ids).view({H, W, 3}).to(torch::kFloat32);
  auto a = has.index_select(0, ids).view({H, W, 1}).to(torch::kFloat32) * static_cast<float>(alpha);
  auto base = img.to(torch::kCPU).to(torch::kFloat32);
  return (base + a * (colour - base)).round_().clamp_(0, 255).to(torch::kUInt8).contiguous();
}

std::vector<LegendEntry> legend(const torch::Tensor& labels, const ModelMeta& meta) {
  auto ids = checked_ids(labels);
  auto counts = torch::bincount(ids, {}, 256);
  const auto* n = counts.data_ptr<int64_t>();
  const double total = static_cast<double>(std::max<int64_t>(ids.numel(), 1));
  std::vector<LegendEntry> out;
  for (size_t i = 0; i < meta.class_names.size() && i < 256; ++i) {
    LegendEntry e;
    e.id = static_cast<int>(i);
    e.name = meta.class_names[i];
    if (i < meta.palette.size()) e.color = meta.palette[i];
    e.pixels = n[i];
    e.share = n[i] / total;
    out.push_back(e);
  }
  return out;
}

nlohmann::json to_json(const std::vector<LegendEntry>& entries) {
  auto j = nlohmann::json::array();
  for (const auto& e : entries)
    j.push_back({{"id", e.id}, {"name", e.name}, {"color", {e.color[0], e.color[1], e.color[2]}},
                 {"pixels", e.pixels}, {"share", e.share}});
  return j;
}

Render render_from_string(const std::string& name) {
  if (name == "ids") return Render::Ids;
  if (name == "color") return Render::Color;
  if (name == "overlay") return Render::Overlay;
  throw std::invalid_argument("unknown rendering '" + name + "' (expected ids, color or overlay)");
}

std::string render(const torch::Tensor& image, const torch::Tensor& labels, const std::vector<RGB>& palette,
                   Render what, double alpha) {
  switch (what) {
    case Render::Ids: return encode_png(labels.to(torch::kUInt8));
    case Render::Color: return encode_png(colorize(labels, palette));
    case Render::Overlay: return encode_png(overlay(image, labels, palette, alpha));
  }
  throw std::invalid_argument("render: unknown rendering");
}

}  // namespace lightseg
