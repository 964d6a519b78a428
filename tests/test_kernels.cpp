// Every kernel of the onednn plans, one table row each, at the ISA level the suite runs at,
// against the generic path: the fused backend (LibTorch's own operators on the same folded
// operation list; no kernel of ours). ctest runs this file again as EngineAt_avx2 (8-channel
// plans, our kernels built for AVX2) and EngineAt_generic (no plans: the rows say so and skip),
// so that every kernel is checked at every level this machine can emulate.
// Each row names the kernel's step label in the plan's profile: the row fails when the plan
// did not run that kernel, so a kernel cannot silently drop out of its own test. The training
// side's kernels (BN + PReLU, PReLU) are checked against LibTorch by Fused.TrainingBnPReLU* and
// Layers.FastPReLUMatchesLibTorch, which the same ctest entries run at each level.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/isa.h"
#include "engine_fixtures.h"
#include "infer/onednn_engine.h"
#include "lightseg/engine.h"
#include "lightseg/network.h"
#include "lightseg/weights.h"

using namespace lightseg;

namespace {

enum class Prec { F32, Bf16, Int8 };

struct KernelCase {
  const char* kernel;  // what the row checks
  const char* step;    // a fragment of the step label that kernel's steps carry in the profile
  NetworkConfig cfg;
  Prec prec = Prec::F32;
  int winograd = -1;   // onednn_set_winograd: -1 measured, 4 / 6 that tile wherever it fits
  int64_t h = 97, w = 131;
};

using fixtures::odd_dab_config;
using fixtures::residual_config;
using fixtures::unaligned_config;

std::vector<KernelCase> kernel_table() {
  return {
      {"normalisation of the image", "normalize", NetworkConfig{}},
      {"depthwise convolution + pass (C4.3, decoder)", "(depthwise+pass)", NetworkConfig{}},
      {"FEB's paired depthwise branches (C4.4, C4.5)", "(paired depthwise+pass)", NetworkConfig{}},
      {"2x2 max pooling + pass (C1.4)", "(max pool+pass)", NetworkConfig{}},
      {"one-output-channel convolution (C6.3)", "(one channel)", NetworkConfig{}},
      {"pass: bias, PReLU, residual, additions (epilogue.h)", "(pass)", unaligned_config()},
      {"Winograd F(6x6, 3x3)", "(winograd_6x3: ours)", NetworkConfig{}, Prec::F32, 6},
      {"Winograd F(4x4, 3x3)", "(winograd_4x3: ours)", NetworkConfig{}, Prec::F32, 4},
      {"Winograd F(6x6, 3x3), maps of a few tiles", "(winograd_6x3: ours)", NetworkConfig{}, Prec::F32, 6, 33, 45},
      {"DAB layers' depthwise pairs", "(depthwise+pass)", odd_dab_config()},
      {"ResNet layers, no attention", "(pass)", residual_config()},
      {"output resize + argmax (large upsampling)", "decoder.up", NetworkConfig{}, Prec::F32, -1, 45, 61},
      {"bf16 passes and tiles", "(pass)", NetworkConfig{}, Prec::Bf16},
      {"bf16 depthwise on bf16 values", "(paired depthwise+pass)", unaligned_config(), Prec::Bf16},
      {"int8 copies written by the passes", "(int8 ", NetworkConfig{}, Prec::Int8},
      {"int8, unaligned channels", "(int8 ", unaligned_config(), Prec::Int8},
  };
}

const char* prec_name(Prec p) { return p == Prec::F32 ? "fp32" : p == Prec::Bf16 ? "bf16" : "int8"; }

// Labels agree on ≥ min_agree of the pixels, logits within max_rel of their scale.
struct Tolerance {
  double min_agree, max_rel;
};
Tolerance tolerance(Prec p) {
  switch (p) {
    case Prec::F32: return {0.999, 1e-5};
    case Prec::Bf16: return {0.99, 0.02};
    default: return {0.9, 0.1};
  }
}

// LIGHTSEG_TEST_MAX_MAP=HxW caps the rows' maps (tests/avx2_emulated.sh: under QEMU's TCG
// every FMA lane is a call into softfloat, and the time goes with the map's area).
std::pair<int64_t, int64_t> map_size(const KernelCase& row) {
  long long mh = 0, mw = 0;
  const char* cap = std::getenv("LIGHTSEG_TEST_MAX_MAP");
  if (cap == nullptr || std::sscanf(cap, "%lldx%lld", &mh, &mw) != 2 || mh < 1 || mw < 1) return {row.h, row.w};
  return {std::min<int64_t>(row.h, mh), std::min<int64_t>(row.w, mw)};
}

}  // namespace

