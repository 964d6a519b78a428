#include "data/transforms.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace lightseg {

namespace F = torch::nn::functional;

torch::Tensor resize_image(const torch::Tensor& x, int64_t h, int64_t w) {
  const bool single = x.dim() == 3;
  torch::Tensor b = single ? x.unsqueeze(0) : x;
  if (b.size(2) == h && b.size(3) == w) return x;
  b = F::interpolate(b, F::InterpolateFuncOptions().size(std::vector<int64_t>{h, w}).mode(torch::kBilinear).align_corners(false));
  return single ? b.squeeze(0) : b;
}

torch::Tensor resize_label(const torch::Tensor& y, int64_t h, int64_t w) {
  if (y.size(0) == h && y.size(1) == w) return y;
  // nearest via index maps (exact, no float rounding differences between backends)
  auto rows = (torch::arange(h, torch::kDouble) + 0.5).mul(double(y.size(0)) / h).floor().clamp_max(y.size(0) - 1).to(torch::kLong);
  auto cols = (torch::arange(w, torch::kDouble) + 0.5).mul(double(y.size(1)) / w).floor().clamp_max(y.size(1) - 1).to(torch::kLong);
  return y.index_select(0, rows.to(y.device())).index_select(1, cols.to(y.device()));
}

torch::Tensor normalize(const torch::Tensor& x, const ModelMeta& meta) {
  auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(x.device());
  auto mean = torch::tensor({meta.mean[0], meta.mean[1], meta.mean[2]}, opts).view({3, 1, 1});
  auto std = torch::tensor({meta.std[0], meta.std[1], meta.std[2]}, opts).view({3, 1, 1});
  return (x - mean) / std;
}

AugmentDraw draw_augment(const AugmentOptions& o, int64_t h, int64_t w, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> U(0.0, 1.0);
  AugmentDraw d;
  d.scale = o.scale_min + (o.scale_max - o.scale_min) * U(rng);
  d.h = h;
  d.w = w;
  if (std::abs(d.scale - 1.0) > 1e-9) {
    d.h = std::max<int64_t>(1, std::llround(h * d.scale));
    d.w = std::max<int64_t>(1, std::llround(w * d.scale));
  }
  const int64_t H = std::max(d.h, o.crop_h), W = std::max(d.w, o.crop_w);  // padded
  d.y0 = std::min(static_cast<int64_t>(U(rng) * (H - o.crop_h + 1)), H - o.crop_h);
  d.x0 = std::min(static_cast<int64_t>(U(rng) * (W - o.crop_w + 1)), W - o.crop_w);
  d.flip = o.flip && U(rng) < 0.5;
  if (o.jitter > 0) {
    d.jitter = true;
    d.brightness = 1.0 + o.jitter * (2 * U(rng) - 1);
    d.contrast = 1.0 + o.jitter * (2 * U(rng) - 1);
    d.saturation = 1.0 + o.jitter * (2 * U(rng) - 1);
  }
  if (o.blur > 0) {
    const double u = U(rng), s = U(rng);
    if (u < o.blur) d.blur_sigma = 0.5 + (kMaxBlurSigma - 0.5) * s;
  }
  if (o.noise > 0) {
    d.noise_std = o.noise * U(rng);
    d.noise_seed = static_cast<uint32_t>(rng() >> 32);
  }
  return d;
}

std::pair<torch::Tensor, torch::Tensor> augment(const torch::Tensor& image, const torch::Tensor& label,
                                                const AugmentOptions& o, const std::array<float, 3>& fill,
                                                std::mt19937_64& rng) {
  const AugmentDraw d = draw_augment(o, image.size(1), image.size(2), rng);
  torch::Tensor img = image, lab = label;
  // 1. random scale
  if (d.h != image.size(1) || d.w != image.size(2)) {
    img = resize_image(img, d.h, d.w);
    lab = resize_label(lab, d.h, d.w);
  }
  // 2. pad to at least the crop (image with the mean colour → 0 after normalisation; label with ignore)
  const int64_t H = img.size(1), W = img.size(2);
  const int64_t ph = std::max<int64_t>(0, o.crop_h - H), pw = std::max<int64_t>(0, o.crop_w - W);
  if (ph > 0 || pw > 0) {
    auto f = torch::tensor({fill[0], fill[1], fill[2]}, img.options()).view({3, 1, 1});
    torch::Tensor pi = f.expand({3, H + ph, W + pw}).clone();
    pi.narrow(1, 0, H).narrow(2, 0, W).copy_(img);
    torch::Tensor pl = torch::full({H + ph, W + pw}, 255, lab.options());
    pl.narrow(0, 0, H).narrow(1, 0, W).copy_(lab);
    img = pi;
    lab = pl;
  }
  // 3. random crop
  img = img.narrow(1, d.y0, o.crop_h).narrow(2, d.x0, o.crop_w);
  lab = lab.narrow(0, d.y0, o.crop_h).narrow(1, d.x0, o.crop_w);
  // 4. horizontal flip
  if (d.flip) {
    img = img.flip({2});
    lab = lab.flip({1});
  }
  // 5. colour jitter
  if (d.jitter) {
    img = img * d.brightness;
    auto gray = (img[0] * 0.299 + img[1] * 0.587 + img[2] * 0.114).unsqueeze(0);
    img = gray + (img - gray) * d.saturation;
    img = (img - gray.mean()) * d.contrast + gray.mean();
    img = img.clamp(0, 255);
  }
  // 6. blur, 7. noise
  if (d.blur_sigma > 0 || d.noise_std > 0) img = blur_and_noise(img.unsqueeze(0), {d})[0];
  return {img.contiguous(), lab.contiguous()};
}

