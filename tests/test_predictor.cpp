// Predictor (claim 8's processing unit) and the palette helpers.
#include <cstdlib>
#include <thread>

#include <gtest/gtest.h>

#include "lightseg/image_io.h"
#include "lightseg/palette.h"
#include "lightseg/predictor.h"
#include "core/json_io.h"
#include "predictor_fixtures.h"

using namespace lightseg;
namespace fx = lightseg::fixtures;

namespace {

const Predictor& shared_predictor() {
  static Predictor p(fx::random_network(), ModelMeta::camvid());
  return p;
}

torch::Tensor rgb_image(int64_t h, int64_t w, uint64_t seed) { return fx::shapes_sample(h, w, seed).first; }

}  // namespace

TEST(Predictor, OutputIsAtTheInputSizeForOddSizesGrayRgbRgba) {
  fx::one_thread();
  const auto& p = shared_predictor();
  std::vector<torch::Tensor> inputs = {
      rgb_image(45, 77, 1),                                        // odd RGB
      rgb_image(61, 35, 2).select(2, 0).contiguous(),              // gray H×W
      rgb_image(33, 47, 3).narrow(2, 1, 1).contiguous(),           // gray H×W×1
      torch::cat({rgb_image(50, 41, 4), torch::full({50, 41, 1}, 200, torch::kUInt8)}, 2),  // RGBA
      rgb_image(7, 5, 5),                                          // smaller than the network's minimum
      torch::full({1, 1, 3}, 90, torch::kUInt8),                   // one pixel
  };
  for (const auto& img : inputs) {
    auto r = p.predict(img, /*confidence=*/true);
    ASSERT_EQ(r.labels.dim(), 2);
    EXPECT_EQ(r.labels.size(0), img.size(0)) << img.sizes();
    EXPECT_EQ(r.labels.size(1), img.size(1)) << img.sizes();
    EXPECT_EQ(r.labels.scalar_type(), torch::kUInt8);
    EXPECT_LT(r.labels.max().item<int>(), 11);
    ASSERT_EQ(r.confidence.sizes(), r.labels.sizes());
    EXPECT_GE(r.confidence.min().item<float>(), 1.0f / 11 - 1e-6f);  // the winner of 11 classes
    EXPECT_LE(r.confidence.max().item<float>(), 1.0f + 1e-6f);
  }
  // the fixture network really segments: several classes appear on a structured image
  auto r = p.predict(rgb_image(96, 128, 9));
  EXPECT_GE(torch::bincount(r.labels.flatten().to(torch::kLong)).gt(0).sum().item<int64_t>(), 2);
}

TEST(Predictor, SameImageSameLabelsAndChannelHandling) {
  fx::one_thread();
  const auto& p = shared_predictor();
  auto img = rgb_image(57, 83, 11);
  auto a = p.predict(img).labels, b = p.predict(img).labels;
  EXPECT_TRUE(a.equal(b));
  // gray = the same value in R, G and B; alpha is ignored
  auto gray = img.select(2, 1).contiguous();
  EXPECT_TRUE(p.predict(gray).labels.equal(p.predict(gray.unsqueeze(2).expand({57, 83, 3}).contiguous()).labels));
  auto rgba = torch::cat({img, torch::randint(0, 256, {57, 83, 1}, torch::kUInt8)}, 2);
  EXPECT_TRUE(p.predict(rgba).labels.equal(a));
  // encoded bytes give the same labels as the decoded image
  auto png = encode_png(img);
  auto e = p.predict_encoded(png.data(), png.size());
  EXPECT_TRUE(e.labels.equal(a));
  EXPECT_TRUE(e.image.equal(img));
}

TEST(Predictor, BatchGivesTheSameLabelsAsSingleCalls) {
  fx::one_thread();
  const auto& p = shared_predictor();
  std::vector<torch::Tensor> imgs = {rgb_image(64, 80, 21), rgb_image(48, 40, 22), rgb_image(64, 80, 23),
                                     rgb_image(64, 80, 24).select(2, 0).contiguous(), rgb_image(31, 29, 25)};
  auto batch = p.predict_batch(imgs, /*confidence=*/true);
  ASSERT_EQ(batch.size(), imgs.size());
  for (size_t i = 0; i < imgs.size(); ++i) {
    auto single = p.predict(imgs[i], true);
    ASSERT_EQ(batch[i].labels.sizes(), single.labels.sizes()) << i;
    // The same arithmetic up to float rounding: allow a handful of exact ties to flip.
    EXPECT_GE(fx::agreement(batch[i].labels, single.labels), 0.999) << "image " << i;
    EXPECT_TRUE(torch::allclose(batch[i].confidence, single.confidence, 1e-4, 1e-4)) << "image " << i;
  }
}

