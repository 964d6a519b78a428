#include "train/losses.h"

#include <stdexcept>

#include <algorithm>

#include "train/fused_cross_entropy.h"

namespace lightseg {

namespace F = torch::nn::functional;

torch::Tensor weighted_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                                     const torch::Tensor& weight) {
  if (fused_cross_entropy_enabled() && logits.dim() == 4 && logits.device().is_cpu() &&
      logits.scalar_type() == torch::kFloat32)
    return fused_cross_entropy(logits, target, weight, 255);
  auto o = F::CrossEntropyFuncOptions().ignore_index(255);
  if (weight.defined()) o.weight(weight.to(logits.device(), logits.scalar_type()));
  return F::cross_entropy(logits, target, o);
}

torch::Tensor ohem_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target, double thresh,
                                 double min_kept_frac, const torch::Tensor& weight) {
  auto o = F::CrossEntropyFuncOptions().ignore_index(255).reduction(torch::kNone);
  if (weight.defined()) o.weight(weight.to(logits.device(), logits.scalar_type()));
  torch::Tensor ce = F::cross_entropy(logits, target, o).reshape(-1);
  torch::Tensor valid = (target != 255).reshape(-1);
  const int64_t n_valid = valid.sum().item<int64_t>();
  if (n_valid == 0) return (logits * 0).sum();
  torch::Tensor prob;
  {
    torch::NoGradGuard ng;
    auto t = target.clamp_max(logits.size(1) - 1).unsqueeze(1);
    prob = torch::softmax(logits.detach(), 1).gather(1, t).reshape(-1);
  }
  torch::Tensor hard = valid & (prob < thresh);
  const int64_t min_kept = std::max<int64_t>(1, static_cast<int64_t>(n_valid * min_kept_frac));
  if (hard.sum().item<int64_t>() < min_kept) {
    // keep the min_kept valid pixels with the lowest target probability
    auto p = prob.masked_fill(~valid, 2.0);
    auto kth = std::get<0>(p.kthvalue(min_kept));
    hard = valid & (p <= kth);
  }
  return ce.masked_select(hard).mean();
}

torch::Tensor distillation_loss(const torch::Tensor& student, const torch::Tensor& teacher, const torch::Tensor& target,
                                double temperature) {
  if (student.sizes() != teacher.sizes())
    throw std::invalid_argument("distillation: the teacher's logits are " + c10::str(teacher.sizes()) +
                                ", the student's " + c10::str(student.sizes()));
  const double T = temperature;
  auto log_s = torch::log_softmax(student / T, 1);
  auto log_t = torch::log_softmax(teacher.detach() / T, 1);
  auto kl = (log_t.exp() * (log_t - log_s)).sum(1);  // N×H×W
  auto valid = (target != 255).to(kl.scalar_type());
  return T * T * (kl * valid).sum() / valid.sum().clamp_min(1);
}

}  // namespace lightseg
