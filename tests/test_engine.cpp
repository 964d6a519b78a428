// The inference path (fused_network.h, engine.h) against the training-graph model.
#include <gtest/gtest.h>

#include <functional>

#include "lightseg/engine.h"
#include "lightseg/features.h"
#include "infer/fused_network.h"
#include "lightseg/image_io.h"
#include "data/transforms.h"
#include "lightseg/weights.h"
#include "infer/onednn_engine.h"
#include "engine_fixtures.h"
#include "test_paths.h"

using namespace lightseg;

namespace {

using fixtures::random_net;

torch::Tensor images(int64_t n, int64_t h, int64_t w, uint64_t seed = 11) {
  torch::manual_seed(seed);
  return torch::rand({n, 3, h, w}) * 255;
}

torch::Tensor reference(Network& net, const ModelMeta& meta, const torch::Tensor& x) {
  torch::NoGradGuard ng;
  return net->forward(normalize(x, meta));
}

double agreement(const torch::Tensor& a, const torch::Tensor& b) {
  return a.argmax(1).eq(b.argmax(1)).to(torch::kFloat64).mean().item<double>();
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

using fixtures::unaligned_config;

}  // namespace

TEST(Fused, FoldingIsExactInDoublePrecision) {
  // In float64 the folded list and the training graph differ only by rounding (~1e-12):
  // the folding itself (BN into conv, normalisation, split concat + PW) is exact.
  auto net = random_net();
  ModelMeta meta = ModelMeta::camvid();
  auto x = images(1, 75, 101);
  net->to(torch::kFloat64);
  torch::Tensor ref;
  {
    torch::NoGradGuard ng;
    ref = net->forward(normalize(x.to(torch::kFloat64), meta));
  }
  auto f = to(fuse_network(net, meta), torch::kCPU, torch::kFloat64);
  torch::Tensor got;
  {
    c10::InferenceMode im;
    got = run_fused(f, x.to(torch::kFloat64));
  }
  ASSERT_EQ(got.sizes(), ref.sizes());
  EXPECT_LT(max_diff(got, ref), 1e-9 * std::max(1.0, ref.abs().max().item<double>()));
}

TEST(Fused, ListFollowsTheClaims) {
  auto net = random_net();
  auto f = fuse_network(net, ModelMeta::camvid());
  // No BatchNorm left: every conv has a bias, and the list starts with the normalisation.
  EXPECT_EQ(f.ops.front().kind, FusedOp::Kind::Affine);
  EXPECT_EQ(f.ops.front().name, "normalize");
  int convs = 0, prelu = 0;
  for (const auto& op : f.ops) {
    if (op.kind != FusedOp::Kind::Conv) continue;
    ++convs;
    EXPECT_TRUE(op.bias.defined()) << op.name;
    if (op.act == Act::PReLU) {
      ++prelu;
      EXPECT_EQ(op.slopes.numel(), op.weight.size(0)) << op.name;
    }
  }
  EXPECT_GT(convs, 60);
  EXPECT_GT(prelu, 50);
  // The adders (C1.4, C1.6) are fused into the semantic branches' last convolution.
  for (const auto& op : f.ops)
    if (op.name == "semantic1.fuse" || op.name == "semantic2.fuse") {
      ASSERT_EQ(op.add.size(), 1u);
      EXPECT_EQ(f.channels[op.add[0]], 1);
    }
  EXPECT_EQ(f.channels[f.output], 11);
  // Same MACs as the training graph's counter (the split PW of C3.4 has the same cost).
  auto rows = profile(net, 360, 480);
  uint64_t macs = 0;
  for (const auto& r : rows) macs += r.macs;
  EXPECT_EQ(static_cast<uint64_t>(f.count_macs(360, 480)), macs);
}

TEST(Engine, BackendsMatchTheTrainingGraph) {
  auto net = random_net();
  ModelMeta meta = ModelMeta::camvid();
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{360, 480}, {97, 131}, {32, 32}, {65, 33}};
  for (const auto& backend : available_backends()) {
    auto engine = make_engine(net, meta, {backend});
    EXPECT_EQ(engine->backend(), backend);
    for (auto [h, w] : sizes) {
      auto x = images(1, h, w);
      auto ref = reference(net, meta, x);
      auto got = engine->logits(x);
      ASSERT_EQ(got.sizes(), ref.sizes()) << backend << " " << h << "x" << w;
      const double scale = std::max(1.0, ref.abs().max().item<double>()), d = max_diff(got, ref);
      EXPECT_GE(agreement(got, ref), 0.999) << backend << " " << h << "x" << w;
      // float32 with BN folded: rounding only (the eager backend is the training graph itself)
      EXPECT_LT(d, 1e-4 * scale) << backend << " " << h << "x" << w;
      std::printf("  %-7s %4lldx%-4lld labels %.5f  max |logit diff| %.2e (logits up to %.1f)\n", backend.c_str(),
                  static_cast<long long>(h), static_cast<long long>(w), agreement(got, ref), d, scale);
    }
  }
}

