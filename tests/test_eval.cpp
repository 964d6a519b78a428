// evaluate(): saved predictions rescore to the same mIoU, an inference backend scores as the training graph.
#include <gtest/gtest.h>

#include "train_fixtures.h"

using namespace lightseg;
using namespace lightseg::train_fixtures;

TEST(Eval, SavedPredictionsRescoreToTheSameMiou) {
  auto dir = fixtures::temp_dir("evalsave");
  fixtures::make_shapes_dataset(dir / "data", 4, 3);
  torch::manual_seed(2);
  NetworkConfig cfg;
  cfg.num_classes = 3;
  Network net(cfg);
  auto ds = SegDataset::open("list", (dir / "data").string(), "val");
  EvalOptions eo;
  eo.save_dir = (dir / "pred").string();
  auto r = evaluate(net, ds.meta(), ds, eo);
  EXPECT_EQ(r.images, 3u);
  ConfusionMatrix again(3);
  for (size_t i = 0; i < ds.size(); ++i) {
    auto name = fs::path(ds.sample(i).image).stem().string() + ".png";
    auto pred = read_label_file((dir / "pred" / name).string());
    EXPECT_EQ(pred.sizes(), (std::vector<int64_t>{64, 64}));
    again.update(pred.to(torch::kLong), ds.load_label(i).to(torch::kLong));
  }
  EXPECT_TRUE(torch::equal(again.matrix(), r.confusion.matrix()));
  auto j = nlohmann::json::parse(r.to_json_string());
  EXPECT_NEAR(j["miou"].get<double>(), again.miou(), 1e-12);
  EXPECT_EQ(j["per_class"].size(), 3u);
  fs::remove_all(dir);
}

TEST(Eval, AnInferenceBackendScoresLikeTheTrainingGraph) {
  // eval --backend onednn|fused: the same confusion matrix as the training graph (fp32
  // backends give its labels); the result names what computed it.
  auto dir = fixtures::temp_dir("evalbackend");
  fixtures::make_shapes_dataset(dir / "data", 4, 3);
  torch::manual_seed(2);
  NetworkConfig cfg;
  cfg.num_classes = 3;
  Network net(cfg);
  net->eval();
  auto ds = SegDataset::open("list", (dir / "data").string(), "val");
  auto ref = evaluate(net, ds.meta(), ds);
  EXPECT_EQ(ref.backend, "eager");
  for (const auto& backend : available_backends()) {
    EvalOptions eo;
    eo.engine.backend = backend;
    auto r = evaluate(net, ds.meta(), ds, eo);
    EXPECT_EQ(r.backend, backend);
    EXPECT_TRUE(torch::equal(r.confusion.matrix(), ref.confusion.matrix())) << backend;
  }
  EvalOptions bad;
  bad.engine.backend = "tensorrt";
  EXPECT_THROW(evaluate(net, ds.meta(), ds, bad), std::invalid_argument);
  fs::remove_all(dir);
}
