// The GPU trainer's parts, run on the CPU device: the batched augmentation against the
// per-sample one, the data cache, and the foreach Adam against torch::optim's.
#include <gtest/gtest.h>

#include <limits>
#include <random>

#include "data/batch_augment.h"
#include "data/data_cache.h"
#include "data/transforms.h"
#include "lightseg/dataset.h"
#include "synthetic.h"
#include "train/foreach_adam.h"

using namespace lightseg;

namespace {

ModelMeta test_meta() {
  ModelMeta m;
  m.mean = {100.f, 110.f, 120.f};
  m.std = {50.f, 60.f, 70.f};
  return m;
}

// n shapes samples of h×w: images N×3×H×W uint8, labels N×H×W uint8 (with some ignore pixels).
std::pair<torch::Tensor, torch::Tensor> shapes(int n, int64_t h, int64_t w) {
  std::vector<torch::Tensor> xs, ys;
  for (int i = 0; i < n; ++i) {
    auto [img, lab] = fixtures::shapes_sample(h, w, 100 + i);
    lab.narrow(0, 0, 2).fill_(255);
    xs.push_back(img.permute({2, 0, 1}));
    ys.push_back(lab);
  }
  return {torch::stack(xs).contiguous(), torch::stack(ys).contiguous()};
}

struct Compared {
  bool labels_equal = true;
  double image_max = 0, image_mean = 0;  // |batched − per-sample| in normalised units
};

// The batch of `samples` both ways, with the same draws (seeded per sample).
Compared compare(const AugmentOptions& o, int trials) {
  const auto meta = test_meta();
  auto [images, labels] = shapes(6, 48, 64);
  Compared c;
  for (int t = 0; t < trials; ++t) {
    std::vector<int64_t> idx{t % 6, (t + 3) % 6, (t + 5) % 6};
    std::vector<AugmentDraw> draws;
    std::vector<torch::Tensor> xs, ys;
    for (size_t k = 0; k < idx.size(); ++k) {
      const uint64_t seed = 1000 * t + k;
      std::mt19937_64 r1(seed), r2(seed);
      draws.push_back(draw_augment(o, 48, 64, r1));
      auto [x, y] = augment(images[idx[k]].to(torch::kFloat32), labels[idx[k]], o, meta.mean, r2);
      xs.push_back(normalize(x, meta));
      ys.push_back(y.to(torch::kLong));
    }
    auto [bx, by] = augment_batch(images, labels, idx, draws, o, meta);
    auto x = torch::stack(xs), y = torch::stack(ys);
    EXPECT_EQ(bx.sizes(), x.sizes());
    EXPECT_EQ(by.scalar_type(), torch::kLong);
    c.labels_equal = c.labels_equal && torch::equal(by, y);
    auto d = (bx - x).abs();
    c.image_max = std::max(c.image_max, d.max().item<double>());
    c.image_mean = std::max(c.image_mean, d.mean().item<double>());
  }
  return c;
}

}  // namespace

TEST(BatchAugment, UnscaledCropsAndFlipsAreThePerSampleOnes) {
  AugmentOptions o;
  o.crop_h = 40;
  o.crop_w = 56;
  o.scale_min = o.scale_max = 1.0;
  auto c = compare(o, 12);
  EXPECT_TRUE(c.labels_equal);
  EXPECT_LT(c.image_max, 1e-3);
}

TEST(BatchAugment, ScaledAndPaddedLabelsAreExactAndImagesClose) {
  AugmentOptions o;
  o.crop_h = 56;  // larger than some scaled images: padding with the mean colour and 255
  o.crop_w = 72;
  o.scale_min = 0.6;
  o.scale_max = 1.8;
  auto c = compare(o, 16);
  EXPECT_TRUE(c.labels_equal);
  EXPECT_LT(c.image_max, 0.02);  // bilinear weights to float rounding, in normalised units
  EXPECT_LT(c.image_mean, 1e-3);
}

TEST(BatchAugment, ColourJitterIsThePerSampleOne) {
  AugmentOptions o;
  o.crop_h = 40;
  o.crop_w = 56;
  o.scale_min = 0.8;
  o.scale_max = 1.3;
  o.jitter = 0.3;
  auto c = compare(o, 12);
  EXPECT_TRUE(c.labels_equal);
  EXPECT_LT(c.image_max, 0.02);
}