TEST(Engine, BatchesAndRepeatedCallsAgree) {
  // Buffers are reused between calls and plans are kept per shape: results must not drift.
  auto net = random_net();
  ModelMeta meta = ModelMeta::camvid();
  auto x = images(2, 90, 120, 5);
  auto y = images(1, 64, 80, 6);
  auto ref = reference(net, meta, x);
  for (const auto& backend : available_backends()) {
    auto engine = make_engine(net, meta, {backend});
    auto a = engine->logits(x);
    engine->logits(y);
    auto b = engine->logits(x);
    EXPECT_TRUE(torch::equal(a, b)) << backend;
    EXPECT_GE(agreement(a, ref), 0.999) << backend;
    // each image of the batch alone gives the same logits as in the batch
    auto one = engine->logits(x.slice(0, 1, 2));
    EXPECT_LT(max_diff(one, a.slice(0, 1, 2)), 1e-4) << backend;
    EXPECT_TRUE(torch::equal(engine->labels(x), a.argmax(1))) << backend;
  }
}

TEST(Engine, OtherConfigurations) {
  // DAB and ResNet stages, no attention, channel counts that are not multiples of 16
  // (unaligned concat halves, padded channel blocks).
  NetworkConfig dab;
  dab.stage1 = {2, FELayerType::DAB, {2, 2}};
  dab.stage2 = {3, FELayerType::ResNet, {2, 4, 8}};
  dab.spatial_attention = false;
  NetworkConfig odd;
  odd.c0 = 20;
  odd.c1 = 40;
  odd.c2 = 72;
  odd.stage1 = {1, FELayerType::FEB, {2}};
  odd.stage2 = {2, FELayerType::FEB, {4, 8}};
  odd.num_classes = 19;
  for (const auto& cfg : {dab, odd}) {
    auto net = random_net(cfg, 9);
    ModelMeta meta = ModelMeta::generic(cfg.num_classes);
    auto x = images(1, 77, 59);
    auto ref = reference(net, meta, x);
    for (const auto& backend : available_backends()) {
      auto got = make_engine(net, meta, {backend})->logits(x);
      ASSERT_EQ(got.sizes(), ref.sizes()) << backend;
      EXPECT_GE(agreement(got, ref), 0.999) << backend;
      EXPECT_LT(max_diff(got, ref), 2e-3 * std::max(1.0, ref.abs().max().item<double>())) << backend;
    }
  }
}

TEST(Engine, AutoPicksTheFastestAndErrorsAreClear) {
  auto net = random_net();
  ModelMeta meta = ModelMeta::camvid();
  auto backends = available_backends();
  ASSERT_FALSE(backends.empty());
  EXPECT_EQ(make_engine(net, meta, {"auto"})->backend(), backends.front());
  EXPECT_NE(std::find(backends.begin(), backends.end(), "fused"), backends.end());
  EXPECT_NE(std::find(backends.begin(), backends.end(), "eager"), backends.end());
  try {
    make_engine(net, meta, {"tensorrt"});
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("tensorrt"), std::string::npos);
  }
  auto engine = make_engine(net, meta, {backends.front()});
  EXPECT_THROW(engine->logits(torch::zeros({1, 3, 16, 64})), std::invalid_argument);
  EXPECT_THROW(engine->logits(torch::zeros({1, 4, 64, 64})), std::invalid_argument);
}

