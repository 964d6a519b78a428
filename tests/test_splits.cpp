// Training and evaluating on any split a data folder has: one split, several joined by
// commas, "trainval" (train + val, the peers' CamVid protocol), "test" when present.
#include <filesystem>
#include <fstream>
#include <functional>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "lightseg/dataset.h"
#include "lightseg/eval.h"
#include "lightseg/image_io.h"
#include "lightseg/train.h"
#include "lightseg/weights.h"
#include "synthetic.h"

using namespace lightseg;
namespace fs = std::filesystem;

namespace {

// CamVid's SegNet layout: SPLIT/ and SPLITannot/ with equally named PNGs.
fs::path make_camvid_tree(const fs::path& dir, const std::vector<std::pair<std::string, int>>& splits) {
  uint64_t seed = 1;
  for (const auto& [name, n] : splits) {
    fs::create_directories(dir / name);
    fs::create_directories(dir / (name + "annot"));
    for (int i = 0; i < n; ++i) {
      auto [img, lab] = fixtures::shapes_sample(32, 48, seed++);
      const std::string file = name + "_" + std::to_string(i) + ".png";
      write_png((dir / name / file).string(), img);
      write_png((dir / (name + "annot") / file).string(), lab);
    }
  }
  return dir;
}

std::vector<std::string> images(const SegDataset& d) {
  std::vector<std::string> out;
  for (const auto& s : d.samples()) out.push_back(fs::path(s.image).filename().string());
  return out;
}

}  // namespace

TEST(Splits, CamVidTrainvalIsTrainThenValAndTestIsItsOwn) {
  auto dir = make_camvid_tree(fixtures::temp_dir("splits"), {{"train", 3}, {"val", 2}, {"test", 4}});
  auto train = SegDataset::open("camvid", dir.string(), "train");
  auto val = SegDataset::open("camvid", dir.string(), "val");
  auto tv = SegDataset::open("camvid", dir.string(), "trainval");
  auto tv2 = SegDataset::open("camvid", dir.string(), "train,val");
  auto test = SegDataset::open("camvid", dir.string(), "test");
  EXPECT_EQ(train.size(), 3u);
  EXPECT_EQ(val.size(), 2u);
  EXPECT_EQ(test.size(), 4u);
  std::vector<std::string> want = images(train);
  for (auto& s : images(val)) want.push_back(s);
  EXPECT_EQ(images(tv), want);
  EXPECT_EQ(images(tv2), want);
  // the labels come along with their images
  for (size_t i = 0; i < tv.size(); ++i)
    EXPECT_EQ(fs::path(tv.sample(i).label).filename(), fs::path(tv.sample(i).image).filename());
  EXPECT_EQ(tv.num_classes(), 11);
  auto [img, lab] = tv.load(4);  // the second val image, read through the joined split
  EXPECT_EQ(img.size(0), 32);
  EXPECT_LE(lab.max().item<int>(), 2);
  fs::remove_all(dir);
}

TEST(Splits, AFolderWithItsOwnTrainvalKeepsIt) {
  auto dir = make_camvid_tree(fixtures::temp_dir("splits"), {{"train", 3}, {"val", 2}, {"trainval", 1}});
  EXPECT_EQ(SegDataset::open("camvid", dir.string(), "trainval").size(), 1u);
  fs::remove_all(dir);
}

