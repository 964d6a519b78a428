// lightseg: the inference path, separate from the training graph.
//
//   auto engine = lightseg::make_engine(net, meta);           // "auto": the fastest backend
//   torch::Tensor logits = engine->logits(images);            // N×3×H×W float RGB 0..255
//
// The engine owns its copy of the weights (never the caller's training graph), applies the
// model's normalisation itself, and is safe to call from one thread at a time (Predictor
// serialises or pools engines for concurrent callers).
#pragma once

#include <memory>
#include <string>

#include "lightseg/config.h"
#include "lightseg/network.h"

namespace lightseg {

class InferenceEngine {
 public:
  virtual ~InferenceEngine() = default;
  // images: N×3×H×W float32, RGB, values 0..255 (unnormalised). Returns N×K×H×W logits.
  virtual torch::Tensor logits(const torch::Tensor& images) = 0;
  // N×H×W int64 label ids.
  torch::Tensor labels(const torch::Tensor& images) { return logits(images).argmax(1); }
  virtual std::string backend() const = 0;
  virtual torch::Device device() const = 0;
};

// backend: "auto" or "eager" (the network in eval mode, channels_last, inference mode).
std::unique_ptr<InferenceEngine> make_engine(const Network& net, const ModelMeta& meta,
                                             const std::string& backend = "auto",
                                             torch::Device device = torch::kCPU);

// A deep copy of a network (parameters and buffers), e.g. to fold or convert it.
Network clone_network(const Network& net);

}  // namespace lightseg