TEST(Kernels, EveryKernelAtThisLevelMatchesTheGenericPath) {
  const IsaLevel level = max_isa_level();
  std::printf("  ISA level: %s (cap), onednn plans of %d channels\n", isa_level_name(level), onednn_plan_block());
  if (!onednn_available()) GTEST_SKIP() << "no onednn backend in this build: the generic path is the only one";
  if (!onednn_unsuitable_reason().empty())
    GTEST_SKIP() << "no plans at this level (" << onednn_unsuitable_reason() << "): the generic path is the only one";
  int ran = 0;
  for (const auto& row : kernel_table()) {
    SCOPED_TRACE(row.kernel);
    if (row.prec == Prec::Bf16 && !onednn_bf16_available()) {
      std::printf("  skip %-52s (no bf16 plans at this level)\n", row.kernel);
      continue;
    }
    if (row.prec == Prec::Int8 && !onednn_int8_available()) {
      std::printf("  skip %-52s (no int8 plans at this level)\n", row.kernel);
      continue;
    }
    auto net = fixtures::random_net(row.cfg, 7);
    ModelMeta meta = ModelMeta::generic(row.cfg.num_classes);
    torch::manual_seed(11);
    const auto [h, w] = map_size(row);
    auto x = torch::rand({1, 3, h, w}) * 255;
    if (row.prec == Prec::Int8) calibrate_int8(net, meta, {torch::rand({2, 3, 96, 128}) * 255}, "random images");
    auto generic = make_engine(net, meta, {"fused"});
    EngineOptions o;
    o.backend = "onednn";
    o.profile = true;
    o.dtype = row.prec == Prec::F32 ? torch::kFloat32 : row.prec == Prec::Bf16 ? torch::kBFloat16 : torch::kQInt8;
    onednn_set_winograd(row.winograd);
    auto engine = make_engine(net, meta, o);
    auto got = engine->logits(x);
    auto labels = engine->labels(x);
    onednn_set_winograd(-1);
    const std::string steps = engine->profile();
    EXPECT_NE(steps.find(row.step), std::string::npos) << "the plan ran no step \"" << row.step << "\":\n" << steps;
    auto ref = generic->logits(x);
    ASSERT_EQ(got.sizes(), ref.sizes());
    const double scale = ref.abs().max().item<double>();
    ASSERT_GT(scale, 0.0);
    const double d = (got - ref).abs().max().item<double>();
    const double agree = got.argmax(1).eq(ref.argmax(1)).to(torch::kFloat64).mean().item<double>();
    const Tolerance t = tolerance(row.prec);
    std::printf("  %-52s %s %3lldx%-3lld labels %.5f  max |logit diff| %.2e (scale %.1f)\n", row.kernel,
                prec_name(row.prec), static_cast<long long>(h), static_cast<long long>(w), agree, d, scale);
    EXPECT_GE(agree, t.min_agree);
    EXPECT_LT(d, t.max_rel * scale);
    // The labels' own path (output resize fused with the argmax) gives the logits' argmax.
    EXPECT_TRUE(labels.equal(got.argmax(1)));
    // The kernels' portable forms (what CPUs without this level's native forms run) agree too.
    onednn_use_native_kernels(false);
    auto portable = engine->logits(x);
    onednn_use_native_kernels(true);
    EXPECT_LT((portable - got).abs().max().item<double>(), row.prec == Prec::F32 ? 1e-5 * scale : 1e-2 * scale);
    ++ran;
  }
  EXPECT_GT(ran, 0);
}
