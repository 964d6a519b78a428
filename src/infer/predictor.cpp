#include "lightseg/predictor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "infer/frame_resize.h"
#include "infer/tta.h"
#include "lightseg/engine.h"
#include "lightseg/image_io.h"
#include "data/transforms.h"
#include "lightseg/weights.h"
#include "lightseg/file_io.h"

namespace lightseg {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The network needs at least 32 pixels a side (five stride-2 stages); smaller inputs are
// upscaled for the forward pass and the logits resized back.
constexpr int64_t kMinSide = 32;

}  // namespace

void InputSize::check() const {
  auto bad = [](int64_t v) { return v < kMin || v > kMax; };
  if (none()) return;
  if (longest_side ? (width != 0 || bad(height)) : (bad(height) || bad(width)))
    throw std::invalid_argument("input size " + text() + ": each side must be in [" + std::to_string(kMin) + ", " +
                                std::to_string(kMax) + "]");
}

std::pair<int64_t, int64_t> InputSize::resolve(int64_t h, int64_t w) const {
  if (none()) return {h, w};
  if (!longest_side) return {height, width};
  const double f = static_cast<double>(height) / static_cast<double>(std::max(h, w));
  auto side = [&](int64_t v) {
    const int64_t r = static_cast<int64_t>(std::llround(static_cast<double>(v) * f / 8.0)) * 8;
    return std::clamp<int64_t>(r, kMin, kMax);
  };
  return {side(h), side(w)};
}

InputSize InputSize::parse(const std::string& t) {
  InputSize s;
  if (t.empty() || t == "0") return s;
  auto num = [&](const std::string& x) -> int64_t {
    if (x.empty() || x.size() > 9 || x.find_first_not_of("0123456789") != std::string::npos)
      throw std::invalid_argument("input size '" + t + "': expected HxW (e.g. 360x480) or a longest side (e.g. 480)");
    return std::stoll(x);
  };
  const auto x = t.find('x');
  if (x == std::string::npos) {
    s.height = num(t);
    s.longest_side = true;
  } else {
    s.height = num(t.substr(0, x));
    s.width = num(t.substr(x + 1));
  }
  try {
    s.check();
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument("input size '" + t + "': each side must be in [" + std::to_string(kMin) + ", " +
                                std::to_string(kMax) + "]");
  }
  return s;
}

std::string InputSize::text() const {
  if (none()) return "image size";
  if (longest_side) return std::to_string(height) + " (longest side)";
  return std::to_string(height) + "x" + std::to_string(width);
}

void Augmentation::check(int max_scales) const {
  if (scales.empty()) throw std::invalid_argument("test-time augmentation: no scale given (e.g. 0.75,1,1.25)");
  for (double s : scales)
    if (!std::isfinite(s) || s < kMinScale || s > kMaxScale) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%g", s);
      throw std::invalid_argument(std::string("test-time augmentation: scale ") + buf + " is not in [0.25, 4]");
    }
  if (max_scales > 0 && scales.size() > static_cast<size_t>(max_scales))
    throw std::invalid_argument("test-time augmentation: at most " + std::to_string(max_scales) + " scales, got " +
                                std::to_string(scales.size()));
}

Augmentation Augmentation::snapped(double grid) const {
  if (!(grid > 0)) throw std::invalid_argument("Augmentation::snapped: the grid must be > 0");
  Augmentation a = *this;
  for (double& s : a.scales)
    if (std::isfinite(s)) s = std::clamp(std::round(s / grid) * grid, std::ceil(kMinScale / grid) * grid, std::floor(kMaxScale / grid) * grid);
  std::sort(a.scales.begin(), a.scales.end());
  a.scales.erase(std::unique(a.scales.begin(), a.scales.end()), a.scales.end());
  return a;
}

std::string Augmentation::text() const { return tta_requested(scales, flip) ? tta_description(scales, flip) : "none"; }

