// Confusion-matrix metrics against hand-computed values; losses; LR schedule.
#include <gtest/gtest.h>

#include <cmath>

#include "train/fused_cross_entropy.h"
#include "train/losses.h"
#include "train/schedule.h"
#include "train/step_time.h"
#include "lightseg/metrics.h"
#include "lightseg/train.h"

using namespace lightseg;

TEST(Metrics, HandComputedConfusionWithAbsentAndIgnoredClasses) {
  ConfusionMatrix cm(4, 255);
  auto target = torch::tensor({0, 0, 1, 1, 2, 255}, torch::kLong);
  auto pred = torch::tensor({0, 1, 1, 1, 0, 2}, torch::kLong);
  cm.update(pred, target);
  EXPECT_EQ(cm.pixels(), 5);  // the ignored pixel is not counted
  EXPECT_EQ(cm.matrix()[0][0].item<int64_t>(), 1);
  EXPECT_EQ(cm.matrix()[0][1].item<int64_t>(), 1);
  EXPECT_EQ(cm.matrix()[1][1].item<int64_t>(), 2);
  EXPECT_EQ(cm.matrix()[2][0].item<int64_t>(), 1);
  auto iou = cm.iou();
  EXPECT_NEAR(iou[0], 1.0 / 3, 1e-12);  // TP 1, GT 2, pred 2
  EXPECT_NEAR(iou[1], 2.0 / 3, 1e-12);  // TP 2, GT 2, pred 3
  EXPECT_EQ(iou[2], 0.0);               // present in GT, never right: counts as 0
  EXPECT_TRUE(std::isnan(iou[3]));      // absent from GT and prediction
  EXPECT_NEAR(cm.miou(), (1.0 / 3 + 2.0 / 3 + 0.0) / 3, 1e-12);
  EXPECT_NEAR(cm.pixel_accuracy(), 3.0 / 5, 1e-12);
}

TEST(Metrics, AccumulatesOverImagesNotMeanOfImages) {
  ConfusionMatrix a(2), b(2), all(2);
  auto t1 = torch::tensor({0, 0, 0, 1}, torch::kLong), p1 = torch::tensor({0, 0, 0, 0}, torch::kLong);
  auto t2 = torch::tensor({1, 1}, torch::kLong), p2 = torch::tensor({1, 1}, torch::kLong);
  a.update(p1, t1);
  b.update(p2, t2);
  all.update(p1, t1);
  all.update(p2, t2);
  a.merge(b);
  EXPECT_TRUE(torch::equal(a.matrix(), all.matrix()));
  // class 0: TP 3, FP 1 → 3/4; class 1: TP 2, FN 1 → 2/3
  EXPECT_NEAR(all.miou(), (0.75 + 2.0 / 3) / 2, 1e-12);
}

TEST(Metrics, RejectsBadIds) {
  ConfusionMatrix cm(3);
  EXPECT_THROW(cm.update(torch::tensor({0, 1}), torch::tensor({0, 7})), std::invalid_argument);
  EXPECT_THROW(cm.update(torch::tensor({0, 5}), torch::tensor({0, 1})), std::invalid_argument);
  EXPECT_THROW(cm.update(torch::tensor({0}), torch::tensor({0, 1})), std::invalid_argument);
}

TEST(Losses, WeightedCrossEntropyIgnoresAndWeights) {
  torch::manual_seed(0);
  auto logits = torch::randn({1, 3, 2, 2});
  auto target = torch::tensor({0, 2, 255, 1}, torch::kLong).view({1, 2, 2});
  auto w = torch::tensor({1.0f, 2.0f, 3.0f});
  auto lp = torch::log_softmax(logits, 1);
  // manual: weighted mean over the 3 valid pixels
  double num = -(1.0 * lp[0][0][0][0].item<double>() + 3.0 * lp[0][2][0][1].item<double>() +
                 2.0 * lp[0][1][1][1].item<double>());
  EXPECT_NEAR(weighted_cross_entropy(logits, target, w).item<double>(), num / 6.0, 1e-5);
}

