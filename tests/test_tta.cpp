// Test-time augmentation (EngineOptions::scales, flip; src/infer/tta.cpp): off by default,
// the log of the mean probability of its passes, mirror-symmetric with flip, clear errors, and
// the same option in eval, the predictor and the CLI.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "cli_run.h"
#include "infer/fused_network.h"
#include "lightseg/image_io.h"
#include "lightseg/engine.h"
#include "lightseg/eval.h"
#include "lightseg/predictor.h"
#include "predictor_fixtures.h"

using namespace lightseg;
namespace fx = lightseg::fixtures;
namespace F = torch::nn::functional;

namespace {

EngineOptions fused(std::vector<double> scales = {1.0}, bool flip = false) {
  EngineOptions o;
  o.backend = "fused";
  o.scales = std::move(scales);
  o.flip = flip;
  return o;
}

torch::Tensor images(int64_t h, int64_t w, uint64_t seed = 5) {
  torch::manual_seed(seed);
  return torch::rand({2, 3, h, w}) * 255;
}

torch::Tensor resized(const torch::Tensor& t, int64_t h, int64_t w) {
  return F::interpolate(t, F::InterpolateFuncOptions().size(std::vector<int64_t>{h, w}).mode(torch::kBilinear)
                               .align_corners(false));
}

}  // namespace

TEST(Tta, OffByDefaultAndOnePlainScaleIsNoAugmentation) {
  fx::one_thread();
  Network net = fx::random_network();
  EngineOptions defaults;
  EXPECT_EQ(defaults.scales, std::vector<double>{1.0});
  EXPECT_FALSE(defaults.flip);
  auto plain = make_engine(net, ModelMeta::camvid(), fused());
  EXPECT_EQ(plain->backend(), "fused");
  auto x = images(48, 64);
  auto two = make_engine(net, ModelMeta::camvid(), fused({1.0, 1.0}));
  EXPECT_EQ(two->backend(), "fused (scales 1,1)");
  // the same pass twice: the mean probability is the softmax of the plain logits
  auto ref = plain->logits(x).log_softmax(1);
  EXPECT_LT((two->logits(x) - ref).abs().max().item<double>(), 1e-4);
}

TEST(Tta, TheLogitsAreTheLogOfTheMeanProbabilityOfItsPasses) {
  fx::one_thread();
  Network net = fx::random_network();
  auto plain = make_engine(net, ModelMeta::camvid(), fused());
  auto tta = make_engine(net, ModelMeta::camvid(), fused({0.5, 1.25}, true));
  EXPECT_EQ(tta->backend(), "fused (scales 0.5,1.25 + flip)");
  const int64_t h = 70, w = 90;
  auto x = images(h, w);
  torch::Tensor sum = torch::zeros({2, 11, h, w});
  for (auto [sh, sw] : {std::pair<int64_t, int64_t>{35, 45}, {88, 113}}) {  // round(70 s) × round(90 s)
    auto xs = resized(x, sh, sw);
    sum += resized(plain->logits(xs), h, w).softmax(1);
    sum += resized(plain->logits(xs.flip({3})).flip({3}), h, w).softmax(1);
  }
  auto mean = sum / 4;
  auto got = tta->logits(x);
  ASSERT_EQ(got.sizes(), mean.sizes());
  EXPECT_LT((got.exp() - mean).abs().max().item<double>(), 1e-5);
  EXPECT_TRUE(tta->labels(x).equal(mean.argmax(1)));
  // the passes disagree somewhere, so the average is not any single one of them
  EXPECT_LT(fx::agreement(plain->labels(x), mean.argmax(1)), 1.0);
}

TEST(Tta, FlipMakesThePredictionMirrorSymmetric) {
  fx::one_thread();
  Network net = fx::random_network();
  auto x = images(64, 80);
  auto sym = [&](InferenceEngine& e) { return (e.logits(x.flip({3})) - e.logits(x).flip({3})).abs().max().item<double>(); };
  auto plain = make_engine(net, ModelMeta::camvid(), fused());
  auto flip = make_engine(net, ModelMeta::camvid(), fused({1.0, 0.75}, true));
  EXPECT_GT(sym(*plain), 1e-2);  // the network alone is not symmetric
  EXPECT_LT(sym(*flip), 1e-4);
}