TEST(Engine, DoesNotShareTheCallersWeights) {
  auto net = random_net();
  ModelMeta meta = ModelMeta::camvid();
  auto x = images(1, 64, 64);
  for (const auto& backend : available_backends()) {
    auto engine = make_engine(net, meta, {backend});
    auto before = engine->logits(x);
    {
      torch::NoGradGuard ng;
      for (auto& p : net->parameters()) p.add_(0.5);
    }
    EXPECT_TRUE(torch::equal(engine->logits(x), before)) << backend;
    {
      torch::NoGradGuard ng;
      for (auto& p : net->parameters()) p.sub_(0.5);
    }
  }
}

namespace {

// The bf16 oneDNN engine, or null (with the reason) where this build or CPU has none.
std::unique_ptr<InferenceEngine> bf16_engine(const Network& net, const ModelMeta& meta, std::string* why) {
  auto b = available_backends();
  if (std::find(b.begin(), b.end(), "onednn") == b.end()) {
    *why = "this build has no onednn backend";
    return nullptr;
  }
  EngineOptions o;
  o.backend = "onednn";
  o.dtype = torch::kBFloat16;
  try {
    return make_engine(net, meta, o);
  } catch (const std::invalid_argument& e) {
    *why = e.what();
    return nullptr;
  }
}

}  // namespace

TEST(Engine, Bf16KeepsTheLabelsOfTheShippedWeights) {
  // Dense convolutions in bf16 (f32 accumulation): on the shipped CamVid weights and the
  // bundled CamVid images, ≥ 99.9 % of the pixels keep the training graph's label.
  const std::string weights = std::string(LIGHTSEG_SOURCE_DIR) + "/models/camvid.lsw";
  ModelMeta meta;
  Network net = load_network(weights, &meta);
  std::string why;
  auto engine = bf16_engine(net, meta, &why);
  if (!engine) GTEST_SKIP() << why;
  EXPECT_EQ(engine->backend(), "onednn-bf16");
  double agree = 0, worst = 0;
  int n = 0;
  for (const char* name : {"0016E5_07959.png", "0016E5_08057.png", "0016E5_08157.png"}) {
    auto x = to_rgb_chw_float(read_image_file(std::string(LIGHTSEG_SOURCE_DIR) + "/examples/" + name)).unsqueeze(0);
    auto ref = reference(net, meta, x);
    auto got = engine->logits(x);
    ASSERT_EQ(got.sizes(), ref.sizes());
    agree += agreement(got, ref);
    worst = std::max(worst, max_diff(got, ref));
    ++n;
  }
  std::printf("  bf16 on the shipped weights: labels %.5f, max |logit diff| %.3f\n", agree / n, worst);
  EXPECT_GE(agree / n, 0.999);
  EXPECT_LT(worst, 1.0);
}

// A low-precision engine against the training graph at odd sizes (97×131, 65×33, 180×240):
// labels agree on ≥ min_agree of the pixels, logits within max_rel of their scale; `also` adds
// checks on each input and result.
static void expect_close_at_odd_sizes(const char* what, Network& net, const ModelMeta& meta, const NetworkConfig& cfg,
                                      InferenceEngine& engine, double min_agree, double max_rel,
                                      const std::function<void(const torch::Tensor&, const torch::Tensor&)>& also = {}) {
  for (auto [h, w] : std::vector<std::pair<int64_t, int64_t>>{{97, 131}, {65, 33}, {2 * 90, 2 * 120}}) {
    auto x = images(1, h, w);
    auto ref = reference(net, meta, x);
    auto got = engine.logits(x);
    ASSERT_EQ(got.sizes(), ref.sizes());
    const double scale = std::max(1.0, ref.abs().max().item<double>()), d = max_diff(got, ref);
    std::printf("  %s c0=%lld %4lldx%-4lld labels %.5f  max |logit diff| %.2e (logits up to %.1f)\n", what,
                static_cast<long long>(cfg.c0), static_cast<long long>(h), static_cast<long long>(w),
                agreement(got, ref), d, scale);
    EXPECT_GE(agreement(got, ref), min_agree);
    EXPECT_LT(d, max_rel * scale);
    if (also) also(x, got);
  }
}

