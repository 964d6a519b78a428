// Cuda.*: the GPU trainer's parts on a GPU, against the CPU. Skipped (with the reason) where
// this LibTorch has no CUDA or no GPU is visible. On a GPU machine scripts/gpu_check.sh builds
// them alone (lightseg_cuda_tests, -DLIGHTSEG_BUILD_CUDA_TESTS=ON) and runs them.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>

#include <torch/cuda.h>

#include "data/batch_augment.h"
#include "data/data_cache.h"
#include "lightseg/dataset.h"
#include "lightseg/network.h"
#include "lightseg/train.h"
#include "lightseg/weights.h"
#include "synthetic.h"
#include "train/foreach_adam.h"

using namespace lightseg;

#define SKIP_WITHOUT_CUDA()                                                                   \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA: this LibTorch has none or no GPU is visible"

TEST(Cuda, BatchAugmentMatchesTheCpu) {
  SKIP_WITHOUT_CUDA();
  std::vector<torch::Tensor> xs, ys;
  for (int i = 0; i < 4; ++i) {
    auto [img, lab] = fixtures::shapes_sample(48, 64, 10 + i);
    xs.push_back(img.permute({2, 0, 1}));
    ys.push_back(lab);
  }
  auto images = torch::stack(xs).contiguous(), labels = torch::stack(ys).contiguous();
  ModelMeta meta;
  AugmentOptions o;
  o.crop_h = 56;
  o.crop_w = 72;
  o.scale_min = 0.6;
  o.scale_max = 1.8;
  o.jitter = 0.3;
  std::vector<AugmentDraw> draws;
  for (int k = 0; k < 4; ++k) {
    std::mt19937_64 rng(77 + k);
    draws.push_back(draw_augment(o, 48, 64, rng));
  }
  std::vector<int64_t> idx{3, 1, 0, 2};
  auto [cx, cy] = augment_batch(images, labels, idx, draws, o, meta);
  auto [gx, gy] = augment_batch(images.cuda(), labels.cuda(), idx, draws, o, meta);
  EXPECT_TRUE(gx.is_cuda());
  EXPECT_TRUE(torch::equal(gy.cpu(), cy));
  EXPECT_LT((gx.cpu() - cx).abs().max().item<double>(), 0.02);
}

TEST(Cuda, ForeachAdamStepsAsTorchAdam) {
  SKIP_WITHOUT_CUDA();
  for (bool conditional : {false, true}) {
    torch::manual_seed(5);
    std::vector<torch::Tensor> ref{torch::randn({8, 4, 3, 3}, torch::kCUDA).contiguous(torch::MemoryFormat::ChannelsLast),
                                   torch::randn({16}, torch::kCUDA)};
    std::vector<torch::Tensor> mine;
    for (auto& p : ref) {
      p.set_requires_grad(true);
      mine.push_back(p.detach().clone().set_requires_grad(true));
    }
    torch::optim::Adam a(ref, torch::optim::AdamOptions(1e-2).weight_decay(0.01));
    torch::optim::Adam b(mine, torch::optim::AdamOptions(1e-2).weight_decay(0.01));
    ForeachAdam fused(b, false);
    for (int step = 0; step < 5; ++step) {
      torch::manual_seed(100 + step);
      for (size_t i = 0; i < ref.size(); ++i) {
        auto g = torch::randn(ref[i].sizes(), torch::kCUDA);
        ref[i].mutable_grad() = g.clone();
        mine[i].mutable_grad().copy_(g);
      }
      a.step();
      if (conditional) fused.step(torch::ones({}, torch::TensorOptions().dtype(torch::kBool).device(torch::kCUDA)));
      else fused.step();
      for (size_t i = 0; i < ref.size(); ++i)
        EXPECT_LT((ref[i] - mine[i]).abs().max().item<double>(), 1e-5) << step << " " << conditional;
    }
  }
}

namespace {
TrainOptions tiny_cuda(const std::filesystem::path& dir) {
  TrainOptions o;
  o.data = (dir / "data").string();
  o.dataset = "list";
  o.out_dir = (dir / "run").string();
  o.device = torch::Device(torch::kCUDA);
  o.batch = 4;
  o.crop_h = o.crop_w = 64;
  o.lr = 5e-3;
  o.loss = "ce";
  o.val_split = "train";
  o.network.c0 = 16;
  o.network.c1 = 32;
  o.network.c2 = 48;
  return o;
}
}  // namespace

