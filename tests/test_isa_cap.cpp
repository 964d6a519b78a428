// The onednn backend at every oneDNN ISA level this machine can emulate (ONEDNN_MAX_CPU_ISA):
// its plans take the layout that level's JIT kernels take (nChw16c on AVX-512, nChw8c on
// AVX2), run no reference kernel on any step, and give fused's labels. Below AVX2 it would
// run reference kernels only (84 s for one 360×480 image with nChw16c plans on an AVX2 EPYC):
// `auto` must not pick it there, and asking for it must be a clear error, not a slow run.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "cli_run.h"
#include "core/isa.h"
#include "infer/onednn_engine.h"
#include "lightseg/features.h"
#include "lightseg/image_io.h"
#include "lightseg/runtime.h"
#include "synthetic.h"

using namespace lightseg;
namespace fs = std::filesystem;

namespace {
// Runs the CLI with oneDNN capped at `isa` ("" : uncapped; the variable is set for the child only).
fixtures::CliResult run_capped(const std::string& isa, const std::vector<std::string>& args, const fs::path& dir) {
  if (!isa.empty()) ::setenv("ONEDNN_MAX_CPU_ISA", isa.c_str(), 1);
  auto r = fixtures::run_cli(args, dir);
  ::unsetenv("ONEDNN_MAX_CPU_ISA");
  return r;
}
// __builtin_cpu_supports takes string literals only; elsewhere than x86 nothing is there.
#if defined(__x86_64__)
#define cpu_has(feature) __builtin_cpu_supports(feature)
#else
#define cpu_has(feature) false
#endif
const std::string kImage = std::string(LIGHTSEG_SOURCE_DIR) + "/examples/0016E5_07959.png";

torch::Tensor segment_ids(const std::string& isa, const std::string& backend, const fs::path& dir, std::string* json) {
  const auto out = dir / (backend + "_" + (isa.empty() ? "native" : isa));
  auto r = run_capped(isa, {"segment", kImage, "--format", "ids", "--out", out.string(), "--json", "--backend", backend}, dir);
  EXPECT_EQ(r.code, 0) << r.err;
  if (json) *json = r.out;
  return r.code == 0 ? read_label_file((out / "0016E5_07959.png").string()) : torch::Tensor();
}
}  // namespace

TEST(IsaCap, OnednnPlansFollowTheIsaAndGiveFusedsLabels) {
  if (!onednn_available()) GTEST_SKIP() << "no onednn backend in this build: nothing to cap";
  if (!LIGHTSEG_NATIVE_KERNELS) GTEST_SKIP() << "built without native kernels: no onednn plans";
  auto dir = fixtures::temp_dir("isacap");
  const torch::Tensor fused = segment_ids("", "fused", dir, nullptr);
  ASSERT_TRUE(fused.defined());
  struct Level {
    std::string cap, kernel;  // the impl name every oneDNN convolution of the plan must have
    bool cpu;
  };
  const std::vector<Level> levels = {{"AVX2", "avx2", cpu_has("avx2") && cpu_has("fma")},
                                     {"", "avx512_core", cpu_has("avx512f") && cpu_has("avx512bw")}};
  int ran = 0;
  for (const auto& l : levels) {
    if (!l.cpu) continue;
    ++ran;
    const std::string name = l.cap.empty() ? "native" : l.cap;
    auto info = run_capped(l.cap, {"info", "--json"}, dir);
    ASSERT_EQ(info.code, 0) << info.err;
    EXPECT_NE(info.out.find("\"onednn\""), std::string::npos) << name << ": " << info.out;
    auto bench = run_capped(l.cap, {"bench", "--size", "96x128", "--iters", "2", "--backend", "onednn", "--profile"}, dir);
    ASSERT_EQ(bench.code, 0) << name << ": " << bench.err;
    EXPECT_EQ(bench.err.find("(ref"), std::string::npos) << name << ": a reference kernel in the plan\n" << bench.err;
    EXPECT_NE(bench.err.find("jit:" + l.kernel), std::string::npos) << name << ": no " << l.kernel << " convolution\n" << bench.err;
    std::string json;
    const torch::Tensor ids = segment_ids(l.cap, "onednn", dir, &json);
    ASSERT_TRUE(ids.defined()) << name;
    EXPECT_NE(json.find("\"backend\":\"onednn\""), std::string::npos) << json;
    const double agree = ids.eq(fused).to(torch::kFloat64).mean().item<double>();
    EXPECT_GT(agree, 0.999) << name << ": onednn and fused labels agree on " << agree;
  }
  if (ran == 0) GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512";
  fs::remove_all(dir);
}

