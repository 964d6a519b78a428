// Fine-tuning (train --init-weights onto another class count): every tensor that fits is loaded,
// the rest start new, the trainer says which; a network that does not fit is refused clearly.
#include <gtest/gtest.h>

#include <fstream>

#include "lightseg/train.h"
#include "lightseg/weights.h"
#include "synthetic.h"

using namespace lightseg;
namespace fs = std::filesystem;

namespace {

NetworkConfig small_net(int classes) {
  NetworkConfig c;
  c.c0 = 16;
  c.c1 = 32;
  c.c2 = 48;
  c.num_classes = classes;
  return c;
}

// The shapes dataset with two classes: background and disc; the boxes (value 2) are ignored.
fs::path two_class_dataset(const fs::path& dir) {
  fixtures::make_shapes_dataset(dir, 8, 4);
  std::ofstream(dir / "dataset.json")
      << R"({"name": "discs", "classes": ["background", "disc"], "palette": [[0,0,0],[255,0,0]], "ignore_index": 2})";
  return dir;
}

TrainOptions fine_tune_options(const fs::path& data, const fs::path& out, const std::string& init) {
  TrainOptions o;
  o.data = data.string();
  o.dataset = "list";
  o.out_dir = out.string();
  o.batch = 4;
  o.crop_h = o.crop_w = 64;
  o.epochs = 1;
  o.workers = 1;
  o.val_every = 0;
  o.network = small_net(2);
  o.init_weights = init;
  return o;
}

}  // namespace

TEST(FineTune, LoadsWhatFitsAndSaysWhatStartsNew) {
  auto dir = fixtures::temp_dir("finetune");
  torch::manual_seed(3);
  Network three(small_net(3));
  save_network((dir / "three.lsw").string(), three, ModelMeta::generic(3));

  // the loader alone: the classifier differs, everything else is copied
  Network two(small_net(2));
  PartialLoad r = load_matching(two, read_weights((dir / "three.lsw").string()));
  ASSERT_FALSE(r.reshaped.empty());
  EXPECT_TRUE(r.missing.empty());
  EXPECT_TRUE(r.unused.empty());
  EXPECT_EQ(r.loaded.size() + r.reshaped.size(), r.model_tensors);
  EXPECT_GT(r.loaded.size(), r.model_tensors * 9 / 10);
  for (const auto& n : r.reshaped) EXPECT_NE(n.find("(file [3"), std::string::npos) << n;
  auto file = read_weights((dir / "three.lsw").string());
  auto loaded = make_weights(two, ModelMeta::generic(2));
  for (size_t i = 0; i < loaded.tensors.size(); ++i) {
    const auto& [name, t] = loaded.tensors[i];
    if (std::find(r.loaded.begin(), r.loaded.end(), name) == r.loaded.end()) continue;
    EXPECT_TRUE(torch::equal(t, file.tensors[i].second)) << name;
  }

  // the trainer: a 2-class run from the 3-class weights trains and reports the partial load
  auto data = two_class_dataset(dir / "data");
  std::string said;
  TrainCallbacks cb;
  cb.on_message = [&](const std::string& m) { said += m + "\n"; };
  auto res = train(fine_tune_options(data, dir / "run", (dir / "three.lsw").string()), cb);
  EXPECT_TRUE(res.finished);
  EXPECT_NE(said.find("initialised from " + (dir / "three.lsw").string() + ": loaded "), std::string::npos) << said;
  EXPECT_NE(said.find("new (shape differs): "), std::string::npos) << said;
  EXPECT_EQ(read_weights((dir / "run" / "last.lsw").string()).config.num_classes, 2);
  fs::remove_all(dir);
}

TEST(FineTune, ANetworkThatDoesNotFitIsRefused) {
  auto dir = fixtures::temp_dir("finetune_bad");
  NetworkConfig wide = small_net(3);
  wide.c0 = 24;
  wide.c1 = 40;
  wide.c2 = 64;
  Network other(wide);
  save_network((dir / "wide.lsw").string(), other, ModelMeta::generic(3));
  auto data = two_class_dataset(dir / "data");
  try {
    train(fine_tune_options(data, dir / "run", (dir / "wide.lsw").string()), {});
    FAIL() << "expected a refusal";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("give the same network keys"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}