Augmentation Augmentation::parse(const std::string& scales_text, const std::string& flip_text,
                                 const Augmentation& defaults, int max_scales) {
  auto quoted = [](const std::string& t) { return "'" + (t.size() > 200 ? t.substr(0, 200) + "…" : t) + "'"; };
  Augmentation a = defaults;
  if (!scales_text.empty()) {
    a.scales.clear();
    size_t start = 0;
    for (;;) {
      const size_t comma = scales_text.find(',', start);
      const std::string item = scales_text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      double v = 0;
      size_t used = 0;
      try {
        if (item.empty() || std::isspace(static_cast<unsigned char>(item[0]))) throw std::invalid_argument(item);
        v = std::stod(item, &used);
      } catch (const std::exception&) {
        used = std::string::npos;
      }
      if (used != item.size())
        throw std::invalid_argument("scales must be numbers separated by commas (e.g. 1,1.25), got " + quoted(scales_text));
      if (!std::isfinite(v) || v < kMinScale || v > kMaxScale)
        throw std::invalid_argument("each scale must be in [0.25, 4], got " + quoted(item));
      a.scales.push_back(v);
      if (max_scales > 0 && a.scales.size() > static_cast<size_t>(max_scales))
        throw std::invalid_argument("at most " + std::to_string(max_scales) + " scales per request, got " +
                                    quoted(scales_text));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  if (!flip_text.empty()) {
    if (flip_text == "1" || flip_text == "true") a.flip = true;
    else if (flip_text == "0" || flip_text == "false") a.flip = false;
    else throw std::invalid_argument("flip must be 0 or 1, got " + quoted(flip_text));
  }
  a.check(max_scales);
  return a;
}

std::pair<int64_t, int64_t> Predictor::pass_size(int64_t h, int64_t w, double s) { return tta_size(h, w, s); }

struct Predictor::Impl {
  PredictorOptions opt;
  std::string weights_path;
  ModelMeta meta;
  NetworkConfig config;
  int64_t params = 0;
  std::string backend;

  // The engine pool: one worker thread per engine takes forward passes from a shared queue.
  // Callers block on their task's future. All heavy LibTorch work thus runs on these few
  // threads (one OpenMP team each), however many threads call the predictor.
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::deque<std::function<void(InferenceEngine&)>> tasks;
  std::vector<std::unique_ptr<InferenceEngine>> engines;
  std::vector<std::thread> workers;

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    for (auto& w : workers) w.join();
  }

  void init(const Network& net, const ModelMeta& m) {
    if (opt.engines < 1) throw std::invalid_argument("a predictor needs at least 1 engine, got " + std::to_string(opt.engines));
    if (opt.max_pixels < 0) throw std::invalid_argument("max_pixels must be ≥ 0, got " + std::to_string(opt.max_pixels));
    opt.input_size.check();
    config = net->config();
    meta = m;
    if (meta.class_names.empty() && meta.palette.empty()) {
      ModelMeta g = ModelMeta::generic(config.num_classes);
      meta.class_names = g.class_names;
      meta.palette = g.palette;
    }
    meta.check(config.num_classes);
    if (config.num_classes > 255)
      throw std::invalid_argument("label maps are 8-bit: at most 255 classes, the model has " +
                                  std::to_string(config.num_classes));
    params = count_parameters(*net);
    if (opt.engine.device.is_cuda() && !torch::cuda::is_available())
      throw std::runtime_error("device '" + opt.engine.device.str() + "': no CUDA device available");
    for (int i = 0; i < opt.engines; ++i) engines.push_back(make_engine(net, meta, opt.engine));
    backend = engines.front()->backend();
    for (auto& e : engines) workers.emplace_back([this, eng = e.get()] { work(*eng); });
  }

  void work(InferenceEngine& engine) {
    // This thread's OpenMP team size follows LibTorch's setting (init_runtime / --threads);
    // without this, a backend calling oneDNN/OpenMP directly would use every core.
    at::init_num_threads();
    for (;;) {
      std::function<void(InferenceEngine&)> task;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stopping || !tasks.empty(); });
        if (tasks.empty()) return;
        task = std::move(tasks.front());
        tasks.pop_front();
      }
      task(engine);
    }
  }

  // Runs f(engine) on the next free engine's thread and returns its result (or rethrows).
  template <class R>
  R on_engine(const std::function<R(InferenceEngine&)>& f) {
    std::packaged_task<R(InferenceEngine&)> job(f);
    auto result = job.get_future();
    {
      std::lock_guard<std::mutex> lock(mu);
      tasks.emplace_back([&job](InferenceEngine& e) { job(e); });
    }
    cv.notify_one();
    return result.get();
  }

  // images: H×W×C uint8 (checked), all the same size → labels N×H×W uint8 (+ confidence N×H×W float).
  std::pair<torch::Tensor, torch::Tensor> run(const std::vector<torch::Tensor>& images, bool want_conf,
                                              const Augmentation& aug) {
    using Out = std::pair<torch::Tensor, torch::Tensor>;
    const bool tta = tta_requested(aug.scales, aug.flip);
    return on_engine<Out>([&](InferenceEngine& engine) -> Out {
      c10::InferenceMode guard;
      const int64_t H0 = images.front().size(0), W0 = images.front().size(1);
      const auto [Hn, Wn] = opt.input_size.resolve(H0, W0);
      std::vector<torch::Tensor> chw;
      if (Hn != H0 || Wn != W0) {
        // the frame read once, at the network's size; the labels written once, at the frame's
        for (const auto& im : images) chw.push_back(frame_to_network_input(im, Hn, Wn));
        auto out = run_net(engine, torch::stack(chw), tta, want_conf, aug);
        torch::Tensor conf;
        if (want_conf)
          conf = torch::nn::functional::interpolate(out.second.unsqueeze(1),
                                                    torch::nn::functional::InterpolateFuncOptions()
                                                        .size(std::vector<int64_t>{H0, W0})
                                                        .mode(torch::kNearest))
                     .squeeze(1)
                     .contiguous();
        return {labels_to_frame_size(out.first, H0, W0), conf};
      }
      for (const auto& im : images) chw.push_back(to_rgb_chw_float(im));
      return run_net(engine, torch::stack(chw), tta, want_conf, aug);
    });
  }

  // x: N×3×H×W float 0-255 → labels N×H×W uint8 (+ confidence) at x's size.
  static std::pair<torch::Tensor, torch::Tensor> run_net(InferenceEngine& engine, torch::Tensor x, bool tta,
                                                         bool want_conf, const Augmentation& aug) {
    {
      const int64_t H = x.size(2), W = x.size(3);
      if (H < kMinSide || W < kMinSide) x = resize_image(x, std::max(H, kMinSide), std::max(W, kMinSide));
      if (!tta && !want_conf && x.size(2) == H && x.size(3) == W)
        return {engine.labels(x).to(torch::kUInt8), torch::Tensor()};
      torch::Tensor logits =
          (tta ? tta_logits(engine, x, aug.scales, aug.flip) : engine.logits(x)).to(torch::kCPU, torch::kFloat32);
      if (logits.size(2) != H || logits.size(3) != W)
        logits = torch::nn::functional::interpolate(
            logits, torch::nn::functional::InterpolateFuncOptions()
                        .size(std::vector<int64_t>{H, W})
                        .mode(torch::kBilinear)
                        .align_corners(false));
      if (!want_conf) return {logits.argmax(1).to(torch::kUInt8), torch::Tensor()};
      auto [p, idx] = torch::softmax(logits, 1).max(1);
      return {idx.to(torch::kUInt8), p.contiguous()};
    }
  }
};

