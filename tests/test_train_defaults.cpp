// Training defaults from the data (issue 41, item 6): the crop from the images' size, the
// precision auto on a new run, the schedule and ETA said at start, and the record of the
// training data stored with the weights that `eval` warns from.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "lightseg/dataset.h"
#include "lightseg/runtime.h"
#include "lightseg/train.h"
#include "lightseg/training_data.h"
#include "lightseg/weights.h"
#include "cli_run.h"
#include "synthetic.h"
#include "train/train_defaults.h"

using namespace lightseg;
namespace fs = std::filesystem;

namespace {
// The tiny recipe, one epoch of batch 2, the crop left to the data.
TrainOptions small(const fs::path& data, const fs::path& out) {
  TrainOptions o = fixtures::tiny_train_options(data, out);
  o.crop_h = o.crop_w = 0;
  o.epochs = 1;
  o.batch = 2;
  o.workers = 1;
  o.val_every = 0;
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

TEST(TrainDefaults, AnUnsetCropFollowsTheImagesAndASetOneLargerThanAllIsWarnedAbout) {
  using Sizes = std::vector<std::pair<int64_t, int64_t>>;
  TrainOptions o;
  ASSERT_EQ(o.crop_h, 0);  // unset by default
  auto c = choose_crop(o, Sizes{{180, 240}, {200, 300}}, 2);
  EXPECT_EQ(c.h, 176);  // the smallest image's side, down to a multiple of 8
  EXPECT_EQ(c.w, 240);
  EXPECT_NE(c.origin.find("from the data: smallest image 180x240 of all 2 images"), std::string::npos) << c.origin;
  EXPECT_TRUE(c.warning.empty());
  c = choose_crop(o, Sizes{{720, 960}}, 1);
  EXPECT_EQ(c.h, kDefaultCropH);  // large images: at most the default
  EXPECT_EQ(c.w, kDefaultCropW);
  c = choose_crop(o, Sizes{{20, 24}}, 10);
  EXPECT_EQ(c.h, 32);  // the network's smallest
  EXPECT_EQ(c.w, 32);
  EXPECT_NE(c.origin.find("1 of 10 images sampled"), std::string::npos) << c.origin;
  EXPECT_THROW(choose_crop(o, Sizes{}, 0), std::invalid_argument);
  o.crop_h = 360;
  o.crop_w = 480;
  o.crop_origin = "--crop";
  c = choose_crop(o, Sizes{{180, 240}, {240, 180}}, 2);
  EXPECT_EQ(c.h, 360);  // a set crop is kept, but said to be mostly padding
  EXPECT_EQ(c.origin, "--crop");
  EXPECT_NE(c.warning.find("360x480 (--crop) is larger than every training image (largest 240x240"), std::string::npos)
      << c.warning;
  EXPECT_NE(c.warning.find("(176x176 here)"), std::string::npos) << c.warning;
  o.crop_h = 200;
  o.crop_w = 100;
  EXPECT_TRUE(choose_crop(o, Sizes{{180, 240}, {240, 180}}, 2).warning.empty());  // fits the second
}

TEST(TrainDefaults, ARunTakesItsCropFromTheDataStoresItAndSaysItsSchedule) {
  auto dir = fixtures::temp_dir("cropdata");
  fixtures::make_shapes_dataset(dir / "data", 4, 1, 60, 84);
  auto o = small(dir / "data", dir / "run");
  auto said = train_said(o);
  auto s = train_state(read_weights((dir / "run" / "last.lsw").string()));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->options.crop_h, 56);
  EXPECT_EQ(s->options.crop_w, 80);
  const std::string all = joined(said);
  EXPECT_NE(all.find("schedule: list 'data' train, 4 images; 1 epochs x 2 iterations of batch 2; crop 56x80 (from the "
                     "data: smallest image 60x84 of all 4 images"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("; fp32 (the amp_cpu option); adam lr 0.005, poly 0.9 after 0.5 warm-up epochs from 0.1x"), std::string::npos) << all;
  EXPECT_EQ(all.find("warning"), std::string::npos) << all;
  // a crop set larger than every image: trained as set, with a warning naming both sizes
  o.out_dir = (dir / "run2").string();
  o.crop_h = o.crop_w = 96;
  said = train_said(o);
  EXPECT_EQ(train_state(read_weights((dir / "run2" / "last.lsw").string()))->options.crop_h, 96);
  EXPECT_NE(joined(said).find("warning: the crop 96x96 (set) is larger than every training image (largest 60x84"),
            std::string::npos)
      << joined(said);
  fs::remove_all(dir);
}

// The time per iteration is said once after a few iterations, and the ETA counts what is left
// after the last iteration too: the validation and checkpoint of the last epoch.
TEST(TrainDefaults, TheEtaIsSaidEarlyAndCountsTheEpochEnds) {
  EXPECT_EQ(validations_left(1, 10, 3), 4);  // epochs 3, 6, 9 and the last
  EXPECT_EQ(validations_left(10, 10, 3), 1);
  EXPECT_EQ(validations_left(1, 10, 0), 0);
  EXPECT_EQ(format_duration(12), "12s");
  EXPECT_EQ(format_duration(200), "3m20s");
  EXPECT_EQ(format_duration(3900), "1h05m");
  EXPECT_EQ(format_duration(-1), "?");
  auto dir = fixtures::temp_dir("eta");
  fixtures::make_shapes_dataset(dir / "data", 6, 2, 32, 32);
  auto o = small(dir / "data", dir / "run");
  o.epochs = 2;
  o.val_every = 1;
  double last_eta = -1;
  TrainCallbacks cb;
  cb.on_iteration = [&](const TrainProgress& p) {
    if (p.epoch == 2 && p.iter == p.iters) last_eta = p.eta_s;
  };
  const std::string all = joined(train_said(o, cb));
  EXPECT_NE(all.find("s per iteration after 5: about "), std::string::npos) << all;
  EXPECT_GT(last_eta, 0) << "no iteration is left, but a validation and a checkpoint are";
  fs::remove_all(dir);
}

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

// A new run without --precision takes auto (bf16 only where the CPU computes it natively) and
// says why; a resumed run keeps its stored choice.
TEST(TrainDefaults, ANewRunDefaultsToPrecisionAutoAndAResumedOneKeepsItsChoice) {
  auto dir = fixtures::temp_dir("precdefault");
  fixtures::make_shapes_dataset(dir / "data", 2, 1, 32, 32);
  auto run = [&](const std::string& out, std::vector<std::string> more, const char* cap) {
    std::vector<std::string> a = {"train", "--data", (dir / "data").string(), "--dataset", "list", "--out",
                                  (dir / out).string(), "--max-iters", "1", "--batch", "2", "--val-every", "0",
                                  "--workers", "1"};
    a.insert(a.end(), more.begin(), more.end());
    if (cap) ::setenv("LIGHTSEG_MAX_ISA", cap, 1);
    auto r = fixtures::run_cli(a, dir);
    if (cap) ::unsetenv("LIGHTSEG_MAX_ISA");
    return r;
  };
  auto amp_cpu = [&](const std::string& out) {
    auto s = train_state(read_weights((dir / out / "last.lsw").string()));
    EXPECT_TRUE(s);
    return s && s->options.amp_cpu;
  };
  auto r = run("new", {"--epochs", "1"}, nullptr);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(amp_cpu("new"), cpu_has_native_bf16());
  EXPECT_NE(r.err.find("(auto, the default: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("crop 32x32 (from the data"), std::string::npos) << r.err;
  // under a cap without native bf16: auto is fp32, but a run started in bf16 resumes in bf16
  r = run("capped", {"--epochs", "1"}, "avx512");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(amp_cpu("capped"));
  r = run("forced", {"--epochs", "1", "--precision", "bf16", "--crop", "32x32"}, "avx512");
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("forced", {"--epochs", "2", "--resume"}, "avx512");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(amp_cpu("forced"));
  EXPECT_NE(r.err.find("; bf16 autocast (the run's stored choice)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("crop 32x32 (the run's stored crop)"), std::string::npos) << r.err;
  fs::remove_all(dir);
}
