#include "train/step.h"

#include <cmath>

#include "core/torch_compat.h"
#include "train/losses.h"

namespace lightseg {

void set_autocast(at::DeviceType type, bool on) {
  compat::set_autocast(type, at::kBFloat16, on);
  if (!on) at::autocast::clear_cache();
}

BufferSnapshot::BufferSnapshot(const std::vector<torch::Tensor>& buffers) {
  torch::NoGradGuard ng;
  for (const auto& b : buffers) buffers_[b.scalar_type()].push_back(b);
  for (auto& [type, bs] : buffers_) {
    int64_t n = 0;
    for (const auto& b : bs) n += b.numel();
    auto opts = bs.front().options().requires_grad(false);
    saved_[type] = torch::empty({n}, opts);
    now_[type] = torch::empty({n}, opts);
    int64_t off = 0;
    for (const auto& b : bs) {
      saved_views_[type].push_back(saved_[type].narrow(0, off, b.numel()).view(b.sizes()));
      now_views_[type].push_back(now_[type].narrow(0, off, b.numel()).view(b.sizes()));
      off += b.numel();
    }
  }
}

void BufferSnapshot::save() {
  torch::NoGradGuard ng;
  for (auto& [type, bs] : buffers_) compat::foreach_copy_(saved_views_[type], bs);
}

void BufferSnapshot::restore() {
  torch::NoGradGuard ng;
  for (auto& [type, bs] : buffers_) compat::foreach_copy_(bs, saved_views_[type]);
}

void BufferSnapshot::restore_unless(const torch::Tensor& ok) {
  torch::NoGradGuard ng;
  for (auto& [type, bs] : buffers_) {
    compat::foreach_copy_(now_views_[type], bs);
    now_[type].copy_(torch::where(ok, now_[type], saved_[type]));
    compat::foreach_copy_(bs, now_views_[type]);
  }
}

namespace {
std::vector<torch::Tensor> all_buffers(Network& net, const AuxHeads& aux) {
  auto bs = net->buffers();
  if (aux)
    for (const auto& b : aux->buffers()) bs.push_back(b);
  return bs;
}
}  // namespace

TrainStep::TrainStep(StepParts parts) : p_(std::move(parts)), buffers_(all_buffers(p_.net, p_.aux)) {}

torch::Tensor TrainStep::criterion(const torch::Tensor& z, const torch::Tensor& y) const {
  return p_.o.loss == "ohem" ? ohem_cross_entropy(z, y, p_.o.ohem_thresh, p_.o.ohem_min_kept, p_.class_weight)
                             : weighted_cross_entropy(z, y, p_.class_weight);
}

// The heads' gradients are not in GradientSync's buckets: they are averaged here.
void TrainStep::average_aux_gradients() {
  torch::NoGradGuard ng;
  std::vector<torch::Tensor> gs, parts;
  for (auto& p : p_.aux->parameters())
    if (p.grad().defined()) gs.push_back(p.grad());
  for (auto& g : gs) parts.push_back(g.reshape(-1));
  if (parts.empty()) return;
  auto flat = torch::cat(parts);
  p_.col->allreduce_sum(flat);
  flat.div_(p_.col->world());
  int64_t off = 0;
  for (auto& g : gs) {
    g.copy_(flat.narrow(0, off, g.numel()).view(g.sizes()));
    off += g.numel();
  }
}

// The loss and every gradient finite, on all ranks (they skip together).
bool TrainStep::all_finite(const torch::Tensor& loss) {
  torch::NoGradGuard ng;
  std::vector<torch::Tensor> grads;
  for (const auto& p : p_.net->parameters())
    if (p.grad().defined()) grads.push_back(p.grad());
  if (p_.aux)
    for (const auto& p : p_.aux->parameters())
      if (p.grad().defined()) grads.push_back(p.grad());
  torch::Tensor sum = loss.detach().to(torch::kFloat32).reshape({});
  if (!grads.empty()) sum = sum + torch::stack(at::_foreach_norm(grads)).sum().to(torch::kFloat32);
  if (!p_.col) return std::isfinite(sum.item<double>());
  auto t = torch::tensor({std::isfinite(sum.item<double>()) ? 0.0 : 1.0}, torch::kDouble);
  p_.col->allreduce_sum(t);
  return t.item<double>() == 0;
}

void TrainStep::zero_grad() {
  if (p_.fused) p_.fused->zero_grad();  // (torch's zero_grad would free the flat gradient's views)
  else p_.opt.zero_grad();
}

StepTotals TrainStep::take_totals() {
  StepTotals t;
  if (!steps_.defined()) return t;
  auto v = torch::stack({loss_sum_, finite_, steps_, max_run_}).to(torch::kCPU);
  auto a = v.accessor<double, 1>();
  t.loss_sum = a[0];
  t.finite = std::llround(a[1]);
  t.steps = std::llround(a[2]);
  t.max_skips_in_row = std::llround(a[3]);
  loss_sum_.zero_();
  finite_.zero_();
  steps_.zero_();
  max_run_.copy_(run_);
  return t;
}

StepResult TrainStep::run(const torch::Tensor& x, const torch::Tensor& y) {
  buffers_.save();
  torch::Tensor logits, aux1, aux2, teacher;
  {
    const bool amp = p_.device.is_cuda() ? p_.o.amp : p_.o.amp_cpu;
    if (amp) set_autocast(p_.device.type(), true);
    if (p_.aux) {  // one pass; the heads read the semantic branches' outputs M1, M2
      auto b = p_.net->forward_with_branches(x);
      logits = b.logits;
      std::tie(aux1, aux2) = p_.aux->forward(b.M1, b.M2, y.size(1), y.size(2));
    } else {
      logits = p_.net->forward(x);
    }
    if (p_.teacher) {
      torch::NoGradGuard ng;
      teacher = p_.teacher->forward(x);
    }
    if (amp) {
      set_autocast(p_.device.type(), false);
      logits = logits.to(torch::kFloat32);
      if (p_.teacher) teacher = teacher.to(torch::kFloat32);
      if (p_.aux) {
        aux1 = aux1.to(torch::kFloat32);
        aux2 = aux2.to(torch::kFloat32);
      }
    }
  }
  // `loss` is what is optimised; the main output's loss alone is reported, comparable
  // between runs with and without the auxiliary heads.
  torch::Tensor main_loss = criterion(logits, y);
  torch::Tensor loss = p_.aux ? main_loss + p_.o.aux_weight * (criterion(aux1, y) + criterion(aux2, y)) : main_loss;
  if (p_.teacher) loss = loss + p_.o.distill_weight * distillation_loss(logits, teacher, y, p_.o.distill_temperature);
  zero_grad();
  if (p_.grad_sync) p_.grad_sync->begin();
  loss.backward();
  if (p_.grad_sync) p_.grad_sync->finish();
  if (p_.col && p_.aux) average_aux_gradients();
  if (p_.after_backward) p_.after_backward(p_.net);
  StepResult r;
  if (p_.deferred) {  // decided and summed on the device
    torch::NoGradGuard ng;
    auto ok = torch::isfinite(loss.detach()).logical_and(torch::isfinite(p_.fused->flat_grad()).all());
    p_.fused->step(ok);
    buffers_.restore_unless(ok);
    auto okd = ok.to(torch::kDouble);
    if (!steps_.defined()) {
      auto z = torch::zeros({}, okd.options());
      loss_sum_ = z.clone(), finite_ = z.clone(), steps_ = z.clone(), run_ = z.clone(), max_run_ = z.clone();
    }
    loss_sum_.add_(torch::where(ok, main_loss.detach().to(torch::kDouble), torch::zeros_like(okd)));
    finite_.add_(okd);
    steps_.add_(1);
    run_.add_(1).mul_(1 - okd);
    max_run_.copy_(torch::maximum(max_run_, run_));
    r.loss = std::nan("");
    return r;
  }
  r.finite = all_finite(loss);
  if (r.finite) {
    if (p_.fused) p_.fused->step();
    else p_.opt.step();
    if (p_.ema) p_.ema->update();
  } else {
    buffers_.restore();
    zero_grad();
  }
  r.loss = main_loss.item<double>();
  return r;
}

}  // namespace lightseg