TEST(Predictor, ConcurrentCallersGetTheirOwnResults) {
  fx::one_thread();
  for (int engines : {1, 2}) {
    PredictorOptions o;
    o.engines = engines;
    Predictor p(fx::random_network(), ModelMeta::camvid(), o);
    const int kThreads = 4, kCalls = 2;
    std::vector<torch::Tensor> imgs, expected;
    for (int i = 0; i < kThreads * kCalls; ++i) {
      imgs.push_back(rgb_image(40 + i % 5, 56 + (i % 3) * 4, 100 + i));
      expected.push_back(p.predict(imgs.back()).labels);
    }
    std::vector<torch::Tensor> got(imgs.size());
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        for (int c = 0; c < kCalls; ++c) got[t * kCalls + c] = p.predict(imgs[t * kCalls + c]).labels;
      });
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < imgs.size(); ++i) EXPECT_TRUE(got[i].equal(expected[i])) << "engines " << engines << ", image " << i;
  }
}

TEST(Predictor, BadEncodedInputThrowsInputErrorOfTheRightKind) {
  fx::one_thread();
  PredictorOptions o;
  o.max_pixels = 40 * 40;
  Predictor p(fx::random_network(), ModelMeta::camvid(), o);
  auto img = rgb_image(32, 32, 3);
  const std::string png = encode_png(img), jpg = encode_jpeg(img);
  auto kind_of = [&](const std::string& bytes) {
    try {
      p.predict_encoded(bytes.data(), bytes.size(), false, "'upload.bin'");
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("upload.bin"), std::string::npos) << e.what();
      return static_cast<int>(e.kind());
    }
    return -1;
  };
  using K = InputError::Kind;
  EXPECT_EQ(kind_of(""), int(K::Empty));
  EXPECT_EQ(kind_of("hello, this is text and not an image"), int(K::NotAnImage));
  EXPECT_EQ(kind_of(std::string("GIF89a\x01\x00\x01\x00\x00\x00\x00;", 13)), int(K::Unsupported));
  EXPECT_EQ(kind_of(png.substr(0, png.size() / 2)), int(K::Corrupt));
  EXPECT_EQ(kind_of(jpg.substr(0, jpg.size() / 2)), int(K::Corrupt));
  EXPECT_EQ(kind_of(encode_png(rgb_image(41, 40, 1))), int(K::TooLarge));
  EXPECT_EQ(kind_of(encode_jpeg(rgb_image(40, 41, 1))), int(K::TooLarge));
  EXPECT_EQ(kind_of(png), -1);  // within the limit
  EXPECT_THROW(p.predict(torch::zeros({0, 4, 3}, torch::kUInt8)), std::invalid_argument);
  EXPECT_THROW(p.predict(torch::zeros({8, 8, 3}, torch::kFloat32)), std::invalid_argument);
  EXPECT_THROW(p.predict(torch::zeros({8, 8, 2, 1}, torch::kUInt8)), std::invalid_argument);
}

TEST(Predictor, ChecksImageSizeFromHeadersWithItsPixelLimit) {
  fx::one_thread();
  auto img = rgb_image(37, 53, 4);
  PredictorOptions o;
  o.engine.backend = "fused";
  o.max_pixels = 53 * 37;
  Predictor p(fx::random_network(), ModelMeta::camvid(), o);
  for (const std::string& bytes : {encode_png(img), encode_jpeg(img), encode_png(img.select(2, 0).contiguous())}) {
    const ImageSize s = check_image(bytes.data(), bytes.size());
    EXPECT_EQ(s.width, 53);
    EXPECT_EQ(s.height, 37);
    EXPECT_EQ(p.check_encoded(bytes.data(), bytes.size()).width, 53);  // exactly at the limit
  }
  const std::string wider = encode_png(rgb_image(37, 54, 4));
  try {
    p.check_encoded(wider.data(), wider.size(), "wider");
    ADD_FAILURE() << "one column over the limit passed";
  } catch (const InputError& e) {
    EXPECT_EQ(e.kind(), InputError::Kind::TooLarge);
    EXPECT_NE(std::string(e.what()).find("54×37"), std::string::npos) << e.what();
  }
  EXPECT_THROW(check_image("abc", 3), InputError);
  EXPECT_EQ(format_name(sniff_format("RIFF\0\0\0\0WEBPVP8 ", 16)), "WebP");
  EXPECT_EQ(format_name(sniff_format("II*\0", 4)), "TIFF");
  EXPECT_EQ(format_name(sniff_format("GIF89a", 6)), "GIF");
  EXPECT_EQ(sniff_format("just text", 9), ImageFormat::Unknown);
}