TEST(Splits, ListDatasetJoinsSplitsAndBadNamesAreClearErrors) {
  auto dir = fixtures::make_shapes_dataset(fixtures::temp_dir("splits"), 3, 2, 16, 16);
  EXPECT_EQ(SegDataset::open("list", dir.string(), "trainval").size(), 5u);
  EXPECT_EQ(SegDataset::open("list", dir.string(), "val,train").size(), 5u);
  EXPECT_EQ(images(SegDataset::open("list", dir.string(), "val,train")).front(), "val_0.png");
  EXPECT_THROW(SegDataset::open("list", dir.string(), "train,train"), std::invalid_argument);
  EXPECT_THROW(SegDataset::open("list", dir.string(), ","), std::invalid_argument);
  try {
    SegDataset::open("list", dir.string(), "train,test");
    FAIL() << "a missing split must be an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("test.txt"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(Splits, CliTrainsOnTrainvalAndEvaluatesTheTestSplit) {
  auto dir = make_camvid_tree(fixtures::temp_dir("splits"), {{"train", 2}, {"val", 2}, {"test", 2}});
  const std::string run = (dir / "run").string();
  auto r = fixtures::run_cli({"train", "--data", dir.string(), "--dataset", "camvid", "--out", run, "--train-split",
                              "trainval", "--epochs", "1", "--batch", "2", "--crop", "32x48", "--val-every", "0",
                              "--threads", "1"},
                             dir);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("from 4 training labels"), std::string::npos) << r.out << r.err;
  ASSERT_TRUE(fs::exists(run + "/last.lsw"));
  auto e = fixtures::run_cli({"eval", "--data", dir.string(), "--dataset", "camvid", "--split", "test", "--weights",
                              run + "/last.lsw", "--threads", "1", "--json"},
                             dir);
  ASSERT_EQ(e.code, 0) << e.out << e.err;
  EXPECT_NE(e.out.find("\"images\":2"), std::string::npos) << e.out;
  auto bad = fixtures::run_cli({"eval", "--data", dir.string(), "--dataset", "camvid", "--split", "nosuch", "--weights",
                                run + "/last.lsw", "--threads", "1"},
                               dir);
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("nosuch"), std::string::npos) << bad.err;
  fs::remove_all(dir);
}

// ---------------------------------------------------------------- sequence-disjoint validation
// Groups (drives, videos, scenes) held out whole: SegDataset::groups, split_by_groups, the
// train options val_groups / group_by, eval --by-group, info --groups.

