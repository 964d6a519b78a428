// Joint image+label transforms as tensor ops (they run on the GPU too).
// Images: 3×H×W float 0..255; labels: H×W uint8 train ids (255 = ignore).
#pragma once

#include <cstdint>
#include <random>

#include <torch/torch.h>

#include "lightseg/config.h"

namespace lightseg {

struct AugmentOptions {
  int64_t crop_h = 360, crop_w = 480;  // output size (padded with the ignore id when smaller)
  double scale_min = 0.75, scale_max = 2.0;
  bool flip = true;
  double jitter = 0.0;  // colour jitter strength: brightness/contrast/saturation ±jitter
  double blur = 0.0;    // probability of a Gaussian blur, sigma uniform in [0.5, 1.5] pixels
  double noise = 0.0;   // additive Gaussian noise: each sample's std uniform in [0, noise] (0..255 units)
};

// The largest blur sigma (pixels) and the blur kernel's radius (taps on each side).
constexpr double kMaxBlurSigma = 1.5;
constexpr int kBlurRadius = 4;

// The random parameters of one sample's augmentation, drawn from rng in augment()'s order
// (scale, crop row, crop column, flip, then brightness/contrast/saturation when jitter > 0, then
// whether and how much to blur when blur > 0, then the noise's std and seed when noise > 0),
// for an image of h×w pixels. augment() and the batched form (data/batch_augment.h) use the
// same draws, so they agree sample for sample.
struct AugmentDraw {
  double scale = 1;               // the drawn scale
  int64_t h = 0, w = 0;           // the image's size after scaling (h, w when unscaled)
  int64_t y0 = 0, x0 = 0;         // the crop's corner in the scaled, padded image
  bool flip = false;
  bool jitter = false;            // colour jitter drawn (o.jitter > 0)
  double brightness = 1, contrast = 1, saturation = 1;
  double blur_sigma = 0;          // 0: no blur
  double noise_std = 0;           // 0: no noise
  uint32_t noise_seed = 0;        // the noise's pattern (a hash of it and the element index)
};
AugmentDraw draw_augment(const AugmentOptions& o, int64_t h, int64_t w, std::mt19937_64& rng);

// Blur and noise of the draws' samples on a batch of crops: images N×3×H×W float 0..255 (any
// device; N = draws.size()), returned clamped to 0..255. The noise is a function of the seed and
// the element's index, computed with integer tensor ops, so the per-sample and the batched
// augmentation (on any device) add the same noise.
torch::Tensor blur_and_noise(const torch::Tensor& images, const std::vector<AugmentDraw>& draws);

// Random scale → random crop (pad image with the mean, label with 255) → flip → jitter → blur → noise.
// Returns {image 3×crop_h×crop_w float 0..255, label crop_h×crop_w uint8}.
std::pair<torch::Tensor, torch::Tensor> augment(const torch::Tensor& image, const torch::Tensor& label,
                                                const AugmentOptions& o, const std::array<float, 3>& fill,
                                                std::mt19937_64& rng);

// (x − mean) / std per channel; x is 3×H×W or N×3×H×W, 0..255.
torch::Tensor normalize(const torch::Tensor& x, const ModelMeta& meta);

// Bilinear resize of a 3×H×W / N×3×H×W float image; nearest for labels (H×W).
torch::Tensor resize_image(const torch::Tensor& x, int64_t h, int64_t w);
torch::Tensor resize_label(const torch::Tensor& y, int64_t h, int64_t w);

}  // namespace lightseg
