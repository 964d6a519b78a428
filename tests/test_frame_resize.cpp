// The Predictor's input-size path (src/infer/frame_resize.cpp) against torch's interpolate, which
// it replaces: the frame straight from uint8 to the network's size, the labels straight back.
#include <gtest/gtest.h>

#include "lightseg/image_io.h"
#include "infer/frame_resize.h"

using namespace lightseg;
namespace F = torch::nn::functional;

namespace {
torch::Tensor random_u8(std::vector<int64_t> sizes, int seed) {
  torch::manual_seed(seed);
  return torch::randint(0, 256, sizes, torch::kUInt8);
}
}  // namespace

TEST(FrameResize, FrameToNetworkInputIsTorchsBilinearFromTheUint8Pixels) {
  const std::vector<std::array<int64_t, 5>> cases = {
      // H, W, C, h, w
      {960, 1280, 3, 360, 480}, {97, 131, 3, 40, 56}, {40, 56, 3, 97, 131},  // down, odd, up
      {64, 64, 3, 64, 64},      {35, 61, 1, 24, 32},  {35, 61, 4, 24, 32},  {30, 20, 2, 7, 9}};
  int seed = 1;
  for (const auto& [H, W, C, h, w] : cases) {
    const auto img = random_u8({H, W, C}, seed++);
    const auto ref = F::interpolate(to_rgb_chw_float(img).unsqueeze(0),
                                    F::InterpolateFuncOptions().size(std::vector<int64_t>{h, w}).mode(torch::kBilinear).align_corners(false))[0];
    const auto got = frame_to_network_input(img, h, w);
    ASSERT_EQ(got.sizes(), ref.sizes()) << H << "x" << W << "x" << C;
    // float rounding of another order of the same products (a wrong tap would be off by units)
    EXPECT_LT((got - ref).abs().max().item<float>(), 0.05) << H << "x" << W << "x" << C << " -> " << h << "x" << w;
  }
  // a 2-D gray image is one channel
  const auto gray = random_u8({20, 30}, 9);
  EXPECT_TRUE(torch::allclose(frame_to_network_input(gray, 10, 15), frame_to_network_input(gray.unsqueeze(2), 10, 15)));
  EXPECT_THROW(frame_to_network_input(torch::zeros({4, 4, 3}), 2, 2), std::invalid_argument);  // float
  EXPECT_THROW(frame_to_network_input(random_u8({4, 4, 5}, 3), 2, 2), std::invalid_argument);
}

TEST(FrameResize, LabelsToFrameSizePicksTorchsNearestIndices) {
  const std::vector<std::array<int64_t, 5>> cases = {
      // N, h, w, H, W
      {1, 360, 480, 960, 1280}, {2, 40, 56, 80, 112}, {1, 40, 56, 97, 131}, {1, 97, 131, 40, 56}, {1, 33, 33, 33, 33},
      {3, 272, 480, 1080, 1920}};
  int seed = 11;
  for (const auto& [N, h, w, H, W] : cases) {
    const auto lab = random_u8({N, h, w}, seed++);
    const auto ref = F::interpolate(lab.unsqueeze(1).to(torch::kFloat32),
                                    F::InterpolateFuncOptions().size(std::vector<int64_t>{H, W}).mode(torch::kNearest))
                         .squeeze(1)
                         .to(torch::kUInt8);
    const auto got = labels_to_frame_size(lab, H, W);
    EXPECT_TRUE(torch::equal(got, ref)) << N << "x" << h << "x" << w << " -> " << H << "x" << W;
  }
  EXPECT_THROW(labels_to_frame_size(torch::zeros({2, 2}, torch::kUInt8), 4, 4), std::invalid_argument);
}
