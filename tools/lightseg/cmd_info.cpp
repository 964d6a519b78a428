// lightseg info: per-module table (output shape, parameters, MACs) and totals.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include <torch/cuda.h>
#include <torch/version.h>

#include "args.h"
#include "lightseg/dataset.h"
#include "lightseg/distributed.h"
#include "lightseg/features.h"
#include "lightseg/network.h"
#include "lightseg/engine.h"
#include "lightseg/runtime.h"
#include "lightseg/weights.h"
#include "video_pipeline.h"
#if LIGHTSEG_HAVE_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace lightseg::cli {

static std::string shape(const std::vector<int64_t>& s) {
  std::string r;
  for (size_t i = 1; i < s.size(); ++i) r += (i > 1 ? "x" : "") + std::to_string(s[i]);
  return r;
}

// The build and the device: LibTorch version, distributed backends, and for --device cuda the GPU
// (an error when this LibTorch has no CUDA or no GPU is visible).
static nlohmann::json device_info(const std::string& device) {
  nlohmann::json j;
  j["torch"] = TORCH_VERSION;
  j["torch_cuda_build"] = static_cast<bool>(LIGHTSEG_HAVE_TORCH_CUDA);
  j["distributed_backends"] = distributed_backends();
  j["device"] = device;
  if (device != "cuda") return j;
  if (!torch::cuda::is_available())
    throw std::runtime_error(std::string("--device cuda: ") +
                             (LIGHTSEG_HAVE_TORCH_CUDA ? "no GPU is visible to this CUDA LibTorch"
                                                       : "this lightseg is built against a LibTorch without CUDA (" +
                                                             std::string(TORCH_VERSION) + ")"));
  j["gpus"] = torch::cuda::device_count();
#if LIGHTSEG_HAVE_TORCH_CUDA
  const auto* p = at::cuda::getCurrentDeviceProperties();
  j["gpu"] = p->name;
  j["gpu_memory_gib"] = static_cast<double>(p->totalGlobalMem) / (1 << 30);
  j["gpu_capability"] = std::to_string(p->major) + "." + std::to_string(p->minor);
  j["gpu_multiprocessors"] = p->multiProcessorCount;
#endif
  return j;
}

