// Run folders and resumption: never overwritten by accident, stale temporaries removed, one
// trainer at a time, a copied checkpoint brings its log, kill and resume end in the same state.
#include <gtest/gtest.h>

#include "train_fixtures.h"

using namespace lightseg;
using namespace lightseg::train_fixtures;

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