TEST(Engine, Bf16HandlesEveryConfigurationAndSize) {
  // The bf16 copies ("shadows") are written by our passes or by reorders, for concat
  // results, padded channel blocks and odd sizes alike: logits stay close to float32.
  for (const auto& cfg : {NetworkConfig{}, fixtures::odd_dab_config(), fixtures::residual_config()}) {
    auto net = random_net(cfg, 9);
    ModelMeta meta = ModelMeta::generic(cfg.num_classes);
    std::string why;
    auto engine = bf16_engine(net, meta, &why);
    if (!engine) GTEST_SKIP() << why;
    auto f32 = make_engine(net, meta, {"onednn"});
    expect_close_at_odd_sizes("bf16", net, meta, cfg, *engine, 0.99, 0.02,
                              [&](const torch::Tensor& x, const torch::Tensor& got) {
                                // and it is not float32 in disguise: bf16 rounding shows in the logits
                                EXPECT_GT(max_diff(got, f32->logits(x)), 1e-5);
                              });
  }
}

// Each engine's logits of x, its plan for x's size built under its own mode of `set`
// (onednn_set_winograd, onednn_set_bf16_nhwc: read when a plan is built, at the first call of
// a size); the default (-1, measured) set again after.
static std::vector<torch::Tensor> logits_under_modes(void (*set)(int),
                                                     const std::vector<std::pair<int, InferenceEngine*>>& runs,
                                                     const torch::Tensor& x) {
  std::vector<torch::Tensor> r;
  for (const auto& [mode, engine] : runs) {
    set(mode);
    r.push_back(engine->logits(x));
  }
  set(-1);
  return r;
}

TEST(Engine, Bf16ConvolutionsInNhwcMatchTheBlockedOnes) {
  // bf16 dense convolutions in NHWC (the layout of oneDNN's AMX kernels: an NHWC bf16 copy of
  // the input, an NHWC f32 result read by the pass) against the same convolutions on the blocked
  // layout: both close to the training graph and to each other, for whole and partial channel
  // blocks (c0 = 20) and odd sizes; the plans say which form each took.
  std::string why;
  {
    auto net = random_net(NetworkConfig{}, 3);
    if (!bf16_engine(net, ModelMeta::generic(NetworkConfig{}.num_classes), &why)) GTEST_SKIP() << why;
  }
  for (const auto& cfg : {NetworkConfig{}, unaligned_config()}) {
    auto net = random_net(cfg, 9);  // Bf16HandlesEveryConfigurationAndSize's weights
    ModelMeta meta = ModelMeta::generic(cfg.num_classes);
    EngineOptions o{"onednn"};
    o.dtype = torch::kBFloat16;
    o.profile = true;
    auto nhwc = make_engine(net, meta, o), blocked = make_engine(net, meta, o);
    for (auto [h, w] : std::vector<std::pair<int64_t, int64_t>>{{97, 131}, {65, 33}, {180, 240}}) {
      auto x = images(1, h, w);
      auto ref = reference(net, meta, x);
      const auto got = logits_under_modes(onednn_set_bf16_nhwc, {{1, nhwc.get()}, {0, blocked.get()}}, x);
      const auto &a = got[0], &b = got[1];
      const double scale = std::max(1.0, ref.abs().max().item<double>());
      std::printf("  c0=%lld %4lldx%-4lld nhwc: labels %.5f max |logit diff| %.2e; blocked: %.5f %.2e; between %.2e\n",
                  static_cast<long long>(cfg.c0), static_cast<long long>(h), static_cast<long long>(w),
                  agreement(a, ref), max_diff(a, ref), agreement(b, ref), max_diff(b, ref), max_diff(a, b));
      for (const auto* got : {&a, &b}) {
        EXPECT_GE(agreement(*got, ref), 0.99) << h << "x" << w;
        EXPECT_LT(max_diff(*got, ref), 0.02 * scale) << h << "x" << w;
      }
      EXPECT_LT(max_diff(a, b), 0.02 * scale) << h << "x" << w;
    }
    const std::string pn = nhwc->profile(), pb = blocked->profile();
    EXPECT_EQ(pb.find("(nhwc "), std::string::npos) << pb;
    EXPECT_NE(pn.find("init.conv2 (nhwc "), std::string::npos) << pn;             // 3x3, the first bf16 one
    EXPECT_NE(pn.find("semantic2.layers.5.pw2 (nhwc "), std::string::npos) << pn;  // 1x1, from a bf16 value
  }
}

