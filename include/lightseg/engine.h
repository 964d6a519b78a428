// lightseg: the inference path, separate from the training graph.
//
//   auto engine = lightseg::make_engine(net, meta);           // "auto": the fastest backend
//   auto cuda = lightseg::make_engine(net, meta, {"fused", torch::kCUDA});
//   torch::Tensor logits = engine->logits(images);            // N×3×H×W float RGB 0..255
//
// Backends (all give the training graph's labels; tests/test_engine.cpp checks it):
//   eager   the training-graph network in eval mode, channels_last, inference mode;
//   fused   the folded operation list of fused_network.h run with LibTorch ops (CPU or CUDA;
//           on CUDA optionally fp16/bf16 and, at batch 1, a replayed CUDA graph);
//   onednn  the same list compiled once per input shape into oneDNN primitives with
//           prepacked weights, reused buffers and fused epilogues (CPU, when built with
//           libdnnl); the fastest on CPU, so "auto" picks it there, "fused" elsewhere.
//           With dtype kBFloat16 its dense convolutions run in bf16 ("onednn-bf16"), with
//           kQInt8 in int8 ("onednn-int8"; weights calibrated by `lightseg calibrate`).
//           The first call at a new input size builds that size's plan (~0.2 s); an engine
//           keeps up to 4 plans, each with its buffers (~30 MB at 360×480, batch 1).
//
// The engine owns its copy of the weights (never the caller's training graph), applies the
// model's normalisation itself, and is safe to call from one thread at a time (Predictor
// serialises or pools engines for concurrent callers).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lightseg/config.h"
#include "lightseg/network.h"

namespace lightseg {

class InferenceEngine {
 public:
  virtual ~InferenceEngine() = default;
  // images: N×3×H×W float32, RGB, values 0..255 (unnormalised). Returns N×K×H×W logits.
  virtual torch::Tensor logits(const torch::Tensor& images) = 0;
  // N×H×W int64 label ids (the argmax of logits(); onednn computes them without the
  // full-size logits).
  virtual torch::Tensor labels(const torch::Tensor& images) { return logits(images).argmax(1); }
  virtual std::string backend() const = 0;
  virtual torch::Device device() const = 0;
  // With EngineOptions::profile: the mean time of every step of each input size's plan so
  // far, as text lines (onednn); empty otherwise. The library never prints it.
  virtual std::string profile() const { return ""; }
  // onednn: what ran the plans' own steps, e.g. "openmp", or with LIGHTSEG_STEPS=auto
  // "auto: 40 of 100 timed calls on the pool, 1 switch"; "" for other backends.
  virtual std::string step_report() const { return ""; }
};

struct EngineOptions {
  std::string backend = "auto";    // "auto", "eager", "fused" or "onednn" (see above)
  torch::Device device = torch::kCPU;
  // Compute type (logits are always returned as float32): on CUDA, of the fused backend:
  // kFloat32, kHalf or kBFloat16. On the CPU: kFloat32, or kBFloat16 with the onednn
  // backend on CPUs with AVX512-BF16/AMX (dense convolutions in bf16 with f32 accumulation,
  // ~2× their f32 speed; labels agree with float32 on ~99.95% of CamVid val pixels), or kQInt8
  // with the onednn backend on CPUs with AVX512-VNNI: dense convolutions in int8 (per-channel
  // weight scales, activation scales from the weights' calibration, ModelMeta::int8_absmax).
  torch::ScalarType dtype = torch::kFloat32;
  bool cuda_graphs = true;  // fused on CUDA: capture once per input shape (the last 4 kept), then replay
  bool profile = false;     // time every step (onednn; InferenceEngine::profile())
  // Test-time augmentation, off by default (one pass at the input's size: the protocol of the
  // model cards and of the published figures). The softmax probabilities of the input resized
  // by each factor of `scales` (in [0.25, 4]; at least 32 pixels a side), and with `flip` of
  // each of those mirrored left-right too, are averaged at the input's size: logits() returns
  // the log of that mean, labels() its argmax, backend() names it ("onednn (scales 0.75,1,1.25
  // + flip)"). One forward pass per scale, twice that with flip.
  std::vector<double> scales{1.0};
  bool flip = false;
};
// make_engine(net, meta) is the fastest backend on the CPU; make_engine(net, meta, {"fused", torch::kCUDA}).
std::unique_ptr<InferenceEngine> make_engine(const Network& net, const ModelMeta& meta, const EngineOptions& o = {});

// Multiply-accumulates per second of a large dense 3×3 convolution (128→128 channels) on
// `device` in `dtype`, measured now (best of several runs): the practical peak that
// `lightseg bench` compares the network's achieved MAC/s with.
double measure_peak_macs(torch::Device device = torch::kCPU, torch::ScalarType dtype = torch::kFloat32);

// The backends this build runs at speed on `device` and this CPU (besides "auto"), fastest
// first: "onednn" only where oneDNN has the AVX-512 kernels its plans need (elsewhere asking
// for it is an error that says why).
std::vector<std::string> available_backends(torch::Device device = torch::kCPU);
// Whether EngineOptions::dtype = kBFloat16 works on this CPU (onednn backend, AVX512-BF16/AMX).
bool cpu_bf16_inference_available();
// Whether EngineOptions::dtype = kQInt8 works on this CPU (onednn backend, AVX512-VNNI), given
// calibrated weights.
bool cpu_int8_inference_available();
// False when the library was built without libdnnl.
bool onednn_available();
// What the onednn backend's plans run on this CPU, e.g. "nChw8c plans on oneDNN's avx2 kernels"
// ("" without onednn).
std::string onednn_plan_description();
// What shares the onednn plans' own steps (not oneDNN's convolutions) among threads
// (LIGHTSEG_STEPS): "auto" (the default: OpenMP while a plan's calls keep near its best one, the
// claim pool while they run well over it, as when other processes hold the cores), "openmp" or
// "pool" (docs/guide/deployment.md, Threads). Throws std::invalid_argument for another value.
std::string onednn_step_scheduler();

// int8 calibration: a bound of |x| for the input of every dense convolution, measured on
// `images` (each N×3×H×W float RGB 0..255, at the size inference will see) as the largest over
// the images of the `quantile` of |x| in one image, stored in meta.int8_absmax (replacing any
// earlier one) with `how` in meta.int8_calibration. Save the weights with that meta
// (save_network) and EngineOptions::dtype = kQInt8 runs them (`lightseg calibrate`).
void calibrate_int8(const Network& net, ModelMeta& meta, const std::vector<torch::Tensor>& images,
                    const std::string& how, double quantile = 0.9999);

// Multiply-accumulates of one h×w image through the network as the engines run it (the
// folded operation list), with o.scales and o.flip: every pass at its own size.
double count_inference_macs(const Network& net, const ModelMeta& meta, int64_t h, int64_t w,
                            const EngineOptions& o = {});

}  // namespace lightseg
