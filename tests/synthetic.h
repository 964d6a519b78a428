// Tiny synthetic datasets for tests: simple shapes on a background.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "lightseg/image_io.h"
#include "lightseg/train.h"
#include "test_paths.h"

namespace lightseg::fixtures {

inline std::filesystem::path temp_dir(const std::string& tag) {
  auto d = std::filesystem::temp_directory_path() /
           ("lightseg_" + tag + "_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// One image + label: class 0 background, 1 a disc, 2 a rectangle; colours per class + noise.
inline std::pair<torch::Tensor, torch::Tensor> shapes_sample(int64_t h, int64_t w, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> ry(0, h - 1), rx(0, w - 1);
  auto lab = torch::zeros({h, w}, torch::kUInt8);
  auto yy = torch::arange(h).view({h, 1}).expand({h, w});
  auto xx = torch::arange(w).view({1, w}).expand({h, w});
  const int64_t cy = ry(rng), cx = rx(rng), r = std::max<int64_t>(4, h / 5);
  lab.masked_fill_((yy - cy) * (yy - cy) + (xx - cx) * (xx - cx) < r * r, 1);
  const int64_t y0 = ry(rng) / 2, x0 = rx(rng) / 2;
  lab.masked_fill_((yy >= y0) & (yy < y0 + h / 3) & (xx >= x0) & (xx < x0 + w / 3), 2);
  const float colours[3][3] = {{40, 120, 40}, {220, 60, 60}, {60, 60, 220}};
  auto img = torch::empty({h, w, 3}, torch::kFloat32);
  for (int c = 0; c < 3; ++c) {
    auto ch = torch::full({h, w}, colours[0][c]);
    ch.masked_fill_(lab == 1, colours[1][c]);
    ch.masked_fill_(lab == 2, colours[2][c]);
    img.select(2, c).copy_(ch);
  }
  torch::manual_seed(seed);
  img = (img + torch::randn({h, w, 3}) * 12).clamp(0, 255).round().to(torch::kUInt8);
  return {img, lab};
}

// A list dataset: DIR/{train,val}.txt, DIR/dataset.json, images/, labels/.
inline std::filesystem::path make_shapes_dataset(const std::filesystem::path& dir, int n_train, int n_val,
                                                 int64_t h = 64, int64_t w = 64) {
  namespace fs = std::filesystem;
  fs::create_directories(dir / "images");
  fs::create_directories(dir / "labels");
  std::ofstream(dir / "dataset.json")
      << R"({"name": "shapes", "classes": ["background", "disc", "box"], "palette": [[0,0,0],[255,0,0],[0,0,255]], "ignore_index": 255})";
  auto split = [&](const std::string& name, int n, uint64_t base) {
    std::ofstream list(dir / (name + ".txt"));
    for (int i = 0; i < n; ++i) {
      auto [img, lab] = shapes_sample(h, w, base + i);
      std::string stem = name + "_" + std::to_string(i);
      write_png((dir / "images" / (stem + ".png")).string(), img);
      write_png((dir / "labels" / (stem + ".png")).string(), lab);
      list << "images/" << stem << ".png labels/" << stem << ".png\n";
    }
  };
  split("train", n_train, 1000);
  split("val", n_val, 5000);
  return dir;
}

// Training options for a tiny list dataset: a small network, batch 4, 64x64 crops.
inline TrainOptions tiny_train_options(const std::filesystem::path& data, const std::filesystem::path& out) {
  TrainOptions o;
  o.data = data.string();
  o.dataset = "list";
  o.out_dir = out.string();
  o.batch = 4;
  o.crop_h = o.crop_w = 64;
  o.scale_min = 0.75;
  o.scale_max = 1.25;
  o.lr = 5e-3;
  o.warmup_epochs = 0.5;
  o.workers = 2;
  o.network.c0 = 16;
  o.network.c1 = 32;
  o.network.c2 = 48;
  return o;
}

inline std::string camvid_dir() {
  const char* env = std::getenv("LIGHTSEG_CAMVID");
  std::string d = env ? env : std::string(LIGHTSEG_SOURCE_DIR) + "/../shared/data/camvid";
  return std::filesystem::exists(d + "/train.txt") ? d : std::string();
}

}  // namespace lightseg::fixtures