TEST(Cuda, TrainsFromTheDeviceCacheAndResumesOnTheCpu) {
  SKIP_WITHOUT_CUDA();
  auto dir = fixtures::temp_dir("cuda_train");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  TrainOptions o = tiny_cuda(dir);
  o.epochs = 6;
  o.val_every = 6;
  o.jitter = 0.2;
  std::vector<std::string> messages;
  TrainCallbacks cb;
  cb.on_message = [&](const std::string& m) { messages.push_back(m); };
  auto r = train(o, cb);  // defaults on CUDA: device cache, fused optimizer, deferred checks, bf16
  ASSERT_TRUE(r.finished);
  bool cached = false;
  for (const auto& m : messages) cached = cached || m.find("data cache:") != std::string::npos;
  EXPECT_TRUE(cached);
  ASSERT_EQ(r.history.size(), 6u);
  EXPECT_TRUE(std::isfinite(r.history.back().loss));
  EXPECT_LT(r.history.back().loss, r.history.front().loss);
  EXPECT_GE(r.history.back().pixel_acc, 0);  // scored
  // the checkpoint continues on the CPU with torch's optimizer and the per-sample loader
  auto oc = o;
  oc.device = torch::kCPU;
  oc.epochs = 7;
  oc.resume = true;
  oc.data_cache = "auto";
  oc.fused_optimizer = "auto";
  ASSERT_TRUE(train(oc, {}).finished);
  auto w = read_weights((dir / "run" / "last.lsw").string());
  EXPECT_EQ(train_state(w)->epoch, 7);
  std::filesystem::remove_all(dir);
}

TEST(Cuda, ANonFiniteStepIsSkippedOnTheDeviceWithoutAnUpdate) {
  // The defaults on CUDA decide the skip on the device (sync_every 20): step 4 of 4 gets a NaN
  // gradient; the weights stay those before it, the BatchNorm statistics those before its forward.
  SKIP_WITHOUT_CUDA();
  auto dir = fixtures::temp_dir("cuda_nonfinite");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  TrainOptions o = tiny_cuda(dir);
  o.epochs = 2;
  o.val_every = 0;
  std::map<std::string, torch::Tensor> weights_before, buffers_before;
  int step = 0;
  TrainCallbacks cb;
  cb.after_backward = [&](Network& net) {
    ++step;
    if (step == 3)
      for (const auto& b : net->named_buffers()) buffers_before[b.key()] = b.value().detach().cpu().clone();
    if (step == 4) {
      for (const auto& p : net->named_parameters()) weights_before[p.key()] = p.value().detach().cpu().clone();
      net->parameters().front().mutable_grad().fill_(std::numeric_limits<float>::quiet_NaN());
    }
  };
  auto r = train(o, cb);
  ASSERT_TRUE(r.finished);
  ASSERT_EQ(r.history.size(), 2u);
  EXPECT_EQ(r.history[0].skipped_steps, 0);
  EXPECT_EQ(r.history[1].skipped_steps, 1);
  EXPECT_TRUE(std::isfinite(r.history[1].loss));
  ModelMeta meta;
  Network net = load_network((dir / "run" / "last.lsw").string(), &meta);
  ASSERT_FALSE(weights_before.empty());
  for (const auto& p : net->named_parameters())
    EXPECT_TRUE(torch::equal(p.value().cpu(), weights_before.at(p.key()))) << p.key();
  for (const auto& b : net->named_buffers())
    EXPECT_TRUE(torch::equal(b.value().cpu(), buffers_before.at(b.key()))) << b.key();
  std::filesystem::remove_all(dir);
}

TEST(Cuda, TheGraphedStepTrainsAsTheEagerOne) {
  // --cuda-graph on: the deferred step captured once, then replayed; it trains as the eager
  // step does (the same kernels; cuDNN's backward may sum in another order, so not bit for bit).
  SKIP_WITHOUT_CUDA();
  auto dir = fixtures::temp_dir("cuda_graph");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  TrainOptions eager = tiny_cuda(dir), graphed = tiny_cuda(dir);
  eager.epochs = graphed.epochs = 6;
  eager.val_every = graphed.val_every = 0;
  graphed.out_dir = (dir / "graphed").string();
  graphed.cuda_graph = "on";
  std::vector<std::string> messages;
  TrainCallbacks cb;
  cb.on_message = [&](const std::string& m) { messages.push_back(m); };
  auto a = train(eager, {});
  auto b = train(graphed, cb);
  ASSERT_TRUE(a.finished);
  ASSERT_TRUE(b.finished);
  std::string said;
  for (const auto& m : messages) said += m + "\n";
  EXPECT_NE(said.find("cuda graph: the step is captured"), std::string::npos) << said;
  ASSERT_EQ(b.history.size(), 6u);
  EXPECT_TRUE(std::isfinite(b.history.back().loss));
  EXPECT_LT(b.history.back().loss, b.history.front().loss);
  EXPECT_NEAR(b.history.back().loss, a.history.back().loss, 0.1 * a.history.back().loss + 1e-3);
  std::filesystem::remove_all(dir);
}
