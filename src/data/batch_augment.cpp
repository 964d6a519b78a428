#include "data/batch_augment.h"

#include <stdexcept>

namespace lightseg {

namespace F = torch::nn::functional;

std::pair<torch::Tensor, torch::Tensor> augment_batch(const torch::Tensor& images, const torch::Tensor& labels,
                                                      const std::vector<int64_t>& index,
                                                      const std::vector<AugmentDraw>& draws, const AugmentOptions& o,
                                                      const ModelMeta& meta) {
  const int64_t B = static_cast<int64_t>(index.size());
  if (B == 0 || draws.size() != index.size())
    throw std::invalid_argument("augment_batch: " + std::to_string(index.size()) + " samples and " +
                                std::to_string(draws.size()) + " draws");
  if (images.dim() != 4 || images.size(1) != 3 || labels.dim() != 3 || labels.size(0) != images.size(0) ||
      labels.size(1) != images.size(2) || labels.size(2) != images.size(3))
    throw std::invalid_argument("augment_batch: images must be N×3×H×W and labels N×H×W of the same N, H, W");
  torch::NoGradGuard ng;
  const auto dev = images.device();
  const int64_t H = images.size(2), W = images.size(3), ch = o.crop_h, cw = o.crop_w;
  // The per-sample parameters and the mean and std, one host→device copy: from pinned memory and
  // asynchronous on a GPU (a copy from pageable memory would wait for the device to catch up).
  auto host = torch::empty({9 * B + 6}, torch::TensorOptions().dtype(torch::kDouble).pinned_memory(dev.is_cuda()));
  auto table = host.narrow(0, 0, 9 * B).view({9, B});
  auto a = table.accessor<double, 2>();
  for (int64_t b = 0; b < B; ++b) {
    const AugmentDraw& d = draws[static_cast<size_t>(b)];
    a[0][b] = static_cast<double>(d.h);
    a[1][b] = static_cast<double>(d.w);
    a[2][b] = static_cast<double>(d.y0);
    a[3][b] = static_cast<double>(d.x0);
    a[4][b] = d.flip ? 1.0 : 0.0;
    a[5][b] = d.brightness;
    a[6][b] = d.contrast;
    a[7][b] = d.saturation;
    a[8][b] = static_cast<double>(index[static_cast<size_t>(b)]);
  }
  for (int c = 0; c < 3; ++c) {
    host[9 * B + c] = static_cast<double>(meta.mean[c]);
    host[9 * B + 3 + c] = static_cast<double>(meta.std[c]);
  }
  const auto all = host.to(dev, /*non_blocking=*/true);
  const auto p = all.narrow(0, 0, 9 * B).view({9, B});
  const auto dopt = torch::TensorOptions().dtype(torch::kDouble).device(dev);
  auto h = p[0].view({B, 1}), w = p[1].view({B, 1});
  // Output pixel (oy, ox) reads row sy, column sx of the scaled, padded image.
  auto oy = torch::arange(ch, dopt).view({1, ch}), ox = torch::arange(cw, dopt).view({1, cw});
  auto sy = p[2].view({B, 1}) + oy;                                                  // B×ch
  auto sx = p[3].view({B, 1}) + torch::where(p[4].view({B, 1}) > 0.5, (cw - 1) - ox, ox);  // B×cw
  auto inside = (sy < h).view({B, ch, 1}).logical_and((sx < w).view({B, 1, cw}));         // B×ch×cw
  // Labels: resize_label's index map floor((s + 0.5) · H/h), clamped (the identity when unscaled).
  auto ry = (sy + 0.5).mul(static_cast<double>(H) / h).floor().clamp_max(H - 1).to(torch::kLong);
  auto rx = (sx + 0.5).mul(static_cast<double>(W) / w).floor().clamp_max(W - 1).to(torch::kLong);
  auto sample = p[8].to(torch::kLong).view({B, 1, 1});
  auto flat = sample * (H * W) + ry.view({B, ch, 1}) * W + rx.view({B, 1, cw});
  auto lab = labels.reshape({-1}).index_select(0, flat.reshape({-1})).view({B, ch, cw});
  lab = torch::where(inside, lab, torch::full({}, 255, lab.options())).to(torch::kLong);
  // Images: bilinear at the source positions (s + 0.5) · H/h − 0.5, i.e. grid (2s + 1)/h − 1.
  auto gy = ((2 * sy + 1) / h - 1).view({B, ch, 1}).expand({B, ch, cw});
  auto gx = ((2 * sx + 1) / w - 1).view({B, 1, cw}).expand({B, ch, cw});
  auto grid = torch::stack({gx, gy}, -1).to(torch::kFloat32);
  auto src = images.index_select(0, sample.view({B})).to(torch::kFloat32);
  auto img = F::grid_sample(src, grid,
                            F::GridSampleFuncOptions().mode(torch::kBilinear).padding_mode(torch::kBorder).align_corners(false));
  auto fill = all.narrow(0, 9 * B, 3).to(torch::kFloat32).view({1, 3, 1, 1});
  img = torch::where(inside.unsqueeze(1), img, fill);
  if (o.jitter > 0) {  // augment()'s order: brightness, saturation around the gray, contrast around its mean
    auto bri = p[5].to(torch::kFloat32).view({B, 1, 1, 1}), con = p[6].to(torch::kFloat32).view({B, 1, 1, 1});
    auto sat = p[7].to(torch::kFloat32).view({B, 1, 1, 1});
    img = img * bri;
    auto gray = (img.select(1, 0) * 0.299 + img.select(1, 1) * 0.587 + img.select(1, 2) * 0.114).unsqueeze(1);
    img = gray + (img - gray) * sat;
    auto m = gray.mean({1, 2, 3}, /*keepdim=*/true);
    img = ((img - m) * con + m).clamp(0, 255);
  }
  bool blur_or_noise = false;
  for (const auto& d : draws) blur_or_noise = blur_or_noise || d.blur_sigma > 0 || d.noise_std > 0;
  if (blur_or_noise) img = blur_and_noise(img, draws);  // augment()'s steps 6 and 7
  auto mean = fill, std = all.narrow(0, 9 * B + 3, 3).to(torch::kFloat32).view({1, 3, 1, 1});
  return {(img - mean) / std, lab};
}

}  // namespace lightseg