Predictor::Predictor(const PredictorOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->opt = options;
  std::string path = options.weights;
  if (path.empty()) {
    path = default_weights_path();
    if (path.empty())
      throw std::runtime_error("no weights file given and no shipped default weights found "
                               "(models/camvid.lsw; LIGHTSEG_MODELS may name its folder)");
  }
  ModelMeta meta;
  Network net = load_network(path, &meta);
  impl_->weights_path = path;
  impl_->init(net, meta);
}

Predictor::Predictor(const Network& net, const ModelMeta& meta, const PredictorOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->opt = options;
  impl_->init(net, meta);
}

Predictor::~Predictor() = default;

const ModelMeta& Predictor::meta() const { return impl_->meta; }
const NetworkConfig& Predictor::config() const { return impl_->config; }
int64_t Predictor::parameters() const { return impl_->params; }
const std::string& Predictor::weights_path() const { return impl_->weights_path; }
std::string Predictor::backend() const { return impl_->backend; }
const PredictorOptions& Predictor::options() const { return impl_->opt; }

namespace {
torch::Tensor checked(const torch::Tensor& image) {
  if (!image.defined()) throw std::invalid_argument("predict: undefined image tensor");
  if (image.scalar_type() != torch::kUInt8)
    throw std::invalid_argument("predict: expected a uint8 image, got " + std::string(c10::toString(image.scalar_type())));
  if (image.dim() != 2 && image.dim() != 3)
    throw std::invalid_argument("predict: expected H×W or H×W×C, got " + c10::str(image.sizes()));
  if (image.size(0) < 1 || image.size(1) < 1)
    throw std::invalid_argument("predict: empty image " + c10::str(image.sizes()));
  if (image.dim() == 3 && image.size(2) != 1 && image.size(2) != 3 && image.size(2) != 4)
    throw std::invalid_argument("predict: expected 1, 3 or 4 channels, got " + std::to_string(image.size(2)));
  return image.to(torch::kCPU);
}
}  // namespace

