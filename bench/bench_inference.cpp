// Google Benchmark suite: every inference backend at the sizes of the README's speed table,
// the dense-convolution peak, and the one-off costs (folding, first call of a new shape).
//
//   build/bin/lightseg_bench                                   # all
//   build/bin/lightseg_bench --benchmark_filter='Engine/onednn'
//   OMP_NUM_THREADS=2 build/bin/lightseg_bench --benchmark_format=json
//
// Counters: images/s (items_per_second) and GMAC/s achieved (the network's convolution
// MACs per image × images/s). Random weights: speed does not depend on them.
#include <benchmark/benchmark.h>

#include "lightseg/engine.h"
#include "infer/fused_network.h"
#include "lightseg/runtime.h"

namespace {

using namespace lightseg;

struct Model {
  Network net{nullptr};
  ModelMeta meta = ModelMeta::camvid();
  Model() {
    torch::manual_seed(0);
    net = Network(NetworkConfig{});
    net->eval();
  }
};

Model& model() {
  static Model m;
  return m;
}

void engine_bench(benchmark::State& state, const EngineOptions& o) {
  const int64_t h = state.range(0), w = state.range(1), n = state.range(2);
  auto engine = make_engine(model().net, model().meta, o);
  torch::manual_seed(1);
  auto x = torch::rand({n, 3, h, w}) * 255;
  for (int i = 0; i < 3; ++i) engine->logits(x);  // plan / kernels / caches
  for (auto _ : state) benchmark::DoNotOptimize(engine->logits(x));
  const double macs = static_cast<double>(fuse_network(model().net, model().meta).count_macs(h, w));
  state.SetItemsProcessed(state.iterations() * n);
  state.counters["GMAC/s"] = benchmark::Counter(macs * n / 1e9 * state.iterations(), benchmark::Counter::kIsRate);
}

// Labels (what `segment` and `serve` ask for): the engine's labels(), where the oneDNN backend
// fuses the final ×4 upsampling with the argmax instead of writing the full-size logits.
void labels_bench(benchmark::State& state, const EngineOptions& o) {
  const int64_t h = state.range(0), w = state.range(1);
  auto engine = make_engine(model().net, model().meta, o);
  torch::manual_seed(1);
  auto x = torch::rand({1, 3, h, w}) * 255;
  for (int i = 0; i < 3; ++i) engine->labels(x);
  for (auto _ : state) benchmark::DoNotOptimize(engine->labels(x));
  state.SetItemsProcessed(state.iterations());
}

void register_engines() {
  std::vector<EngineOptions> all;
  for (const auto& backend : available_backends()) {
    EngineOptions o;
    o.backend = backend;
    all.push_back(o);
  }
  EngineOptions bf16;  // onednn with bf16 convolutions, where the CPU has AVX512-BF16/AMX
  bf16.backend = "onednn";
  bf16.dtype = torch::kBFloat16;
  try {
    make_engine(model().net, model().meta, bf16);
    all.push_back(bf16);
  } catch (const std::exception&) {
  }
  for (const auto& o : all) {
    const std::string name = o.dtype == torch::kBFloat16 ? o.backend + "-bf16" : o.backend;
    auto* b = benchmark::RegisterBenchmark(("Engine/" + name).c_str(), engine_bench, o);
    b->Args({360, 480, 1})->Args({512, 1024, 1})->Args({360, 480, 4})->ArgNames({"H", "W", "N"});
    b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
    auto* l = benchmark::RegisterBenchmark(("Labels/" + name).c_str(), labels_bench, o);
    l->Args({360, 480})->ArgNames({"H", "W"})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
  }
}

// The peak the network is compared with: a dense 3×3 convolution, 128→128 channels, 96×96,
// in float32 (arg 0) or bfloat16 (arg 1).
void BM_DenseConvPeak(benchmark::State& state) {
  c10::InferenceMode guard;
  const auto dt = state.range(0) ? torch::kBFloat16 : torch::kFloat32;
  auto x = torch::randn({1, 128, 96, 96}).to(dt).contiguous(torch::MemoryFormat::ChannelsLast);
  auto wt = torch::randn({128, 128, 3, 3}).to(dt).contiguous(torch::MemoryFormat::ChannelsLast);
  for (auto _ : state) benchmark::DoNotOptimize(torch::conv2d(x, wt, {}, 1, 1));
  state.counters["GMAC/s"] =
      benchmark::Counter(128.0 * 128 * 9 * 96 * 96 / 1e9 * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DenseConvPeak)->Arg(0)->Arg(1)->ArgName("bf16")->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_FuseNetwork(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(fuse_network(model().net, model().meta));
}
BENCHMARK(BM_FuseNetwork)->Unit(benchmark::kMillisecond);

// First call at a new input shape (the onednn backend compiles a plan per shape).
void BM_FirstCallNewShape(benchmark::State& state) {
  auto x = torch::rand({1, 3, 360, 480}) * 255;
  for (auto _ : state) {
    auto engine = make_engine(model().net, model().meta, {"auto"});
    benchmark::DoNotOptimize(engine->logits(x));
  }
}
BENCHMARK(BM_FirstCallNewShape)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  lightseg::init_runtime();
  register_engines();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
