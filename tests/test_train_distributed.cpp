// Two ranks in one process (threads, Gloo on loopback): the run folder lock of rank 0, aux heads and EMA.
#include <gtest/gtest.h>

#include "train_fixtures.h"

using namespace lightseg;
using namespace lightseg::train_fixtures;

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
