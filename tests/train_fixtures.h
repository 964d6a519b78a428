// The fixtures of the training tests (test_train*.cpp, test_eval.cpp): tiny runs, weights
// compared tensor by tensor, the kill-and-resume exactness check, two ranks in one process.
#pragma once

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

namespace lightseg::train_fixtures {

using namespace lightseg;
namespace fs = std::filesystem;

inline TrainOptions tiny(const fs::path& data, const fs::path& out) { return fixtures::tiny_train_options(data, out); }

inline std::vector<torch::Tensor> tensors_of(const std::string& path) {
  std::vector<torch::Tensor> r;
  for (auto& [n, t] : read_weights(path).tensors) r.push_back(t);
  return r;
}

inline double max_diff(const std::string& a, const std::string& b) {
  auto x = tensors_of(a), y = tensors_of(b);
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i)
    m = std::max(m, (x[i].to(torch::kDouble) - y[i].to(torch::kDouble)).abs().max().item<double>());
  return m;
}

// Overfitting setup: `epochs` epochs on the tiny set, measured on the training images at the
// end; returns the per-epoch records (the run must finish).
inline std::vector<EpochRecord> overfit(TrainOptions o, int epochs, TrainCallbacks cb = {}) {
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

// A PID that no process has: a child that has exited and been reaped.
inline pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

// A TCP port nobody listens on now (the kernel's pick), for an in-process rendezvous.
inline int free_port() {
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
inline std::vector<std::string> train_two_ranks(const TrainOptions& base) {
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

// What a checkpoint carries besides its inference tensors, flattened in a fixed order: the raw
// weights behind an EMA ("raw_weights") and the auxiliary heads ("aux_heads"), when present.
inline std::vector<torch::Tensor> blob_tensors(const WeightsFile& w) {
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

inline double max_diff(const std::vector<torch::Tensor>& x, const std::vector<torch::Tensor>& y) {
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i)
    m = std::max(m, (x[i].to(torch::kDouble) - y[i].to(torch::kDouble)).abs().max().item<double>());
  return m;
}

// For `base`'s options (the default recipe, aux heads, EMA): an uninterrupted run (a), one killed
// mid-epoch 2 and resumed (b), one stopped cleanly mid-epoch 2 and resumed (c) end with the
// same inference tensors, the same blobs' tensors and the same losses.
inline void expect_kill_and_resume_exact(TrainOptions base, const fs::path& dir, size_t expected_blob_tensors) {
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

}  // namespace lightseg::train_fixtures
