// lightseg: the processing unit of claim 8 — images in, label maps out.
//
// Basic usage:
//   lightseg::Predictor p;                                   // the shipped models/camvid.lsw
//   lightseg::PredictorOptions o; o.weights = "my.lsw";     // or any weights file
//   o.engine.device = torch::kCUDA;                          // backend, device, dtype: EngineOptions
//   lightseg::Predictor p2(o);
//   auto r = p.predict_file("street.png");                   // r.labels: H×W uint8 class ids
//   auto r = p.predict_encoded(bytes.data(), bytes.size());  // PNG/JPEG bytes
//   auto r = p.predict(image_hwc_u8, /*confidence=*/true);   // decoded H×W×{1,3,4} uint8
//   auto rs = p.predict_batch({a, b, c});                    // same labels as single calls
//   auto r = p.predict(image, false, {{1, 1.25}, true});     // test-time augmentation, this call only
//
// Inputs of any size (≥ 1×1; below 32 pixels a side they are upscaled for the network), gray,
// RGB or RGBA 8-bit; labels come back at the input's own height and width.
//
// Concurrency: a Predictor may be shared by any number of threads. It owns a pool of
// `PredictorOptions::engines` inference engines (each with its own copy of the weights), each
// served by one worker thread. A call queues its forward pass (normalisation, network,
// argmax) and blocks until a worker has done it; with the default of one engine concurrent
// calls are thus serialised (on a CPU one engine already uses every core), and LibTorch's
// thread pools are used by those workers only, however many threads call. Decoding runs in
// the caller's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "lightseg/config.h"
#include "lightseg/engine.h"
#include "lightseg/image_io.h"
#include "lightseg/network.h"

namespace lightseg {

struct PredictorOptions {
  std::string weights;             // .lsw file; empty: default_weights_path() (throws if none)
  EngineOptions engine;            // backend, device and compute type of each engine (make_engine)
  int engines = 1;                 // engines in the pool (concurrent forward passes)
  int64_t max_pixels = 0;          // refuse larger inputs with InputError::TooLarge (0: no limit)
};

// Test-time augmentation for one call (e.g. one HTTP request), on top of the engines' own
// (EngineOptions::scales/flip, normally none): the softmax probabilities of the input resized
// by each factor of `scales` (in [0.25, 4]) and, with `flip`, of each of those mirrored too,
// averaged at the input's size (as EngineOptions describes). The default is one plain pass.
// The onednn engine keeps the plans of max(4, EngineOptions::scales.size()) input sizes: more
// scales per call than that rebuild plans at every call (correct, but slow).
struct Augmentation {
  std::vector<double> scales{1.0};
  bool flip = false;
};

struct Prediction {
  torch::Tensor labels;      // H×W uint8 class ids, at the input's size
  torch::Tensor confidence;  // H×W float32 softmax probability of the chosen class (if asked)
  torch::Tensor image;       // the decoded input H×W×C uint8 (predict_encoded/predict_file only)
  double decode_ms = 0, inference_ms = 0;
};

class Predictor {
 public:
  explicit Predictor(const PredictorOptions& options = PredictorOptions{});
  // From a network in memory (e.g. a freshly initialised one in tests).
  Predictor(const Network& net, const ModelMeta& meta, const PredictorOptions& options = PredictorOptions{});
  ~Predictor();
  Predictor(const Predictor&) = delete;
  Predictor& operator=(const Predictor&) = delete;

  // image: H×W, H×W×1, H×W×3 or H×W×4 uint8 (RGB order).
  // A bad Augmentation throws std::invalid_argument before any work.
  Prediction predict(const torch::Tensor& image, bool confidence = false, const Augmentation& aug = {}) const;
  // Encoded PNG/JPEG. Bad input throws InputError naming `what`.
  Prediction predict_encoded(const void* data, size_t size, bool confidence = false,
                             const std::string& what = "image", const Augmentation& aug = {}) const;
  Prediction predict_file(const std::string& path, bool confidence = false, const Augmentation& aug = {}) const;
  // One forward pass per group of equally sized images; results in input order, with the
  // labels of single calls (up to float rounding in rare near-ties).
  std::vector<Prediction> predict_batch(const std::vector<torch::Tensor>& images, bool confidence = false,
                                        const Augmentation& aug = {}) const;

  // check_image with this predictor's max_pixels: the size from the header, or InputError.
  ImageSize check_encoded(const void* data, size_t size, const std::string& what = "image") const;

  const ModelMeta& meta() const;
  const NetworkConfig& config() const;
  int64_t parameters() const;
  const std::string& weights_path() const;  // empty when built from a network in memory
  std::string backend() const;
  const PredictorOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lightseg