TEST(Engine, PortableKernelsMatchTheNativeOnes) {
  // The register epilogues (AVX-512 and AVX2 forms), the packed logits and the AVX-512 argmax
  // have a portable twin (finish_tile, one store per pixel, the portable argmax) that other
  // CPUs run: both give the same logits and labels, in fp32 and bf16, at the level the suite
  // runs at (ctest EngineAt_avx2 runs it with the AVX2 forms),
  // for the default network (11 classes: packed logits), 19 classes (two blocks), odd sizes.
  if (!onednn_available()) GTEST_SKIP() << "no onednn backend in this build";
  if (!onednn_unsuitable_reason().empty()) GTEST_SKIP() << onednn_unsuitable_reason();
  if (!LIGHTSEG_NATIVE_KERNELS) GTEST_SKIP() << "built without native kernels (LIGHTSEG_NATIVE_KERNELS=OFF): only the portable ones";
#if defined(__GNUC__) && defined(__x86_64__)
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "no AVX2 here: only the portable kernels run";
#endif
  for (const auto& cfg : {NetworkConfig{}, unaligned_config()}) {
    auto net = random_net(cfg, 5);
    ModelMeta meta = ModelMeta::generic(cfg.num_classes);
    const auto f = fuse_network(net, meta);
    for (bool bf16 : {false, true}) {
      if (bf16 && !onednn_bf16_available()) continue;
      auto engine = make_onednn_engine(f, bf16);
      for (auto [h, w] : std::vector<std::pair<int64_t, int64_t>>{{97, 131}, {64, 128}, {65, 33}}) {
        auto x = images(1, h, w);
        onednn_use_native_kernels(true);
        auto fast = engine->logits(x).clone();
        auto fast_labels = engine->labels(x);
        onednn_use_native_kernels(false);
        auto portable = engine->logits(x).clone();
        auto portable_labels = engine->labels(x);
        onednn_use_native_kernels(true);
        EXPECT_TRUE(torch::equal(fast_labels, portable_labels)) << h << "x" << w;
        const double d = max_diff(fast, portable);
        std::printf("  %s classes=%d %4lldx%-4lld max |logit diff| %.2e\n", bf16 ? "bf16" : "fp32", cfg.num_classes,
                    static_cast<long long>(h), static_cast<long long>(w), d);
        EXPECT_LT(d, bf16 ? 1e-3 : 1e-6) << h << "x" << w;
        EXPECT_GE(agreement(fast, portable), 0.9999);
      }
    }
  }
}

TEST(Engine, PrecisionErrorsAreClear) {
  auto net = random_net();
  ModelMeta meta = ModelMeta::camvid();
  EngineOptions o;
  o.dtype = torch::kHalf;  // no fp16 on the CPU
  EXPECT_THROW(make_engine(net, meta, o), std::invalid_argument);
  o.dtype = torch::kBFloat16;
  o.backend = "eager";  // bf16 only through onednn
  try {
    make_engine(net, meta, o);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("onednn"), std::string::npos) << e.what();
  }
}

