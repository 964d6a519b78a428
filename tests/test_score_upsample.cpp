// The class scores' bilinear resize (src/model/score_upsample.cpp) against torch's bilinear
// interpolation (align_corners = false) in double precision, forward and backward. Named Fused.*
// so that the suite runs it again at LIGHTSEG_MAX_ISA=avx2 and generic (CMakeLists.txt).
#include <gtest/gtest.h>

#include <string>

#include "lightseg/model/fusion_decoder.h"
#include "model/score_upsample.h"

using namespace lightseg;

namespace {

torch::Tensor reference(const torch::Tensor& x, int64_t h, int64_t w) {
  return torch::nn::functional::interpolate(x, torch::nn::functional::InterpolateFuncOptions()
                                                   .size(std::vector<int64_t>{h, w})
                                                   .mode(torch::kBilinear)
                                                   .align_corners(false));
}

double rel_err(const torch::Tensor& got, const torch::Tensor& want) {
  const auto w = want.to(torch::kFloat64), g = got.to(torch::kFloat64);
  return ((g - w).abs().max() / (w.abs().max() + 1e-12)).item<double>();
}

struct Case {
  int64_t N, C, H, W, h, w;
};

}  // namespace

TEST(Fused, ScoreUpsampleMatchesTorchsBilinearForwardAndBackward) {
  // C1.11's ×4 and the auxiliary heads' ×8 with CamVid's 11 classes; class counts below, at and
  // over one vector (the loads and stores that cross a pixel); factors that are no integer, a
  // shrink, the same size, one source pixel, one output column.
  const Case cases[] = {{2, 11, 9, 12, 36, 48}, {1, 11, 5, 6, 40, 48}, {2, 19, 7, 5, 16, 23}, {1, 2, 6, 7, 6, 7},
                        {1, 33, 8, 9, 5, 4},    {1, 1, 1, 1, 3, 5},    {3, 16, 4, 4, 8, 8},   {1, 17, 3, 2, 9, 1}};
  torch::manual_seed(7);
  for (const auto& k : cases) {
    SCOPED_TRACE(std::to_string(k.N) + "x" + std::to_string(k.C) + "x" + std::to_string(k.H) + "x" +
                 std::to_string(k.W) + " -> " + std::to_string(k.h) + "x" + std::to_string(k.w));
    const auto base = torch::randn({k.N, k.C, k.H, k.W}) * 5;
    const auto grad = torch::randn({k.N, k.C, k.h, k.w});
    auto xd = base.to(torch::kFloat64).requires_grad_(true);
    auto want = reference(xd, k.h, k.w);
    want.backward(grad.to(torch::kFloat64));

    auto x = base.contiguous(at::MemoryFormat::ChannelsLast).requires_grad_(true);
    ASSERT_TRUE(model::score_upsample_applies(x));
    auto y = model::score_upsample(x, k.h, k.w);
    EXPECT_EQ(y.sizes(), want.sizes());
    EXPECT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast));
    EXPECT_LT(rel_err(y, want), 1e-6) << "forward";
    // the incoming gradient in either layout
    y.backward(k.N == 2 ? grad : grad.contiguous(at::MemoryFormat::ChannelsLast));
    EXPECT_LT(rel_err(x.grad(), xd.grad()), 1e-6) << "backward";
  }
}

TEST(Fused, ScoreUpsampleIsTheSameOnAnyNumberOfThreads) {
  torch::manual_seed(8);
  const auto x0 = torch::randn({3, 11, 45, 60}).contiguous(at::MemoryFormat::ChannelsLast);
  const auto g = torch::randn({3, 11, 360, 480}).contiguous(at::MemoryFormat::ChannelsLast);
  const int threads = torch::get_num_threads();
  std::vector<torch::Tensor> out, grads;
  for (int t : {1, 2, 3}) {
    torch::set_num_threads(t);
    auto x = x0.clone().requires_grad_(true);
    auto y = model::score_upsample(x, 360, 480);
    y.backward(g);
    out.push_back(y.detach());
    grads.push_back(x.grad());
  }
  torch::set_num_threads(threads);
  for (size_t i = 1; i < out.size(); ++i) {
    EXPECT_TRUE(torch::equal(out[0], out[i]));
    EXPECT_TRUE(torch::equal(grads[0], grads[i]));
  }
}

TEST(Fused, ScoreUpsampleTakesTheTrainingScoresAndRefusesOthers) {
  torch::manual_seed(9);
  // upsample_scores: bfloat16 scores (autocast) come back float32, as the float32 resize of them
  const auto lo = torch::randn({2, 11, 6, 8}).to(torch::kBFloat16).contiguous(at::MemoryFormat::ChannelsLast);
  const auto up = model::upsample_scores(lo, 24, 32);
  EXPECT_EQ(up.scalar_type(), torch::kFloat32);
  EXPECT_LT(rel_err(up, reference(lo.to(torch::kFloat64), 24, 32)), 1e-6);
  EXPECT_EQ(model::upsample_scores(lo, 6, 8).scalar_type(), torch::kFloat32);
  // upsample_to: C1.9's ×2 of bfloat16 maps (autocast) in float32, rounded once to bfloat16;
  // the gradient comes back to the bfloat16 input
  auto feat = (torch::randn({2, 32, 5, 7}) * 3).to(torch::kBFloat16).contiguous(at::MemoryFormat::ChannelsLast);
  feat.requires_grad_(true);
  const auto grad = torch::randn({2, 32, 10, 14});
  auto fd = feat.detach().to(torch::kFloat64).requires_grad_(true);
  auto want = reference(fd, 10, 14);
  want.backward(grad.to(torch::kFloat64));
  auto got = model::upsample_to(feat, 10, 14);
  EXPECT_EQ(got.scalar_type(), torch::kBFloat16);
  EXPECT_LT(rel_err(got, want), 4e-3);  // one bfloat16 rounding (2^-8 of the value, at most)
  got.backward(grad.to(torch::kBFloat16));
  ASSERT_TRUE(feat.grad().defined());
  EXPECT_LT(rel_err(feat.grad(), fd.grad()), 8e-3);  // the incoming gradient rounded too
  // NCHW scores (C > 1) take torch's resize: the same values
  const auto nchw = torch::randn({1, 5, 6, 8});
  EXPECT_FALSE(model::score_upsample_applies(nchw));
  EXPECT_LT(rel_err(model::upsample_scores(nchw, 12, 16), reference(nchw.to(torch::kFloat64), 12, 16)), 1e-6);
  EXPECT_THROW(model::score_upsample(nchw, 12, 16), std::invalid_argument);
  EXPECT_THROW(model::score_upsample(lo, 12, 16), std::invalid_argument);  // bfloat16
  const auto cl = nchw.contiguous(at::MemoryFormat::ChannelsLast);
  EXPECT_THROW(model::score_upsample(cl, 0, 16), std::invalid_argument);
  EXPECT_THROW(model::score_upsample(cl.to(torch::kFloat64), 12, 16), std::invalid_argument);
}