namespace {
// torch's cross_entropy (the reference) and the fused one on the same logits: loss and the
// gradient of 0.4 · loss (a scaled backward, as for the auxiliary heads' terms).
void expect_fused_matches_torch(const torch::Tensor& base, const torch::Tensor& target, const torch::Tensor& w) {
  auto run = [&](bool fused) {
    set_fused_cross_entropy(fused);
    auto z = base.detach().clone(at::MemoryFormat::Preserve).requires_grad_(true);
    auto loss = weighted_cross_entropy(z, target, w);
    (loss * 0.4).backward();
    set_fused_cross_entropy(true);
    return std::make_pair(loss.item<double>(), z.grad());
  };
  auto [ref_loss, ref_grad] = run(false);
  auto [loss, grad] = run(true);
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::abs(ref_loss));
  EXPECT_TRUE(torch::allclose(grad, ref_grad, 1e-4, 1e-7)) << (grad - ref_grad).abs().max().item<double>();
  EXPECT_EQ(grad.strides(), base.strides());
}
}  // namespace

TEST(Losses, FusedCrossEntropyMatchesTorchInEveryLayout) {
  torch::manual_seed(3);
  // 2 × 64 × 72 pixels: more than one work item of the fused pass
  auto nchw = torch::randn({2, 5, 64, 72}) * 3;
  auto target = torch::randint(0, 6, {2, 64, 72}, torch::kLong);
  target.masked_fill_(target == 5, 255);
  auto w = torch::tensor({0.5f, 1.0f, 2.0f, 3.5f, 1.25f});
  for (const auto& wt : {torch::Tensor(), w}) {
    expect_fused_matches_torch(nchw, target, wt);
    expect_fused_matches_torch(nchw.contiguous(at::MemoryFormat::ChannelsLast), target, wt);
  }
  // a strided view (every other column) is copied to a dense layout first
  auto wide = torch::randn({2, 5, 64, 144});
  auto view = wide.slice(3, 0, 144, 2);
  set_fused_cross_entropy(false);
  double ref = weighted_cross_entropy(view, target, w).item<double>();
  set_fused_cross_entropy(true);
  EXPECT_NEAR(weighted_cross_entropy(view, target, w).item<double>(), ref, 1e-5 * std::abs(ref));
}

TEST(Losses, FusedCrossEntropyMatchesDoublePrecisionOnWideLogits) {
  // Logits 60 apart and more (exponentials down to the kernel's e^-80 floor), 19 classes,
  // images whose pixel count is no multiple of the kernel's 16-pixel groups, both layouts,
  // against torch's cross-entropy in double precision. Run again at LIGHTSEG_MAX_ISA=avx2 and
  // generic by ctest (each level's kernel).
  torch::manual_seed(5);
  auto base = torch::randn({2, 19, 37, 53}) * 20;
  auto target = torch::randint(0, 20, {2, 37, 53}, torch::kLong);
  target.masked_fill_(target == 19, 255);
  auto w = torch::rand({19}) + 0.25;
  auto zd = base.to(torch::kDouble).requires_grad_(true);
  auto ref = torch::nn::functional::cross_entropy(
      zd, target, torch::nn::functional::CrossEntropyFuncOptions().weight(w.to(torch::kDouble)).ignore_index(255));
  ref.backward();
  for (const auto& layout : {at::MemoryFormat::Contiguous, at::MemoryFormat::ChannelsLast}) {
    auto z = base.clone(layout).detach().requires_grad_(true);
    auto loss = fused_cross_entropy(z, target, w);
    loss.backward();
    EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-5 * std::abs(ref.item<double>()));
    const double err = (z.grad().to(torch::kDouble) - zd.grad()).abs().max().item<double>();
    EXPECT_LT(err, 1e-6 * zd.grad().abs().max().item<double>() + 1e-9) << "largest gradient error";
  }
}

TEST(Losses, FusedCrossEntropyIsTheSameOnAnyNumberOfThreads) {
  torch::manual_seed(4);
  auto z = torch::randn({3, 11, 90, 120}).contiguous(at::MemoryFormat::ChannelsLast);
  auto target = torch::randint(0, 11, {3, 90, 120}, torch::kLong);
  const int threads = torch::get_num_threads();
  torch::set_num_threads(1);
  const double one = fused_cross_entropy(z, target).item<double>();
  torch::set_num_threads(2);
  const double two = fused_cross_entropy(z, target).item<double>();
  torch::set_num_threads(threads);
  EXPECT_EQ(one, two);
}

