// The compact training state (TrainOptions::compact_state, `train --compact-state`;
// src/train/compact_state.h): Adam's second moments as 8-bit log codes and its first moments left
// out, an EMA run's raw weights as an int8 difference from the average, for a run state kept in
// version control between sessions (issue 36: at most 4 MB); the first compact form still loads.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "lightseg/train.h"
#include "lightseg/weights.h"
#include "core/torch_compat.h"
#include "synthetic.h"
#include "train/archive_bytes.h"
#include "train/compact_state.h"
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

// The same tiny run stopped after `steps` steps twice: with full and with compact state.
struct StoppedTwice {
  fs::path dir;
  TrainOptions compact_run;  // the compact run's options (to resume it)
  WeightsFile full, compact;
};
StoppedTwice stop_twice(const char* name, int steps, const std::function<void(TrainOptions&)>& configure) {
  StoppedTwice r;
  r.dir = fixtures::temp_dir(name);
  fixtures::make_shapes_dataset(r.dir / "data", 8, 2);
  auto stop_after = [](int n, int* done) {
    TrainCallbacks cb;
    cb.after_backward = [done](Network&) { ++*done; };
    cb.stop_requested = [n, done] { return *done == n; };
    return cb;
  };
  auto o = fixtures::tiny_train_options(r.dir / "data", r.dir / "full");
  o.epochs = 3;
  o.val_every = 1;
  configure(o);
  int s1 = 0, s2 = 0;
  EXPECT_TRUE(train(o, stop_after(steps, &s1)).stopped_by_time);
  r.compact_run = o;
  r.compact_run.out_dir = (r.dir / "compact").string();
  r.compact_run.compact_state = true;
  EXPECT_TRUE(train(r.compact_run, stop_after(steps, &s2)).stopped_by_time);
  r.full = read_weights((r.dir / "full" / "last.lsw").string());
  r.compact = read_weights((r.dir / "compact" / "last.lsw").string());
  return r;
}

}  // namespace

TEST(CompactState, KeepsSecondMomentsIn8BitLogCodesLeavesOutFirstMomentsAndLeavesTheOptimizerAlone) {
  Stepped a(5);
  {
    torch::NoGradGuard ng;
    a.state(0).exp_avg_sq()[0][0] = 0.f;  // an exact zero (a weight that never had a gradient) stays 0
    a.state(0).exp_avg_sq()[1][0] = 1e-30f;  // 100 binary orders below the rest of its block
  }
  const torch::Tensor m0 = a.state(0).exp_avg().clone(), v0 = a.state(0).exp_avg_sq().clone();
  const std::string full = to_archive_bytes(*a.opt);
  const std::string compact = compact_optimizer_bytes(*a.opt);
  // fp32 m and v (8 bytes a parameter) in torch's framing against ~1 byte a parameter
  EXPECT_LT(compact.size() * 6, full.size()) << compact.size() << " vs " << full.size();
  EXPECT_LT(compact.size(), 2200u + 2 * 64) << "2080 parameters, a byte each, 8 bytes a block of 256";
  // the live optimizer is untouched
  EXPECT_TRUE(torch::equal(a.state(0).exp_avg(), m0));
  EXPECT_TRUE(torch::equal(a.state(0).exp_avg_sq(), v0));
  EXPECT_EQ(a.state(0).exp_avg_sq().scalar_type(), torch::kFloat32);

  Stepped b(0);  // same parameters' shapes, no state yet
  load_optimizer_bytes(*b.opt, compact, torch::kCPU);
  EXPECT_EQ(expand_optimizer_state(*b.opt), 2);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(b.state(i).step(), 5);
    EXPECT_EQ(b.state(i).exp_avg().sizes(), b.params[i].sizes());
    EXPECT_EQ(b.state(i).exp_avg().abs().max().item<float>(), 0.0f);
    ASSERT_EQ(b.state(i).exp_avg_sq().scalar_type(), torch::kFloat32);
    ASSERT_EQ(b.state(i).exp_avg_sq().sizes(), b.params[i].sizes());
    const auto v = a.state(i).exp_avg_sq();
    const auto w = b.state(i).exp_avg_sq();
    EXPECT_TRUE(torch::equal(w.eq(0), v.eq(0))) << "zeros stay zeros, nothing else becomes one";
    // a block spans at most 32 binary orders below its largest value: a code step is at most
    // 32 / 254 orders, so within 2^(16/254) - 1 = 4.5 %; a value further below comes back as the
    // floor, never smaller (a smaller step for that weight, not a larger one)
    const auto tiny = v.gt(0) & v.lt(1e-20);
    const auto rel = ((w - v).abs() / v.clamp_min(1e-38)).masked_fill(v.eq(0) | tiny, 0);
    EXPECT_LE(rel.max().item<float>(), 0.045f) << "parameter " << i;
    if (i == 0) {
      EXPECT_GT(w[1][0].item<float>(), 1e-30f);
      EXPECT_GE(w[1][0].item<float>() * std::exp2(33.f), w.slice(0, 0, 8).max().item<float>() * 0.99f) << "the floor";
    }
  }
  // a full state loads as it was, and expanding it changes nothing
  Stepped c(0);
  load_optimizer_bytes(*c.opt, full, torch::kCPU);
  EXPECT_EQ(expand_optimizer_state(*c.opt), 0);
  EXPECT_TRUE(torch::equal(c.state(0).exp_avg(), m0));
  EXPECT_TRUE(torch::equal(c.state(0).exp_avg_sq(), v0));
  // bytes of other parameters are refused with a clear error, not read past their end
  torch::manual_seed(1);
  std::vector<torch::Tensor> other = {torch::randn({64, 31}).requires_grad_(), torch::randn({32}).requires_grad_()};
  torch::optim::Adam d(other, torch::optim::AdamOptions(1e-2));
  EXPECT_THROW(load_optimizer_bytes(d, compact, torch::kCPU), std::runtime_error);
  EXPECT_THROW(load_optimizer_bytes(*c.opt, compact.substr(0, compact.size() - 3), torch::kCPU), std::runtime_error);
}