TEST(Predictor, UsesTheDefaultWeightsWhenNoneAreGiven) {
  fx::one_thread();
  auto dir = fx::temp_dir("predictor_default");
  // default_weights_path() looks in $LIGHTSEG_MODELS first
  const std::string path = fx::random_weights(dir);
  std::filesystem::rename(path, dir / "camvid.lsw");
  const char* old = std::getenv("LIGHTSEG_MODELS");
  const std::string saved = old ? old : "";
  ::setenv("LIGHTSEG_MODELS", dir.c_str(), 1);
  Predictor p;  // no weights path
  if (old) ::setenv("LIGHTSEG_MODELS", saved.c_str(), 1);
  else ::unsetenv("LIGHTSEG_MODELS");
  EXPECT_EQ(std::filesystem::canonical(p.weights_path()), std::filesystem::canonical(dir / "camvid.lsw"));
  EXPECT_EQ(p.meta().class_names, ModelMeta::camvid().class_names);
  EXPECT_EQ(p.parameters(), count_parameters(*fx::random_network()));
  // and it is the network that was saved
  auto img = rgb_image(48, 64, 5);
  EXPECT_TRUE(p.predict(img).labels.equal(shared_predictor().predict(img).labels));
  std::filesystem::remove_all(dir);
}

TEST(Palette, ColorizeOverlayAndLegend) {
  fx::one_thread();
  std::vector<RGB> pal = {{{10, 20, 30}}, {{200, 100, 0}}};
  ModelMeta meta;
  meta.class_names = {"a", "b"};
  meta.palette = pal;
  auto labels = torch::tensor({0, 1, 1, 255}, torch::kUInt8).view({2, 2});
  auto c = colorize(labels, pal);
  ASSERT_EQ(c.sizes(), (std::vector<int64_t>{2, 2, 3}));
  EXPECT_EQ(c[0][0][2].item<int>(), 30);
  EXPECT_EQ(c[0][1][0].item<int>(), 200);
  EXPECT_EQ(c[1][1].sum().item<int>(), 0);  // no colour for 255
  auto img = torch::full({2, 2, 3}, 100, torch::kUInt8);
  EXPECT_TRUE(overlay(img, labels, pal, 0.0).equal(img));
  auto full = overlay(img, labels, pal, 1.0);
  EXPECT_TRUE(full[0][1].equal(c[0][1]));
  EXPECT_TRUE(full[1][1].equal(img[1][1]));  // ignore id keeps the image
  auto half = overlay(img.select(2, 0).contiguous(), labels, pal, 0.5);  // gray input
  EXPECT_EQ(half[0][1][0].item<int>(), 150);
  EXPECT_EQ(half[0][1][2].item<int>(), 50);
  EXPECT_THROW(overlay(img, labels, pal, 1.5), std::invalid_argument);
  EXPECT_THROW(overlay(torch::zeros({3, 2, 3}, torch::kUInt8), labels, pal, 0.5), std::invalid_argument);
  auto lg = legend(labels, meta);
  ASSERT_EQ(lg.size(), 2u);
  EXPECT_EQ(lg[0].pixels, 1);
  EXPECT_EQ(lg[1].pixels, 2);
  EXPECT_DOUBLE_EQ(lg[1].share, 0.5);
  EXPECT_EQ(lg[1].name, "b");
  auto j = to_json(lg);
  EXPECT_EQ(j[1]["color"][0], 200);
}