Prediction Predictor::predict(const torch::Tensor& image, bool confidence, const Augmentation& aug) const {
  auto x = checked(image);
  aug.check();
  auto t0 = std::chrono::steady_clock::now();
  auto [labels, conf] = impl_->run({x}, confidence, aug);
  Prediction p;
  p.inference_ms = ms_since(t0);
  p.labels = labels[0];
  if (confidence) p.confidence = conf[0];
  return p;
}

std::vector<Prediction> Predictor::predict_batch(const std::vector<torch::Tensor>& images, bool confidence,
                                                 const Augmentation& aug) const {
  aug.check();
  std::vector<torch::Tensor> imgs;
  imgs.reserve(images.size());
  for (const auto& im : images) imgs.push_back(checked(im));
  // Equally sized images share one forward pass.
  std::map<std::pair<int64_t, int64_t>, std::vector<size_t>> groups;
  for (size_t i = 0; i < imgs.size(); ++i) groups[{imgs[i].size(0), imgs[i].size(1)}].push_back(i);
  std::vector<Prediction> out(images.size());
  for (const auto& [hw, idx] : groups) {
    std::vector<torch::Tensor> xs;
    for (size_t i : idx) xs.push_back(imgs[i]);
    auto t0 = std::chrono::steady_clock::now();
    auto [labels, conf] = impl_->run(xs, confidence, aug);
    const double ms = ms_since(t0) / idx.size();
    for (size_t k = 0; k < idx.size(); ++k) {
      auto& p = out[idx[k]];
      p.labels = labels[k];
      if (confidence) p.confidence = conf[k];
      p.inference_ms = ms;
    }
  }
  return out;
}

ImageSize Predictor::check_encoded(const void* data, size_t size, const std::string& what) const {
  return check_image(data, size, what, impl_->opt.max_pixels);
}

InspectedImage Predictor::inspect(const void* data, size_t size, const Augmentation& aug, const std::string& what) const {
  InspectedImage info;
  info.size = check_encoded(data, size, what);
  aug.check();
  info.aug = aug;
  const int64_t limit = impl_->opt.max_pixels;
  // The passes run at the network input size (a 4K image at 360x480 costs 360x480).
  const auto [nh, nw] = impl_->opt.input_size.resolve(info.size.height, info.size.width);
  for (double s : aug.scales) {
    const auto [h, w] = pass_size(nh, nw, s);
    if (limit > 0 && h * w > limit) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", s);
      throw InputError(InputError::Kind::TooLarge, std::string("scale ") + buf + " makes the " +
                                                       std::to_string(info.size.width) + "x" +
                                                       std::to_string(info.size.height) + " " + what + " " +
                                                       std::to_string(w) + "x" + std::to_string(h) +
                                                       ", over the limit of " + std::to_string(limit) + " pixels");
    }
    info.largest_pass = std::max(info.largest_pass, h * w);
    info.cost += h * w * (aug.flip ? 2 : 1);
  }
  return info;
}

Prediction Predictor::predict_inspected(const InspectedImage& info, const void* data, size_t size, bool confidence,
                                        const std::string& what) const {
  auto t0 = std::chrono::steady_clock::now();
  torch::Tensor img;
  try {
    // The decoder checks the limit itself, after the header and before any pixel.
    img = decode_image(data, size, what, impl_->opt.max_pixels);
  } catch (const ImageTooLarge& e) {
    throw InputError(InputError::Kind::TooLarge, e.what());
  } catch (const std::runtime_error& e) {
    throw InputError(InputError::Kind::Corrupt, e.what());
  }
  if (img.size(0) != info.size.height || img.size(1) != info.size.width)
    throw InputError(InputError::Kind::Corrupt, what + ": the decoded size differs from the header's");
  const double decode_ms = ms_since(t0);
  Prediction p = predict(img, confidence, info.aug);
  p.image = img;
  p.decode_ms = decode_ms;
  return p;
}

Prediction Predictor::predict_encoded(const void* data, size_t size, bool confidence, const std::string& what,
                                      const Augmentation& aug) const {
  return predict_inspected(inspect(data, size, aug, what), data, size, confidence, what);
}

Prediction Predictor::predict_file(const std::string& path, bool confidence, const Augmentation& aug) const {
  std::string bytes = read_file(path);
  return predict_encoded(bytes.data(), bytes.size(), confidence, "'" + path + "'", aug);
}

}  // namespace lightseg
