// lightseg: the processing unit of claim 8 — images in, label maps out.
//
// Basic usage:
//   lightseg::Predictor p;                                   // the shipped models/camvid.lsw
//   lightseg::PredictorOptions o; o.weights = "my.lsw";     // or any weights file
//   o.engine.device = torch::kCUDA;                          // backend, device, dtype: EngineOptions
//   o.input_size = lightseg::InputSize::parse("360x480");    // network input size ("480": longest side)
//   lightseg::Predictor p2(o);
//   auto r = p.predict_file("street.png");                   // r.labels: H×W uint8 class ids
//   auto r = p.predict_encoded(bytes.data(), bytes.size());  // PNG/JPEG bytes
//   auto r = p.predict(image_hwc_u8, /*confidence=*/true);   // decoded H×W×{1,3,4} uint8
//   auto rs = p.predict_batch({a, b, c});                    // same labels as single calls
//   auto r = p.predict(image, false, {{1, 1.25}, true});     // test-time augmentation, this call only
//
// The front door for an image someone sent (what `serve` does per request):
//   auto aug = lightseg::Augmentation::parse("1,1.25", "1", {}, /*max_scales=*/4);  // std::invalid_argument
//   auto info = p.inspect(bytes.data(), bytes.size(), aug, "upload");  // header only: size, cost; InputError
//   ... admit info.cost against a budget ...
//   auto r = p.predict_inspected(info, bytes.data(), bytes.size());     // one decode, the passes
//
// Inputs of any size (≥ 1×1; below 32 pixels a side they are upscaled for the network), gray,
// RGB or RGBA 8-bit; labels come back at the input's own height and width. With
// PredictorOptions::input_size the network sees the image resized to that size (TTA scales are
// relative to it) and the labels are resized back (nearest) to the input's size.
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

// The network's input size: every image is resized once (bilinear) to it before the network,
// and its labels come back at the image's own size (nearest neighbour; the confidence too).
// {height, width}: exactly that size (the aspect may change). {longest, 0} (`longest_side`): the
// longest side becomes that many pixels with the aspect kept, each side rounded to a multiple of
// 8 (the network's output stride). Default {0, 0}: the image's own size.
struct InputSize {
  static constexpr int64_t kMin = 32, kMax = 8192;  // each side, and a longest side, in [kMin, kMax]
  int64_t height = 0, width = 0;
  bool longest_side = false;
  bool none() const { return height == 0 && width == 0; }
  // Throws std::invalid_argument naming the fault (a side < kMin or > kMax).
  void check() const;
  // The network input size for an h×w image ({h, w} when none()).
  std::pair<int64_t, int64_t> resolve(int64_t h, int64_t w) const;
  // "360x480" (exact) or "480" (longest side); "0" or "" is none(). Checked; throws
  // std::invalid_argument quoting the text.
  static InputSize parse(const std::string& text);
  std::string text() const;  // "360x480", "480 (longest side)" or "image size"
};

struct PredictorOptions {
  std::string weights;             // .lsw file; empty: default_weights_path() (throws if none)
  EngineOptions engine;            // backend, device and compute type of each engine (make_engine)
  int engines = 1;                 // engines in the pool (concurrent forward passes)
  int64_t max_pixels = 0;          // refuse larger inputs with InputError::TooLarge (0: no limit)
  InputSize input_size;            // the network's input size (default: each image's own)
};

// Test-time augmentation for one call (e.g. one HTTP request), on top of the engines' own
// (EngineOptions::scales/flip, normally none): the softmax probabilities of the input resized
// by each factor of `scales` (in [0.25, 4]) and, with `flip`, of each of those mirrored too,
// averaged at the input's size (as EngineOptions describes). The default is one plain pass.
// The onednn engine keeps the plans of max(4, EngineOptions::scales.size()) input sizes: more
// scales per call than that rebuild plans at every call (correct, but slow).
struct Augmentation {
  static constexpr double kMinScale = 0.25, kMaxScale = 4;  // the one range of a scale
  std::vector<double> scales{1.0};
  bool flip = false;

  // Throws std::invalid_argument naming the fault: no scale, a scale not finite or outside
  // [kMinScale, kMaxScale], more than max_scales of them (0: any number).
  void check(int max_scales = 0) const;
  // Each scale rounded to the nearest multiple of `grid` (> 0) within the range, then sorted with
  // duplicates dropped: 1.93,1.95,1.97,1.99 on a 0.25 grid is the one scale 2, so that a
  // server's passes come in few shapes (each new shape is a plan to build).
  Augmentation snapped(double grid) const;
  // Forward passes per image: scales × (flip ? 2 : 1).
  int passes() const { return static_cast<int>(scales.size()) * (flip ? 2 : 1); }
  // "none", or e.g. "scales 1,1.25 + flip".
  std::string text() const;
  // From text such as a query's &scales=1,1.25&flip=1: `scales` numbers separated by commas,
  // `flip` 0|1|true|false; an empty text keeps `defaults`' value. Checked (check(max_scales));
  // throws std::invalid_argument quoting the text.
  static Augmentation parse(const std::string& scales, const std::string& flip, const Augmentation& defaults,
                            int max_scales = 0);
};

// What Predictor::inspect learned before any pixel is decoded: the image's header and the passes
// its augmentation will run.
struct InspectedImage {
  ImageSize size;            // width and height from the header
  Augmentation aug;          // checked
  int64_t cost = 0;          // pixels of all forward passes (at the network input size): Σ over the scales of the pass's pixels, × 2 with flip
  int64_t largest_pass = 0;  // pixels of the largest pass
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
  // The front door: the header parsed once (check_encoded), the augmentation checked, every pass
  // held to max_pixels (InputError::TooLarge naming the scale), and the cost of the request.
  // Nothing is decoded. Throws InputError for the image, std::invalid_argument for `aug`.
  InspectedImage inspect(const void* data, size_t size, const Augmentation& aug = {},
                         const std::string& what = "image") const;
  // Decodes the image `info` was made from (once; bad pixel data throws InputError) and runs it
  // with info.aug. `data` must be the bytes given to inspect.
  Prediction predict_inspected(const InspectedImage& info, const void* data, size_t size, bool confidence = false,
                               const std::string& what = "image") const;
  // The size of the forward pass at scale s of an h×w input: round(h·s) × round(w·s), at least
  // 32 a side (smaller inputs are upscaled for the network).
  static std::pair<int64_t, int64_t> pass_size(int64_t h, int64_t w, double s);

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
