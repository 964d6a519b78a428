// Training end to end on a tiny synthetic dataset: overfitting, kill/resume exactness,
// checkpoints never overwritten by accident; eval --save consistency.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <future>
#include <limits>
#include <map>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "lightseg/dataset.h"
#include "lightseg/distributed.h"
#include "lightseg/engine.h"
#include "lightseg/eval.h"
#include "lightseg/runtime.h"
#include "lightseg/train.h"
#include "lightseg/weights.h"
#include "cli_run.h"
#include "synthetic.h"
#include "train/archive_bytes.h"
#include "train/aux_heads.h"
#include "lightseg/file_io.h"

using namespace lightseg;
namespace fs = std::filesystem;

namespace {
TrainOptions tiny(const fs::path& data, const fs::path& out) { return fixtures::tiny_train_options(data, out); }

std::vector<torch::Tensor> tensors_of(const std::string& path) {
  std::vector<torch::Tensor> r;
  for (auto& [n, t] : read_weights(path).tensors) r.push_back(t);
  return r;
}

double max_diff(const std::string& a, const std::string& b) {
  auto x = tensors_of(a), y = tensors_of(b);
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i)
    m = std::max(m, (x[i].to(torch::kDouble) - y[i].to(torch::kDouble)).abs().max().item<double>());
  return m;
}
}  // namespace

// Overfitting setup: `epochs` epochs on the tiny set, measured on the training images at the
// end; returns the per-epoch records (the run must finish).
static std::vector<EpochRecord> overfit(TrainOptions o, int epochs, TrainCallbacks cb = {}) {
  o.epochs = epochs;
  o.val_split = "train";  // overfitting: measure on the training images
  o.val_every = epochs;
  o.loss = "ce";
  o.scale_min = o.scale_max = 1.0;
  std::vector<EpochRecord> records;
  cb.on_epoch = [&](const EpochRecord& r) { records.push_back(r); };
  auto r = train(o, cb);
  EXPECT_TRUE(r.finished);
  return records;
}

TEST(Train, OverfitsTinySyntheticDataset) {
  auto dir = fixtures::temp_dir("overfit");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  auto epochs = overfit(tiny(dir / "data", dir / "run"), 40);
  ASSERT_EQ(epochs.size(), 40u);
  EXPECT_LT(epochs.back().loss, epochs.front().loss);
  EXPECT_GT(epochs.back().pixel_acc, 0.95);
  EXPECT_TRUE(fs::exists(dir / "run" / "best.lsw"));
  EXPECT_TRUE(fs::exists(dir / "run" / "curve.svg"));
  EXPECT_TRUE(fs::exists(dir / "run" / "log.jsonl"));
  // the checkpoint evaluates to the same number as the last epoch's record
  ModelMeta meta;
  Network net = load_network((dir / "run" / "best.lsw").string(), &meta);
  auto ev = evaluate(net, meta, SegDataset::open("list", (dir / "data").string(), "train"));
  EXPECT_NEAR(ev.pixel_accuracy(), epochs.back().pixel_acc, 1e-9);
  fs::remove_all(dir);
}

TEST(Train, Bf16AutocastOnTheCpuLearns) {
  // --precision bf16 on the CPU: convolutions run in bf16 under autocast, the weights and
  // their checkpoint stay float32, and the network still fits the tiny dataset.
  auto dir = fixtures::temp_dir("amp_cpu");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  auto o = tiny(dir / "data", dir / "run");
  o.amp_cpu = true;
  auto epochs = overfit(o, 25);
  ASSERT_EQ(epochs.size(), 25u);
  EXPECT_LT(epochs.back().loss, 0.5 * epochs.front().loss);
  EXPECT_GT(epochs.back().pixel_acc, 0.9);
  auto w = read_weights((dir / "run" / "last.lsw").string());
  EXPECT_TRUE(train_state(w)->options.amp_cpu);
  ModelMeta meta;
  Network net = load_network((dir / "run" / "last.lsw").string(), &meta);
  for (const auto& p : net->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat32);
  fs::remove_all(dir);
}

