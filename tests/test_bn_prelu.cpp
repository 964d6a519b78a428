// The fused training BatchNorm → PReLU (src/model/bn_prelu.cpp) against the same computation in
// double precision: output, the four gradients, running statistics and the batch count. Named
// Fused.* so that the suite runs it again at LIGHTSEG_MAX_ISA=avx2 and generic (CMakeLists.txt).
#include <gtest/gtest.h>

#include "lightseg/model/layers.h"
#include "model/bn_prelu.h"

using namespace lightseg;

namespace {

double rel_err(const torch::Tensor& got, const torch::Tensor& want) {
  const auto w = want.to(torch::kFloat64), g = got.to(torch::kFloat64);
  return ((g - w).abs().max() / (w.abs().max() + 1e-12)).item<double>();
}

}  // namespace

TEST(Fused, TrainingBnPReLUMatchesBatchNormThenPReLU) {
  torch::manual_seed(4);
  // with_act false: BatchNorm alone (C4.7's PW2 before the residual), the same operator with
  // every slope 1
  for (bool with_act : {true, false})
  for (int64_t C : {32, 48})
    for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      SCOPED_TRACE(std::to_string(C) + (dtype == torch::kFloat32 ? " float32" : " bfloat16") +
                   (with_act ? "" : ", no PReLU"));
      model::BNAct m(C, with_act);
      {
        torch::NoGradGuard ng;
        m->bn->weight.uniform_(0.5, 1.5);
        m->bn->bias.uniform_(-0.5, 0.5);
        if (with_act) m->act->weight.uniform_(-0.2, 0.6);
        m->bn->running_mean.uniform_(-1, 1);
        m->bn->running_var.uniform_(0.5, 2);
      }
      m->train();
      // channels far from zero mean: the variance must not cancel
      const auto offset = (torch::rand({1, C, 1, 1}) * 20 - 10);
      auto x0 = (torch::randn({4, C, 11, 17}) * (torch::rand({1, C, 1, 1}) + 0.2) + offset)
                    .to(dtype)
                    .contiguous(torch::MemoryFormat::ChannelsLast);
      const auto slopes = with_act ? m->act->weight : torch::ones({C});
      ASSERT_TRUE(model::fused_bn_prelu_applies(x0, m->bn, slopes));
      const auto rm0 = m->bn->running_mean.clone(), rv0 = m->bn->running_var.clone();
      auto x = x0.detach().requires_grad_(true);
      auto y = m->forward(x);
      EXPECT_EQ(y.scalar_type(), dtype);
      EXPECT_TRUE(y.is_contiguous(torch::MemoryFormat::ChannelsLast));
      ASSERT_TRUE(y.grad_fn());
      EXPECT_EQ(y.grad_fn()->name().find("BatchNorm"), std::string::npos) << y.grad_fn()->name();  // ours
      auto g = torch::randn(y.sizes()).to(dtype);
      (y * g).sum().backward();

      // the reference in double
      auto xd = x0.to(torch::kFloat64).detach().requires_grad_(true);
      auto gam = m->bn->weight.detach().to(torch::kFloat64).requires_grad_(true);
      auto bet = m->bn->bias.detach().to(torch::kFloat64).requires_grad_(true);
      auto slo = slopes.detach().to(torch::kFloat64).requires_grad_(true);
      auto mean = xd.mean({0, 2, 3}, true), var = (xd - mean).pow(2).mean({0, 2, 3}, true);
      auto z = (xd - mean) / (var + 1e-5).sqrt() * gam.view({1, C, 1, 1}) + bet.view({1, C, 1, 1});
      auto yd = torch::where(z > 0, z, z * slo.view({1, C, 1, 1}));
      (yd * g.to(torch::kFloat64)).sum().backward();

      const double tol = dtype == torch::kFloat32 ? 1e-4 : 1e-2;  // bf16: the outputs rounded to 8 bits
      EXPECT_LT(rel_err(y, yd), tol);
      EXPECT_LT(rel_err(x.grad(), xd.grad()), dtype == torch::kFloat32 ? 1e-4 : 1e-2);
      EXPECT_LT(rel_err(m->bn->weight.grad(), gam.grad()), tol);
      EXPECT_LT(rel_err(m->bn->bias.grad(), bet.grad()), tol);
      if (with_act) EXPECT_LT(rel_err(m->act->weight.grad(), slo.grad()), tol);
      std::vector<torch::Tensor> grads{m->bn->weight.grad(), m->bn->bias.grad()};
      if (with_act) grads.push_back(m->act->weight.grad());
      for (const auto& p : grads) EXPECT_EQ(p.scalar_type(), torch::kFloat32);
      // running statistics: momentum 0.1, the unbiased variance; the batch count
      const double M = 4.0 * 11 * 17;
      auto want_rm = rm0.to(torch::kFloat64) * 0.9 + 0.1 * mean.flatten();
      auto want_rv = rv0.to(torch::kFloat64) * 0.9 + 0.1 * var.flatten() * M / (M - 1);
      EXPECT_LT(rel_err(m->bn->running_mean, want_rm.detach()), 1e-5);
      EXPECT_LT(rel_err(m->bn->running_var, want_rv.detach()), 1e-5);
      EXPECT_EQ(m->bn->num_batches_tracked.item<int64_t>(), 1);
    }
}

TEST(Fused, TrainingBnPReLUTakesOnlyItsCases) {
  model::BNAct m(32, true), odd(20, true);
  m->train();
  odd->train();
  const auto x = torch::randn({2, 32, 8, 8}).contiguous(torch::MemoryFormat::ChannelsLast);
  EXPECT_TRUE(model::fused_bn_prelu_applies(x, m->bn, m->act->weight));
  EXPECT_FALSE(model::fused_bn_prelu_applies(x.contiguous(), m->bn, m->act->weight));  // NCHW
  EXPECT_FALSE(model::fused_bn_prelu_applies(x.to(torch::kFloat64), m->bn, m->act->weight));
  const auto x20 = torch::randn({2, 20, 8, 8}).contiguous(torch::MemoryFormat::ChannelsLast);
  EXPECT_FALSE(model::fused_bn_prelu_applies(x20, odd->bn, odd->act->weight));  // not whole 16-channel blocks
  m->eval();
  EXPECT_FALSE(model::fused_bn_prelu_applies(x, m->bn, m->act->weight));  // running statistics: bn's own path
  // the cases it does not take give the same result through BatchNorm2d + PReLU
  odd->train();
  auto y = odd->forward(x20);
  EXPECT_EQ(y.sizes(), x20.sizes());
}