void add_info(CLI::App& app, Args& a) {
  auto* sub = app.add_subcommand("info", "Show the network: per-module output shape, parameters and MACs");
  add_options(sub, a, {Opt::Config, Opt::Weights, Opt::Size, Opt::Json, Opt::Threads, Opt::Device});
  // --groups: a dataset's groups (what --val-groups can hold out) instead of the network.
  static std::string data, dataset = "camvid", split = "train,val", group_by;
  static bool groups = false;
  auto* g = sub->add_option_group("groups", "A dataset's groups (drives, videos, scenes) for train --val-groups");
  g->add_flag("--groups", groups, "List the groups of --data's --split with their image counts, and stop");
  g->add_option("--data", data, "Dataset root folder (with --groups)");
  g->add_option("--dataset", dataset, "camvid, cityscapes or list (with --groups)")->capture_default_str();
  g->add_option("--split", split, "Split(s), joined by commas (with --groups)")->capture_default_str();
  g->add_option("--group-by", group_by, "prefix, dir, regex:PATTERN or file:PATH (default: dir for cityscapes, else prefix)");
  sub->callback([&a]() {
    if (groups) {
      if (data.empty()) throw std::invalid_argument("info --groups needs --data DIR");
      auto ds = SegDataset::open(dataset, data, split);
      auto counts = group_counts(ds.groups(group_by));
      const std::string rule = group_by.empty() ? (dataset == "cityscapes" ? "dir" : "prefix") : group_by;
      if (a.json) {
        nlohmann::json j = nlohmann::json::object();
        for (const auto& [name, n] : counts) j[name] = n;
        std::cout << nlohmann::json{{"split", split}, {"group_by", rule}, {"images", ds.size()}, {"groups", j}}.dump()
                  << std::endl;
        return;
      }
      std::printf("%s %s: %zu images in %zu groups (group_by %s)\n", dataset.c_str(), split.c_str(), ds.size(),
                  counts.size(), rule.c_str());
      for (const auto& [name, n] : counts) std::printf("%-24s %6zu\n", name.c_str(), n);
      return;
    }
    init_runtime(a.threads);
    const nlohmann::json dev = device_info(a.device);
    auto [h, w] = parse_size(a.size);
    NetworkConfig cfg;
    if (!a.config.empty() && !a.weights.empty())
      throw std::invalid_argument("give --config or --weights, not both");
    if (!a.config.empty()) cfg = NetworkConfig::from_file(a.config);
    if (!a.weights.empty()) cfg = read_weights(a.weights).config;
    Network net(cfg);
    auto rows = profile(net, h, w);
    int64_t params = count_parameters(*net);
    uint64_t macs = 0;
    for (const auto& r : rows) macs += r.macs;
    if (a.json) {
      nlohmann::json j;
      j["params"] = params;
      j["macs"] = macs;
      j["input"] = {h, w};
      j["config"] = nlohmann::json::parse(cfg.to_json_string());
      j["cpu_backends"] = available_backends(torch::kCPU);
      j["cpu_bf16"] = cpu_bf16_inference_available();
      j["onednn_plans"] = onednn_plan_description();
      if (onednn_available()) j["onednn_steps"] = onednn_step_scheduler();
      j["build"] = dev;
      j["modules"] = nlohmann::json::array();
      for (const auto& r : rows)
        j["modules"].push_back({{"name", r.name}, {"claim", r.claim}, {"out", r.out},
                                {"params", r.params}, {"macs", r.macs}});
      std::cout << j.dump() << std::endl;
      return;
    }
    std::printf("lightseg network, input 3x%ldx%ld\n", static_cast<long>(h), static_cast<long>(w));
    std::printf("%-20s %-10s %-14s %10s %14s\n", "module", "claim", "output", "params", "MACs");
    for (const auto& r : rows)
      std::printf("%-20s %-10s %-14s %10ld %14llu\n", r.name.c_str(), r.claim.c_str(), shape(r.out).c_str(),
                  static_cast<long>(r.params), static_cast<unsigned long long>(r.macs));
    std::printf("%-20s %-10s %-14s %10ld %14llu\n", "total", "", "", static_cast<long>(params),
                static_cast<unsigned long long>(macs));
    std::printf("parameters: %.3f M   MACs: %.3f G (convolutions, k_h*k_w*C_in/groups per output element)\n",
                params / 1e6, macs / 1e9);
    std::string backends;
    for (const auto& b : available_backends(torch::kCPU)) backends += (backends.empty() ? "" : ", ") + b;
    std::printf("CPU inference backends (fastest first): %s; --precision bf16: %s; int8: %s\n", backends.c_str(),
                cpu_bf16_inference_available() ? "available" : "not on this CPU/build (needs onednn and AVX512-BF16 or AMX)",
                cpu_int8_inference_available() ? "available (calibrated weights)"
                                               : "not on this CPU/build (needs onednn and AVX512-VNNI)");
    if (onednn_available())
      std::printf("onednn: %s; their own steps on %s\n", onednn_plan_description().c_str(),
                  onednn_step_scheduler() == "pool"     ? "the claim pool (LIGHTSEG_STEPS=pool)"
                  : onednn_step_scheduler() == "openmp" ? "OpenMP's threads (LIGHTSEG_STEPS=openmp)"
                                                        : "OpenMP's threads, or the claim pool while calls run slow "
                                                          "(LIGHTSEG_STEPS=auto)");
    std::printf("video and cameras: %s\n", video_support().c_str());
    std::string dist;
    for (const auto& b : dev["distributed_backends"]) dist += (dist.empty() ? "" : ", ") + b.get<std::string>();
    std::printf("LibTorch %s (%s); distributed backends: %s\n", TORCH_VERSION,
                LIGHTSEG_HAVE_TORCH_CUDA ? "CUDA build" : "CPU build", dist.empty() ? "none" : dist.c_str());
    if (dev.contains("gpu"))
      std::printf("GPU: %s, %.1f GiB, compute capability %s, %d multiprocessors (%d visible)\n",
                  dev["gpu"].get<std::string>().c_str(), dev["gpu_memory_gib"].get<double>(),
                  dev["gpu_capability"].get<std::string>().c_str(), dev["gpu_multiprocessors"].get<int>(),
                  dev["gpus"].get<int>());
  });
}

}  // namespace lightseg::cli