namespace {

// A 32-bit integer hash (lowbias-style multiply-xorshift) of int64 tensors holding values in
// [0, 2^32): every product stays below 2^59, so CPU and GPU compute the same bits.
torch::Tensor noise_hash(torch::Tensor x) {
  for (int i = 0; i < 2; ++i) x = torch::bitwise_and(torch::bitwise_xor(x.__rshift__(16), x) * 0x45d9f3b, static_cast<int64_t>(0xffffffff));
  return torch::bitwise_xor(x.__rshift__(16), x);
}
uint64_t noise_hash(uint64_t x) {
  for (int i = 0; i < 2; ++i) x = (((x >> 16) ^ x) * 0x45d9f3bULL) & 0xffffffffULL;
  return (x >> 16) ^ x;
}

}  // namespace

torch::Tensor blur_and_noise(const torch::Tensor& images, const std::vector<AugmentDraw>& draws) {
  const int64_t B = images.size(0), H = images.size(2), W = images.size(3);
  if (images.dim() != 4 || images.size(1) != 3 || static_cast<size_t>(B) != draws.size())
    throw std::invalid_argument("blur_and_noise: images must be N×3×H×W with one draw each");
  torch::Tensor img = images;
  const auto dev = images.device();
  bool any_blur = false, any_noise = false;
  for (const auto& d : draws) {
    any_blur = any_blur || d.blur_sigma > 0;
    any_noise = any_noise || d.noise_std > 0;
  }
  if (any_blur) {  // separable, every channel of sample b with its sigma (0: the identity kernel)
    const int k = 2 * kBlurRadius + 1;
    auto taps = torch::zeros({B, k}, torch::kFloat32);
    for (int64_t b = 0; b < B; ++b) {
      const double s = draws[static_cast<size_t>(b)].blur_sigma;
      if (s <= 0) {
        taps[b][kBlurRadius] = 1.0f;
        continue;
      }
      double sum = 0;
      std::vector<double> t(k);
      for (int i = 0; i < k; ++i) sum += t[i] = std::exp(-0.5 * (i - kBlurRadius) * (i - kBlurRadius) / (s * s));
      for (int i = 0; i < k; ++i) taps[b][i] = static_cast<float>(t[i] / sum);
    }
    auto w = taps.to(dev).repeat_interleave(3, 0);  // (B·3)×k
    namespace F = torch::nn::functional;
    auto x = F::pad(img.reshape({1, B * 3, H, W}),
                    F::PadFuncOptions({kBlurRadius, kBlurRadius, kBlurRadius, kBlurRadius}).mode(torch::kReplicate));
    x = F::conv2d(x, w.view({B * 3, 1, 1, k}), F::Conv2dFuncOptions().groups(B * 3));
    x = F::conv2d(x, w.view({B * 3, 1, k, 1}), F::Conv2dFuncOptions().groups(B * 3));
    img = x.view({B, 3, H, W});
  }
  if (any_noise) {
    auto lopt = torch::TensorOptions().dtype(torch::kLong).device(dev);
    std::vector<int64_t> seeds(static_cast<size_t>(B));
    std::vector<float> stds(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      seeds[static_cast<size_t>(b)] = static_cast<int64_t>(noise_hash(draws[static_cast<size_t>(b)].noise_seed));
      stds[static_cast<size_t>(b)] = static_cast<float>(draws[static_cast<size_t>(b)].noise_std);
    }
    auto seed = torch::tensor(seeds, torch::kLong).to(dev).view({B, 1});
    auto idx = torch::arange(3 * H * W, lopt).view({1, -1}) * 2;  // two draws per element
    const double inv = 1.0 / 4294967296.0;
    auto u1 = (noise_hash(torch::bitwise_xor(idx, seed)).to(torch::kDouble) + 1) * inv;  // (0, 1]
    auto u2 = noise_hash(torch::bitwise_xor(idx + 1, seed)).to(torch::kDouble) * inv;    // [0, 1)
    auto z = (torch::sqrt(-2 * torch::log(u1)) * torch::cos(2 * M_PI * u2)).to(torch::kFloat32);
    auto std = torch::tensor(stds, torch::kFloat32).to(dev).view({B, 1});
    img = img + (z * std).view({B, 3, H, W});
  }
  return img.clamp(0, 255);
}

}  // namespace lightseg
