// The compact training state (TrainOptions::compact_state, `train --compact-state`): Adam's
// second moments in bf16 and its first moments left out, for a run state kept in version control
// between sessions (issue 36: at most 4 MB).
#include <gtest/gtest.h>

#include <filesystem>

#include "lightseg/train.h"
#include "lightseg/weights.h"
#include "core/torch_compat.h"
#include "synthetic.h"
#include "train/archive_bytes.h"
#include "train/optimizer.h"

using namespace lightseg;
namespace fs = std::filesystem;

namespace {

// Two parameters trained a few Adam steps on a fixed quadratic, so that both moments are non-zero.
struct Stepped {
  std::vector<torch::Tensor> params;
  std::unique_ptr<torch::optim::Adam> opt;
  explicit Stepped(int steps) {
    torch::manual_seed(3);
    params = {torch::randn({64, 32}).requires_grad_(), torch::randn({32}).requires_grad_()};
    opt = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
    for (int i = 0; i < steps; ++i) {
      opt->zero_grad();
      (params[0].pow(2).sum() + (params[1] - 1).pow(2).sum()).backward();
      opt->step();
    }
  }
  torch::optim::AdamParamState& state(size_t i) {
    return static_cast<torch::optim::AdamParamState&>(*opt->state().at(compat::optimizer_state_key(params[i])));
  }
};

}  // namespace

TEST(CompactState, KeepsSecondMomentsInBf16LeavesOutFirstMomentsAndLeavesTheOptimizerAlone) {
  Stepped a(5);
  const torch::Tensor m0 = a.state(0).exp_avg().clone(), v0 = a.state(0).exp_avg_sq().clone();
  const std::string full = to_archive_bytes(*a.opt);
  const std::string compact = compact_optimizer_bytes(*a.opt);
  // fp32 m and v (8 bytes a parameter) against bf16 v (2 bytes), plus the archive's framing
  EXPECT_LT(compact.size() * 2, full.size()) << compact.size() << " vs " << full.size();
  // the live optimizer is untouched
  EXPECT_TRUE(torch::equal(a.state(0).exp_avg(), m0));
  EXPECT_TRUE(torch::equal(a.state(0).exp_avg_sq(), v0));
  EXPECT_EQ(a.state(0).exp_avg_sq().scalar_type(), torch::kFloat32);

  Stepped b(0);  // same parameters' shapes, no state yet
  from_archive_bytes(*b.opt, compact);
  EXPECT_EQ(expand_optimizer_state(*b.opt), 2);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(b.state(i).step(), 5);
    EXPECT_EQ(b.state(i).exp_avg().sizes(), b.params[i].sizes());
    EXPECT_EQ(b.state(i).exp_avg().abs().max().item<float>(), 0.0f);
    ASSERT_EQ(b.state(i).exp_avg_sq().scalar_type(), torch::kFloat32);
    const auto v = a.state(i).exp_avg_sq();
    // bf16 keeps 8 significant bits: within 2^-8 relative
    EXPECT_LE(((b.state(i).exp_avg_sq() - v).abs() / v.abs().clamp_min(1e-30)).max().item<float>(), 1.0f / 256);
  }
  // a full state loads as it was, and expanding it changes nothing
  Stepped c(0);
  from_archive_bytes(*c.opt, full);
  EXPECT_EQ(expand_optimizer_state(*c.opt), 0);
  EXPECT_TRUE(torch::equal(c.state(0).exp_avg(), m0));
  EXPECT_TRUE(torch::equal(c.state(0).exp_avg_sq(), v0));
}

TEST(CompactState, ARunStoppedWithItWritesASmallerCheckpointThatResumesToTheEnd) {
  auto dir = fixtures::temp_dir("compact_state");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  auto stop_after = [](int n, int* steps) {
    TrainCallbacks cb;
    cb.after_backward = [steps](Network&) { ++*steps; };
    cb.stop_requested = [n, steps] { return *steps == n; };
    return cb;
  };
  auto o = fixtures::tiny_train_options(dir / "data", dir / "full");
  o.epochs = 3;
  o.val_every = 1;
  o.aux_weight = 0.4;
  int s1 = 0, s2 = 0;
  ASSERT_TRUE(train(o, stop_after(3, &s1)).stopped_by_time);
  auto oc = o;
  oc.out_dir = (dir / "compact").string();
  oc.compact_state = true;
  ASSERT_TRUE(train(oc, stop_after(3, &s2)).stopped_by_time);

  const auto full = read_weights((dir / "full" / "last.lsw").string());
  const auto compact = read_weights((dir / "compact" / "last.lsw").string());
  // the same network and position; only the optimizer blob is smaller
  EXPECT_EQ(train_state(compact)->global_step, train_state(full)->global_step);
  EXPECT_EQ(compact.blobs.at("aux_heads"), full.blobs.at("aux_heads"));
  EXPECT_LT(compact.blobs.at("optimizer").size() * 2, full.blobs.at("optimizer").size());
  EXPECT_LT(fs::file_size(dir / "compact" / "last.lsw"), fs::file_size(dir / "full" / "last.lsw"));
  // the option belongs to the invocation: a resumed run finishes with full checkpoints
  oc.compact_state = false;
  oc.resume = true;
  const auto r = train(oc, {});
  ASSERT_TRUE(r.finished);
  ASSERT_EQ(r.history.size(), 3u);
  for (const auto& e : r.history) EXPECT_TRUE(std::isfinite(e.loss));
  // full again: fp32 m and v. Not byte-equal to the stopped run's blob (the archive's pickled
  // numbers and zip framing vary by a few hundred bytes), so the test compares against twice the
  // compact blob, which only a state with both fp32 moments exceeds.
  const auto last = read_weights((dir / "compact" / "last.lsw").string());
  EXPECT_GT(last.blobs.at("optimizer").size(), 2 * compact.blobs.at("optimizer").size());
  EXPECT_GT(last.blobs.at("optimizer").size() * 100, full.blobs.at("optimizer").size() * 99);
  fs::remove_all(dir);
}
