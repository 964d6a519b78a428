// Training and evaluating on any split a data folder has: one split, several joined by
// commas, "trainval" (train + val, the peers' CamVid protocol), "test" when present.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "cli_run.h"
#include "lightseg/dataset.h"
#include "lightseg/image_io.h"
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
