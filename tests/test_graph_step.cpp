// The training step in its CUDA-graph form (train/graph_step.h), run on the CPU: fixed input
// buffers and the learning rate on the device, uncaptured. It must train exactly as the plain
// deferred step does; the capture itself is checked on a GPU (Cuda.TheGraphedStepTrainsAsTheEagerOne).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "lightseg/train.h"
#include "lightseg/weights.h"
#include "synthetic.h"
#include "train/foreach_adam.h"
#include "train/graph_step.h"

using namespace lightseg;
namespace fs = std::filesystem;

namespace {

TrainOptions tiny(const fs::path& dir, const std::string& run) {
  TrainOptions o;
  o.data = (dir / "data").string();
  o.dataset = "list";
  o.out_dir = (dir / run).string();
  o.batch = 2;
  o.crop_h = o.crop_w = 48;
  o.epochs = 3;
  o.val_every = 0;
  o.lr = 5e-3;
  o.loss = "ce";
  o.optimizer = "adamw";
  o.weight_decay = 1e-2;  // AdamW's decoupled decay reads the learning rate too
  o.workers = 1;
  o.network.c0 = 8;
  o.network.c1 = 16;
  o.network.c2 = 16;
  o.fused_optimizer = "on";
  o.sync_every = 3;  // the deferred step
  return o;
}

struct TrainedRun {
  TrainResult result;
  std::vector<std::string> messages;
  std::map<std::string, torch::Tensor> weights;
};

TrainedRun train_tiny(const TrainOptions& o) {
  TrainedRun r;
  TrainCallbacks cb;
  cb.on_message = [&](const std::string& m) { r.messages.push_back(m); };
  r.result = train(o, cb);
  ModelMeta meta;
  Network net = load_network(o.out_dir + "/last.lsw", &meta);
  for (const auto& p : net->named_parameters()) r.weights[p.key()] = p.value().detach().clone();
  for (const auto& b : net->named_buffers()) r.weights[b.key()] = b.value().detach().clone();
  return r;
}

bool said(const TrainedRun& r, const std::string& what) {
  for (const auto& m : r.messages)
    if (m.find(what) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST(GraphStep, TrainsExactlyAsTheDeferredStep) {
  auto dir = fixtures::temp_dir("graph_step");
  fixtures::make_shapes_dataset(dir / "data", 7, 1, 48, 64);  // 7 images: each epoch ends on a batch of 1
  auto plain = tiny(dir, "plain");
  auto graphed = tiny(dir, "graphed");
  graphed.cuda_graph = "on";
  TrainedRun a = train_tiny(plain), b = train_tiny(graphed);
  ASSERT_TRUE(a.result.finished);
  ASSERT_TRUE(b.result.finished);
  EXPECT_FALSE(said(a, "cuda graph"));
  EXPECT_TRUE(said(b, "cuda graph: no CUDA here")) << "the CPU says it runs the step uncaptured";
  ASSERT_EQ(a.result.history.size(), b.result.history.size());
  for (size_t e = 0; e < a.result.history.size(); ++e) EXPECT_EQ(a.result.history[e].loss, b.result.history[e].loss) << e;
  ASSERT_EQ(a.weights.size(), b.weights.size());
  bool moved = false;
  for (const auto& [k, w] : a.weights) {
    EXPECT_TRUE(torch::equal(w, b.weights.at(k))) << k;
    moved = moved || w.dtype() == torch::kFloat32;
  }
  EXPECT_TRUE(moved);
  // the graphed run resumes (its optimizer state is the plain one's) and continues as it would
  auto more_a = plain, more_b = graphed;
  more_a.epochs = more_b.epochs = 4;
  more_a.resume = more_b.resume = true;
  TrainedRun c = train_tiny(more_a), d = train_tiny(more_b);
  for (const auto& [k, w] : c.weights) EXPECT_TRUE(torch::equal(w, d.weights.at(k))) << k;
  fs::remove_all(dir);
}

TEST(GraphStep, SaysWhyTheStepCannotBeCaptured) {
  auto dir = fixtures::temp_dir("graph_step_why");
  fixtures::make_shapes_dataset(dir / "data", 4, 1, 48, 64);
  auto o = tiny(dir, "ohem");
  o.epochs = 1;
  o.cuda_graph = "on";
  o.loss = "ohem";
  TrainedRun r = train_tiny(o);
  EXPECT_TRUE(r.result.finished);
  EXPECT_TRUE(said(r, "cuda graph: needs a loss without data-dependent shapes"));
  o = tiny(dir, "every_step");
  o.epochs = 1;
  o.cuda_graph = "on";
  o.sync_every = 1;
  r = train_tiny(o);
  EXPECT_TRUE(r.result.finished);
  EXPECT_TRUE(said(r, "cuda graph: needs the deferred step"));
  EXPECT_EQ(graph_step_unavailable(o, true, true), "no per-step callback");
  EXPECT_EQ(graph_step_unavailable(tiny(dir, "x"), true, false), "");
  o.cuda_graph = "yes";
  EXPECT_THROW(o.validate(), std::invalid_argument);
  fs::remove_all(dir);
}

TEST(GraphStep, DeviceLearningRatesStepAsHostOnes) {
  // Two copies of the same parameters; one optimizer reads its learning rate from the device
  // copy, loaded before each step; the schedule changes every step, and one step is skipped.
  torch::manual_seed(3);
  std::vector<torch::Tensor> p1{torch::randn({5, 4}), torch::randn({7})};
  std::vector<torch::Tensor> p2;
  for (auto& p : p1) {
    p.set_requires_grad(true);
    p2.push_back(p.detach().clone().set_requires_grad(true));
  }
  torch::optim::AdamW o1(p1, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  torch::optim::AdamW o2(p2, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  ForeachAdam f1(o1, true), f2(o2, true);
  f2.use_device_learning_rates();
  for (int step = 0; step < 6; ++step) {
    const double lr = 1e-2 / (1 + step);
    for (auto* o : {&o1, &o2})
      for (auto& g : o->param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
    f1.zero_grad();
    f2.zero_grad();
    auto g = torch::randn({5 * 4 + 7});
    (p1[0] * g.narrow(0, 0, 20).view({5, 4})).sum().add((p1[1] * g.narrow(0, 20, 7)).sum()).backward();
    (p2[0] * g.narrow(0, 0, 20).view({5, 4})).sum().add((p2[1] * g.narrow(0, 20, 7)).sum()).backward();
    auto ok = torch::tensor(step != 3);
    f2.load_learning_rates();
    f1.step(ok);
    f2.step(ok);
    for (size_t i = 0; i < p1.size(); ++i) ASSERT_TRUE(torch::equal(p1[i], p2[i])) << "step " << step << " tensor " << i;
  }
  // and the learning rate matters: a different one gives different weights
  for (auto& g : o2.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(0.5);
  f2.load_learning_rates();
  f1.step(torch::tensor(true));
  f2.step(torch::tensor(true));
  EXPECT_FALSE(torch::equal(p1[0], p2[0]));
}
