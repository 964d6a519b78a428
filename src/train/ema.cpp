#include "train/ema.h"

#include <algorithm>

namespace lightseg {

WeightsEma::WeightsEma(Network avg, Network src, double decay, int64_t steps) : decay_(decay), steps_(steps) {
  auto add = [&](const std::vector<torch::Tensor>& dst, const std::vector<torch::Tensor>& from) {
    for (size_t i = 0; i < dst.size(); ++i) {
      (dst[i].is_floating_point() ? avg_ : copy_).push_back(dst[i]);
      (dst[i].is_floating_point() ? src_ : copy_src_).push_back(from[i]);
    }
  };
  add(avg->parameters(), src->parameters());
  add(avg->buffers(), src->buffers());
}

void WeightsEma::update() {
  torch::NoGradGuard ng;
  const double n = static_cast<double>(steps_);
  const double d = std::min(decay_, (1.0 + n) / (10.0 + n));
  at::_foreach_mul_(avg_, d);
  at::_foreach_add_(avg_, src_, 1.0 - d);
  for (size_t i = 0; i < copy_.size(); ++i) copy_[i].copy_(copy_src_[i]);
  ++steps_;
}

void WeightsEma::copy_weights(Network& dst, Network& src) {
  torch::NoGradGuard ng;
  auto s = src->parameters(), d = dst->parameters();
  for (size_t i = 0; i < s.size(); ++i) d[i].copy_(s[i]);
  auto bs = src->buffers(), bd = dst->buffers();
  for (size_t i = 0; i < bs.size(); ++i) bd[i].copy_(bs[i]);
}

}  // namespace lightseg
