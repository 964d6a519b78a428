// Image codecs, datasets (CamVid, Cityscapes, list), joint augmentation.
#include <gtest/gtest.h>

#include <fstream>

#include "lightseg/dataset.h"
#include "lightseg/image_io.h"
#include "data/transforms.h"
#include "synthetic.h"
#include "test_paths.h"

using namespace lightseg;
namespace fs = std::filesystem;

TEST(ImageIO, PngRoundTripGrayRgbRgba) {
  torch::manual_seed(0);
  for (int c : {1, 3, 4}) {
    auto img = torch::randint(0, 256, {37, 53, c}, torch::kUInt8);
    auto png = encode_png(img);
    auto back = decode_image(png.data(), png.size());
    EXPECT_TRUE(torch::equal(back, c == 1 ? img : img)) << c;
    EXPECT_EQ(back.size(2), c);
  }
}

TEST(ImageIO, JpegRoundTripIsClose) {
  // smooth content (8×8-block aligned) so that the JPEG error is small
  auto img = torch::arange(8 * 10 * 3).view({8, 10, 3}).mul(3).remainder(256).to(torch::kUInt8)
                 .repeat_interleave(8, 0).repeat_interleave(8, 1).contiguous();
  auto jpg = encode_jpeg(img, 95);
  auto back = decode_image(jpg.data(), jpg.size());
  ASSERT_EQ(back.sizes(), img.sizes());
  EXPECT_LT((back.to(torch::kFloat) - img.to(torch::kFloat)).abs().mean().item<double>(), 4.0);
}

TEST(ImageIO, BadInputsThrowWithAMessage) {
  auto img = torch::randint(0, 256, {32, 32, 3}, torch::kUInt8);
  auto png = encode_png(img), jpg = encode_jpeg(img);
  EXPECT_THROW(decode_image("", 0), std::runtime_error);
  EXPECT_THROW(decode_image("GIF89a......", 12), std::runtime_error);
  EXPECT_THROW(decode_image(png.data(), png.size() / 2), std::runtime_error);
  EXPECT_THROW(decode_image(jpg.data(), jpg.size() / 2), std::runtime_error);
  std::string bad = png;
  for (size_t i = 40; i < bad.size() - 20; i += 7) bad[i] ^= 0x5A;
  EXPECT_THROW(decode_image(bad.data(), bad.size()), std::runtime_error);
  try {
    decode_image(png.data(), 20, "'x.png'");
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("x.png"), std::string::npos);
  }
}

TEST(Augment, ImageAndLabelStayAlignedAndPadWithIgnore) {
  // image value encodes the label: 40·label + 20, constant on 8×8 blocks
  const int64_t H = 48, W = 64;
  auto yy = torch::arange(H).view({H, 1}).expand({H, W}).div(8, "floor");
  auto xx = torch::arange(W).view({1, W}).expand({H, W}).div(8, "floor");
  auto label = ((yy * 3 + xx) % 5).to(torch::kUInt8);
  // channel 0 = 40·l + 20, channel 1 = 9·l² + 20: a blend of two blocks cannot look pure in both
  auto lf = label.to(torch::kFloat);
  auto img = torch::stack({lf * 40 + 20, lf * lf * 9 + 20, lf * 0 + 50}).contiguous();
  std::mt19937_64 rng(1);
  AugmentOptions o;
  o.crop_h = 40;
  o.crop_w = 56;
  int padded_runs = 0;
  for (int trial = 0; trial < 30; ++trial) {
    o.scale_min = trial % 3 == 0 ? 0.5 : 1.0;  // 0.5 → smaller than the crop → padding
    o.scale_max = trial % 3 == 0 ? 0.5 : 2.0;
    auto [x, y] = augment(img, label, o, {7.f, 7.f, 7.f}, rng);
    ASSERT_EQ(x.sizes(), (std::vector<int64_t>{3, 40, 56}));
    ASSERT_EQ(y.sizes(), (std::vector<int64_t>{40, 56}));
    auto valid = y != 255;
    auto expect = y.to(torch::kFloat) * 40 + 20;
    // Pixels whose image value is exactly one of the levels (block interiors; borders are
    // blended by bilinear resizing) must carry that level's label. A one-pixel shift between
    // image and label would break this at every block edge.
    auto level = ((x[0] - 20) / 40).round();
    auto pure = ((x[0] - (level * 40 + 20)).abs() < 0.01) & ((x[1] - (level * level * 9 + 20)).abs() < 0.01) & valid;
    auto agree = pure & (level == y.to(torch::kFloat));
    EXPECT_GT(pure.sum().item<double>() / valid.sum().item<double>(), 0.4) << trial;
    EXPECT_GT(agree.sum().item<double>() / pure.sum().item<double>(), 0.99) << trial;
    // padded label pixels (255) sit where the image holds the fill value
    auto pad = y == 255;
    if (pad.any().item<bool>()) {
      ++padded_runs;
      EXPECT_TRUE((x[0].masked_select(pad) == 7.0f).all().item<bool>());
    }
  }
  EXPECT_GT(padded_runs, 0);
}

