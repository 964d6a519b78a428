#include "train/optimizer.h"

#include <functional>

#include "core/torch_compat.h"
#include "train/archive_bytes.h"

namespace lightseg {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainOptions& o, Network& net, const AuxHeads& aux) {
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : net->named_parameters()) (p.value().dim() > 1 || o.bn_weight_decay ? decay : no_decay).push_back(p.value());
  if (aux)
    for (auto& p : aux->parameters()) (p.dim() > 1 || o.bn_weight_decay ? decay : no_decay).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (o.optimizer == "sgd") {
    auto opts = [&](double wd) {
      return torch::optim::SGDOptions(o.lr).momentum(o.momentum).nesterov(o.nesterov).weight_decay(wd);
    };
    groups.emplace_back(decay, std::make_unique<torch::optim::SGDOptions>(opts(o.weight_decay)));
    groups.emplace_back(no_decay, std::make_unique<torch::optim::SGDOptions>(opts(0)));
    return std::make_unique<torch::optim::SGD>(groups, opts(0));
  }
  if (o.optimizer == "adamw") {
    auto opts = [&](double wd) { return torch::optim::AdamWOptions(o.lr).weight_decay(wd); };
    groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(opts(o.weight_decay)));
    groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(opts(0)));
    return std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(o.lr));
  }
  auto opts = [&](double wd) { return torch::optim::AdamOptions(o.lr).weight_decay(wd); };
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamOptions>(opts(o.weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamOptions>(opts(0)));
  return std::make_unique<torch::optim::Adam>(groups, torch::optim::AdamOptions(o.lr));
}

void set_learning_rate(torch::optim::Optimizer& opt, double lr) {
  for (auto& g : opt.param_groups()) g.options().set_lr(lr);
}

namespace {

// Calls f(param, state) for every parameter with Adam or AdamW state.
template <class F>
void for_each_adam_state(torch::optim::Optimizer& opt, F f) {
  for (auto& g : opt.param_groups())
    for (auto& p : g.params()) {
      auto it = opt.state().find(compat::optimizer_state_key(p));
      if (it == opt.state().end()) continue;
      if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) f(p, *a);
      else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) f(p, *w);
    }
}

}  // namespace

std::string compact_optimizer_bytes(torch::optim::Optimizer& opt) {
  struct Kept {
    std::function<void()> restore;
  };
  std::vector<Kept> kept;
  for_each_adam_state(opt, [&](const torch::Tensor&, auto& s) {
    torch::Tensor m = s.exp_avg(), v = s.exp_avg_sq();
    if (!m.defined() || !v.defined()) return;
    kept.push_back({[&s, m, v] {
      s.exp_avg(m);
      s.exp_avg_sq(v);
    }});
    s.exp_avg(torch::empty({0}, m.options()));
    s.exp_avg_sq(v.to(torch::kBFloat16));
  });
  std::string bytes;
  try {
    bytes = to_archive_bytes(opt);
  } catch (...) {
    for (auto& k : kept) k.restore();
    throw;
  }
  for (auto& k : kept) k.restore();
  return bytes;
}

int64_t expand_optimizer_state(torch::optim::Optimizer& opt) {
  torch::NoGradGuard ng;
  int64_t restarted = 0;
  for_each_adam_state(opt, [&](const torch::Tensor& p, auto& s) {
    const auto as_param = p.options().dtype(torch::kFloat32);
    if (s.exp_avg().defined() && s.exp_avg().numel() == 0 && p.numel() > 0) {
      s.exp_avg(torch::zeros_like(p, as_param));
      ++restarted;
    } else if (s.exp_avg().defined() && s.exp_avg().scalar_type() != torch::kFloat32) {
      s.exp_avg(s.exp_avg().to(as_param));
    }
    if (s.exp_avg_sq().defined() && s.exp_avg_sq().scalar_type() != torch::kFloat32)
      s.exp_avg_sq(s.exp_avg_sq().to(as_param));
  });
  return restarted;
}

}  // namespace lightseg
