#include "lightseg/engine.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include <torch/cuda.h>

#include "infer/onednn_engine.h"
#include "infer/tta.h"
#include "lightseg/features.h"
#include "infer/fused_network.h"
#include "data/transforms.h"
#if LIGHTSEG_HAVE_TORCH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace lightseg {

namespace {

// A deep copy of a network (parameters and buffers): the engine's own weights.
Network clone_network(const Network& net) {
  Network copy(net->config());
  torch::NoGradGuard ng;
  auto src_p = net->named_parameters(true);
  for (auto& p : copy->named_parameters(true)) p.value().copy_(src_p[p.key()]);
  auto src_b = net->named_buffers(true);
  for (auto& b : copy->named_buffers(true)) b.value().copy_(src_b[b.key()]);
  return copy;
}

// The training-graph network in eval mode: the reference every faster backend is checked against.
class EagerEngine : public InferenceEngine {
 public:
  EagerEngine(const Network& net, const ModelMeta& meta, torch::Device dev)
      : net_(clone_network(net)), meta_(meta), dev_(dev) {
    net_->eval();
    net_->to(dev_);
    to_channels_last(*net_);
  }
  torch::Tensor logits(const torch::Tensor& images) override {
    c10::InferenceMode guard;
    auto x = normalize(images.to(dev_, torch::kFloat32), meta_).contiguous(torch::MemoryFormat::ChannelsLast);
    return net_->forward(x);
  }
  std::string backend() const override { return "eager"; }
  torch::Device device() const override { return dev_; }

 private:
  Network net_;
  ModelMeta meta_;
  torch::Device dev_;
};

// The folded operation list (fused_network.h) run with LibTorch ops.
class FusedEngine : public InferenceEngine {
 public:
  FusedEngine(const Network& net, const ModelMeta& meta, const EngineOptions& o)
      : dev_(o.device), dtype_(o.device.is_cuda() ? o.dtype : torch::kFloat32), graphs_(o.cuda_graphs) {
    if (dtype_ != torch::kFloat32 && dtype_ != torch::kHalf && dtype_ != torch::kBFloat16)
      throw std::invalid_argument("fused backend: dtype must be float32, float16 or bfloat16");
    f_ = to(fuse_network(net, meta), dev_, dtype_);
  }
  torch::Tensor logits(const torch::Tensor& images) override {
    c10::InferenceMode guard;
    auto x = images.to(dev_, dtype_).contiguous();
#if LIGHTSEG_HAVE_TORCH_CUDA
    if (dev_.is_cuda() && graphs_) return replay(x);
#endif
    return run_fused(f_, x).to(torch::kFloat32);
  }
  std::string backend() const override { return "fused"; }
  torch::Device device() const override { return dev_; }

 private:
#if LIGHTSEG_HAVE_TORCH_CUDA
  // On CUDA: the whole forward captured once per input shape (batch and size), then replayed
  // (one launch instead of ~150; inputs and outputs live in fixed buffers). The last
  // kMaxGraphs shapes keep their graphs (the least recently used one goes first).
  static constexpr size_t kMaxGraphs = 4;
  struct Captured {
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    torch::Tensor in, out;
    uint64_t used = 0;
  };
  torch::Tensor replay(const torch::Tensor& x) {
    Captured* c = nullptr;
    for (auto& g : graphs_by_shape_)
      if (g.in.sizes() == x.sizes()) c = &g;
    if (!c) {
      if (graphs_by_shape_.size() >= kMaxGraphs)
        graphs_by_shape_.erase(std::min_element(graphs_by_shape_.begin(), graphs_by_shape_.end(),
                                                [](const Captured& a, const Captured& b) { return a.used < b.used; }));
      Captured n;
      n.in = x.clone();
      torch::cuda::synchronize();  // the side stream below must see n.in
      {
        c10::cuda::CUDAStreamGuard sg(c10::cuda::getStreamFromPool());
        for (int i = 0; i < 3; ++i) run_fused(f_, n.in);  // warm-up (cuDNN algorithm choice) off the graph
        n.graph = std::make_unique<at::cuda::CUDAGraph>();
        n.graph->capture_begin();
        n.out = run_fused(f_, n.in);
        n.graph->capture_end();
      }
      torch::cuda::synchronize();
      graphs_by_shape_.push_back(std::move(n));
      c = &graphs_by_shape_.back();
    }
    c->used = ++uses_;
    c->in.copy_(x);
    c->graph->replay();
    return c->out.to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);
  }
  std::vector<Captured> graphs_by_shape_;
  uint64_t uses_ = 0;
#endif
  FusedNetwork f_;
  torch::Device dev_;
  torch::ScalarType dtype_;
  bool graphs_;
};

}  // namespace

