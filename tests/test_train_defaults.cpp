// Training defaults from the data (issue 41, item 6): the record of the training data stored
// with the weights that `eval` warns from.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "lightseg/dataset.h"
#include "lightseg/train.h"
#include "lightseg/training_data.h"
#include "lightseg/weights.h"
#include "cli_run.h"
#include "synthetic.h"

using namespace lightseg;
namespace fs = std::filesystem;

namespace {
TrainOptions small(const fs::path& data, const fs::path& out) {
  TrainOptions o;
  o.data = data.string();
  o.dataset = "list";
  o.out_dir = out.string();
  o.epochs = 1;
  o.batch = 2;
  o.workers = 1;
  o.val_every = 0;
  o.network.c0 = 16;
  o.network.c1 = 32;
  o.network.c2 = 48;
  return o;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& m : v) s += m + "\n";
  return s;
}

// Runs train() and returns its messages.
std::vector<std::string> train_said(const TrainOptions& o, TrainCallbacks cb = {}) {
  std::vector<std::string> said;
  cb.on_message = [&](const std::string& m) { said.push_back(m); };
  auto r = train(o, cb);
  EXPECT_TRUE(r.finished) << joined(said);
  return said;
}
}  // namespace

TEST(TrainDefaults, CheckpointsRecordTheirTrainingData) {
  auto dir = fixtures::temp_dir("trainedon");
  fixtures::make_shapes_dataset(dir / "data", 4, 2, 32, 32);
  auto o = small(dir / "data", dir / "run");
  o.val_every = 1;
  train_said(o);
  for (const char* f : {"last.lsw", "best.lsw"}) {
    auto d = training_data(read_weights((dir / "run" / f).string()));
    ASSERT_TRUE(d) << f;
    EXPECT_EQ(d->dataset, "list");
    EXPECT_EQ(d->root, "data");
    EXPECT_EQ(d->splits, std::vector<std::string>{"train"});
    EXPECT_EQ(d->images, 4u);
    EXPECT_EQ(d->stems, (std::vector<std::string>{"train_0", "train_1", "train_2", "train_3"}));
    ASSERT_EQ(d->groups.size(), 1u);  // by prefix: "train"
    EXPECT_EQ(d->groups[0].second, 4u);
    EXPECT_TRUE(d->val_groups.empty());
  }
  // sequence-disjoint: both splits pooled, the val groups held out and named
  o.out_dir = (dir / "run2").string();
  o.val_groups = {"val"};
  train_said(o);
  auto d = training_data(read_weights((dir / "run2" / "last.lsw").string()));
  ASSERT_TRUE(d);
  EXPECT_EQ(d->splits, (std::vector<std::string>{"train", "val"}));
  EXPECT_EQ(d->val_groups, std::vector<std::string>{"val"});
  EXPECT_EQ(d->images, 4u);
  // the record round-trips, and a malformed one is a clear error
  EXPECT_EQ(TrainingData::from_json_string(d->to_json_string()).to_json_string(), d->to_json_string());
  EXPECT_THROW(TrainingData::from_json_string(R"({"dataset": "list", "splits": 3})"), std::invalid_argument);
  fs::remove_all(dir);
}

TEST(TrainDefaults, EvalWarnsWhenTheEvaluatedImagesWereTrainedOn) {
  auto dir = fixtures::temp_dir("evaltrained");
  fixtures::make_shapes_dataset(dir / "data", 4, 2, 32, 32);
  auto o = small(dir / "data", dir / "run");
  train_said(o);
  auto eval = [&](const std::string& weights, const std::string& split) {
    return fixtures::run_cli({"eval", "--data", (dir / "data").string(), "--dataset", "list", "--split", split,
                              "--weights", weights},
                             dir);
  };
  const std::string last = (dir / "run" / "last.lsw").string();
  auto r = eval(last, "train");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: 4 of the 4 images of list 'data' train were in these weights' training data"),
            std::string::npos)
      << r.err;
  r = eval(last, "val");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("training data"), std::string::npos) << r.err;
  r = eval(last, "train,val");
  EXPECT_NE(r.err.find("warning: 4 of the 6 images"), std::string::npos) << r.err;
  // weights without a record claim nothing; a model card beside them can carry one (by split)
  WeightsFile w = read_weights(last);
  w.extra = "{}";
  const std::string plain = (dir / "plain.lsw").string();
  write_weights(plain, w);
  r = eval(plain, "train");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("training data"), std::string::npos) << r.err;
  std::ofstream(dir / "plain.json")
      << R"({"training_data_record": {"dataset": "list", "root": "data", "splits": ["val"], "images": 2}})";
  r = eval(plain, "val");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: val was in these weights' training data, list 'data' val (2 images)"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("model card"), std::string::npos) << r.err;
  r = eval(plain, "train");
  EXPECT_EQ(r.err.find("training data"), std::string::npos) << r.err;
  // a broken record: said, and the evaluation still runs
  std::ofstream(dir / "plain.json") << R"({"training_data_record": {"dataset": 1}})";
  r = eval(plain, "val");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("training-data record cannot be read"), std::string::npos) << r.err;
  fs::remove_all(dir);
}


// The shipped weights predate the record: their model cards carry it (the binaries in git are
// not rewritten), so eval of models/camvid.lsw on CamVid val says val was trained on.
TEST(TrainDefaults, TheShippedWeightsCardsRecordTheirTrainingSplits) {
  const std::string models = std::string(LIGHTSEG_SOURCE_DIR) + "/models/";
  std::string source;
  auto d = training_data_of(models + "camvid.lsw", read_weights(models + "camvid.lsw"), &source);
  ASSERT_TRUE(d);
  EXPECT_NE(source.find("camvid.json"), std::string::npos) << source;
  EXPECT_EQ(d->splits, (std::vector<std::string>{"train", "val"}));
  EXPECT_EQ(d->images, 468u);
  auto t = training_data_of(models + "camvid-train.lsw", read_weights(models + "camvid-train.lsw"));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->splits, std::vector<std::string>{"train"});
  const std::string camvid = fixtures::camvid_dir();
  if (camvid.empty()) GTEST_SKIP() << "no CamVid data (LIGHTSEG_CAMVID)";
  auto val = SegDataset::open("camvid", camvid, "val");
  EXPECT_NE(trained_on_warning(*d, val, "camvid", camvid, "val").find("warning: val was in these weights' training data"),
            std::string::npos);
  EXPECT_EQ(trained_on_warning(*t, val, "camvid", camvid, "val"), "");  // stage 1: train only
  EXPECT_EQ(trained_on_warning(*d, val, "cityscapes", camvid, "val"), "");  // another dataset: nothing claimed
}

