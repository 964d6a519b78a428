// Blur and noise augmentation (AugmentOptions::blur, ::noise; train's `blur` and `noise` keys):
// what each does to a crop, that they are drawn per sample, and that off means untouched.
#include <gtest/gtest.h>

#include <random>

#include "data/transforms.h"

using namespace lightseg;

namespace {
// A smooth gradient with a sharp square in it, 3×48×64, values within 40..215 (no clamping by noise of std ≤ 12).
torch::Tensor test_crop() {
  auto y = torch::linspace(40, 140, 48).view({1, 48, 1}), x = torch::linspace(0, 60, 64).view({1, 1, 64});
  auto img = (y + x).expand({3, 48, 64}).clone();
  img.narrow(1, 16, 16).narrow(2, 24, 16).fill_(215);
  return img;
}
// Mean squared difference of horizontally neighbouring pixels: high-frequency energy (a blur
// keeps a step's total variation but spreads it, so its square falls).
double edge_energy(const torch::Tensor& img) {
  return (img.narrow(2, 1, img.size(2) - 1) - img.narrow(2, 0, img.size(2) - 1)).pow(2).mean().item<double>();
}
}  // namespace

TEST(BlurNoise, BlurSmoothsNoiseAddsItsStdAndNeitherTouchesAnUndrawnSample) {
  const auto img = test_crop().unsqueeze(0);
  AugmentDraw none, blur, noise, noise2;
  blur.blur_sigma = 1.5;
  noise.noise_std = 12;
  noise.noise_seed = 7;
  noise2 = noise;
  noise2.noise_seed = 8;
  auto out = blur_and_noise(torch::cat({img, img, img, img}), {none, blur, noise, noise2});
  EXPECT_TRUE(torch::equal(out[0], img[0]));  // no draw: bit for bit
  EXPECT_LT(edge_energy(out[1]), 0.5 * edge_energy(img[0]));
  EXPECT_NEAR(out[1].mean().item<double>(), img[0].mean().item<double>(), 0.5);  // blur keeps the mean
  const auto n = out[2] - img[0];
  EXPECT_NEAR(n.std().item<double>(), 12.0, 0.6);
  EXPECT_NEAR(n.mean().item<double>(), 0.0, 0.3);
  // the seed is the pattern: another seed, another noise (nearly uncorrelated); the same seed, the same
  const auto n2 = out[3] - img[0];
  EXPECT_LT(std::abs((n * n2).mean().item<double>()) / (12.0 * 12.0), 0.05);
  EXPECT_TRUE(torch::equal(blur_and_noise(img, {noise})[0], out[2]));
  // clamped to 0..255
  auto bright = torch::full({1, 3, 8, 8}, 250.0f);
  EXPECT_LE(blur_and_noise(bright, {noise}).max().item<float>(), 255.0f);
}

TEST(BlurNoise, DrawsAreMadeOnlyWhenAskedSoOldRunsReplayTheirAugmentation) {
  AugmentOptions plain;
  plain.jitter = 0.2;
  AugmentOptions more = plain;
  more.blur = 0.5;
  more.noise = 8;
  std::mt19937_64 r1(5), r2(5);
  int blurred = 0, noised = 0;
  for (int i = 0; i < 200; ++i) {
    const auto a = draw_augment(plain, 360, 480, r1), b = draw_augment(more, 360, 480, r2);
    // the earlier draws of each sample are those of a run without blur and noise
    EXPECT_EQ(a.blur_sigma, 0);
    EXPECT_EQ(a.noise_std, 0);
    if (i == 0) {
      EXPECT_EQ(a.scale, b.scale);
      EXPECT_EQ(a.y0, b.y0);
      EXPECT_EQ(a.brightness, b.brightness);
    }
    r1 = r2;  // keep the two streams aligned at each sample's start
    if (b.blur_sigma > 0) {
      ++blurred;
      EXPECT_GE(b.blur_sigma, 0.5);
      EXPECT_LE(b.blur_sigma, kMaxBlurSigma);
    }
    if (b.noise_std > 0) ++noised;
    EXPECT_LE(b.noise_std, 8.0);
  }
  EXPECT_GT(blurred, 70);  // probability 0.5 of 200
  EXPECT_LT(blurred, 130);
  EXPECT_GT(noised, 190);
}