TEST(Engine, LabelsAreTheArgmaxOfTheLogits) {
  // onednn computes labels() from the H/4 logits (upsampling + argmax in one pass, no
  // full-size logits); every backend must give exactly logits().argmax(1).
  auto net = random_net();
  ModelMeta meta = ModelMeta::camvid();
  std::vector<std::unique_ptr<InferenceEngine>> engines;
  for (const auto& backend : available_backends()) engines.push_back(make_engine(net, meta, {backend}));
  std::string why;
  if (auto e = bf16_engine(net, meta, &why)) engines.push_back(std::move(e));
  for (auto& engine : engines) {
    for (auto [h, w] : std::vector<std::pair<int64_t, int64_t>>{{360, 480}, {97, 131}, {65, 33}}) {
      auto x = images(2, h, w, 21);
      auto labels = engine->labels(x);
      ASSERT_EQ(labels.sizes(), (std::vector<int64_t>{2, h, w})) << engine->backend();
      EXPECT_EQ(labels.scalar_type(), torch::kInt64);
      EXPECT_TRUE(torch::equal(labels, engine->logits(x).argmax(1))) << engine->backend() << " " << h << "x" << w;
    }
  }
}

// The engine never prints: with EngineOptions::profile the caller gets the per-step times.
TEST(Engine, ProfileIsReturnedToTheCallerNotPrinted) {
  auto b = available_backends();
  if (std::find(b.begin(), b.end(), "onednn") == b.end())
    GTEST_SKIP() << "no onednn backend on this CPU/build (its plans need AVX-512)";
  auto net = random_net();
  ModelMeta meta = ModelMeta::camvid();
  EngineOptions o{"onednn"};
  auto quiet = make_engine(net, meta, o);
  o.profile = true;
  auto timed = make_engine(net, meta, o);
  auto x = images(1, 64, 96);
  testing::internal::CaptureStderr();
  for (int i = 0; i < 2; ++i) {
    quiet->logits(x);
    timed->logits(x);
  }
  const std::string report = timed->profile();
  timed.reset();  // a plan's end prints nothing either
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(quiet->profile(), "");
  EXPECT_NE(report.find("onednn plan 1x64x96: 2 calls"), std::string::npos) << report;
  EXPECT_NE(report.find(" ms "), std::string::npos) << report;
}