TEST(CompactState, TheFirstCompactFormStillLoads) {
  // bf16 second moments and 0-element first moments in torch's archive: the state files written
  // before the 8-bit form (a run in progress resumes from one)
  Stepped a(4);
  const torch::Tensor v0 = a.state(0).exp_avg_sq().clone();
  Stepped legacy(4);
  for (size_t i = 0; i < 2; ++i) {
    legacy.state(i).exp_avg(torch::empty({0}));
    legacy.state(i).exp_avg_sq(legacy.state(i).exp_avg_sq().to(torch::kBFloat16));
  }
  const std::string bytes = to_archive_bytes(*legacy.opt);
  Stepped b(0);
  load_optimizer_bytes(*b.opt, bytes, torch::kCPU);
  EXPECT_EQ(expand_optimizer_state(*b.opt), 2);
  EXPECT_EQ(b.state(0).step(), 4);
  ASSERT_EQ(b.state(0).exp_avg_sq().scalar_type(), torch::kFloat32);
  EXPECT_LE(((b.state(0).exp_avg_sq() - v0).abs() / v0.abs().clamp_min(1e-30)).max().item<float>(), 1.0f / 256);
}

TEST(CompactState, RawWeightsAsAnInt8DifferenceFromTheAverage) {
  torch::manual_seed(6);
  Network ema(NetworkConfig{}), raw(NetworkConfig{});
  {
    torch::NoGradGuard ng;
    auto e = ema->named_parameters(true);
    for (auto& p : raw->named_parameters(true)) p.value().copy_(e[p.key()] + 0.01 * torch::randn_like(p.value()));
    auto eb = ema->named_buffers(true);
    for (auto& b : raw->named_buffers(true))
      if (b.value().is_floating_point()) b.value().copy_(eb[b.key()] + 0.1);
      else b.value().fill_(17);  // a batch count: exact
  }
  const std::string bytes = compact_weights_delta_bytes(*raw, *ema);
  int64_t numel = 0;
  for (auto& p : raw->named_parameters(true)) numel += p.value().numel();
  EXPECT_LT(static_cast<double>(bytes.size()), 1.1 * static_cast<double>(numel)) << "about a byte a parameter";
  // the loader's network holds the average, then gains the difference
  Network back(NetworkConfig{});
  {
    torch::NoGradGuard ng;
    auto e = ema->named_parameters(true);
    for (auto& p : back->named_parameters(true)) p.value().copy_(e[p.key()]);
    auto eb = ema->named_buffers(true);
    for (auto& b : back->named_buffers(true)) b.value().copy_(eb[b.key()]);
  }
  add_weights_delta(*back, bytes);
  auto r = raw->named_parameters(true);
  for (auto& p : back->named_parameters(true)) {
    const auto d = r[p.key()] - ema->named_parameters(true)[p.key()];
    // within half a code step of each block's scale (max |d| / 127) and never beyond d's own size
    EXPECT_LE((p.value() - r[p.key()]).abs().max().item<float>(), d.abs().max().item<float>() / 254 * 1.01 + 1e-7)
        << p.key();
  }
  auto rb = raw->named_buffers(true);
  for (auto& b : back->named_buffers(true))
    if (!b.value().is_floating_point()) EXPECT_TRUE(torch::equal(b.value(), rb[b.key()])) << b.key();
    else EXPECT_LE((b.value() - rb[b.key()]).abs().max().item<float>(), 0.1f / 254 * 1.01 + 1e-6) << b.key();
  // another network's bytes are refused
  NetworkConfig wide;
  wide.c1 *= 2;
  Network other(wide);
  EXPECT_THROW(add_weights_delta(*other, bytes), std::runtime_error);
}

