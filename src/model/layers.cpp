#include "lightseg/model/layers.h"

namespace lightseg::model {

bool& MacCounter::enabled() {
  thread_local bool on = false;
  return on;
}

uint64_t& MacCounter::total() {
  thread_local uint64_t n = 0;
  return n;
}

torch::nn::Conv2d make_conv(const ConvSpec& s) {
  // "same" padding for odd kernels: d·(k−1)/2
  const int64_t ph = s.dilation[0] * (s.kernel[0] - 1) / 2;
  const int64_t pw = s.dilation[1] * (s.kernel[1] - 1) / 2;
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(s.in, s.out, {s.kernel[0], s.kernel[1]})
                               .stride(s.stride)
                               .padding({ph, pw})
                               .dilation({s.dilation[0], s.dilation[1]})
                               .groups(s.groups)
                               .bias(s.bias));
}

torch::Tensor conv(const torch::nn::Conv2d& c, const torch::Tensor& x) {
  torch::Tensor y = c.ptr()->forward(x);
  if (MacCounter::enabled()) {
    const auto& o = c->options;
    const int64_t per_out = (*o.kernel_size())[0] * (*o.kernel_size())[1] * o.in_channels() / o.groups();
    MacCounter::total() += static_cast<uint64_t>(y.numel()) * static_cast<uint64_t>(per_out);
  }
  return y;
}

BNActImpl::BNActImpl(int64_t channels, bool with_act)
    : bn(register_module("bn", torch::nn::BatchNorm2d(channels))) {
  if (with_act) act = register_module("act", torch::nn::PReLU(torch::nn::PReLUOptions().num_parameters(channels)));
}

torch::Tensor BNActImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = bn->forward(x);
  return act ? act->forward(y) : y;
}

ConvBNActImpl::ConvBNActImpl(const ConvSpec& spec, bool with_act)
    : conv(register_module("conv", make_conv(spec))),
      bn_act(register_module("bn_act", BNAct(spec.out, with_act))) {}

torch::Tensor ConvBNActImpl::forward(const torch::Tensor& x) {
  return bn_act->forward(model::conv(conv, x));
}

}  // namespace lightseg::model