TEST(Engine, WinogradConvolutionsMatchTheTrainingGraph) {
  // The plans' own Winograd F(4×4, 3×3) and F(6×6, 3×3) for dense 3×3 stride-1 convolutions
  // (C1.1's second and third, C4.6's), each forced on, and off, whatever this CPU measures: all
  // match the training graph, on maps whose last tiles hang over the edge (65x33; 33x35: 5x5 at
  // 1/8, one F(6×6) tile with one row and column outside, two F(4×4) tiles of which the second
  // has one row and column inside) and with channel counts it must leave to oneDNN (c0 = 20:
  // not whole blocks).
  auto b = available_backends();
  if (std::find(b.begin(), b.end(), "onednn") == b.end()) GTEST_SKIP() << "no onednn backend on this CPU/build";
  for (const auto& cfg : {NetworkConfig{}, unaligned_config()}) {
    auto net = random_net(cfg, 5);
    ModelMeta meta = ModelMeta::generic(cfg.num_classes);
    EngineOptions o{"onednn"};
    o.profile = true;
    auto f4 = make_engine(net, meta, o), f6 = make_engine(net, meta, o), direct = make_engine(net, meta, o);
    for (auto [h, w] : std::vector<std::pair<int64_t, int64_t>>{{97, 131}, {65, 33}, {33, 35}}) {
      auto x = images(1, h, w);
      auto ref = reference(net, meta, x);
      const auto got = logits_under_modes(onednn_set_winograd, {{4, f4.get()}, {6, f6.get()}, {0, direct.get()}}, x);
      const auto &got4 = got[0], &got6 = got[1], &base = got[2];
      const double scale = std::max(1.0, ref.abs().max().item<double>());
      std::printf("  c0=%lld %4lldx%-4lld F(4x4): labels %.5f  max |logit diff| %.2e; F(6x6): %.5f %.2e; direct %.2e\n",
                  static_cast<long long>(cfg.c0), static_cast<long long>(h), static_cast<long long>(w),
                  agreement(got4, ref), max_diff(got4, ref), agreement(got6, ref), max_diff(got6, ref),
                  max_diff(base, ref));
      for (const auto* got : {&got4, &got6}) {
        EXPECT_GE(agreement(*got, ref), 0.999) << h << "x" << w;
        EXPECT_LT(max_diff(*got, ref), 1e-4 * scale) << h << "x" << w;
      }
      EXPECT_LT(max_diff(base, ref), 1e-4 * scale) << h << "x" << w;
    }
    // The plans say which convolutions took it, with which tile: all of C4.6's in the default
    // network (32 and 64 channels), none in the forced-off engine.
    const std::string p4 = f4->profile(), p6 = f6->profile(), pd = direct->profile();
    EXPECT_EQ(pd.find("(winograd_"), std::string::npos) << pd;
    EXPECT_EQ(p4.find("(winograd_6x3"), std::string::npos) << p4;
    EXPECT_EQ(p6.find("(winograd_4x3"), std::string::npos) << p6;
    if (cfg.c0 % 8 == 0) {
      EXPECT_NE(p4.find("semantic2.layers.5.conv3d (winograd_4x3"), std::string::npos) << p4;
      EXPECT_NE(p4.find("init.conv2 (winograd_4x3"), std::string::npos) << p4;
      EXPECT_NE(p6.find("semantic2.layers.5.conv3d (winograd_6x3"), std::string::npos) << p6;
      EXPECT_NE(p6.find("init.conv2 (winograd_6x3"), std::string::npos) << p6;
    } else {
      EXPECT_EQ(p4.find("init.conv2 (winograd_"), std::string::npos) << p4;  // 20 channels
      EXPECT_EQ(p6.find("init.conv2 (winograd_"), std::string::npos) << p6;
    }
  }
}

namespace {

// The int8 oneDNN engine of calibrated weights, or null (with the reason) where this build or
// CPU has none.
std::unique_ptr<InferenceEngine> int8_engine(const Network& net, const ModelMeta& meta, std::string* why) {
  if (!cpu_int8_inference_available()) {
    *why = "no int8 inference on this CPU/build (needs onednn and AVX512-VNNI)";
    return nullptr;
  }
  EngineOptions o;
  o.dtype = torch::kQInt8;
  return make_engine(net, meta, o);  // "auto" is onednn for int8
}

}  // namespace

TEST(Engine, Int8KeepsTheLabelsOfTheShippedWeights) {
  // Calibrated on two of the bundled CamVid images, int8 dense convolutions keep ≥ 98 % of the
  // training graph's labels on all three (the third unseen by the calibration).
  const std::string dir = std::string(LIGHTSEG_SOURCE_DIR) + "/examples/";
  ModelMeta meta;
  Network net = load_network(std::string(LIGHTSEG_SOURCE_DIR) + "/models/camvid.lsw", &meta);
  std::vector<torch::Tensor> xs;
  for (const char* name : {"0016E5_07959.png", "0016E5_08057.png", "0016E5_08157.png"})
    xs.push_back(to_rgb_chw_float(read_image_file(dir + name)).unsqueeze(0));
  calibrate_int8(net, meta, {xs[0], xs[1]}, "two bundled images");
  EXPECT_FALSE(meta.int8_absmax.empty());
  std::string why;
  auto engine = int8_engine(net, meta, &why);
  if (!engine) GTEST_SKIP() << why;
  EXPECT_EQ(engine->backend(), "onednn-int8");
  auto f32 = make_engine(net, meta, {"onednn"});
  for (const auto& x : xs) {
    auto ref = reference(net, meta, x);
    auto got = engine->logits(x);
    ASSERT_EQ(got.sizes(), ref.sizes());
    std::printf("  int8 on the shipped weights: labels %.5f, max |logit diff| %.3f\n", agreement(got, ref),
                max_diff(got, ref));
    EXPECT_GE(agreement(got, ref), 0.98);
    EXPECT_TRUE(engine->labels(x).equal(got.argmax(1)));
    // int8 rounding shows: not float32 in disguise
    EXPECT_GT(max_diff(got, f32->logits(x)), 1e-3);
  }
}