namespace {

// A CamVid tree whose file names carry a drive prefix: SPLIT/DRIVE_i.png, as the real one.
fs::path make_drive_tree(const fs::path& dir,
                         const std::vector<std::pair<std::string, std::vector<std::pair<std::string, int>>>>& splits) {
  uint64_t seed = 100;
  for (const auto& [name, drives] : splits) {
    fs::create_directories(dir / name);
    fs::create_directories(dir / (name + "annot"));
    for (const auto& [drive, n] : drives)
      for (int i = 0; i < n; ++i) {
        auto [img, lab] = fixtures::shapes_sample(32, 48, seed++);
        const std::string file = drive + "_" + std::to_string(1000 + i) + ".png";
        write_png((dir / name / file).string(), img);
        write_png((dir / (name + "annot") / file).string(), lab);
      }
  }
  return dir;
}

// CamVid in miniature: drive BB in train and val (as 0016E5), AA and CC only in train.
fs::path mini_camvid(const std::string& tag) {
  return make_drive_tree(fixtures::temp_dir(tag), {{"train", {{"AA", 2}, {"BB", 3}, {"CC", 2}}}, {"val", {{"BB", 2}}}});
}

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(SplitsByGroup, PrefixDirRegexAndFileNameTheGroups) {
  auto dir = mini_camvid("groups");
  auto d = SegDataset::open("camvid", dir.string(), "train,val");
  const std::vector<std::string> want = {"AA", "AA", "BB", "BB", "BB", "CC", "CC", "BB", "BB"};
  EXPECT_EQ(d.groups(), want);  // CamVid's default: the prefix
  EXPECT_EQ(d.groups("prefix"), want);
  EXPECT_EQ(d.groups("dir"), (std::vector<std::string>{"train", "train", "train", "train", "train", "train", "train", "val", "val"}));
  auto r = d.groups("regex:^([A-Z])[A-Z]_100([0-9])");  // first capture group
  EXPECT_EQ(r[0], "A");
  EXPECT_EQ(r[8], "B");
  EXPECT_EQ(d.groups("regex:[0-9]{2}")[0], "10");  // no group: the whole match
  EXPECT_NE(what_of([&] { d.groups("regex:^ZZ(.*)"); }).find("AA_1000.png"), std::string::npos);
  EXPECT_NE(what_of([&] { d.groups("regex:(["); }).find("not a valid regular expression"), std::string::npos);
  // file: by path relative to the dataset folder, or by file name alone
  const std::string gf = (dir / "groups.txt").string();
  std::ofstream(gf) << "# image group\ntrain/AA_1000.png scene1\ntrain/AA_1001.png scene1\n"
                       "BB_1000.png scene2\nBB_1001.png scene2\nBB_1002.png scene2\nCC_1000.png scene3\n"
                       "train/CC_1001.png scene3\nval/BB_1000.png scene4\nval/BB_1001.png scene4\n";
  // BB_1000.png is in train and in val: its file name alone names no sample, its path does
  EXPECT_NE(what_of([&] { d.groups("file:" + gf); }).find("train/BB_1000.png"), std::string::npos);
  std::ofstream(gf, std::ios::app) << "train/BB_1000.png scene2\ntrain/BB_1001.png scene2\n";
  auto f = d.groups("file:" + gf);
  EXPECT_EQ(f, (std::vector<std::string>{"scene1", "scene1", "scene2", "scene2", "scene2", "scene3", "scene3", "scene4", "scene4"}));
  EXPECT_EQ(d.groups("file:groups.txt"), f);  // a relative path: found in the dataset folder
  EXPECT_NE(what_of([&] { d.groups("file:nosuch.txt"); }).find("nosuch.txt"), std::string::npos);
  EXPECT_NE(what_of([&] { d.groups("video"); }).find("prefix, dir, regex:PATTERN or file:PATH"), std::string::npos);
  // a name with no '_' has no prefix
  auto list = fixtures::make_shapes_dataset(dir / "list", 2, 1, 16, 16);
  std::ofstream(list / "nounderscore.txt") << "images/train_0.png labels/train_0.png\n";
  fs::copy_file(list / "images" / "train_0.png", list / "images" / "frame7.png");
  fs::copy_file(list / "labels" / "train_0.png", list / "labels" / "frame7.png");
  std::ofstream(list / "nounderscore.txt", std::ios::app) << "images/frame7.png labels/frame7.png\n";
  EXPECT_NE(what_of([&] { SegDataset::open("list", list.string(), "nounderscore").groups(); }).find("frame7.png"),
            std::string::npos);
  fs::remove_all(dir);
}

TEST(SplitsByGroup, CityscapesGroupsByCityFolder) {
  auto dir = fixtures::temp_dir("groups");
  for (const std::string city : {"aachen", "bonn"})
    for (int i = 0; i < 2; ++i) {
      fs::create_directories(dir / "leftImg8bit/train" / city);
      fs::create_directories(dir / "gtFine/train" / city);
      auto [img, lab] = fixtures::shapes_sample(16, 32, 7 + i);
      const std::string stem = city + "_000000_00000" + std::to_string(i);
      write_png((dir / "leftImg8bit/train" / city / (stem + "_leftImg8bit.png")).string(), img);
      write_png((dir / "gtFine/train" / city / (stem + "_gtFine_labelIds.png")).string(), (lab + 7).to(torch::kUInt8));
    }
  auto d = SegDataset::open("cityscapes", dir.string(), "train");
  EXPECT_EQ(d.groups(), (std::vector<std::string>{"aachen", "aachen", "bonn", "bonn"}));
  auto s = split_by_groups(d, "", {"bonn"});
  EXPECT_EQ(s.describe(), "train 2 images (aachen 2), val 2 images (bonn 2)");
  fs::remove_all(dir);
}

TEST(SplitsByGroup, PoolingHoldsOutWholeGroupsAndErrorsNameTheGroups) {
  EXPECT_EQ(pool_splits("train", "val"), "train,val");
  EXPECT_EQ(pool_splits("trainval", "val"), "train,val");
  EXPECT_EQ(pool_splits("train,extra", "train"), "train,extra");
  auto dir = mini_camvid("groups");
  auto pooled = SegDataset::open("camvid", dir.string(), pool_splits("train", "val"));
  auto s = split_by_groups(pooled, "prefix", {"CC"});
  EXPECT_EQ(s.train.size(), 7u);
  EXPECT_EQ(s.val.size(), 2u);
  EXPECT_EQ(s.describe(), "train 7 images (AA 2, BB 5), val 2 images (CC 2)");
  for (const auto& g : s.val.groups()) EXPECT_EQ(g, "CC");
  for (const auto& g : s.train.groups()) EXPECT_NE(g, "CC");
  EXPECT_EQ(images(s.train).back(), "BB_1001.png");  // pooled order: train's, then val's
  EXPECT_EQ(s.val.num_classes(), 11);
  auto [img, lab] = s.val.load(1);  // the subset loads its own samples
  EXPECT_EQ(img.size(1), 48);
  auto two = split_by_groups(pooled, "prefix", {"AA", "BB"});
  EXPECT_EQ(two.train.size(), 2u);
  EXPECT_EQ(two.val.size(), 7u);
  const std::string unknown = what_of([&] { split_by_groups(pooled, "prefix", {"0006R0"}); });
  EXPECT_NE(unknown.find("'0006R0'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("AA 2, BB 5, CC 2"), std::string::npos) << unknown;
  const std::string all = what_of([&] { split_by_groups(pooled, "prefix", {"AA", "BB", "CC"}); });
  EXPECT_NE(all.find("no image is left to train on"), std::string::npos) << all;
  EXPECT_NE(all.find("AA 2, BB 5, CC 2"), std::string::npos) << all;
  EXPECT_NE(what_of([&] { split_by_groups(pooled, "prefix", {}); }).find("AA 2"), std::string::npos);
  fs::remove_all(dir);
}

TEST(SplitsByGroup, TrainOptionsTakeValGroupsAsAListOrACommaString) {
  TrainOptions o;
  o.apply_json_string(R"({"val_groups": ["0006R0"], "group_by": "prefix", "class_weighting": "median"})");
  EXPECT_EQ(o.val_groups, (std::vector<std::string>{"0006R0"}));
  o.set("val_groups=0001TP, 0016E5");
  EXPECT_EQ(o.val_groups, (std::vector<std::string>{"0001TP", "0016E5"}));
  TrainOptions back;
  back.apply_json_string(o.to_json_string());
  EXPECT_EQ(back.val_groups, o.val_groups);
  EXPECT_EQ(back.group_by, "prefix");
  EXPECT_EQ(back.class_weighting, "median");
  EXPECT_THROW(o.apply_json_string(R"({"val_groups": 3})"), std::invalid_argument);
  EXPECT_THROW(o.apply_json_string(R"({"val_groups": ["A", "A"]})"), std::invalid_argument);
  o.data = "d";
  o.out_dir = "o";
  o.group_by = "video";
  EXPECT_THROW(o.validate(), std::invalid_argument);
  o.group_by = "regex:^(.*)_";
  o.class_weighting = "inverse";
  EXPECT_THROW(o.validate(), std::invalid_argument);
}

TEST(SplitsByGroup, MedianFrequencyWeightsAreStrongerForRareClasses) {
  const std::vector<int64_t> counts = {10, 20, 70, 0};
  auto m = median_frequency_class_weights(counts);  // shares .1 .2 .7, median .2
  ASSERT_EQ(m.size(), 4u);
  EXPECT_NEAR(m[0], 2.0, 1e-6);
  EXPECT_NEAR(m[1], 1.0, 1e-6);
  EXPECT_NEAR(m[2], 0.2 / 0.7, 1e-6);
  EXPECT_EQ(m[3], 0.0f);
  auto e = class_weights_from_counts(counts, "enet");
  EXPECT_EQ(e, enet_class_weights(counts));
  EXPECT_GT(m[0] / m[2], e[0] / e[2]);  // a wider range than ENet's
  EXPECT_EQ(class_weights_from_counts(counts, "median"), m);
  EXPECT_THROW(class_weights_from_counts(counts, "inverse"), std::invalid_argument);
}

TEST(SplitsByGroup, EvalScoresEachGroupApartAndTheyAddUpToTheTotal) {
  auto dir = mini_camvid("groups");
  auto d = SegDataset::open("camvid", dir.string(), "train,val");
  torch::manual_seed(3);
  NetworkConfig cfg;
  cfg.c0 = 8;
  cfg.c1 = 16;
  cfg.c2 = 24;
  Network net(cfg);
  EvalOptions eo;
  eo.groups = d.groups();
  auto r = evaluate(net, d.meta(), d, eo);
  ASSERT_EQ(r.by_group.size(), 3u);
  EXPECT_EQ(r.by_group[0].group, "AA");
  EXPECT_EQ(r.by_group[1].group, "BB");
  EXPECT_EQ(r.by_group[1].images, 5u);
  ConfusionMatrix sum(11);
  for (const auto& g : r.by_group) sum.merge(g.confusion);
  EXPECT_TRUE(torch::equal(sum.matrix(), r.confusion.matrix()));
  auto j = nlohmann::json::parse(r.to_json_string());
  EXPECT_EQ(j["groups"]["CC"]["images"].get<int>(), 2);
  EXPECT_NEAR(j["groups"]["CC"]["miou"].get<double>(), r.by_group[2].confusion.miou(), 1e-12);
  eo.groups.pop_back();
  EXPECT_THROW(evaluate(net, d.meta(), d, eo), std::invalid_argument);
  fs::remove_all(dir);
}

TEST(SplitsByGroup, CliTrainsWithValGroupsAndEvalAndInfoShowTheGroups) {
  auto dir = mini_camvid("groups");
  const std::string data = dir.string(), run = (dir / "run").string();
  auto base = [&](std::vector<std::string> more) {
    std::vector<std::string> a = {"train", "--data", data, "--dataset", "camvid", "--out", run, "--epochs", "1",
                                  "--batch", "2", "--crop", "32x48", "--threads", "1", "--workers", "1",
                                  "--set", "network.c0=8", "--set", "network.c1=16", "--set", "network.c2=24"};
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  // without --val-groups: BB is on both sides, which is said
  auto plain = fixtures::run_cli(base({"--max-iters", "1", "--val-every", "1"}), dir);
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_NE(plain.err.find("val images of groups also trained on (BB 2)"), std::string::npos) << plain.err;
  fs::remove_all(run);
  // an unknown group: the error names those that exist, and nothing is written
  auto bad = fixtures::run_cli(base({"--val-groups", "0006R0"}), dir);
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("AA 2, BB 5, CC 2"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(run + "/last.lsw"));
  auto r = fixtures::run_cli(
      base({"--val-groups", "CC", "--group-by", "prefix", "--max-iters", "2", "--val-every", "1", "--class-weighting", "median"}), dir);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("train 7 images (AA 2, BB 5), val 2 images (CC 2)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("also trained on"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("best val mIoU"), std::string::npos) << r.out;
  EXPECT_NE((r.out + r.err).find("from 7 training labels"), std::string::npos) << r.err;
  auto s = train_state(read_weights(run + "/last.lsw"));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->options.val_groups, (std::vector<std::string>{"CC"}));  // the checkpoint says what validated it
  EXPECT_EQ(s->options.group_by, "prefix");
  EXPECT_EQ(s->options.class_weighting, "median");
  auto cw = nlohmann::json::parse(std::ifstream(run + "/class_weights.json"));
  EXPECT_EQ(cw["method"], "median");
  EXPECT_EQ(cw["weights"], nlohmann::json(median_frequency_class_weights(cw["counts"].get<std::vector<int64_t>>())));
  EXPECT_NE(cw["key"].get<std::string>().find("without CC"), std::string::npos) << cw["key"];
  EXPECT_EQ(train_state(read_weights(run + "/best.lsw"))->options.val_groups, s->options.val_groups);
  // --resume keeps the held-out groups without being told again
  r = fixtures::run_cli({"train", "--data", data, "--dataset", "camvid", "--out", run, "--resume", "--epochs", "2",
                         "--threads", "1", "--workers", "1"},
                        dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("val 2 images (CC 2)"), std::string::npos) << r.err;
  // eval --by-group: a column per group
  auto e = fixtures::run_cli({"eval", "--data", data, "--dataset", "camvid", "--split", "train,val", "--weights",
                              run + "/last.lsw", "--threads", "1", "--by-group", "--json"},
                             dir);
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_NE(e.out.find("IoU         AA         BB         CC"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("\"groups\":{\"AA\":"), std::string::npos) << e.out;
  // eval --groups: the held-out drive alone, from the pooled splits
  e = fixtures::run_cli({"eval", "--data", data, "--dataset", "camvid", "--split", "train,val", "--groups", "CC",
                         "--weights", run + "/last.lsw", "--threads", "1", "--json"},
                        dir);
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_NE(e.out.find("\"images\":2"), std::string::npos) << e.out;
  e = fixtures::run_cli({"eval", "--data", data, "--dataset", "camvid", "--split", "val", "--groups", "CC",
                         "--weights", run + "/last.lsw", "--threads", "1"},
                        dir);
  EXPECT_NE(e.code, 0);
  EXPECT_NE(e.err.find("its groups (images) are: BB 2"), std::string::npos) << e.err;
  // info --groups
  auto i = fixtures::run_cli({"info", "--groups", "--data", data, "--dataset", "camvid", "--split", "train,val"}, dir);
  ASSERT_EQ(i.code, 0) << i.err;
  EXPECT_NE(i.out.find("9 images in 3 groups (group_by prefix)"), std::string::npos) << i.out;
  EXPECT_NE(i.out.find("BB                            5"), std::string::npos) << i.out;
  fs::remove_all(dir);
}
