// Confusion-matrix metrics against hand-computed values; losses; LR schedule.
#include <gtest/gtest.h>

#include <cmath>

#include "train/losses.h"
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

TEST(Schedule, PolyWithWarmup) {
  EXPECT_NEAR(poly_lr(1e-3, 0, 1000, 100, 0.1, 0.9), 1e-4, 1e-12);
  EXPECT_NEAR(poly_lr(1e-3, 50, 1000, 100, 0.1, 0.9), 0.55e-3, 1e-12);
  EXPECT_NEAR(poly_lr(1e-3, 500, 1000, 100, 0.1, 0.9), 1e-3 * std::pow(0.5, 0.9), 1e-12);
  EXPECT_NEAR(poly_lr(1e-3, 1000, 1000, 100, 0.1, 0.9), 0.0, 1e-12);
}