TEST(Tta, BadScalesAreClearErrors) {
  fx::one_thread();
  Network net = fx::random_network();
  auto fails = [&](std::vector<double> scales, const std::string& says) {
    try {
      make_engine(net, ModelMeta::camvid(), fused(std::move(scales)));
      ADD_FAILURE() << "no error";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  fails({}, "no scale");
  fails({1.0, 0.1}, "not in [0.25, 4]");
  fails({8.0}, "not in [0.25, 4]");
  fails({std::numeric_limits<double>::quiet_NaN()}, "not in [0.25, 4]");
  auto dir = fx::temp_dir("tta_cli");
  auto r = fx::run_cli({"segment", "nothing.png", "--scales", "1,0.1"}, dir);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--scales"), std::string::npos) << r.err;
  std::filesystem::remove_all(dir);
}

TEST(Tta, EvalThePredictorSegmentAndBenchTakeIt) {
  fx::one_thread();
  auto dir = fx::temp_dir("tta_front_ends");
  // eval: a 3-class network on the synthetic list dataset, scored through the augmented engine
  fx::make_shapes_dataset(dir / "data", 0, 3, 48, 64);
  NetworkConfig cfg;
  cfg.num_classes = 3;
  torch::manual_seed(2);
  Network small(cfg);
  small->eval();
  auto data = SegDataset::open("list", (dir / "data").string(), "val");
  EvalOptions eo;
  eo.engine = fused({1.0}, true);
  auto r = evaluate(small, ModelMeta::generic(3), data, eo);
  EXPECT_EQ(r.backend, "fused (scales 1 + flip)");
  EXPECT_EQ(r.images, 3u);
  auto engine = make_engine(small, ModelMeta::generic(3), eo.engine);
  ConfusionMatrix cm(3, kIgnore);
  for (size_t i = 0; i < data.size(); ++i) {
    auto [img, lab] = data.load(i);
    cm.update(engine->labels(to_rgb_chw_float(img).unsqueeze(0))[0], lab);
  }
  EXPECT_NEAR(r.miou(), cm.miou(), 1e-12);

  // the predictor: labels and confidence of the mean probability
  Network net = fx::random_network();
  PredictorOptions po;
  po.engine = fused({0.75, 1.0}, true);
  Predictor p(net, ModelMeta::camvid(), po);
  EXPECT_EQ(p.backend(), "fused (scales 0.75,1 + flip)");
  auto img = fx::shapes_sample(50, 70, 9).first;
  auto pred = p.predict(img, /*confidence=*/true);
  auto mean = make_engine(net, ModelMeta::camvid(), po.engine)->logits(to_rgb_chw_float(img).unsqueeze(0)).exp()[0];
  EXPECT_GT(fx::agreement(pred.labels.to(torch::kLong), mean.argmax(0)), 0.995);
  EXPECT_LT((pred.confidence - std::get<0>(mean.max(0))).abs().max().item<double>(), 1e-4);

  // the CLI: segment --scales --flip says which augmentation it ran
  const std::string weights = fx::random_weights(dir);
  write_png((dir / "a.png").string(), img);
  auto c = fx::run_cli({"segment", (dir / "a.png").string(), "--weights", weights, "--out", (dir / "out").string(),
                        "--scales", "0.75,1", "--flip", "--backend", "fused", "--json"},
                       dir);
  ASSERT_EQ(c.code, 0) << c.err;
  auto j = nlohmann::json::parse(c.out.substr(c.out.rfind('{')));
  EXPECT_EQ(j["backend"], "fused (scales 0.75,1 + flip)");
  auto ids = read_label_file((dir / "out" / "a.png").string());
  EXPECT_GT(fx::agreement(ids.to(torch::kLong), pred.labels.to(torch::kLong)), 0.995);

  // bench: the augmented engine, and the work of all its passes
  auto b = fx::run_cli({"bench", "--weights", weights, "--size", "192x256", "--iters", "1", "--backend", "fused",
                        "--scales", "1,0.5", "--flip", "--json"},
                       dir);
  ASSERT_EQ(b.code, 0) << b.err;
  auto bj = nlohmann::json::parse(b.out.substr(b.out.rfind('{')));
  EXPECT_EQ(bj["backend"], "fused (scales 1,0.5 + flip)");
  const auto f = fuse_network(net, ModelMeta::camvid());
  EXPECT_NEAR(bj["gmacs_per_image"].get<double>(), 2 * double(f.count_macs(192, 256) + f.count_macs(96, 128)) / 1e9, 1e-3);
  std::filesystem::remove_all(dir);
}

// Predictor's per-call Augmentation (what `serve` uses per request): the same result as an
// engine built with that augmentation, only for the calls that ask; bad scales are refused first.
TEST(Tta, APredictorCallChoosesItsOwnAugmentation) {
  fx::one_thread();
  Network net = fx::random_network();
  PredictorOptions plain_opt, aug_opt;
  plain_opt.engine = fused();
  aug_opt.engine = fused({1.0, 1.25}, true);
  Predictor plain(net, ModelMeta::camvid(), plain_opt), augmented(net, ModelMeta::camvid(), aug_opt);
  auto img = fx::shapes_sample(50, 70, 9).first;
  const Augmentation aug{{1.0, 1.25}, true};

  auto per_call = plain.predict(img, /*confidence=*/true, aug);
  auto built_in = augmented.predict(img, true);
  EXPECT_TRUE(per_call.labels.equal(built_in.labels));
  EXPECT_LT((per_call.confidence - built_in.confidence).abs().max().item<double>(), 1e-6);
  // the next plain call is plain again, and differs from the augmented one
  auto again = plain.predict(img, true);
  EXPECT_TRUE(again.labels.equal(plain.predict(img).labels));
  EXPECT_GT((again.confidence - per_call.confidence).abs().max().item<double>(), 1e-3);

  // encoded input and batches take it too
  const std::string png = encode_png(img);
  EXPECT_TRUE(plain.predict_encoded(png.data(), png.size(), false, "image", aug).labels.equal(built_in.labels));
  auto batch = plain.predict_batch({img, img.flip({1})}, false, aug);
  EXPECT_TRUE(batch[0].labels.equal(built_in.labels));
  EXPECT_TRUE(batch[1].labels.equal(augmented.predict(img.flip({1})).labels));

  EXPECT_THROW(plain.predict(img, false, Augmentation{{}, false}), std::invalid_argument);
  EXPECT_THROW(plain.predict(img, false, Augmentation{{1.0, 9.0}, false}), std::invalid_argument);
  EXPECT_THROW(plain.predict_encoded(png.data(), png.size(), false, "image", Augmentation{{0.1}, true}),
               std::invalid_argument);
}