TEST(IsaCap, BelowAvx2AutoSegmentsWithFusedAndOnednnSaysWhy) {
  if (!onednn_available()) GTEST_SKIP() << "no onednn backend in this build: nothing to cap";
  if (!LIGHTSEG_NATIVE_KERNELS) GTEST_SKIP() << "built without native kernels: no onednn plans at any level";
  auto dir = fixtures::temp_dir("isacap_sse");
  auto info = run_capped("SSE41", {"info", "--json"}, dir);
  ASSERT_EQ(info.code, 0) << info.err;
  EXPECT_EQ(info.out.find("\"onednn\""), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("\"fused\""), std::string::npos) << info.out;
  std::string json;
  const torch::Tensor ids = segment_ids("SSE41", "auto", dir, &json);
  ASSERT_TRUE(ids.defined());
  EXPECT_NE(json.find("\"backend\":\"fused\""), std::string::npos) << json;
  EXPECT_EQ(ids.sizes(), (std::vector<int64_t>{360, 480}));
  EXPECT_LT(ids.max().item<int>(), 11);
  auto forced = run_capped("SSE41", {"segment", kImage, "--format", "ids", "--out", (dir / "forced").string(),
                                     "--backend", "onednn"},
                           dir);
  EXPECT_NE(forced.code, 0);
  EXPECT_NE(forced.err.find("reference kernels"), std::string::npos) << forced.err;
  EXPECT_FALSE(fs::exists(dir / "forced" / "0016E5_07959.png"));
  fs::remove_all(dir);
}

// LIGHTSEG_MAX_ISA, the project's own cap: it lowers the plans (and oneDNN with them), and an
// unknown level is a clear error.
TEST(IsaCap, LightsegMaxIsaCapsThePlansAndRefusesUnknownLevels) {
  if (!onednn_available()) GTEST_SKIP() << "no onednn backend in this build: nothing to cap";
  if (!LIGHTSEG_NATIVE_KERNELS) GTEST_SKIP() << "built without native kernels: no onednn plans";
  auto dir = fixtures::temp_dir("isacap_own");
  auto with = [&](const std::string& level, const std::vector<std::string>& args) {
    ::setenv("LIGHTSEG_MAX_ISA", level.c_str(), 1);
    auto r = fixtures::run_cli(args, dir);
    ::unsetenv("LIGHTSEG_MAX_ISA");
    return r;
  };
  auto generic = with("generic", {"info", "--json"});
  ASSERT_EQ(generic.code, 0) << generic.err;
  EXPECT_EQ(generic.out.find("\"onednn\""), std::string::npos) << generic.out;  // auto is fused there
  if (cpu_has("avx2") && cpu_has("fma")) {
    auto avx2 = with("avx2", {"info", "--json"});
    ASSERT_EQ(avx2.code, 0) << avx2.err;
    EXPECT_NE(avx2.out.find("nChw8c plans on oneDNN's avx2 kernels"), std::string::npos) << avx2.out;
    auto bf16 = with("avx2", {"bench", "--size", "64x64", "--iters", "1", "--precision", "bf16"});
    EXPECT_NE(bf16.code, 0);
  }
  auto bad = with("avx9000", {"info"});
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("LIGHTSEG_MAX_ISA must be generic, avx2, avx512 or avx512_bf16"), std::string::npos) << bad.err;
  fs::remove_all(dir);
}

