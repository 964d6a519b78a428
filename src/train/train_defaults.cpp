#include "train/train_defaults.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "lightseg/image_io.h"
#include "lightseg/file_io.h"

namespace lightseg {

namespace {
std::string hxw(int64_t h, int64_t w) { return std::to_string(h) + "x" + std::to_string(w); }
}  // namespace

std::vector<std::pair<int64_t, int64_t>> sample_image_sizes(const SegDataset& ds, size_t at_most) {
  std::vector<std::pair<int64_t, int64_t>> sizes;
  const size_t n = ds.size(), k = std::min(n, std::max<size_t>(1, at_most));
  for (size_t j = 0; j < k; ++j) {
    const size_t i = k == 1 ? 0 : j * (n - 1) / (k - 1);
    const std::string path = ds.sample(i).image;
    const std::string bytes = read_file(path);
    auto [w, h] = decode_image_size(bytes.data(), bytes.size(), path);
    sizes.emplace_back(h, w);
  }
  return sizes;
}

CropChoice choose_crop(const TrainOptions& o, const std::vector<std::pair<int64_t, int64_t>>& sizes, size_t images) {
  CropChoice c;
  const std::string sampled = sizes.size() == images ? "all " + std::to_string(images) + " images"
                                                     : std::to_string(sizes.size()) + " of " + std::to_string(images) +
                                                           " images sampled";
  if (o.crop_h > 0 && o.crop_w > 0) {
    c.h = o.crop_h;
    c.w = o.crop_w;
    c.origin = o.crop_origin.empty() ? "set" : o.crop_origin;
    const bool fits_one = std::any_of(sizes.begin(), sizes.end(), [&](const auto& s) { return c.h <= s.first && c.w <= s.second; });
    if (!sizes.empty() && !fits_one) {
      int64_t mh = 0, mw = 0;
      for (const auto& s : sizes) mh = std::max(mh, s.first), mw = std::max(mw, s.second);
      TrainOptions unset = o;
      unset.crop_h = unset.crop_w = 0;
      const CropChoice d = choose_crop(unset, sizes, images);
      c.warning = "warning: the crop " + hxw(c.h, c.w) + " (" + c.origin + ") is larger than every training image (largest " +
                  hxw(mh, mw) + ", " + sampled + "): most of each crop is padding; leave the crop unset to follow the "
                  "images (" + hxw(d.h, d.w) + " here)";
    }
    return c;
  }
  if (sizes.empty()) throw std::invalid_argument("train: no training image to take the crop from");
  int64_t nh = sizes[0].first, nw = sizes[0].second;
  for (const auto& s : sizes) nh = std::min(nh, s.first), nw = std::min(nw, s.second);
  auto side = [](int64_t image, int64_t cap) { return std::max<int64_t>(32, std::min(image, cap) / 8 * 8); };
  c.h = side(nh, kDefaultCropH);
  c.w = side(nw, kDefaultCropW);
  c.origin = "from the data: smallest image " + hxw(nh, nw) + " of " + sampled + ", at most " +
             hxw(kDefaultCropH, kDefaultCropW) + ", a multiple of 8";
  return c;
}

std::string describe_lr_schedule(const TrainOptions& o) {
  char b[200];
  std::snprintf(b, sizeof b, "%s lr %.3g, poly %.3g after %.3g warm-up epoch%s from %.3gx, weight decay %.3g",
                o.optimizer.c_str(), o.lr, o.poly_power, o.warmup_epochs, o.warmup_epochs == 1 ? "" : "s", o.warmup_start,
                o.weight_decay);
  return b;
}

int64_t validations_left(int from, int epochs, int val_every) {
  if (val_every <= 0) return 0;
  int64_t n = 0;
  for (int e = std::max(1, from); e <= epochs; ++e) n += e % val_every == 0 || e == epochs;
  return n;
}

std::string format_duration(double s) {
  if (!(s >= 0) || s > 1e8) return "?";
  const long t = std::lround(s), h = t / 3600, m = t / 60 % 60, sec = t % 60;
  auto two = [](long v) { return (v < 10 ? "0" : "") + std::to_string(v); };
  return h ? std::to_string(h) + "h" + two(m) + "m" : m ? std::to_string(m) + "m" + two(sec) + "s" : std::to_string(sec) + "s";
}

}  // namespace lightseg
