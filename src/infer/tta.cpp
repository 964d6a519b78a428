#include "infer/tta.h"

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include <torch/torch.h>

#include "data/transforms.h"
#include "lightseg/predictor.h"

namespace lightseg {

// The one check, with the one range (Augmentation::kMinScale, kMaxScale).
void check_tta(const std::vector<double>& scales) { Augmentation{scales, false}.check(); }

bool tta_requested(const std::vector<double>& scales, bool flip) {
  return flip || scales.size() != 1 || scales[0] != 1.0;
}

std::string tta_description(const std::vector<double>& scales, bool flip) {
  std::string r = "scales ";
  for (size_t i = 0; i < scales.size(); ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%g", i ? "," : "", scales[i]);
    r += buf;
  }
  return flip ? r + " + flip" : r;
}

std::pair<int64_t, int64_t> tta_size(int64_t h, int64_t w, double s) {
  return {std::max<int64_t>(32, std::llround(h * s)), std::max<int64_t>(32, std::llround(w * s))};
}

torch::Tensor tta_logits(InferenceEngine& inner, const torch::Tensor& images, const std::vector<double>& scales,
                         bool flip) {
  check_tta(scales);
  c10::InferenceMode guard;
  const int64_t h = images.size(2), w = images.size(3);
  const auto src = images.to(inner.device(), torch::kFloat32);
  torch::Tensor sum;
  auto add = [&](const torch::Tensor& x, bool mirrored) {
    auto y = inner.logits(mirrored ? x.flip({3}) : x);
    if (mirrored) y = y.flip({3});
    auto p = resize_image(y, h, w).softmax(1);  // bilinear, as Predictor brings logits to the input's size
    sum = sum.defined() ? sum.add_(p) : p.contiguous();
  };
  for (double s : scales) {
    const auto [sh, sw] = tta_size(h, w, s);
    const auto x = s == 1.0 ? src : resize_image(src, sh, sw);
    add(x, false);
    if (flip) add(x, true);
  }
  // log of the mean probability: its argmax is the averaged prediction, its softmax the mean
  // probabilities themselves (what Predictor's confidence reports).
  const double passes = static_cast<double>(scales.size() * (flip ? 2 : 1));
  return sum.div_(passes).clamp_min_(FLT_MIN).log_();
}

namespace {

class TtaEngine : public InferenceEngine {
 public:
  TtaEngine(std::unique_ptr<InferenceEngine> inner, std::vector<double> scales, bool flip)
      : inner_(std::move(inner)), scales_(std::move(scales)), flip_(flip) {
    check_tta(scales_);
  }
  torch::Tensor logits(const torch::Tensor& images) override { return tta_logits(*inner_, images, scales_, flip_); }
  std::string backend() const override { return inner_->backend() + " (" + tta_description(scales_, flip_) + ")"; }
  torch::Device device() const override { return inner_->device(); }
  std::string profile() const override { return inner_->profile(); }
  std::string step_report() const override { return inner_->step_report(); }

 private:
  std::unique_ptr<InferenceEngine> inner_;
  std::vector<double> scales_;
  bool flip_;
};

}  // namespace

std::unique_ptr<InferenceEngine> make_tta_engine(std::unique_ptr<InferenceEngine> inner, std::vector<double> scales,
                                                 bool flip) {
  return std::make_unique<TtaEngine>(std::move(inner), std::move(scales), flip);
}

}  // namespace lightseg