TEST(CompactState, ARunStoppedWithItWritesASmallerCheckpointThatResumesToTheEnd) {
  auto t = stop_twice("compact_state", 3, [](TrainOptions& o) { o.aux_weight = 0.4; });
  const auto& full = t.full;
  const auto& compact = t.compact;
  auto& oc = t.compact_run;
  auto& dir = t.dir;

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

TEST(CompactState, AnEmaRunsCompactStateResumesWithItsRawWeightsNearlyExact) {
  // The same EMA run stopped at the same step with full and with compact state: the compact file
  // has the average as its tensors (the same), the raw weights as an 8-bit difference from it
  // (close to the full file's), an 8-bit optimizer state; it is far smaller and resumes to the end.
  auto t = stop_twice("compact_state_ema", 4, [](TrainOptions& o) { o.ema_decay = 0.9; });
  const auto& full = t.full;
  const auto& compact = t.compact;
  auto& oc = t.compact_run;
  ASSERT_TRUE(full.blobs.count("raw_weights"));
  ASSERT_TRUE(compact.blobs.count("raw_weights_q8"));
  EXPECT_FALSE(compact.blobs.count("raw_weights"));
  EXPECT_LT(compact.blobs.at("raw_weights_q8").size() * 3, full.blobs.at("raw_weights").size());
  EXPECT_LT(compact.blobs.at("optimizer").size() * 6, full.blobs.at("optimizer").size());
  // raw = average + difference, against the full file's raw weights
  Network avg(full.config), raw(full.config);
  load_into(avg, full);
  from_archive_bytes(*raw, full.blobs.at("raw_weights"));
  Network back(full.config);
  load_into(back, compact);
  add_weights_delta(*back, compact.blobs.at("raw_weights_q8"));
  auto r = raw->named_parameters(true), a = avg->named_parameters(true);
  for (auto& p : back->named_parameters(true)) {
    const float spread = (r[p.key()] - a[p.key()]).abs().max().item<float>();
    EXPECT_LE((p.value() - r[p.key()]).abs().max().item<float>(), spread / 254 * 1.01f + 1e-6f) << p.key();
  }
  oc.compact_state = false;
  oc.resume = true;
  const auto res = train(oc, {});
  ASSERT_TRUE(res.finished);
  ASSERT_EQ(res.history.size(), 3u);
  for (const auto& e : res.history) EXPECT_TRUE(std::isfinite(e.loss));
  fs::remove_all(t.dir);
}