TEST(BatchAugment, BlurAndNoiseAreThePerSampleOnes) {
  AugmentOptions o;
  o.crop_h = 40;
  o.crop_w = 56;
  o.scale_min = 0.8;
  o.scale_max = 1.3;
  o.jitter = 0.3;
  o.blur = 0.5;
  o.noise = 10;
  auto c = compare(o, 12);
  EXPECT_TRUE(c.labels_equal);
  EXPECT_LT(c.image_max, 0.02);
}

TEST(BatchAugment, PaddingIsIgnoreAndTheMeanColourAndFlipsMirror) {
  const auto meta = test_meta();
  auto [images, labels] = shapes(2, 48, 64);
  AugmentOptions o;
  o.crop_h = 64;
  o.crop_w = 80;
  AugmentDraw d;  // unscaled, crop at the corner: the bottom 16 rows and right 16 columns are padding
  d.h = 48;
  d.w = 64;
  auto [x, y] = augment_batch(images, labels, {1}, {d}, o, meta);
  EXPECT_TRUE((y[0].narrow(0, 48, 16) == 255).all().item<bool>());
  EXPECT_TRUE((y[0].narrow(1, 64, 16) == 255).all().item<bool>());
  EXPECT_TRUE(torch::equal(y[0].narrow(0, 0, 48).narrow(1, 0, 64), labels[1].to(torch::kLong)));
  EXPECT_LT(x[0].narrow(1, 48, 16).abs().max().item<double>(), 1e-6);  // mean colour → 0
  d.flip = true;
  auto [xf, yf] = augment_batch(images, labels, {1}, {d}, o, meta);
  EXPECT_TRUE(torch::equal(yf, y.flip({2})));
  EXPECT_LT((xf - x.flip({3})).abs().max().item<double>(), 1e-4);
  // the same draws give the same batch
  auto [x2, y2] = augment_batch(images, labels, {1}, {d}, o, meta);
  EXPECT_TRUE(torch::equal(xf, x2));
  EXPECT_TRUE(torch::equal(yf, y2));
}

