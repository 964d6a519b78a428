#include "infer/frame_resize.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include <ATen/Parallel.h>

namespace lightseg {

namespace {

// torch's nearest_idx: the source index of output index i (input n, output m).
int64_t nearest_source(int64_t i, int64_t n, int64_t m) {
  if (m == n) return i;
  if (m == 2 * n) return i >> 1;
  const float scale = static_cast<float>(n) / static_cast<float>(m);
  return std::min(static_cast<int64_t>(std::floor(static_cast<float>(i) * scale)), n - 1);
}

// torch's linear source indices and weights (align_corners false): for output index i of m from n.
struct Tap {
  int64_t i0, i1;
  float w0, w1;
};
std::vector<Tap> linear_taps(int64_t n, int64_t m) {
  std::vector<Tap> taps(static_cast<size_t>(m));
  const float scale = static_cast<float>(n) / static_cast<float>(m);
  for (int64_t i = 0; i < m; ++i) {
    float src = scale * (static_cast<float>(i) + 0.5f) - 0.5f;
    if (src < 0) src = 0;
    const int64_t i0 = static_cast<int64_t>(src);
    const float l1 = std::min(std::max(src - static_cast<float>(i0), 0.0f), 1.0f);
    taps[static_cast<size_t>(i)] = {i0, i0 + (i0 < n - 1 ? 1 : 0), 1.0f - l1, l1};
  }
  return taps;
}

}  // namespace

torch::Tensor frame_to_network_input(const torch::Tensor& image, int64_t h, int64_t w) {
  torch::Tensor x = image.dim() == 2 ? image.unsqueeze(2) : image;
  if (x.dim() != 3 || x.scalar_type() != torch::kUInt8)
    throw std::invalid_argument("frame_to_network_input: expected uint8 H×W×C, got " + c10::str(image.sizes()));
  const int64_t C = x.size(2);
  if (C < 1 || C > 4) throw std::invalid_argument("image must have 1, 3 or 4 channels, got " + std::to_string(C));
  if (h < 1 || w < 1) throw std::invalid_argument("frame_to_network_input: empty output size");
  x = x.to(torch::kCPU).contiguous();
  const int64_t H = x.size(0), W = x.size(1);
  const int64_t ch[3] = {0, C >= 3 ? 1 : 0, C >= 3 ? 2 : 0};  // gray: one channel three times
  const auto rows = linear_taps(H, h), cols = linear_taps(W, w);
  torch::Tensor out = torch::empty({3, h, w}, torch::kFloat32);
  const uint8_t* src = x.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, h, 16, [&](int64_t y0, int64_t y1) {
    for (int64_t y = y0; y < y1; ++y) {
      const Tap& r = rows[static_cast<size_t>(y)];
      const uint8_t* a = src + r.i0 * W * C;
      const uint8_t* b = src + r.i1 * W * C;
      for (int c = 0; c < 3; ++c) {
        float* o = dst + (c * h + y) * w;
        const int64_t k = ch[c];
        for (int64_t xo = 0; xo < w; ++xo) {
          const Tap& t = cols[static_cast<size_t>(xo)];
          const float top = t.w0 * a[t.i0 * C + k] + t.w1 * a[t.i1 * C + k];
          const float bottom = t.w0 * b[t.i0 * C + k] + t.w1 * b[t.i1 * C + k];
          o[xo] = r.w0 * top + r.w1 * bottom;
        }
      }
    }
  });
  return out;
}

torch::Tensor labels_to_frame_size(const torch::Tensor& labels, int64_t H, int64_t W) {
  if (labels.dim() != 3 || labels.scalar_type() != torch::kUInt8)
    throw std::invalid_argument("labels_to_frame_size: expected uint8 N×h×w, got " + c10::str(labels.sizes()));
  torch::Tensor l = labels.to(torch::kCPU).contiguous();
  const int64_t N = l.size(0), h = l.size(1), w = l.size(2);
  std::vector<int64_t> col(static_cast<size_t>(W));
  for (int64_t x = 0; x < W; ++x) col[static_cast<size_t>(x)] = nearest_source(x, w, W);
  torch::Tensor out = torch::empty({N, H, W}, torch::kUInt8);
  const uint8_t* src = l.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, N * H, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r / H, y = r % H;
      const uint8_t* s = src + (n * h + nearest_source(y, h, H)) * w;
      uint8_t* o = dst + r * W;
      for (int64_t x = 0; x < W; ++x) o[x] = s[col[static_cast<size_t>(x)]];
    }
  });
  return out;
}

}  // namespace lightseg