TEST(Augment, FlipMirrorsBoth) {
  auto label = torch::arange(32 * 32).view({32, 32}).remainder(200).to(torch::kUInt8);
  auto img = label.to(torch::kFloat).unsqueeze(0).expand({3, 32, 32}).contiguous();
  AugmentOptions o;
  o.crop_h = o.crop_w = 32;
  o.scale_min = o.scale_max = 1.0;
  std::mt19937_64 rng(3);
  int flipped = 0;
  for (int i = 0; i < 16; ++i) {
    auto [x, y] = augment(img, label, o, {0, 0, 0}, rng);
    EXPECT_TRUE(torch::equal(x[0], y.to(torch::kFloat)));
    flipped += !torch::equal(y, label);
  }
  EXPECT_GT(flipped, 0);
  EXPECT_LT(flipped, 16);
}

TEST(Dataset, ListDatasetLoadsAndRejectsBadLabels) {
  auto dir = fixtures::temp_dir("list");
  fixtures::make_shapes_dataset(dir, 3, 1);
  auto ds = SegDataset::open("list", dir.string(), "train");
  EXPECT_EQ(ds.size(), 3u);
  EXPECT_EQ(ds.num_classes(), 3);
  EXPECT_EQ(ds.meta().class_names[1], "disc");
  auto [img, lab] = ds.load(0);
  EXPECT_EQ(img.sizes(), (std::vector<int64_t>{64, 64, 3}));
  EXPECT_EQ(lab.max().item<int>(), 2);
  // a label value outside the classes (and not the ignore id): error names file and value
  write_png((dir / "labels" / "train_1.png").string(), torch::full({64, 64}, 7, torch::kUInt8));
  try {
    ds.load(1);
    FAIL();
  } catch (const std::runtime_error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("train_1.png"), std::string::npos) << m;
    EXPECT_NE(m.find("value 7"), std::string::npos) << m;
  }
  // label of the wrong size
  write_png((dir / "labels" / "train_2.png").string(), torch::zeros({32, 64}, torch::kUInt8));
  try {
    ds.load(2);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("train_2.png"), std::string::npos) << e.what();
  }
  // corrupt image
  std::ofstream(dir / "images" / "train_0.png") << "\x89PNG\r\n\x1a\n garbage";
  try {
    ds.load(0);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("train_0.png"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(Dataset, CityscapesLayoutAndLabelMapping) {
  auto dir = fixtures::temp_dir("cityscapes");
  for (std::string city : {"aachen", "bremen"}) {
    fs::create_directories(dir / "leftImg8bit" / "train" / city);
    fs::create_directories(dir / "gtFine" / "train" / city);
    auto img = torch::full({40, 80, 3}, 100, torch::kUInt8);
    // labelIds: 7 road → 0, 26 car → 13, 33 bicycle → 18, 0 unlabeled → 255, 4 static → 255
    auto lab = torch::zeros({40, 80}, torch::kUInt8);
    lab.narrow(1, 0, 16).fill_(7);
    lab.narrow(1, 16, 16).fill_(26);
    lab.narrow(1, 32, 16).fill_(33);
    lab.narrow(1, 48, 16).fill_(4);
    std::string stem = city + "_000000_000019";
    write_png((dir / "leftImg8bit" / "train" / city / (stem + "_leftImg8bit.png")).string(), img);
    write_png((dir / "gtFine" / "train" / city / (stem + "_gtFine_labelIds.png")).string(), lab);
  }
  auto ds = SegDataset::open("cityscapes", dir.string(), "train");
  ASSERT_EQ(ds.size(), 2u);
  EXPECT_EQ(ds.num_classes(), 19);
  auto lab = ds.load_label(1);
  EXPECT_EQ(lab[0][0].item<int>(), 0);
  EXPECT_EQ(lab[0][20].item<int>(), 13);
  EXPECT_EQ(lab[0][40].item<int>(), 18);
  EXPECT_EQ(lab[0][50].item<int>(), 255);
  EXPECT_EQ(lab[0][70].item<int>(), 255);
  // a value that is no Cityscapes labelId
  write_png((dir / "gtFine" / "train" / "aachen" / "aachen_000000_000019_gtFine_labelIds.png").string(),
            torch::full({40, 80}, 200, torch::kUInt8));
  try {
    ds.load_label(0);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("aachen_000000_000019_gtFine_labelIds.png"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("200"), std::string::npos);
  }
  EXPECT_THROW(SegDataset::open("cityscapes", dir.string(), "val"), std::runtime_error);
  fs::remove_all(dir);
}

TEST(Dataset, ClassWeightsFollowEnetFormula) {
  auto w = enet_class_weights({70, 20, 10, 0});
  EXPECT_NEAR(w[0], 1.0 / std::log(1.10 + 0.7), 1e-6);
  EXPECT_NEAR(w[3], 1.0 / std::log(1.10), 1e-6);
  EXPECT_GT(w[2], w[1]);
}

TEST(Dataset, CamVidWhenPresent) {
  const std::string d = fixtures::camvid_dir();
  if (d.empty()) GTEST_SKIP() << "CamVid not found at ../shared/data/camvid (set LIGHTSEG_CAMVID)";
  auto tr = SegDataset::open("camvid", d, "train");
  auto va = SegDataset::open("camvid", d, "val");
  EXPECT_EQ(tr.size(), 367u);
  EXPECT_EQ(va.size(), 101u);
  auto [img, lab] = va.load(0);
  EXPECT_EQ(img.sizes(), (std::vector<int64_t>{360, 480, 3}));
  EXPECT_EQ(lab.sizes(), (std::vector<int64_t>{360, 480}));
  auto vals = std::get<0>(at::_unique(lab));
  EXPECT_LE(vals.max().item<int>(), 255);
  EXPECT_TRUE(((vals < 11) | (vals == 255)).all().item<bool>());
}