double measure_peak_macs(torch::Device device, torch::ScalarType dtype) {
  c10::InferenceMode guard;
  const int64_t c = 128, n = device.is_cuda() ? 16 : 1, h = device.is_cuda() ? 128 : 96, w = h;
  auto opts = torch::TensorOptions().device(device).dtype(dtype);
  auto x = torch::randn({n, c, h, w}, opts).contiguous(torch::MemoryFormat::ChannelsLast);
  auto wt = torch::randn({c, c, 3, 3}, opts).contiguous(torch::MemoryFormat::ChannelsLast);
  auto b = torch::zeros({c}, opts);
  auto sync = [&] {
    if (device.is_cuda()) torch::cuda::synchronize();
  };
  for (int i = 0; i < 3; ++i) torch::conv2d(x, wt, b, 1, 1);
  sync();
  double best = 1e30;
  for (int i = 0; i < 15; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    torch::conv2d(x, wt, b, 1, 1);
    sync();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return static_cast<double>(n * c * c * 9 * h * w) / best;
}

double count_inference_macs(const Network& net, const ModelMeta& meta, int64_t h, int64_t w, const EngineOptions& o) {
  const FusedNetwork fused = fuse_network(net, meta);
  double macs = 0;
  for (double s : o.scales) {
    const auto [sh, sw] = tta_size(h, w, s);
    macs += (o.flip ? 2.0 : 1.0) * static_cast<double>(fused.count_macs(sh, sw));
  }
  return macs;
}

std::vector<std::string> available_backends(torch::Device device) {
  std::vector<std::string> r;
  // onednn only where oneDNN's kernels take its layouts (AVX-512): below, it would run
  // oneDNN's reference kernels, ~1000x slower than fused.
  if (device.is_cpu() && onednn_available() && onednn_unsuitable_reason().empty()) r.push_back("onednn");
  r.push_back("fused");
  r.push_back("eager");
  return r;
}

bool cpu_bf16_inference_available() { return onednn_bf16_available(); }
bool cpu_int8_inference_available() { return onednn_int8_available(); }

void calibrate_int8(const Network& net, ModelMeta& meta, const std::vector<torch::Tensor>& images,
                    const std::string& how, double quantile) {
  ModelMeta plain = meta;
  plain.int8_absmax.clear();
  const FusedNetwork f = to(fuse_network(net, plain), torch::kCPU);
  std::vector<torch::Tensor> cpu;
  for (const auto& x : images) {
    if (x.dim() != 4 || x.size(1) != 3)
      throw std::invalid_argument("int8 calibration: images must be N×3×H×W, got " + c10::str(x.sizes()));
    cpu.push_back(x.to(torch::kCPU, torch::kFloat32).contiguous(torch::MemoryFormat::ChannelsLast));
  }
  meta.int8_absmax = int8_activation_bounds(f, cpu, quantile);
  meta.int8_calibration = how;
}

namespace {

std::unique_ptr<InferenceEngine> make_plain_engine(const Network& net, const ModelMeta& meta, const EngineOptions& o) {
  std::string backend = o.backend;
  const bool low = o.dtype == torch::kBFloat16 || o.dtype == torch::kQInt8;
  if (backend == "auto")  // measured fastest first; bf16 and int8 on the CPU are onednn's alone
    backend = o.device.is_cpu() && low ? "onednn" : available_backends(o.device).front();
  if (o.dtype == torch::kQInt8 && !o.device.is_cpu())
    throw std::invalid_argument("int8 inference runs on the CPU only (onednn backend)");
  if (o.dtype == torch::kQInt8 && !onednn_available())  // e.g. ARM builds: say what int8 needs
    throw std::invalid_argument("int8 inference on the CPU needs the onednn backend and AVX512-VNNI; this build has "
                                "no onednn backend: use fp32");
  if (o.device.is_cpu() && o.dtype != torch::kFloat32) {
    if (!low)
      throw std::invalid_argument(std::string("the CPU backends compute in float32 or (onednn) bfloat16 or int8, not ") +
                                  c10::toString(o.dtype));
    if (backend != "onednn")
      throw std::invalid_argument(std::string(o.dtype == torch::kQInt8 ? "int8" : "bfloat16") +
                                  " on the CPU needs the onednn backend (asked for '" + backend + "')");
  }
  if (backend == "eager") {
    if (o.dtype != torch::kFloat32) throw std::invalid_argument("the eager backend computes in float32 only");
    return std::make_unique<EagerEngine>(net, meta, o.device);
  }
  if (backend == "fused") return std::make_unique<FusedEngine>(net, meta, o);
  if (backend == "onednn") {
    if (!o.device.is_cpu()) throw std::invalid_argument("the onednn backend runs on the CPU only");
    if (!onednn_available())
      throw std::invalid_argument("this build has no onednn backend (libdnnl-dev was not found at configure time)");
    // one plan per scale of test-time augmentation, so that its passes do not rebuild them
    return make_onednn_engine(fuse_network(net, meta), o.dtype == torch::kBFloat16, o.profile,
                              std::max<size_t>(4, o.scales.size()), o.dtype == torch::kQInt8);
  }
  throw std::invalid_argument("unknown inference backend '" + backend + "' (expected auto, eager, fused or onednn)");
}

}  // namespace

std::unique_ptr<InferenceEngine> make_engine(const Network& net, const ModelMeta& meta, const EngineOptions& o) {
  check_tta(o.scales);
  auto engine = make_plain_engine(net, meta, o);
  return tta_requested(o.scales, o.flip) ? make_tta_engine(std::move(engine), o.scales, o.flip) : std::move(engine);
}

}  // namespace lightseg