TEST(Losses, FusedCrossEntropyRejectsBadLabelsAndHasNoLossWithoutPixels) {
  auto z = torch::randn({1, 3, 4, 4});
  auto target = torch::zeros({1, 4, 4}, torch::kLong);
  target[0][2][1] = 3;  // not a class, not the ignore label
  EXPECT_THROW(fused_cross_entropy(z, target), std::invalid_argument);
  target[0][2][1] = -1;
  EXPECT_THROW(fused_cross_entropy(z, target), std::invalid_argument);
  EXPECT_THROW(fused_cross_entropy(z, torch::zeros({1, 4, 5}, torch::kLong)), std::invalid_argument);
  EXPECT_THROW(fused_cross_entropy(z.to(torch::kDouble), torch::zeros({1, 4, 4}, torch::kLong)), std::invalid_argument);
  // every pixel ignored: NaN, as torch's mean over no pixels (the trainer skips such a step)
  auto none = torch::full({1, 4, 4}, 255, torch::kLong);
  EXPECT_TRUE(std::isnan(fused_cross_entropy(z, none).item<double>()));
  EXPECT_TRUE(std::isnan(fused_cross_entropy(z, none, torch::tensor({1.0f, 2.0f, 3.0f})).item<double>()));
}

TEST(Losses, OhemKeepsHardPixelsButAtLeastMinKept) {
  // 16 pixels, 15 confidently right, 1 wrong
  auto target = torch::zeros({1, 4, 4}, torch::kLong);
  auto logits = torch::zeros({1, 2, 4, 4});
  logits.select(1, 0).copy_(torch::arange(16, torch::kFloat).view({1, 4, 4}) * 0.1 + 5.0);  // no ties
  logits[0][1][3][3] = 10.0;  // the one hard pixel
  auto ce = torch::nn::functional::cross_entropy(logits, target,
                                                 torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  // threshold 0.7: only the wrong pixel is hard; min_kept = 16/16 = 1 → loss = its CE
  EXPECT_NEAR(ohem_cross_entropy(logits, target, 0.7, 1.0 / 16).item<double>(), ce[0][3][3].item<double>(), 1e-5);
  // min_kept 4/16 → the 4 hardest pixels
  auto top = std::get<0>(ce.reshape(-1).topk(4)).mean().item<double>();
  EXPECT_NEAR(ohem_cross_entropy(logits, target, 0.7, 0.25).item<double>(), top, 1e-5);
}

// The ETA's step time follows the current speed: the slow first step is dropped, and after a
// slowdown the estimate reaches the new step time (a whole-run mean would stay between).
TEST(Schedule, StepTimeEstimateDropsTheFirstStepAndFollowsTheCurrentSpeed) {
  StepTimeEstimate e;
  EXPECT_EQ(e.seconds_per_step(), 0.0);
  e.add(60.0);  // warm-up
  EXPECT_DOUBLE_EQ(e.seconds_per_step(), 60.0);
  e.add(1.0);
  EXPECT_DOUBLE_EQ(e.seconds_per_step(), 1.0);
  for (int i = 0; i < 200; ++i) e.add(1.0);
  EXPECT_NEAR(e.seconds_per_step(), 1.0, 1e-9);
  for (int i = 0; i < 100; ++i) e.add(2.0);
  EXPECT_NEAR(e.seconds_per_step(), 2.0, 0.02);  // 0.95^100 of the old 1 s is left: < 0.6 %
  EXPECT_EQ(e.steps(), 302);
}

TEST(Schedule, PolyWithWarmup) {
  EXPECT_NEAR(poly_lr(1e-3, 0, 1000, 100, 0.1, 0.9), 1e-4, 1e-12);
  EXPECT_NEAR(poly_lr(1e-3, 50, 1000, 100, 0.1, 0.9), 0.55e-3, 1e-12);
  EXPECT_NEAR(poly_lr(1e-3, 500, 1000, 100, 0.1, 0.9), 1e-3 * std::pow(0.5, 0.9), 1e-12);
  EXPECT_NEAR(poly_lr(1e-3, 1000, 1000, 100, 0.1, 0.9), 0.0, 1e-12);
}
