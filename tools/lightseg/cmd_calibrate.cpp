// lightseg calibrate: an int8 calibration of weights (lightseg::calibrate_int8) measured on
// training images and written with a copy of the weights; `--precision int8` then runs them.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "args.h"
#include "lightseg/engine.h"
#include "lightseg/runtime.h"
#include "lightseg/training_data.h"
#include "lightseg/weights.h"

namespace lightseg::cli {

void add_calibrate(CLI::App& app, Args& a) {
  auto* sub = app.add_subcommand(
      "calibrate", "Calibrate weights for int8 inference on training images: writes the weights with the calibration");
  add_options(sub, a, {Opt::Data, Opt::Dataset, Opt::Split, Opt::Weights, Opt::Threads});
  static std::string out;
  static int count = 32;
  static double quantile = 0.9999;
  sub->add_option("--out", out, "Weights file to write: the input weights and their int8 calibration")->required();
  sub->add_option("--images", count, "Images to measure, spread evenly over the split")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  sub->add_option("--quantile", quantile,
                  "Bound of |activation| taken per image (1: its maximum); the largest over the images is kept")
      ->check(CLI::Range(0.9, 1.0))
      ->capture_default_str();
  sub->callback([&a, sub]() {
    if (!sub->count("--split")) a.split = "train";  // calibrate on training images unless told otherwise
    init_runtime(a.threads);
    const std::string wpath = resolve_weights(a.weights);
    WeightsFile file = read_weights(wpath);  // everything it holds is written back, with the calibration
    ModelMeta meta;
    Network net = load_network(wpath, &meta);
    auto data = SegDataset::open(a.dataset, a.data, a.split);
    if (data.size() == 0) throw std::invalid_argument(a.dataset + "/" + a.split + " has no images");
    const size_t n = std::min(static_cast<size_t>(count), data.size());
    std::vector<torch::Tensor> images;
    for (size_t k = 0; k < n; ++k) {
      const size_t i = k * data.size() / n;
      images.push_back(data.load_image(i).permute({2, 0, 1}).unsqueeze(0).to(torch::kFloat32));
    }
    std::fprintf(stderr, "calibrate: measuring %zu images of %s/%s ...\n", n, a.dataset.c_str(), a.split.c_str());
    char how[256];
    std::snprintf(how, sizeof how, "%zu images of %s %s, the %g quantile of |x| per image, the largest kept", n,
                  a.dataset.c_str(), a.split.c_str(), quantile);
    calibrate_int8(net, meta, images, how, quantile);
    file.meta = meta;
    write_weights(out, file);
    float lo = 1e30f, hi = 0.f;
    for (const auto& [name, b] : meta.int8_absmax) {
      lo = std::min(lo, b);
      hi = std::max(hi, b);
    }
    std::printf("calibrate: %zu convolution inputs bounded (|x| %.3g .. %.3g) on %s\nwrote %s (run it with --precision int8)\n",
                meta.int8_absmax.size(), lo, hi, how, out.c_str());
  });
}

}  // namespace lightseg::cli