TEST(DataCache, HoldsTheDecodedSetAndRefusesMixedSizes) {
  auto dir = fixtures::temp_dir("data_cache");
  fixtures::make_shapes_dataset(dir / "data", 5, 1, 40, 56);
  auto ds = SegDataset::open("list", (dir / "data").string(), "train");
  auto cache = DataCache::build(ds, torch::kCPU, 3);
  ASSERT_EQ(cache.size(), 5);
  EXPECT_EQ(cache.height(), 40);
  EXPECT_EQ(cache.width(), 56);
  for (size_t i = 0; i < ds.size(); ++i) {
    auto [img, lab] = ds.load(i);
    EXPECT_TRUE(torch::equal(cache.images()[i], img.permute({2, 0, 1})));
    EXPECT_TRUE(torch::equal(cache.labels()[i], lab));
  }
  // a sample of another size: an error naming it
  fixtures::make_shapes_dataset(dir / "other", 2, 1, 32, 32);
  std::filesystem::copy_file(dir / "other" / "images" / "train_0.png", dir / "data" / "images" / "train_0.png",
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(dir / "other" / "labels" / "train_0.png", dir / "data" / "labels" / "train_0.png",
                             std::filesystem::copy_options::overwrite_existing);
  try {
    DataCache::build(ds, torch::kCPU, 2);
    ADD_FAILURE() << "mixed sizes must be refused";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("one image size"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

namespace {

// Parameters of a few shapes (one conv weight channels_last), two groups as make_optimizer's.
std::vector<torch::Tensor> make_params(uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> ps{torch::randn({8, 4, 3, 3}).contiguous(torch::MemoryFormat::ChannelsLast),
                                torch::randn({16, 8, 1, 1}), torch::randn({8}), torch::randn({16})};
  for (auto& p : ps) p.set_requires_grad(true);
  return ps;
}

template <class Opt, class Options>
std::unique_ptr<torch::optim::Optimizer> two_groups(std::vector<torch::Tensor> ps, double wd) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{ps[0], ps[1]}, std::make_unique<Options>(Options(1e-2).weight_decay(wd)));
  groups.emplace_back(std::vector<torch::Tensor>{ps[2], ps[3]}, std::make_unique<Options>(Options(1e-2).weight_decay(0)));
  return std::make_unique<Opt>(groups, Options(1e-2));
}

void set_grads(std::vector<torch::Tensor>& ps, int step) {
  torch::manual_seed(1000 + step);
  for (auto& p : ps) {
    torch::NoGradGuard ng;
    auto g = torch::randn(p.sizes()) * (1 + step);
    if (p.grad().defined()) p.mutable_grad().copy_(g);  // in place: the fused optimizer's views
    else p.mutable_grad() = g;
  }
}

double max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, (a[i] - b[i]).abs().max().item<double>());
  return m;
}

// Six steps of torch's optimizer and of ForeachAdam over it, at changing learning rates;
// conditional: through step(ok), with a skipped step (ok false) after each taken one. Then the
// state exported into the optimizer continues under torch's step as under ForeachAdam's.
template <class Opt, class Options>
void expect_same_steps(bool decoupled, bool conditional) {
  auto ref = make_params(7), mine = make_params(7);
  auto opt_ref = two_groups<Opt, Options>(ref, 0.05);
  auto opt_mine = two_groups<Opt, Options>(mine, 0.05);
  ForeachAdam fused(*opt_mine, decoupled);
  auto set_lr = [](torch::optim::Optimizer& o, double lr) {
    for (auto& g : o.param_groups()) static_cast<Options&>(g.options()).lr(lr);
  };
  for (int step = 0; step < 6; ++step) {
    set_lr(*opt_ref, 1e-2 * (1 + step));
    set_lr(*opt_mine, 1e-2 * (1 + step));
    set_grads(ref, step);
    set_grads(mine, step);
    opt_ref->step();
    if (conditional) {
      fused.step(torch::ones({}, torch::kBool));
      auto before = mine;
      for (auto& t : before) t = t.detach().clone();
      mine[0].grad().fill_(std::numeric_limits<float>::quiet_NaN());
      fused.step(torch::zeros({}, torch::kBool));
      EXPECT_EQ(max_diff(before, mine), 0) << step;  // a skipped step changes nothing
    } else {
      fused.step();
    }
    EXPECT_LT(max_diff(ref, mine), 1e-6) << step;
  }
  // the optimizer's own state, as a checkpoint would store it: torch's step continues from it
  fused.export_state();
  set_grads(ref, 6);
  set_grads(mine, 6);
  opt_ref->step();
  opt_mine->step();
  EXPECT_LT(max_diff(ref, mine), 1e-6);
}

}  // namespace

TEST(ForeachAdam, StepsAsTorchAdam) { expect_same_steps<torch::optim::Adam, torch::optim::AdamOptions>(false, false); }
TEST(ForeachAdam, StepsAsTorchAdamW) { expect_same_steps<torch::optim::AdamW, torch::optim::AdamWOptions>(true, false); }
TEST(ForeachAdam, ConditionalStepsAsTorchAdamAndSkipsChangeNothing) {
  expect_same_steps<torch::optim::Adam, torch::optim::AdamOptions>(false, true);
  expect_same_steps<torch::optim::AdamW, torch::optim::AdamWOptions>(true, true);
}

TEST(ForeachAdam, ContinuesTheStateOfTorchAdam) {
  // a checkpoint of the unfused optimizer resumes under the fused one
  auto ref = make_params(3), mine = make_params(3);
  auto opt_ref = two_groups<torch::optim::Adam, torch::optim::AdamOptions>(ref, 0.01);
  auto opt_mine = two_groups<torch::optim::Adam, torch::optim::AdamOptions>(mine, 0.01);
  for (int step = 0; step < 3; ++step) {
    set_grads(ref, step);
    set_grads(mine, step);
    opt_ref->step();
    opt_mine->step();
  }
  ForeachAdam fused(*opt_mine, false);
  for (int step = 3; step < 5; ++step) {
    set_grads(ref, step);
    set_grads(mine, step);
    opt_ref->step();
    fused.step();
  }
  EXPECT_LT(max_diff(ref, mine), 1e-6);
}
