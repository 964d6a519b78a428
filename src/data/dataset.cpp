#include "lightseg/dataset.h"
#include "data/two_column_file.h"
#include "core/json_io.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "lightseg/image_io.h"

namespace lightseg {

namespace fs = std::filesystem;

static std::vector<Sample> read_pairs(const fs::path& root, const fs::path& list) {
  std::vector<Sample> out;
  auto resolve = [&](const std::string& p) {
    fs::path q(p);
    if (q.is_absolute()) return q.string();
    return (root / q).string();
  };
  for_each_two_column_line(list.string(), "image label", "cannot open list file '" + list.string() + "'",
                           [&](const std::string& a, const std::string& b) { out.push_back({resolve(a), resolve(b)}); });
  return out;
}

static void require_nonempty(const std::vector<Sample>& s, const std::string& what) {
  if (s.empty()) throw std::runtime_error("no samples found for " + what);
}

static std::vector<std::string> split_names(const std::string& split) {
  std::vector<std::string> out;
  std::stringstream ss(split);
  std::string s;
  while (std::getline(ss, s, ','))
    if (!s.empty()) out.push_back(s);
  return out;
}

// Whether the folder has a split of that name of its own (a list file or the layout's folder).
static bool has_split(const std::string& kind, const fs::path& r, const std::string& split) {
  if (kind == "cityscapes") return fs::is_directory(r / "leftImg8bit" / split);
  if (fs::exists(r / (split + ".txt"))) return true;
  return kind == "camvid" && fs::is_directory(r / split);
}

SegDataset SegDataset::open(const std::string& kind, const std::string& root, const std::string& split) {
  if (!fs::is_directory(root)) throw std::runtime_error("dataset folder '" + root + "' does not exist");
  if (kind != "camvid" && kind != "cityscapes" && kind != "list")
    throw std::invalid_argument("unknown dataset kind '" + kind + "' (expected camvid, cityscapes or list)");
  std::vector<std::string> names = split_names(split);
  if (names.empty()) throw std::invalid_argument("empty split name");
  // "trainval" is train + val unless the folder has a split of that name (the peers' protocol
  // for CamVid: 367 + 101 images).
  if (names.size() == 1 && names[0] == "trainval" && !has_split(kind, root, "trainval")) names = {"train", "val"};
  auto one = [&](const std::string& s) {
    if (kind == "camvid") return camvid(root, s);
    if (kind == "cityscapes") return cityscapes(root, s);
    return list(root, s);
  };
  SegDataset d = one(names[0]);
  for (size_t i = 1; i < names.size(); ++i) {
    if (std::find(names.begin(), names.begin() + i, names[i]) != names.begin() + i)
      throw std::invalid_argument("split '" + names[i] + "' named twice in '" + split + "'");
    SegDataset more = one(names[i]);
    d.samples_.insert(d.samples_.end(), more.samples_.begin(), more.samples_.end());
  }
  return d;
}

SegDataset SegDataset::camvid(const std::string& root, const std::string& split) {
  SegDataset d;
  d.kind_ = "camvid";
  d.root_ = root;
  d.meta_ = ModelMeta::camvid();
  fs::path r(root);
  if (fs::exists(r / (split + ".txt"))) {
    d.samples_ = read_pairs(r, r / (split + ".txt"));
  } else {
    fs::path img = r / split, ann = r / (split + "annot");
    if (!fs::is_directory(img) || !fs::is_directory(ann))
      throw std::runtime_error("CamVid layout not found: need '" + img.string() + "' and '" + ann.string() +
                               "' (or '" + (r / (split + ".txt")).string() + "')");
    std::vector<fs::path> files;
    for (auto& e : fs::directory_iterator(img))
      if (e.is_regular_file() && e.path().extension() == ".png") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (auto& f : files) d.samples_.push_back({f.string(), (ann / f.filename()).string()});
  }
  require_nonempty(d.samples_, "CamVid split '" + split + "' in '" + root + "'");
  d.lut_.fill(-1);
  for (int i = 0; i < 11; ++i) d.lut_[i] = i;
  d.lut_[11] = kIgnore;  // void
  d.lut_[255] = kIgnore;
  return d;
}

SegDataset SegDataset::cityscapes(const std::string& root, const std::string& split) {
  SegDataset d;
  d.kind_ = "cityscapes";
  d.root_ = root;
  d.meta_ = ModelMeta::cityscapes();
  fs::path img = fs::path(root) / "leftImg8bit" / split, gt = fs::path(root) / "gtFine" / split;
  if (!fs::is_directory(img) || !fs::is_directory(gt))
    throw std::runtime_error("Cityscapes layout not found: need '" + img.string() + "' and '" + gt.string() + "'");
  std::vector<fs::path> files;
  for (auto& e : fs::recursive_directory_iterator(img)) {
    const std::string n = e.path().filename().string();
    const std::string suffix = "_leftImg8bit.png";
    if (e.is_regular_file() && n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
      files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (auto& f : files) {
    std::string n = f.filename().string();
    std::string stem = n.substr(0, n.size() - std::string("_leftImg8bit.png").size());
    fs::path city = f.parent_path().filename();
    d.samples_.push_back({f.string(), (gt / city / (stem + "_gtFine_labelIds.png")).string()});
  }
  require_nonempty(d.samples_, "Cityscapes split '" + split + "' in '" + root + "'");
  // labelIds 0..33 → trainIds (cityscapesScripts' labels.py); others are ignored.
  d.lut_.fill(-1);
  for (int i = 0; i <= 33; ++i) d.lut_[i] = kIgnore;
  const int ids[19] = {7, 8, 11, 12, 13, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 31, 32, 33};
  for (int t = 0; t < 19; ++t) d.lut_[ids[t]] = t;
  d.lut_[255] = kIgnore;
  return d;
}

SegDataset SegDataset::list(const std::string& root, const std::string& split) {
  SegDataset d;
  d.kind_ = "list";
  d.root_ = root;
  fs::path r(root);
  fs::path meta = r / "dataset.json";
  if (!fs::exists(meta))
    throw std::runtime_error("list dataset: '" + meta.string() +
                             "' is missing (it names \"classes\", \"palette\" and \"ignore_index\")");
  auto j = read_json_file(meta.string());
  try {
    d.meta_ = model_meta_from_json(j);
  } catch (const std::exception& e) {
    throw std::runtime_error(meta.string() + ": " + e.what());
  }
  d.meta_.dataset = j.value("name", std::string("custom"));
  const int k = static_cast<int>(d.meta_.class_names.size());
  if (k < 1 || k > 255) throw std::runtime_error(meta.string() + ": \"classes\" must list 1..255 names");
  if (d.meta_.palette.empty()) d.meta_.palette = ModelMeta::generic(k).palette;
  d.meta_.check(k);
  const int ignore = d.meta_.ignore_index;
  if (ignore < 0 || ignore > 255 || ignore < k)
    throw std::runtime_error(meta.string() + ": ignore_index must be in " + std::to_string(k) + "..255, got " +
                             std::to_string(ignore));
  d.samples_ = read_pairs(r, r / (split + ".txt"));
  require_nonempty(d.samples_, "list split '" + split + "' in '" + root + "'");
  d.lut_.fill(-1);
  for (int i = 0; i < k; ++i) d.lut_[i] = i;
  d.lut_[ignore] = kIgnore;
  d.meta_.ignore_index = kIgnore;
  return d;
}

torch::Tensor SegDataset::load_image(size_t i) const {
  torch::Tensor img = read_image_file(samples_.at(i).image);
  if (img.size(2) == 3) return img;
  return to_rgb_chw_float(img).permute({1, 2, 0}).to(torch::kUInt8).contiguous();
}

torch::Tensor SegDataset::map_label(const torch::Tensor& raw, const std::string& what) const {
  auto counts = torch::bincount(raw.reshape(-1).to(torch::kLong), {}, 256);
  auto* c = counts.data_ptr<int64_t>();
  std::array<uint8_t, 256> table{};
  for (int v = 0; v < 256; ++v) {
    if (c[v] > 0 && lut_[v] < 0)
      throw std::runtime_error(what + ": label value " + std::to_string(v) + " is neither a class id (0.." +
                               std::to_string(num_classes() - 1) + ") nor the ignore id");
    table[v] = static_cast<uint8_t>(lut_[v] < 0 ? kIgnore : lut_[v]);
  }
  auto t = torch::from_blob(table.data(), {256}, torch::kUInt8);
  return t.index({raw.to(torch::kLong)}).contiguous();
}

torch::Tensor SegDataset::load_label(size_t i) const {
  const auto& p = samples_.at(i).label;
  return map_label(read_label_file(p), "'" + p + "'");
}

std::pair<torch::Tensor, torch::Tensor> SegDataset::load(size_t i) const {
  torch::Tensor img = load_image(i), lab = load_label(i);
  if (img.size(0) != lab.size(0) || img.size(1) != lab.size(1))
    throw std::runtime_error("'" + samples_[i].label + "' is " + std::to_string(lab.size(1)) + "x" +
                             std::to_string(lab.size(0)) + " but its image '" + samples_[i].image + "' is " +
                             std::to_string(img.size(1)) + "x" + std::to_string(img.size(0)));
  return {img, lab};
}

std::vector<int64_t> SegDataset::class_histogram() const {
  std::vector<int64_t> h(num_classes(), 0);
  for (size_t i = 0; i < size(); ++i) {
    auto c = torch::bincount(load_label(i).reshape(-1).to(torch::kLong), {}, 256);
    for (int k = 0; k < num_classes(); ++k) h[k] += c[k].item<int64_t>();
  }
  return h;
}

std::vector<float> enet_class_weights(const std::vector<int64_t>& counts, double c) {
  double total = 0;
  for (auto n : counts) total += static_cast<double>(n);
  std::vector<float> w;
  for (auto n : counts) {
    double p = total > 0 ? static_cast<double>(n) / total : 0.0;
    w.push_back(static_cast<float>(1.0 / std::log(c + p)));
  }
  return w;
}

std::vector<float> median_frequency_class_weights(const std::vector<int64_t>& counts) {
  double total = 0;
  for (auto n : counts) total += static_cast<double>(n);
  std::vector<double> p;
  for (auto n : counts)
    if (n > 0) p.push_back(static_cast<double>(n) / total);
  if (p.empty()) return std::vector<float>(counts.size(), 1.0f);
  std::sort(p.begin(), p.end());
  const size_t m = p.size();
  const double median = m % 2 ? p[m / 2] : 0.5 * (p[m / 2 - 1] + p[m / 2]);
  std::vector<float> w;
  for (auto n : counts) w.push_back(n > 0 ? static_cast<float>(median / (static_cast<double>(n) / total)) : 0.0f);
  return w;
}

std::vector<float> class_weights_from_counts(const std::vector<int64_t>& counts, const std::string& method) {
  if (method == "enet") return enet_class_weights(counts);
  if (method == "median") return median_frequency_class_weights(counts);
  throw std::invalid_argument("class_weighting must be enet or median, got '" + method + "'");
}

}  // namespace lightseg