TEST(Train, NonFiniteStepsAreSkippedAndRepeatedOnesStopTheRun) {
  // A NaN gradient (a bf16 overflow, a bad batch) skips that step: no update, and the BatchNorm
  // statistics its forward pass changed are put back; five in a row are divergence.
  auto dir = fixtures::temp_dir("nonfinite");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  auto o = tiny(dir / "data", dir / "a");
  o.epochs = 2;  // 2 steps per epoch
  o.val_every = 0;
  std::map<std::string, torch::Tensor> weights_before, buffers_before;
  int step = 0;
  TrainCallbacks cb;
  cb.after_backward = [&](Network& net) {
    ++step;
    if (step == 3)  // BatchNorm statistics as step 4's forward pass found them
      for (const auto& b : net->named_buffers()) buffers_before[b.key()] = b.value().detach().clone();
    if (step == 4) {  // the weights step 4 must leave alone; then poison one gradient
      for (const auto& p : net->named_parameters()) weights_before[p.key()] = p.value().detach().clone();
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
  Network net = load_network((dir / "a" / "last.lsw").string(), &meta);
  ASSERT_FALSE(weights_before.empty());
  for (const auto& p : net->named_parameters())
    EXPECT_TRUE(torch::equal(p.value(), weights_before.at(p.key()))) << p.key();
  int changed_by_forward = 0;
  for (const auto& b : net->named_buffers()) {
    EXPECT_TRUE(torch::equal(b.value(), buffers_before.at(b.key()))) << b.key();
    changed_by_forward += b.value().is_floating_point() ? 1 : 0;
  }
  EXPECT_GT(changed_by_forward, 0);
  EXPECT_EQ(train_state(read_weights((dir / "a" / "last.lsw").string()))->history[1].skipped_steps, 1);

  // NaN from the second step on: five skips in a row end the run with a clear error
  auto o2 = tiny(dir / "data", dir / "b");
  o2.epochs = 10;
  o2.val_every = 0;
  step = 0;
  TrainCallbacks bad;
  bad.after_backward = [&](Network& n) {
    if (++step >= 2) n->parameters().front().mutable_grad().fill_(std::numeric_limits<float>::infinity());
  };
  try {
    train(o2, bad);
    ADD_FAILURE() << "a run of non-finite steps must stop training";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("diverged"), std::string::npos) << e.what();
  }
  EXPECT_EQ(step, 6);  // one good step, five skipped
  // the last checkpoint (end of epoch 2) is intact and finite
  Network n2 = load_network((dir / "b" / "last.lsw").string(), &meta);
  for (const auto& p : n2->parameters()) EXPECT_TRUE(torch::isfinite(p).all().item<bool>());
  fs::remove_all(dir);
}

TEST(Train, RefusesToOverwriteARunWithoutResume) {
  auto dir = fixtures::temp_dir("nooverwrite");
  fixtures::make_shapes_dataset(dir / "data", 4, 1);
  auto o = tiny(dir / "data", dir / "run");
  o.epochs = 1;
  o.val_every = 0;
  train(o, {});
  auto before = read_file((dir / "run" / "last.lsw").string());
  try {
    train(o, {});
    ADD_FAILURE() << "a second run into the same folder was not refused";
  } catch (const std::runtime_error& e) {  // it names the CLI's options
    EXPECT_NE(std::string(e.what()).find("(--resume)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(--out)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_file((dir / "run" / "last.lsw").string()), before);
  // too few images for one batch: a clear error
  auto o2 = tiny(dir / "data", dir / "run2");
  o2.batch = 16;
  EXPECT_THROW(train(o2, {}), std::runtime_error);
  fs::remove_all(dir);
}

// A PID that no process has: a child that has exited and been reaped.
static pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

TEST(Train, ResumeRemovesStaleTemporariesOfKilledCheckpointWrites) {
  // kill -9 during a checkpoint write leaves NAME.tmp.PID behind; the next run in the folder
  // removes those of its own files whose writer is gone, and nothing else.
  auto dir = fixtures::temp_dir("staletmp");
  fixtures::make_shapes_dataset(dir / "data", 4, 1);
  auto o = tiny(dir / "data", dir / "run");
  o.epochs = 1;
  o.val_every = 1;
  o.loss = "ce";
  ASSERT_TRUE(train(o, {}).finished);
  const fs::path run = dir / "run";
  const std::string best_before = read_file((run / "best.lsw").string());
  const std::string dead = std::to_string(dead_pid());
  const std::vector<std::string> stale = {"last.lsw.tmp." + dead, "best.lsw.tmp." + dead, "log.jsonl.tmp." + dead,
                                          "curve.svg.tmp." + dead};
  const std::vector<std::string> kept = {
      "last.lsw.tmp.1",            // its writer (pid 1) is alive
      "notes.txt.tmp." + dead,     // not a file of the run
      "last.lsw.tmp.x" + dead,     // not a PID
      "last.lsw.tmp"};
  for (const auto& n : stale) std::ofstream(run / n) << std::string(1000, 'x');
  for (const auto& n : kept) std::ofstream(run / n) << "keep";
  o.resume = true;
  o.epochs = 2;
  std::vector<std::string> messages;
  TrainCallbacks cb;
  cb.on_message = [&](const std::string& m) { messages.push_back(m); };
  auto r = train(o, cb);
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.history.size(), 2u);  // resumed from the intact checkpoint of epoch 1
  for (const auto& n : stale) EXPECT_FALSE(fs::exists(run / n)) << n;
  for (const auto& n : kept) EXPECT_TRUE(fs::exists(run / n)) << n;
  bool said = false;
  for (const auto& m : messages) said = said || (m.find("stale") != std::string::npos && m.find("last.lsw.tmp." + dead) != std::string::npos);
  EXPECT_TRUE(said) << "no message names the removed temporaries";
  EXPECT_EQ(train_state(read_weights((run / "last.lsw").string()))->epoch, 2);
  // best.lsw: rewritten only if epoch 2 scored higher; either way a complete weights file
  EXPECT_NO_THROW(read_weights((run / "best.lsw").string()));
  if (r.best_miou == r.history[0].miou) EXPECT_EQ(read_file((run / "best.lsw").string()), best_before);
  fs::remove_all(dir);
}

TEST(Train, ACheckpointCopiedIntoANewFolderBringsItsLogAndCurve) {
  // the run folder's log.jsonl and curve.svg are lost (a new machine), its checkpoint is not:
  // resuming it in a new folder rewrites both from the checkpoint's history, also when the
  // schedule is finished and no epoch is left to train
  auto dir = fixtures::temp_dir("ckptlog");
  fixtures::make_shapes_dataset(dir / "data", 4, 1);
  auto o = tiny(dir / "data", dir / "run");
  o.epochs = 2;
  o.val_every = 0;
  o.loss = "ce";
  ASSERT_TRUE(train(o, {}).finished);
  const std::string log = read_file((dir / "run" / "log.jsonl").string());
  ASSERT_EQ(std::count(log.begin(), log.end(), '\n'), 2);
  fs::create_directories(dir / "copy");
  fs::copy_file(dir / "run" / "last.lsw", dir / "copy" / "last.lsw");
  const std::string ckpt = read_file((dir / "copy" / "last.lsw").string());
  o.out_dir = (dir / "copy").string();
  o.resume = true;
  auto r = train(o, {});
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.history.size(), 2u);
  EXPECT_EQ(read_file((dir / "copy" / "log.jsonl").string()), log);
  EXPECT_EQ(read_file((dir / "copy" / "curve.svg").string()), read_file((dir / "run" / "curve.svg").string()));
  EXPECT_EQ(read_file((dir / "copy" / "last.lsw").string()), ckpt);  // nothing trained, nothing rewritten
  fs::remove_all(dir);
}

TEST(Train, ARunFolderTakesOneTrainerAtATime) {
  // A second trainer on a folder in use fails at once, naming the folder and the holder;
  // once the first has ended (or died: the lock goes with the process) the folder is free.
  auto dir = fixtures::temp_dir("runlock");
  fixtures::make_shapes_dataset(dir / "data", 4, 1);
  auto o = tiny(dir / "data", dir / "run");
  o.epochs = 1;
  o.val_every = 0;
  o.loss = "ce";
  o.resume = true;
  // A .lock file left by a killed trainer (nobody holds it) does not block.
  fs::create_directories(dir / "run");
  std::ofstream(dir / "run" / ".lock") << "999999999 nowhere\n";
  std::promise<void> started, release;
  auto released = release.get_future().share();
  TrainCallbacks first;
  bool waited = false;
  first.on_iteration = [&](const TrainProgress&) {
    if (waited) return;
    waited = true;
    started.set_value();
    released.wait_for(std::chrono::minutes(5));  // bounded, should the test fail before releasing
  };
  auto running = std::async(std::launch::async, [&] { return train(o, first); });
  ASSERT_EQ(started.get_future().wait_for(std::chrono::minutes(5)), std::future_status::ready);
  bool second_trained = false;
  TrainCallbacks second;
  second.on_iteration = [&](const TrainProgress&) { second_trained = true; };
  try {
    train(o, second);
    ADD_FAILURE() << "a second trainer started on a folder in use";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find((dir / "run").string()), std::string::npos) << m;
    EXPECT_NE(m.find("in use"), std::string::npos) << m;
    EXPECT_NE(m.find("process " + std::to_string(::getpid())), std::string::npos) << m;
  }
  EXPECT_FALSE(second_trained);
  // held by someone else than a trainer (here: the test itself, through its own descriptor)
  release.set_value();
  ASSERT_TRUE(running.get().finished);
  {
    const int fd = ::open((dir / "run" / ".lock").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0) << "the first trainer still holds the lock after it ended";
    auto o2 = o;
    o2.epochs = 2;
    EXPECT_THROW(train(o2, {}), std::runtime_error);
    ::close(fd);
  }
  // free again: the run continues
  auto o3 = o;
  o3.epochs = 2;
  auto r = train(o3, {});
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.history.size(), 2u);
  fs::remove_all(dir);
}

