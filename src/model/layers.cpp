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

namespace {
AllReduceFn& bn_allreduce() {
  static AllReduceFn fn;
  return fn;
}

// y = (x − μ)/σ·γ + β with μ, σ² over the batch of ALL ranks (sums all-reduced).
class SyncBatchNormFn : public torch::autograd::Function<SyncBatchNormFn> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, torch::Tensor weight,
                               torch::Tensor bias, torch::Tensor running_mean, torch::Tensor running_var,
                               double eps, double momentum, const AllReduceFn* reduce) {
    const int64_t C = x.size(1);
    auto xd = x.to(torch::kDouble);
    auto stats = torch::cat({xd.sum({0, 2, 3}), (xd * xd).sum({0, 2, 3}),
                             torch::full({1}, static_cast<double>(x.numel() / C), xd.options())});
    (*reduce)(stats);
    const double n = stats[2 * C].item<double>();
    auto mean = stats.narrow(0, 0, C) / n;
    auto var = (stats.narrow(0, C, C) / n - mean * mean).clamp_min(0);
    auto invstd = (var + eps).rsqrt();
    {
      torch::NoGradGuard ng;
      running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()) * momentum);
      running_var.mul_(1 - momentum).add_(var.to(running_var.scalar_type()) * (momentum * n / std::max(1.0, n - 1)));
    }
    auto m = mean.to(x.scalar_type()).view({1, C, 1, 1}), is = invstd.to(x.scalar_type()).view({1, C, 1, 1});
    ctx->save_for_backward({x, m, is, weight});
    ctx->saved_data["n"] = n;
    ctx->saved_data["reduce"] = reinterpret_cast<int64_t>(reduce);
    return (x - m) * is * weight.view({1, C, 1, 1}) + bias.view({1, C, 1, 1});
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto x = saved[0], m = saved[1], is = saved[2], w = saved[3];
    const double n = ctx->saved_data["n"].toDouble();
    const auto* reduce = reinterpret_cast<const AllReduceFn*>(ctx->saved_data["reduce"].toInt());
    auto dy = grads[0];
    const int64_t C = x.size(1);
    auto xmu = x - m;
    auto sum_dy = dy.sum({0, 2, 3});
    auto sum_dy_xmu = (dy * xmu).sum({0, 2, 3});
    auto grad_weight = sum_dy_xmu * is.view({C});  // local: averaged with the other gradients
    auto grad_bias = sum_dy;
    auto both = torch::cat({sum_dy, sum_dy_xmu}).to(torch::kDouble);
    (*reduce)(both);
    auto mean_dy = (both.narrow(0, 0, C) / n).to(x.scalar_type()).view({1, C, 1, 1});
    auto mean_dy_xmu = (both.narrow(0, C, C) / n).to(x.scalar_type()).view({1, C, 1, 1});
    auto dx = (dy - mean_dy - xmu * is * is * mean_dy_xmu) * is * w.view({1, C, 1, 1});
    return {dx, grad_weight, grad_bias, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};
}  // namespace

void set_batchnorm_allreduce(AllReduceFn fn) { bn_allreduce() = std::move(fn); }

torch::Tensor sync_batch_norm(const torch::Tensor& x, torch::nn::BatchNorm2d& bn, const AllReduceFn& reduce) {
  const auto& o = bn->options;
  return SyncBatchNormFn::apply(x, bn->weight, bn->bias, bn->running_mean, bn->running_var, o.eps(),
                                o.momentum().value_or(0.1), &reduce);
}

torch::Tensor BNActImpl::forward(const torch::Tensor& x) {
  const AllReduceFn& reduce = bn_allreduce();
  torch::Tensor y = (reduce && is_training()) ? sync_batch_norm(x, bn, reduce) : bn->forward(x);
  return act ? act->forward(y) : y;
}

ConvBNActImpl::ConvBNActImpl(const ConvSpec& spec, bool with_act)
    : conv(register_module("conv", make_conv(spec))),
      bn_act(register_module("bn_act", BNAct(spec.out, with_act))) {}

torch::Tensor ConvBNActImpl::forward(const torch::Tensor& x) {
  return bn_act->forward(model::conv(conv, x));
}

}  // namespace lightseg::model