// One CPU feature probe (core/isa.h: cpu_isa_level) serves the training kernels, the plans and
// oneDNN's width: the level it reports is the CPU's, lowered by LIGHTSEG_MAX_ISA to exactly the cap.
TEST(IsaCap, TheOneFeatureProbeFollowsTheCpuAndTheCap) {
  const char* saved = std::getenv("LIGHTSEG_MAX_ISA");
  const std::string keep = saved ? saved : "";
  ::unsetenv("LIGHTSEG_MAX_ISA");
  const IsaLevel cpu = cpu_isa_level();
  std::printf("  this CPU: %s\n", isa_level_name(cpu));
  EXPECT_EQ(cpu >= IsaLevel::Avx2, cpu_has("avx2") && cpu_has("fma"));
  EXPECT_EQ(cpu >= IsaLevel::Avx512, cpu_has("avx512f") && cpu_has("avx512bw") && cpu_has("avx512dq") &&
                                         cpu_has("avx512vl"));
  EXPECT_EQ(cpu_has_native_bf16(), cpu >= IsaLevel::Avx512Bf16);
  for (IsaLevel cap : {IsaLevel::Generic, IsaLevel::Avx2, IsaLevel::Avx512, IsaLevel::Avx512Bf16}) {
    ::setenv("LIGHTSEG_MAX_ISA", isa_level_name(cap), 1);
    EXPECT_EQ(cpu_isa_level(), std::min(cpu, cap)) << isa_level_name(cap);
    if (onednn_available() && cap == IsaLevel::Generic) EXPECT_EQ(onednn_plan_block(), 0);
    if (onednn_available() && LIGHTSEG_NATIVE_KERNELS && cap == IsaLevel::Avx2 && cpu >= IsaLevel::Avx2 &&
        !std::getenv("ONEDNN_MAX_CPU_ISA"))
      EXPECT_EQ(onednn_plan_block(), 8);
  }
  if (keep.empty())
    ::unsetenv("LIGHTSEG_MAX_ISA");
  else
    ::setenv("LIGHTSEG_MAX_ISA", keep.c_str(), 1);
}

// A real CPU without AVX-512: the main job under QEMU's Haswell model (AVX2 + FMA; QEMU 7.2
// emulates them), where any AVX-512 instruction outside the paths chosen for this CPU would
// stop the process (SIGILL). It must run the 8-channel plans and give the native labels.
// The network runs at --input-size 96x128 (the image read, resized once, labels resized back
// to 480x360: the main job's whole path): at full size QEMU's AVX2 emulation took over 10
// minutes on a CI machine; every step of the plan still runs, on smaller maps.
TEST(IsaCap, OnAnEmulatedAvx2CpuTheMainJobRunsAndGivesTheNativeLabels) {
  if (!LIGHTSEG_NATIVE_KERNELS) GTEST_SKIP() << "built without native kernels: no onednn plans";
  if (std::system("command -v qemu-x86_64 >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "qemu-x86_64 (Debian's qemu-user) is not installed";
  auto dir = fixtures::temp_dir("isacap_qemu");
  // GOMP_SPINCOUNT set: the CLI does not re-execute itself for its wait policy (qemu-user
  // would run the new image natively, outside the emulated CPU).
  const std::string cmd = "OMP_NUM_THREADS=2 GOMP_SPINCOUNT=1000 timeout -k 5 600 qemu-x86_64 -cpu Haswell " +
                          fixtures::shell_quote(LIGHTSEG_CLI) + " ";
  auto run = [&](const std::string& args, const fs::path& out) {
    return std::system((cmd + args + " >" + fixtures::shell_quote(out.string()) + " 2>&1").c_str());
  };
  ASSERT_EQ(run("info --json --size 32x32", dir / "info.txt"), 0);
  std::ifstream info(dir / "info.txt");
  const std::string text((std::istreambuf_iterator<char>(info)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("nChw8c plans on oneDNN's avx2 kernels"), std::string::npos) << text;
  const std::string segment = "segment " + fixtures::shell_quote(kImage) + " --format ids --backend onednn --input-size 96x128 --out ";
  ASSERT_EQ(run(segment + fixtures::shell_quote((dir / "avx2").string()), dir / "segment.txt"), 0)
      << std::ifstream(dir / "segment.txt").rdbuf();
  ASSERT_EQ(std::system((fixtures::shell_quote(LIGHTSEG_CLI) + " " + segment + fixtures::shell_quote((dir / "native").string()) +
                         " >" + fixtures::shell_quote((dir / "native.txt").string()) + " 2>&1").c_str()),
            0);
  const torch::Tensor native = read_label_file((dir / "native" / "0016E5_07959.png").string());
  const torch::Tensor avx2 = read_label_file((dir / "avx2" / "0016E5_07959.png").string());
  ASSERT_EQ(avx2.sizes(), native.sizes());
  EXPECT_EQ(avx2.size(-1), 480);
  const double agree = avx2.eq(native).to(torch::kFloat64).mean().item<double>();
  EXPECT_GT(agree, 0.999) << "AVX2 (emulated) and native labels agree on " << agree;
  fs::remove_all(dir);
}