// A TCP port nobody listens on now (the kernel's pick), for an in-process rendezvous.
static int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return 29765;
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// Both ranks of a 2-rank run as threads of this process, on one run folder; the errors they
// ended with (empty: finished).
static std::vector<std::string> train_two_ranks(const TrainOptions& base) {
  const int port = free_port();
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      try {
        DistConfig dc;
        dc.rank = r;
        dc.world = 2;
        dc.master_port = port;
        dc.backend = "gloo";
        dc.timeout = std::chrono::seconds(60);  // a rank left waiting fails the test, not hangs it
        auto col = Collective::create(dc, torch::kCPU);
        auto o = base;
        o.rank = r;
        o.world = 2;
        if (!train(o, {}, col).finished) errors[r] = "not finished";
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (errors[r].empty()) errors[r] = "exception";
      }
    });
  for (auto& t : ranks) t.join();
  return errors;
}

TEST(Train, DistributedRanksShareTheRunFolderLockOfRankZero) {
  // Only rank 0 writes the folder and only it locks it (ranks on one machine would otherwise
  // lock each other out); when it cannot, every rank fails at once with the reason.
  auto dir = fixtures::temp_dir("distlock");
  fixtures::make_shapes_dataset(dir / "data", 4, 1);
  auto o = tiny(dir / "data", dir / "run");
  o.epochs = 1;
  o.batch = 2;
  o.val_every = 0;
  o.loss = "ce";
  o.workers = 1;
  auto errors = train_two_ranks(o);
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  const int fd = ::open((dir / "run" / ".lock").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);  // held by the test now
  o.resume = true;
  o.epochs = 2;
  errors = train_two_ranks(o);
  ::close(fd);
  EXPECT_NE(errors[0].find("in use"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank 0 could not lock the run folder"), std::string::npos) << errors[1];
  EXPECT_EQ(train_state(read_weights((dir / "run" / "last.lsw").string()))->epoch, 1);
  fs::remove_all(dir);
}

TEST(Train, DistributedRanksTrainWithAuxHeadsAndEma) {
  // The heads' gradients are averaged over the ranks (they are not in GradientSync's buckets)
  // and every rank keeps its own EMA of identical weights; rank 0 writes both into last.lsw.
  auto dir = fixtures::temp_dir("distrecipe");
  fixtures::make_shapes_dataset(dir / "data", 4, 1);
  auto o = tiny(dir / "data", dir / "run");
  o.epochs = 2;
  o.batch = 2;
  o.val_every = 0;
  o.loss = "ce";
  o.workers = 1;
  o.aux_weight = 0.4;
  o.ema_decay = 0.9;
  o.verify_sync = true;  // the network's weights identical on both ranks after every step
  auto errors = train_two_ranks(o);
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  auto w = read_weights((dir / "run" / "last.lsw").string());
  EXPECT_TRUE(w.blobs.count("aux_heads"));
  EXPECT_TRUE(w.blobs.count("raw_weights"));
  EXPECT_EQ(train_state(w)->ema_steps, 2);  // 2 images per rank, batch 2: 1 step per epoch
  fs::remove_all(dir);
}

TEST(Eval, SavedPredictionsRescoreToTheSameMiou) {
  auto dir = fixtures::temp_dir("evalsave");
  fixtures::make_shapes_dataset(dir / "data", 4, 3);
  torch::manual_seed(2);
  NetworkConfig cfg;
  cfg.num_classes = 3;
  Network net(cfg);
  auto ds = SegDataset::open("list", (dir / "data").string(), "val");
  EvalOptions eo;
  eo.save_dir = (dir / "pred").string();
  auto r = evaluate(net, ds.meta(), ds, eo);
  EXPECT_EQ(r.images, 3u);
  ConfusionMatrix again(3);
  for (size_t i = 0; i < ds.size(); ++i) {
    auto name = fs::path(ds.sample(i).image).stem().string() + ".png";
    auto pred = read_label_file((dir / "pred" / name).string());
    EXPECT_EQ(pred.sizes(), (std::vector<int64_t>{64, 64}));
    again.update(pred.to(torch::kLong), ds.load_label(i).to(torch::kLong));
  }
  EXPECT_TRUE(torch::equal(again.matrix(), r.confusion.matrix()));
  auto j = nlohmann::json::parse(r.to_json_string());
  EXPECT_NEAR(j["miou"].get<double>(), again.miou(), 1e-12);
  EXPECT_EQ(j["per_class"].size(), 3u);
  fs::remove_all(dir);
}

TEST(Eval, AnInferenceBackendScoresLikeTheTrainingGraph) {
  // eval --backend onednn|fused: the same confusion matrix as the training graph (fp32
  // backends give its labels); the result names what computed it.
  auto dir = fixtures::temp_dir("evalbackend");
  fixtures::make_shapes_dataset(dir / "data", 4, 3);
  torch::manual_seed(2);
  NetworkConfig cfg;
  cfg.num_classes = 3;
  Network net(cfg);
  net->eval();
  auto ds = SegDataset::open("list", (dir / "data").string(), "val");
  auto ref = evaluate(net, ds.meta(), ds);
  EXPECT_EQ(ref.backend, "eager");
  for (const auto& backend : available_backends()) {
    EvalOptions eo;
    eo.engine.backend = backend;
    auto r = evaluate(net, ds.meta(), ds, eo);
    EXPECT_EQ(r.backend, backend);
    EXPECT_TRUE(torch::equal(r.confusion.matrix(), ref.confusion.matrix())) << backend;
  }
  EvalOptions bad;
  bad.engine.backend = "tensorrt";
  EXPECT_THROW(evaluate(net, ds.meta(), ds, bad), std::invalid_argument);
  fs::remove_all(dir);
}

// ------------------------------------------------------------ recipe options: aux heads, EMA

// What a checkpoint carries besides its inference tensors, flattened in a fixed order: the raw
// weights behind an EMA ("raw_weights") and the auxiliary heads ("aux_heads"), when present.
static std::vector<torch::Tensor> blob_tensors(const WeightsFile& w) {
  std::vector<torch::Tensor> r;
  auto take = [&](torch::nn::Module& m) {
    for (const auto& p : m.parameters()) r.push_back(p.detach());
    for (const auto& b : m.buffers()) r.push_back(b);
  };
  if (w.blobs.count("raw_weights")) {
    Network n(w.config);
    from_archive_bytes(*n, w.blobs.at("raw_weights"));
    take(*n);
  }
  if (w.blobs.count("aux_heads")) {
    AuxHeads a(w.config.c1, w.config.c2, w.config.num_classes);
    from_archive_bytes(*a, w.blobs.at("aux_heads"));
    take(*a);
  }
  return r;
}

static double max_diff(const std::vector<torch::Tensor>& x, const std::vector<torch::Tensor>& y) {
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i)
    m = std::max(m, (x[i].to(torch::kDouble) - y[i].to(torch::kDouble)).abs().max().item<double>());
  return m;
}

// For `base`'s options (the default recipe, aux heads, EMA): an uninterrupted run (a), one killed
// mid-epoch 2 and resumed (b), one stopped cleanly mid-epoch 2 and resumed (c) end with the
// same inference tensors, the same blobs' tensors and the same losses.
static void expect_kill_and_resume_exact(TrainOptions base, const fs::path& dir, size_t expected_blob_tensors) {
  base.epochs = 3;
  base.val_every = 1;
  base.out_dir = (dir / "a").string();
  auto ra = train(base, {});
  ASSERT_TRUE(ra.finished);
  auto ob = base;
  ob.out_dir = (dir / "b").string();
  TrainCallbacks kill;
  kill.kill_now = [](int epoch, int64_t iter) { return epoch == 2 && iter == 2; };
  ASSERT_TRUE(train(ob, kill).killed);
  ob.resume = true;
  ASSERT_TRUE(train(ob, {}).finished);
  auto oc = base;
  oc.out_dir = (dir / "c").string();
  int steps = 0;
  TrainCallbacks stop;
  stop.after_backward = [&](Network&) { ++steps; };
  stop.stop_requested = [&] { return steps == 3; };  // epoch 2, iteration 1: a mid-epoch checkpoint
  ASSERT_TRUE(train(oc, stop).stopped_by_time);
  ASSERT_EQ(train_state(read_weights((dir / "c" / "last.lsw").string()))->batch, 1);
  oc.resume = true;
  auto rc = train(oc, {});
  ASSERT_TRUE(rc.finished);
  const auto a = read_weights((dir / "a" / "last.lsw").string());
  const auto blobs_a = blob_tensors(a);
  EXPECT_EQ(blobs_a.size(), expected_blob_tensors);
  for (const char* run : {"b", "c"}) {
    const auto w = read_weights((dir / run / "last.lsw").string());
    EXPECT_LT(max_diff((dir / "a" / "last.lsw").string(), (dir / run / "last.lsw").string()), 1e-6) << run;
    EXPECT_LT(max_diff(blobs_a, blob_tensors(w)), 1e-6) << run;
    EXPECT_EQ(train_state(w)->ema_steps, train_state(a)->ema_steps) << run;
  }
  ASSERT_EQ(rc.history.size(), 3u);
  for (int e = 0; e < 3; ++e) {
    EXPECT_NEAR(rc.history[e].loss, ra.history[e].loss, 1e-5) << e;
    EXPECT_NEAR(rc.history[e].miou, ra.history[e].miou, 1e-9) << e;
  }
}

TEST(Train, AuxHeadsHelpTrainingAndStayOutOfTheSavedNetwork) {
  // --aux-weight: heads on M1 (C1.3) and M2 (C1.5) join the loss during training only; the
  // saved weights are exactly the network's tensors, and they give the trainer's logits.
  auto dir = fixtures::temp_dir("aux");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  auto o = tiny(dir / "data", dir / "run");
  o.aux_weight = 0.4;
  Network trained{nullptr};
  int64_t nonzero = 0;
  TrainCallbacks cb;
  cb.after_backward = [&](Network& n) { trained = n; };
  auto epochs = overfit(o, 25, cb);
  ASSERT_EQ(epochs.size(), 25u);
  EXPECT_LT(epochs.back().loss, 0.5 * epochs.front().loss);
  EXPECT_GT(epochs.back().pixel_acc, 0.9);
  const auto w = read_weights((dir / "run" / "last.lsw").string());
  EXPECT_DOUBLE_EQ(train_state(w)->options.aux_weight, 0.4);
  // the inference tensors: those of a plain network, name for name, and none of the heads'
  ModelMeta meta;
  Network plain(w.config);
  const auto ref = make_weights(plain, meta);
  ASSERT_EQ(w.tensors.size(), ref.tensors.size());
  for (size_t i = 0; i < ref.tensors.size(); ++i) {
    EXPECT_EQ(w.tensors[i].first, ref.tensors[i].first);
    EXPECT_EQ(w.tensors[i].second.sizes(), ref.tensors[i].second.sizes()) << ref.tensors[i].first;
  }
  // the heads ride along as a blob (for --resume), with trained, non-zero weights
  ASSERT_TRUE(w.blobs.count("aux_heads"));
  AuxHeads heads(w.config.c1, w.config.c2, w.config.num_classes);
  from_archive_bytes(*heads, w.blobs.at("aux_heads"));
  for (const auto& p : heads->parameters()) nonzero += p.abs().sum().item<double>() > 0;
  EXPECT_EQ(nonzero, static_cast<int64_t>(heads->parameters().size()));
  // a plain load gives the trainer's network: same logits
  Network loaded = load_network((dir / "run" / "last.lsw").string(), &meta);
  ASSERT_TRUE(trained);
  trained->eval();
  torch::NoGradGuard ng;
  torch::manual_seed(5);
  auto x = torch::randn({2, 3, 64, 64});
  auto want = trained->forward(x.contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(torch::allclose(loaded->forward(x), want, 1e-4, 1e-5));
  // the training variant computes forward()'s logits, op for op
  auto b = trained->forward_with_branches(x.contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(torch::equal(b.logits, want));
  EXPECT_EQ(b.M1.size(1), w.config.c1);
  EXPECT_EQ(b.M2.size(1), w.config.c2);
  fs::remove_all(dir);
}

TEST(Train, EmaWeightsAreTheClosedFormAverageAndAreWhatIsScoredAndSaved) {
  // --ema-decay d: after update n, ema = d_n·ema + (1−d_n)·raw with d_n = min(d, (1+n)/(10+n)),
  // starting from the initial weights, over parameters and BatchNorm statistics; validation,
  // best.lsw and last.lsw use the average, the raw weights ride along for --resume.
  auto dir = fixtures::temp_dir("ema");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  auto o = tiny(dir / "data", dir / "run");
  o.epochs = 3;  // 2 steps per epoch: 6 updates, d_n = 0.1, 0.18, 0.25, then 0.3 (the cap)
  o.ema_decay = 0.3;
  o.val_split = "train";
  o.val_every = 3;
  o.loss = "ce";
  // What the optimizer steps on: the raw weights before each step (= after the previous one)
  // and the BatchNorm statistics as each step's forward pass left them.
  std::vector<std::map<std::string, torch::Tensor>> params_before, buffers_after_forward;
  TrainCallbacks cb;
  cb.after_backward = [&](Network& n) {
    std::map<std::string, torch::Tensor> p, b;
    for (const auto& t : n->named_parameters()) p[t.key()] = t.value().detach().to(torch::kDouble).clone();
    for (const auto& t : n->named_buffers()) b[t.key()] = t.value().detach().to(torch::kDouble).clone();
    params_before.push_back(p);
    buffers_after_forward.push_back(b);
  };
  auto r = train(o, cb);
  ASSERT_TRUE(r.finished);
  ASSERT_EQ(params_before.size(), 6u);
  const auto w = read_weights((dir / "run" / "last.lsw").string());
  EXPECT_EQ(train_state(w)->ema_steps, 6);
  ASSERT_TRUE(w.blobs.count("raw_weights"));
  Network raw(w.config);
  from_archive_bytes(*raw, w.blobs.at("raw_weights"));
  // the start: the network as initialised (its BatchNorm statistics before any forward pass)
  torch::manual_seed(o.seed);
  NetworkConfig cfg = o.network;
  cfg.num_classes = 3;
  Network init(cfg);
  std::map<std::string, torch::Tensor> ema;
  for (const auto& t : init->named_parameters()) {
    ema[t.key()] = t.value().detach().to(torch::kDouble);
    EXPECT_TRUE(torch::equal(ema[t.key()], params_before[0].at(t.key()))) << t.key();
  }
  for (const auto& t : init->named_buffers()) ema[t.key()] = t.value().detach().to(torch::kDouble);
  for (size_t k = 0; k < 6; ++k) {
    const double d = std::min(0.3, (1.0 + k) / (10.0 + k));
    for (const auto& t : raw->named_parameters()) {
      const auto& after = k + 1 < 6 ? params_before[k + 1].at(t.key()) : t.value().detach().to(torch::kDouble);
      ema[t.key()] = d * ema[t.key()] + (1 - d) * after;
    }
    for (const auto& t : raw->named_buffers()) {
      const auto& now = buffers_after_forward[k].at(t.key());
      ema[t.key()] = t.value().is_floating_point() ? d * ema[t.key()] + (1 - d) * now : now;
    }
  }
  // the raw weights the blob holds are the last step's, i.e. not the average
  double raw_vs_ema = 0;
  for (const auto& [name, t] : w.tensors) {
    const auto& want = ema.at(name);
    const auto got = t.to(torch::kDouble);
    EXPECT_LT((got - want).abs().max().item<double>(), 1e-6 * (1 + want.abs().max().item<double>())) << name;
    for (const auto& p : raw->named_parameters())
      if (p.key() == name) raw_vs_ema = std::max(raw_vs_ema, (p.value().to(torch::kDouble) - got).abs().max().item<double>());
  }
  EXPECT_GT(raw_vs_ema, 1e-4);
  // validation scored the average; best.lsw (written by that validation) holds it too
  ModelMeta meta;
  Network saved = load_network((dir / "run" / "last.lsw").string(), &meta);
  auto ev = evaluate(saved, meta, SegDataset::open("list", (dir / "data").string(), "train"));
  ASSERT_EQ(r.history.size(), 3u);
  EXPECT_NEAR(ev.miou(), r.history.back().miou, 1e-9);
  EXPECT_LT(max_diff((dir / "run" / "last.lsw").string(), (dir / "run" / "best.lsw").string()), 1e-12);
  fs::remove_all(dir);
}

TEST(Train, KillAndResumeEndInTheSameState) {
  // The default recipe: same data order and augmentation by construction; same float ops on
  // the same thread count → identical weights (1e-6 leaves room only for reduction-order noise).
  auto dir = fixtures::temp_dir("resume");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  auto o = tiny(dir / "data", dir / "a");
  o.jitter = 0.2;
  expect_kill_and_resume_exact(o, dir, 0);
  fs::remove_all(dir);
}

TEST(Train, KillAndResumeWithAuxHeadsEndInTheSameState) {
  auto dir = fixtures::temp_dir("resume_aux");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  auto o = tiny(dir / "data", dir / "a");
  o.jitter = 0.2;
  o.aux_weight = 0.4;
  o.loss = "ohem";  // the heads take the main loss, OHEM included
  AuxHeads heads(o.network.c1, o.network.c2, 3);
  expect_kill_and_resume_exact(o, dir, heads->parameters().size() + heads->buffers().size());
  fs::remove_all(dir);
}

TEST(Train, KillAndResumeWithEmaEndInTheSameState) {
  auto dir = fixtures::temp_dir("resume_ema");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  auto o = tiny(dir / "data", dir / "a");
  o.jitter = 0.2;
  o.ema_decay = 0.9;
  o.aux_weight = 0.4;  // both at once: the raw weights and the heads are resumed together
  NetworkConfig cfg = o.network;
  cfg.num_classes = 3;
  Network net(cfg);
  AuxHeads heads(o.network.c1, o.network.c2, 3);
  expect_kill_and_resume_exact(o, dir, net->parameters().size() + net->buffers().size() +
                                           heads->parameters().size() + heads->buffers().size());
  fs::remove_all(dir);
}

TEST(Train, KillAndResumeOnTheGpuPathEndInTheSameState) {
  // The GPU trainer's path on the CPU device: the training set cached and each batch augmented
  // in a few tensor operations, the foreach Adam, the loss and the non-finite check read every
  // 2 steps. A resumed run replays what an uninterrupted one does, as on the recipe path.
  auto dir = fixtures::temp_dir("resume_gpu_path");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  auto o = tiny(dir / "data", dir / "a");
  o.jitter = 0.2;
  o.aux_weight = 0.4;
  o.data_cache = "device";
  o.fused_optimizer = "on";
  o.sync_every = 2;
  AuxHeads heads(o.network.c1, o.network.c2, 3);
  expect_kill_and_resume_exact(o, dir, heads->parameters().size() + heads->buffers().size());
  fs::remove_all(dir);
}

TEST(Train, TheGpuPathTrainsAsTheRecipePath) {
  // Same draws, same maths: host and device caches give the same weights; the foreach Adam
  // those of torch's Adam (to float rounding); deferred checks those of per-step ones.
  auto dir = fixtures::temp_dir("gpu_path_same");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  auto run = [&](const std::string& name, const std::string& cache, const std::string& fused, int sync_every) {
    auto o = tiny(dir / "data", dir / name);
    o.epochs = 2;
    o.val_every = 0;
    o.scale_min = o.scale_max = 1.0;  // unscaled: batched and per-sample images agree to 1e-6
    o.data_cache = cache;
    o.fused_optimizer = fused;
    o.sync_every = sync_every;
    auto r = train(o, {});
    EXPECT_TRUE(r.finished);
    return (dir / name / "last.lsw").string();
  };
  const auto recipe = run("recipe", "off", "off", 1), host = run("host", "host", "off", 1);
  const auto device = run("device", "device", "off", 1), fused = run("fused", "device", "on", 1);
  const auto deferred = run("deferred", "device", "on", 4);
  EXPECT_EQ(max_diff(host, device), 0);
  EXPECT_LT(max_diff(recipe, device), 1e-3);
  EXPECT_LT(max_diff(device, fused), 1e-5);
  EXPECT_LT(max_diff(fused, deferred), 1e-5);
  fs::remove_all(dir);
}

TEST(Train, DeferredNonFiniteChecksSkipTheStepAndStopARun) {
  // sync_every > 1: the skip is decided on the device; the same outcome as the per-step check
  auto dir = fixtures::temp_dir("nonfinite_deferred");
  fixtures::make_shapes_dataset(dir / "data", 8, 2);
  auto o = tiny(dir / "data", dir / "a");
  o.epochs = 2;
  o.val_every = 0;
  o.data_cache = "device";
  o.fused_optimizer = "on";
  o.sync_every = 2;
  std::map<std::string, torch::Tensor> weights_before, buffers_before;
  int step = 0;
  TrainCallbacks cb;
  cb.after_backward = [&](Network& net) {
    ++step;
    if (step == 3)
      for (const auto& b : net->named_buffers()) buffers_before[b.key()] = b.value().detach().clone();
    if (step == 4) {
      for (const auto& p : net->named_parameters()) weights_before[p.key()] = p.value().detach().clone();
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
  Network net = load_network((dir / "a" / "last.lsw").string(), &meta);
  ASSERT_FALSE(weights_before.empty());
  for (const auto& p : net->named_parameters())
    EXPECT_TRUE(torch::equal(p.value(), weights_before.at(p.key()))) << p.key();
  for (const auto& b : net->named_buffers()) EXPECT_TRUE(torch::equal(b.value(), buffers_before.at(b.key()))) << b.key();
  auto o2 = o;
  o2.out_dir = (dir / "b").string();
  o2.epochs = 10;
  step = 0;
  TrainCallbacks bad;
  bad.after_backward = [&](Network& n) {
    if (++step >= 2) n->parameters().front().mutable_grad().fill_(std::numeric_limits<float>::infinity());
  };
  try {
    train(o2, bad);
    ADD_FAILURE() << "a run of non-finite steps must stop training";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("diverged"), std::string::npos) << e.what();
  }
  EXPECT_EQ(step, 6);  // read every 2 steps: the fifth skip in a row (step 6) is seen at once
  fs::remove_all(dir);
}

TEST(Train, RecipeOptionsComeFromTheTrainObjectAndAreChecked) {
  TrainOptions o;
  EXPECT_EQ(o.aux_weight, 0.0);  // off by default: the default recipe trains as before
  EXPECT_EQ(o.ema_decay, 0.0);
  o.apply_json_string(R"({"aux_weight": 0.4, "ema_decay": 0.999})");
  EXPECT_DOUBLE_EQ(o.aux_weight, 0.4);
  EXPECT_DOUBLE_EQ(o.ema_decay, 0.999);
  TrainOptions back;
  back.apply_json_string(o.to_json_string());  // how a resumed run gets them from its checkpoint
  EXPECT_DOUBLE_EQ(back.aux_weight, 0.4);
  EXPECT_DOUBLE_EQ(back.ema_decay, 0.999);
  o.data = o.out_dir = "x";
  EXPECT_NO_THROW(o.validate());
  o.ema_decay = 1.0;
  EXPECT_THROW(o.validate(), std::invalid_argument);
  o.ema_decay = 0;
  o.aux_weight = -0.1;
  EXPECT_THROW(o.validate(), std::invalid_argument);
}

// --set KEY=VALUE (mmsegmentation's --cfg-options): any train option or network key.
TEST(Train, SetOverridesAnyOptionByKey) {
  TrainOptions o;
  o.set("lr=5e-4");
  EXPECT_DOUBLE_EQ(o.lr, 5e-4);
  o.set("train.loss=ohem");  // a bare word is a string
  EXPECT_EQ(o.loss, "ohem");
  o.set("crop=[256,512]");
  EXPECT_EQ(o.crop_h, 256);
  EXPECT_EQ(o.crop_w, 512);
  o.set("network.c0=16");
  EXPECT_EQ(o.network.c0, 16);
  EXPECT_EQ(o.network.c1, 64);  // the rest stays
  o.set("network.stage2.layers=4");  // the dilation schedule follows the new count
  EXPECT_EQ(o.network.stage2.layers, 4);
  EXPECT_EQ(o.network.stage2.dilations.size(), 4u);
  o.set("network.stage2.dilations=[1,2,3,4]");
  EXPECT_EQ(o.network.stage2.dilations, (std::vector<int>{1, 2, 3, 4}));
  for (const char* bad : {"nonsense=1", "lr", "=3", "network.c9=1", "network.stage3.layers=2", "lr=fast",
                          "network.stage2.layers=3" /* = stage1's: C5.1 */, "a.b=1"}) {
    try {
      TrainOptions p;
      p.set(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_FALSE(std::string(e.what()).empty());
    }
  }
  TrainOptions p;
  try {
    p.set("nonsense=1");
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("nonsense"), std::string::npos) << e.what();
  }
}

TEST(TrainCli, SetIsAppliedAndABadKeyIsAClearError) {
  auto dir = fs::temp_directory_path() / ("lightseg_set_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto r = fixtures::run_cli({"train", "--data", dir.string(), "--out", (dir / "run").string(), "--set", "bogus=1"}, dir);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("bogus"), std::string::npos) << r.err;
  r = fixtures::run_cli({"train", "--data", dir.string(), "--out", (dir / "run").string(), "--set", "network.c0=100"}, dir);
  EXPECT_NE(r.code, 0);  // c1 = 64 < c0: the network config refuses it, naming the keys
  EXPECT_NE(r.err.find("c0"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "run" / "last.lsw"));
  fs::remove_all(dir);
}

// Each training flag is a row of one table over TrainOptions::set: what it sets lands in the
// checkpoint's options, a bad value names the option, and --resume starts from the stored ones.
TEST(TrainCli, FlagsSetTheirTrainOptionsAndBadValuesAreClearErrors) {
  auto dir = fixtures::temp_dir("trainflags");
  fixtures::make_shapes_dataset(dir / "data", 4, 2);
  const std::string data = (dir / "data").string(), run = (dir / "run").string();
  auto base = [&](std::vector<std::string> more) {
    std::vector<std::string> a = {"train", "--data", data, "--dataset", "list", "--out", run};
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  auto r = fixtures::run_cli(base({"--epochs", "1", "--batch", "2", "--crop", "32x48", "--lr", "5e-4", "--val-every",
                                   "0", "--seed", "7", "--workers", "1", "--no-overlap", "--train-split", "train"}),
                             dir);
  ASSERT_EQ(r.code, 0) << r.err;
  auto s = train_state(read_weights(run + "/last.lsw"));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->epoch, 1);
  EXPECT_EQ(s->options.epochs, 1);
  EXPECT_EQ(s->options.batch, 2);
  EXPECT_EQ(s->options.crop_h, 32);
  EXPECT_EQ(s->options.crop_w, 48);
  EXPECT_DOUBLE_EQ(s->options.lr, 5e-4);
  EXPECT_EQ(s->options.val_every, 0);
  EXPECT_EQ(s->options.seed, 7u);
  EXPECT_FALSE(s->options.overlap_allreduce);
  EXPECT_EQ(s->options.weight_decay, TrainOptions{}.weight_decay);  // not given: the library's default
  // --resume: the stored options are the defaults, a flag changes only its own
  r = fixtures::run_cli(base({"--resume", "--epochs", "2", "--workers", "1"}), dir);
  ASSERT_EQ(r.code, 0) << r.err;
  s = train_state(read_weights(run + "/last.lsw"));
  EXPECT_EQ(s->epoch, 2);
  EXPECT_EQ(s->options.crop_w, 48);
  EXPECT_DOUBLE_EQ(s->options.lr, 5e-4);
  for (const auto& [flag, value, named] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"--epochs", "many", "epochs"}, {"--crop", "10x10", "32x32"}, {"--lr", "[1]", "lr"}, {"--precision", "fp16", "bf16"}}) {
    r = fixtures::run_cli(base({"--resume", flag, value}), dir);
    EXPECT_NE(r.code, 0) << flag;
    EXPECT_NE(r.err.find(named), std::string::npos) << flag << ": " << r.err;
  }
  EXPECT_EQ(train_state(read_weights(run + "/last.lsw"))->epoch, 2);  // refused runs touched nothing
  fs::remove_all(dir);
}

// --precision auto is bf16 on the CPU only where the CPU computes bf16 natively; an explicit
// bf16 without that (here: under the cap LIGHTSEG_MAX_ISA=avx512, true of any CPU) is honoured
// but warned about, since it is emulated (~10x slower than fp32 on an AVX2 EPYC).
TEST(TrainCli, PrecisionAutoTakesBf16OnlyWhereTheCpuHasItAndForcedBf16Warns) {
  auto dir = fixtures::temp_dir("trainprec");
  fixtures::make_shapes_dataset(dir / "data", 2, 1);
  const std::string data = (dir / "data").string();
  auto train = [&](const std::string& name, const std::string& precision, const char* cap) {
    if (cap) ::setenv("LIGHTSEG_MAX_ISA", cap, 1);
    auto r = fixtures::run_cli({"train", "--data", data, "--dataset", "list", "--out", (dir / name).string(), "--epochs",
                                "1", "--max-iters", "1", "--batch", "2", "--crop", "32x32", "--val-every", "0",
                                "--workers", "1", "--precision", precision},
                               dir);
    if (cap) ::unsetenv("LIGHTSEG_MAX_ISA");
    return r;
  };
  auto stored_amp_cpu = [&](const std::string& name) {
    auto s = train_state(read_weights((dir / name / "last.lsw").string()));
    EXPECT_TRUE(s);
    return s && s->options.amp_cpu;
  };
  auto r = train("auto", "auto", nullptr);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(stored_amp_cpu("auto"), cpu_has_native_bf16());
  // the schedule line names the precision the run got, and why
  const std::string got = cpu_has_native_bf16() ? "; bf16 autocast (--precision auto: this CPU computes bf16 natively"
                                                : "; fp32 (--precision auto: no native bf16";
  EXPECT_NE((r.out + r.err).find(got), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("warning: bf16"), std::string::npos) << r.err;
  r = train("auto_capped", "auto", "avx512");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(stored_amp_cpu("auto_capped"));
  EXPECT_NE((r.out + r.err).find("; fp32 (--precision auto: no native bf16"), std::string::npos) << r.err;
  r = train("forced", "bf16", "avx512");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(stored_amp_cpu("forced"));
  EXPECT_NE(r.err.find("warning: bf16 training on a CPU without native bf16"), std::string::npos) << r.err;
  r = train("fp32", "fp32", "avx512");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(stored_amp_cpu("fp32"));
  EXPECT_EQ(r.err.find("warning: bf16"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

// The training state of a checkpoint: read from the layout every checkpoint so far has used,
// written back with the other keys of the weights' extra JSON kept.
TEST(Train, TrainStateReadsTheCheckpointLayoutAndRoundTrips) {
  WeightsFile w;
  EXPECT_FALSE(train_state(w));  // plain weights
  w.extra = R"({"note": "kept", "train": {"epoch": 3, "batch": 5, "global_step": 41, "world": 2, "best_miou": 0.5,
                "part_loss": 2.5, "part_count": 5, "history": [{"epoch": 1, "loss": 1.5, "lr": 0.001,
                "val_miou": null, "val_pixel_acc": null}], "options": {"lr": 0.002, "crop": [64, 96]}}})";
  auto s = train_state(w);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->epoch, 3);
  EXPECT_EQ(s->batch, 5);
  EXPECT_EQ(s->global_step, 41);
  EXPECT_EQ(s->world, 2);
  EXPECT_DOUBLE_EQ(s->best_miou, 0.5);
  EXPECT_DOUBLE_EQ(s->part_loss, 2.5);
  EXPECT_EQ(s->part_count, 5);
  EXPECT_EQ(s->ema_steps, 0);  // absent: no EMA
  ASSERT_EQ(s->history.size(), 1u);
  EXPECT_DOUBLE_EQ(s->history[0].loss, 1.5);
  EXPECT_LT(s->history[0].miou, 0);  // not scored that epoch
  EXPECT_DOUBLE_EQ(s->options.lr, 0.002);
  EXPECT_EQ(s->options.crop_w, 96);
  EXPECT_EQ(s->options.epochs, TrainOptions{}.epochs);
  s->epoch = 4;
  s->ema_steps = 9;
  set_train_state(w, *s);
  auto back = train_state(w);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->epoch, 4);
  EXPECT_EQ(back->ema_steps, 9);
  EXPECT_EQ(back->history.size(), 1u);
  EXPECT_EQ(back->options.to_json_string(), s->options.to_json_string());
  EXPECT_EQ(nlohmann::json::parse(w.extra)["note"], "kept");
  w.extra = R"({"train": {"epoch": 1.5}})";
  EXPECT_THROW(train_state(w), std::invalid_argument);
  w.extra = R"({"train": {"options": {"lr": "fast"}}})";
  EXPECT_THROW(train_state(w), std::invalid_argument);
}

// TrainOptions::device is a torch::Device like every other option struct's; JSON keeps the text.
TEST(Train, DeviceIsATorchDeviceWithATextForm) {
  TrainOptions o;
  EXPECT_TRUE(o.device.is_cpu());
  o.set("device=cuda:1");
  EXPECT_EQ(o.device, torch::Device(torch::kCUDA, 1));
  EXPECT_NE(o.to_json_string().find(R"("device":"cuda:1")"), std::string::npos) << o.to_json_string();
  TrainOptions back;
  back.apply_json_string(o.to_json_string());
  EXPECT_EQ(back.device, o.device);
  for (const char* bad : {"device=gpu", "device=cuda:x", "device=3"}) {
    try {
      o.set(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("device"), std::string::npos) << e.what();
    }
  }
}
