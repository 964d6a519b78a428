// `lightseg train` flags and --set: applied to TrainOptions, bad values clear errors, precision auto.
#include <gtest/gtest.h>

#include "train_fixtures.h"

using namespace lightseg;
using namespace lightseg::train_fixtures;

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
