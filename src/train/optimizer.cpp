#include "train/optimizer.h"

#include <functional>

#include "core/torch_compat.h"

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

}  // namespace lightseg