// The one rendering segment and serve share: PNG bytes that decode to the ids, the mask, the overlay.
TEST(Palette, RenderGivesThePngOfEachRendering) {
  std::vector<RGB> pal = {{{10, 20, 30}}, {{200, 100, 0}}};
  auto labels = torch::tensor({0, 1, 1, 255, 0, 1}, torch::kUInt8).view({2, 3});
  auto img = torch::full({2, 3, 3}, 100, torch::kUInt8);
  auto decoded = [](const std::string& png) { return decode_image(png.data(), png.size()); };
  EXPECT_TRUE(decoded(render(img, labels, pal, Render::Ids)).squeeze(2).equal(labels));
  EXPECT_TRUE(decoded(render(img, labels, pal, render_from_string("color"))).equal(colorize(labels, pal)));
  EXPECT_TRUE(decoded(render(img, labels, pal, Render::Overlay, 0.3)).equal(overlay(img, labels, pal, 0.3)));
  EXPECT_TRUE(decoded(render(img, labels.to(torch::kLong), pal, Render::Ids)).squeeze(2).equal(labels));
  EXPECT_THROW(render_from_string("json"), std::invalid_argument);
  EXPECT_THROW(render(img, labels, pal, Render::Overlay, 2.0), std::invalid_argument);
}

// PredictorOptions::input_size: the network sees the resized image, the labels come back at
// the input's own size.
TEST(Predictor, InputSizeGivesLabelsAtTheOriginalSize) {
  fx::one_thread();
  PredictorOptions o;
  o.input_size = InputSize::parse("40x56");
  Predictor p(fx::random_network(), ModelMeta::camvid(), o);
  const auto& plain = shared_predictor();
  auto small = rgb_image(40, 56, 11);
  // a 2x copy (each pixel a 2x2 block): bilinear to 40x56 gives back the small image
  auto big = small.repeat_interleave(2, 0).repeat_interleave(2, 1).contiguous();
  auto r = p.predict(big, /*confidence=*/true);
  ASSERT_EQ(r.labels.sizes(), (std::vector<int64_t>{80, 112}));
  ASSERT_EQ(r.confidence.sizes(), (std::vector<int64_t>{80, 112}));
  auto expect = plain.predict(small).labels.repeat_interleave(2, 0).repeat_interleave(2, 1);
  EXPECT_GE(fx::agreement(r.labels, expect), 0.99);
  // labels-only path and the encoded front door agree
  EXPECT_GE(fx::agreement(p.predict(big).labels, expect), 0.99);
  const std::string png = encode_png(big);
  auto info = p.inspect(png.data(), png.size());
  EXPECT_EQ(info.cost, 40 * 56);  // the network's size, not the image's
  EXPECT_GE(fx::agreement(p.predict_inspected(info, png.data(), png.size()).labels, expect), 0.99);
  // odd sizes, gray, and smaller than the input size
  for (auto img : {rgb_image(45, 77, 1), rgb_image(61, 35, 2).select(2, 0).contiguous(), rgb_image(7, 5, 3)}) {
    auto q = p.predict(img);
    EXPECT_EQ(q.labels.size(0), img.size(0));
    EXPECT_EQ(q.labels.size(1), img.size(1));
  }
}

TEST(Predictor, InputSizeLongestSideKeepsAspectAndRounds) {
  auto s = InputSize::parse("480");
  EXPECT_TRUE(s.longest_side);
  EXPECT_EQ(s.resolve(960, 1280), (std::pair<int64_t, int64_t>{360, 480}));
  EXPECT_EQ(s.resolve(1280, 960), (std::pair<int64_t, int64_t>{480, 360}));
  EXPECT_EQ(s.resolve(1080, 1920), (std::pair<int64_t, int64_t>{272, 480}));  // 270 → a multiple of 8
  EXPECT_EQ(s.resolve(100, 3000), (std::pair<int64_t, int64_t>{32, 480}));    // never below 32
  EXPECT_EQ(InputSize::parse("360x480").resolve(7, 5), (std::pair<int64_t, int64_t>{360, 480}));
  EXPECT_TRUE(InputSize::parse("").none());
  EXPECT_TRUE(InputSize::parse("0").none());
  EXPECT_EQ(InputSize::parse("0").resolve(45, 77), (std::pair<int64_t, int64_t>{45, 77}));
  EXPECT_EQ(InputSize::parse("360x480").text(), "360x480");
}

TEST(Predictor, BadInputSizesAreClearErrors) {
  for (const char* t : {"0x480", "-5", "360x-1", "16", "360x16", "100000", "99999x480", "abc", "360x", "x480", "3.5"}) {
    try {
      InputSize::parse(t);
      ADD_FAILURE() << "'" << t << "' was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + t + "'"), std::string::npos) << e.what();
    }
  }
  PredictorOptions o;
  o.input_size.height = 10;
  o.input_size.width = 480;
  EXPECT_THROW(Predictor(fx::random_network(), ModelMeta::camvid(), o), std::invalid_argument);
}
