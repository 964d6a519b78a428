#include "train/foreach_adam.h"

#include <cmath>
#include <stdexcept>

#include "core/torch_compat.h"

namespace lightseg {

namespace {

double learning_rate(torch::optim::OptimizerOptions* o, bool decoupled) {
  return decoupled ? static_cast<torch::optim::AdamWOptions*>(o)->lr() : static_cast<torch::optim::AdamOptions*>(o)->lr();
}

// A view of flat[offset, offset + numel(like)) with like's sizes and strides.
torch::Tensor view_like(const torch::Tensor& flat, int64_t offset, const torch::Tensor& like) {
  return flat.narrow(0, offset, like.numel()).as_strided(like.sizes(), like.strides());
}

template <class State>
void import_state(torch::optim::Optimizer& opt, const torch::Tensor& p, torch::Tensor& m, torch::Tensor& v, int64_t* step,
                  bool* have_step) {
  auto it = opt.state().find(compat::optimizer_state_key(p));
  if (it == opt.state().end()) return;
  auto& s = static_cast<State&>(*it->second);
  if (*have_step && s.step() != *step)
    throw std::invalid_argument("fused optimizer: the optimizer state holds different step counts (" +
                                std::to_string(*step) + ", " + std::to_string(s.step()) + ")");
  *step = s.step();
  *have_step = true;
  if (s.exp_avg().defined()) m.copy_(s.exp_avg());
  if (s.exp_avg_sq().defined()) v.copy_(s.exp_avg_sq());
}

template <class State>
void write_state(torch::optim::Optimizer& opt, const torch::Tensor& p, const torch::Tensor& m, const torch::Tensor& v,
                 int64_t step) {
  auto& slot = opt.state()[compat::optimizer_state_key(p)];
  if (!slot) slot = std::make_unique<State>();
  auto& s = static_cast<State&>(*slot);
  s.step(step);
  s.exp_avg(m.clone());
  s.exp_avg_sq(v.clone());
}

}  // namespace

ForeachAdam::ForeachAdam(torch::optim::Optimizer& opt, bool decoupled) : opt_(opt), decoupled_(decoupled) {
  torch::NoGradGuard ng;
  int64_t total = 0;
  torch::Device device = torch::kCPU;
  bool first = true;
  for (auto& g : opt.param_groups()) {
    Group gr;
    gr.options = &g.options();
    std::tuple<double, double> betas;
    if (decoupled) {
      auto& o = static_cast<torch::optim::AdamWOptions&>(g.options());
      if (o.amsgrad()) throw std::invalid_argument("fused optimizer: amsgrad is not supported");
      betas = o.betas();
      gr.eps = o.eps();
      gr.weight_decay = o.weight_decay();
    } else {
      auto& o = static_cast<torch::optim::AdamOptions&>(g.options());
      if (o.amsgrad()) throw std::invalid_argument("fused optimizer: amsgrad is not supported");
      betas = o.betas();
      gr.eps = o.eps();
      gr.weight_decay = o.weight_decay();
    }
    gr.beta1 = std::get<0>(betas);
    gr.beta2 = std::get<1>(betas);
    gr.begin = total;
    for (auto& p : g.params()) {
      if (p.scalar_type() != torch::kFloat32 || !p.is_non_overlapping_and_dense())
        throw std::invalid_argument("fused optimizer: parameters must be dense float32 tensors");
      if (first) device = p.device();
      first = false;
      if (p.device() != device) throw std::invalid_argument("fused optimizer: parameters on more than one device");
      gr.params.push_back(p);
      total += p.numel();
    }
    gr.size = total - gr.begin;
    groups_.push_back(std::move(gr));
  }
  auto fo = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  grad_ = torch::zeros({total}, fo);
  m_ = torch::zeros({total}, fo);
  v_ = torch::zeros({total}, fo);
  denom_ = torch::zeros({total}, fo);
  bool have_step = false;
  for (auto& gr : groups_) {
    int64_t off = gr.begin;
    for (auto& p : gr.params) {
      gr.grads.push_back(view_like(grad_, off, p));
      gr.m.push_back(view_like(m_, off, p));
      gr.v.push_back(view_like(v_, off, p));
      gr.denom.push_back(view_like(denom_, off, p));
      if (decoupled) import_state<torch::optim::AdamWParamState>(opt, p, gr.m.back(), gr.v.back(), &step_, &have_step);
      else import_state<torch::optim::AdamParamState>(opt, p, gr.m.back(), gr.v.back(), &step_, &have_step);
      // autograd accumulates into this view from now on (the flat buffer is zeroed, not freed)
      if (p.grad().defined()) gr.grads.back().copy_(p.grad());
      p.mutable_grad() = gr.grads.back();
      off += p.numel();
    }
  }
}

void ForeachAdam::zero_grad() { grad_.zero_(); }

// torch::optim::Adam(W)::step for each parameter p with gradient g (Adam: g += wd·p; AdamW:
// p *= 1 − lr·wd), step t:
//   m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²;  p −= lr/(1−β1^t) · m / (√v/√(1−β2^t) + ε)
// the same operations in the same order, over flat buffers and parameter lists.
void ForeachAdam::step(const torch::Tensor& ok) {
  torch::NoGradGuard ng;
  const bool conditional = ok.defined();
  torch::Tensor bc1_t, bc2_t;
  double bc1 = 1, bc2 = 1;
  if (conditional) {
    if (!step_count_.defined()) step_count_ = torch::full({}, static_cast<double>(step_), grad_.options().dtype(torch::kDouble));
    step_count_.add_(ok.to(torch::kDouble));
  } else {
    if (step_count_.defined()) throw std::logic_error("ForeachAdam: unconditional step after conditional ones");
    ++step_;
  }
  for (auto& g : groups_) {
    if (g.size == 0) continue;
    const double lr = learning_rate(g.options, decoupled_);
    if (conditional) {
      bc1_t = 1 - torch::pow(g.beta1, step_count_);
      bc2_t = 1 - torch::pow(g.beta2, step_count_);
    } else {
      bc1 = 1 - std::pow(g.beta1, static_cast<double>(step_));
      bc2 = 1 - std::pow(g.beta2, static_cast<double>(step_));
    }
    if (g.weight_decay != 0) {
      if (!decoupled_) {
        at::_foreach_add_(g.grads, g.params, g.weight_decay);
      } else if (conditional) {
        auto keep = g.lr.defined()
                        ? torch::where(ok, (1 - g.lr * g.weight_decay).to(torch::kFloat32), torch::ones({}, grad_.options()))
                        : torch::where(ok, torch::full({}, 1 - lr * g.weight_decay, grad_.options()), torch::ones({}, grad_.options()));
        compat::foreach_mul_(g.params, keep);
      } else {
        at::_foreach_mul_(g.params, 1 - lr * g.weight_decay);
      }
    }
    auto grad = grad_.narrow(0, g.begin, g.size), m = m_.narrow(0, g.begin, g.size), v = v_.narrow(0, g.begin, g.size);
    auto denom = denom_.narrow(0, g.begin, g.size);
    if (!conditional) {
      m.mul_(g.beta1).add_(grad, 1 - g.beta1);
      v.mul_(g.beta2).addcmul_(grad, grad, 1 - g.beta2);
      denom.copy_(v.sqrt() / std::sqrt(bc2)).add_(g.eps);
      at::_foreach_addcdiv_(g.params, g.m, g.denom, -lr / bc1);
      continue;
    }
    auto m_new = m.mul(g.beta1).add_(grad, 1 - g.beta1);
    auto v_new = v.mul(g.beta2).addcmul_(grad, grad, 1 - g.beta2);
    m.copy_(torch::where(ok, m_new, m));
    v.copy_(torch::where(ok, v_new, v));
    // the update, in the denominator's buffer: (lr/bc1 · m) / (√v/√bc2 + ε), 0 where not ok;
    // rounded as addcdiv's p + (−lr/bc1 · m) / denom, so both forms give the same weights
    auto d = (v_new.sqrt() / bc2_t.sqrt()).add_(g.eps);
    denom.copy_(m_new.mul(g.lr.defined() ? g.lr / bc1_t : lr / bc1_t).div_(d)).masked_fill_(ok.logical_not(), 0);
    at::_foreach_sub_(g.params, g.denom);
  }
}

void ForeachAdam::use_device_learning_rates() {
  for (auto& g : groups_)
    if (!g.lr.defined()) g.lr = torch::zeros({}, grad_.options().dtype(torch::kDouble));
  load_learning_rates();
}

void ForeachAdam::load_learning_rates() {
  torch::NoGradGuard ng;
  for (auto& g : groups_)
    if (g.lr.defined()) g.lr.fill_(learning_rate(g.options, decoupled_));
}

void ForeachAdam::export_state() {
  torch::NoGradGuard ng;
  const int64_t step = step_count_.defined() ? std::llround(step_count_.item<double>()) : step_;
  for (auto& g : groups_)
    for (size_t i = 0; i < g.params.size(); ++i) {
      if (decoupled_) write_state<torch::optim::AdamWParamState>(opt_, g.params[i], g.m[i], g.v[i], step);
      else write_state<torch::optim::AdamParamState>(opt_, g.params[i], g.m[i], g.v[i], step);
    }
}

}  // namespace lightseg