TEST(Engine, Int8HandlesEveryConfigurationAndSize) {
  // The int8 copies are written by our passes (NHWC, partial channel blocks) or by reorders;
  // the NHWC results of oneDNN's int8 kernels are read back by the passes: logits stay close to
  // float32 for every configuration, odd channel counts and sizes included.
  for (const auto& cfg : {NetworkConfig{}, unaligned_config(), fixtures::residual_config()}) {
    auto net = random_net(cfg, 9);
    ModelMeta meta = ModelMeta::generic(cfg.num_classes);
    calibrate_int8(net, meta, {images(2, 96, 128, 5)}, "random images");
    std::string why;
    auto engine = int8_engine(net, meta, &why);
    if (!engine) GTEST_SKIP() << why;
    expect_close_at_odd_sizes("int8", net, meta, cfg, *engine, 0.9, 0.1);
  }
}

TEST(Engine, Int8IsRefusedWithAReason) {
  // Uncalibrated weights, or a CPU (or LIGHTSEG_MAX_ISA cap) without AVX512-VNNI: a clear
  // std::invalid_argument, never a silent fallback. Int8 is the CPU's only.
  auto net = random_net();
  ModelMeta meta = ModelMeta::generic(NetworkConfig{}.num_classes);
  EngineOptions o;
  o.dtype = torch::kQInt8;
  try {
    make_engine(net, meta, o);
    FAIL() << "int8 without a calibration ran";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_TRUE(cpu_int8_inference_available() ? m.find("lightseg calibrate") != std::string::npos
                                               : m.find("VNNI") != std::string::npos)
        << m;
  }
  calibrate_int8(net, meta, {images(1, 64, 64)}, "random images");
  if (!cpu_int8_inference_available()) {
    EXPECT_THROW(make_engine(net, meta, o), std::invalid_argument);
  }
  o.backend = "fused";
  EXPECT_THROW(make_engine(net, meta, o), std::invalid_argument);
}

TEST(Engine, Int8CalibrationSurvivesTheWeightsFile) {
  auto net = random_net();
  ModelMeta meta = ModelMeta::generic(NetworkConfig{}.num_classes);
  calibrate_int8(net, meta, {images(1, 64, 64)}, "one random image");
  const std::string path = testing::TempDir() + "int8_meta.lsw";
  save_network(path, net, meta);
  ModelMeta back;
  load_network(path, &back);
  EXPECT_EQ(back.int8_absmax, meta.int8_absmax);
  EXPECT_EQ(back.int8_calibration, "one random image");
  // every dense convolution's input has a bound, keyed by the folded network's value names
  const auto f = fuse_network(net, back);
  ASSERT_EQ(f.act_absmax.size(), static_cast<size_t>(f.num_values));
  for (size_t i = 1; i < f.ops.size(); ++i)
    if (f.ops[i].kind == FusedOp::Kind::Conv && f.ops[i].groups == 1) EXPECT_GT(f.act_absmax[f.ops[i].in[0]], 0.f);
  // a bound that is not a positive number is refused when the file is read
  EXPECT_THROW(ModelMeta::from_json_string(R"({"int8": {"absmax": {"init.conv2": -1}}})"), std::invalid_argument);
  std::remove(path.c_str());
}
