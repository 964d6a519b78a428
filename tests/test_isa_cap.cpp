// Below AVX-512 (a CPU without it, or oneDNN capped by ONEDNN_MAX_CPU_ISA) the onednn backend
// would run oneDNN's reference kernels only (84 s for one 360×480 image on an AVX2 EPYC):
// `auto` must not pick it there, and asking for it must be a clear error, not a slow run.
#include <cstdlib>
#include <filesystem>

#include <gtest/gtest.h>

#include "cli_run.h"
#include "infer/onednn_engine.h"
#include "lightseg/image_io.h"
#include "synthetic.h"

using namespace lightseg;
namespace fs = std::filesystem;

namespace {
// Runs the CLI with oneDNN capped at `isa` (the variable is set for the child only).
fixtures::CliResult run_capped(const std::string& isa, const std::vector<std::string>& args, const fs::path& dir) {
  ::setenv("ONEDNN_MAX_CPU_ISA", isa.c_str(), 1);
  auto r = fixtures::run_cli(args, dir);
  ::unsetenv("ONEDNN_MAX_CPU_ISA");
  return r;
}
}  // namespace

TEST(IsaCap, BelowAvx512AutoSegmentsWithFusedAndOnednnSaysWhy) {
  if (!onednn_available()) GTEST_SKIP() << "no onednn backend in this build: nothing to cap";
  auto dir = fixtures::temp_dir("isacap");
  const std::string image = std::string(LIGHTSEG_SOURCE_DIR) + "/examples/0016E5_07959.png";

  auto info = run_capped("AVX2", {"info", "--json"}, dir);
  ASSERT_EQ(info.code, 0) << info.err;
  EXPECT_EQ(info.out.find("\"onednn\""), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("\"fused\""), std::string::npos) << info.out;

  auto seg = run_capped("AVX2", {"segment", image, "--format", "ids", "--out", (dir / "capped").string(), "--json"}, dir);
  ASSERT_EQ(seg.code, 0) << seg.err;
  EXPECT_NE(seg.out.find("\"backend\":\"fused\""), std::string::npos) << seg.out;
  auto capped = read_label_file((dir / "capped" / "0016E5_07959.png").string());
  EXPECT_EQ(capped.sizes(), (std::vector<int64_t>{360, 480}));
  EXPECT_LT(capped.max().item<int>(), 11);

  auto forced = run_capped("AVX2", {"segment", image, "--format", "ids", "--out", (dir / "forced").string(),
                                    "--backend", "onednn"},
                           dir);
  EXPECT_NE(forced.code, 0);
  EXPECT_NE(forced.err.find("reference kernels"), std::string::npos) << forced.err;
  EXPECT_FALSE(fs::exists(dir / "forced" / "0016E5_07959.png"));

  // Uncapped on an AVX-512 CPU, auto is onednn and gives the same labels as fused here.
  if (onednn_unsuitable_reason().empty()) {
    auto native = fixtures::run_cli({"segment", image, "--format", "ids", "--out", (dir / "native").string(), "--json"}, dir);
    ASSERT_EQ(native.code, 0) << native.err;
    EXPECT_NE(native.out.find("\"backend\":\"onednn\""), std::string::npos) << native.out;
    auto labels = read_label_file((dir / "native" / "0016E5_07959.png").string());
    const double agree = labels.eq(capped).to(torch::kFloat64).mean().item<double>();
    EXPECT_GT(agree, 0.999) << "fused (capped) and onednn (native) labels agree on " << agree;
  }
  fs::remove_all(dir);
}
