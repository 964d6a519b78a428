#include "lightseg/network.h"
#include "model/hooks.h"

#include <map>
#include <stdexcept>

namespace lightseg {

torch::Tensor adder(const torch::Tensor& M, const torch::Tensor& s) { return M + s; }

NetworkImpl::NetworkImpl(const NetworkConfig& cfg) : config_(cfg) {
  config_.validate();
  const auto& c = config_;
  init = register_module("init", model::InitModule(c.in_channels, c.c0));
  spatial = register_module("spatial", model::SpatialBranch(c.c0));
  semantic1 = register_module("semantic1", model::SemanticBranch(c.c0, c.c1, c.stage1, c.feb_ratio));
  semantic2 = register_module("semantic2", model::SemanticBranch(c.c1, c.c2, c.stage2, c.feb_ratio));
  decoder = register_module("decoder", model::FusionDecoder(c.c0, c.c1, c.c2, c.num_classes, c.spatial_attention));
}

static void check_input(const torch::Tensor& x, int64_t channels) {
  if (x.dim() != 4 || x.size(1) != channels)
    throw std::invalid_argument("network input must be N×" + std::to_string(channels) + "×H×W, got " +
                                c10::str(x.sizes()));
  if (x.size(2) < 32 || x.size(3) < 32)
    throw std::invalid_argument("network input must be at least 32×32, got " + std::to_string(x.size(2)) + "×" +
                                std::to_string(x.size(3)));
}

NetworkOutputs NetworkImpl::forward_debug(const torch::Tensor& x, const model::StageHook& hook) {
  check_input(x, config_.in_channels);
  auto step = [&](const char* name, const torch::Tensor& t) {
    if (hook) hook(name, t);
  };
  NetworkOutputs o;
  o.F1 = init->forward(x);  // C1.1
  step("init", o.F1);
  // C1.2 / claim 2: spatial branch, computed sub-branch by sub-branch for the cost table.
  o.S1 = spatial->conv1->forward(o.F1);
  o.s1 = model::conv(spatial->compress1, o.S1);
  step("spatial.sub1", o.s1);
  o.S2 = spatial->conv2->forward(o.S1);
  o.s2 = model::conv(spatial->compress2, o.S2);
  step("spatial.sub2", o.s2);
  auto b1 = semantic1->forward_debug(o.F1);  // C1.3
  o.D1 = b1.D;
  o.E1 = b1.E;
  o.M1 = b1.M;
  step("semantic1", o.M1);
  o.A1 = adder(o.M1, o.s1);  // C1.4 first adder
  step("adder1", o.A1);
  auto b2 = semantic2->forward_debug(o.A1);  // C1.5
  o.D2 = b2.D;
  o.E2 = b2.E;
  o.M2 = b2.M;
  step("semantic2", o.M2);
  o.A2 = adder(o.M2, o.s2);  // C1.6 second adder
  step("adder2", o.A2);
  auto d = decoder->forward_debug(o.F1, o.A1, o.A2, x.size(2), x.size(3), hook);  // C1.7–C1.11
  o.X1 = d.X1;
  o.X2 = d.X2;
  o.X3 = d.X3;
  o.mask = d.mask;
  o.SA = d.SA;
  o.F = d.F;
  o.logits = d.logits;
  return o;
}

torch::Tensor NetworkImpl::forward(const torch::Tensor& x) {
  check_input(x, config_.in_channels);
  torch::Tensor F1 = init->forward(x);
  model::SpatialOutputs s = spatial->forward(F1);
  torch::Tensor A1 = adder(semantic1->forward(F1), s.s1);
  torch::Tensor A2 = adder(semantic2->forward(A1), s.s2);
  return decoder->forward(F1, A1, A2, x.size(2), x.size(3));
}

// The same ops as forward() in the same order (so a run trains identically with or without
// the branch outputs being kept); used by the trainer's auxiliary heads (--aux-weight).
BranchOutputs NetworkImpl::forward_with_branches(const torch::Tensor& x) {
  check_input(x, config_.in_channels);
  BranchOutputs o;
  torch::Tensor F1 = init->forward(x);                 // C1.1
  model::SpatialOutputs s = spatial->forward(F1);      // C1.2
  o.M1 = semantic1->forward(F1);                       // C1.3
  torch::Tensor A1 = adder(o.M1, s.s1);                // C1.4
  o.M2 = semantic2->forward(A1);                       // C1.5
  torch::Tensor A2 = adder(o.M2, s.s2);                // C1.6
  o.logits = decoder->forward(F1, A1, A2, x.size(2), x.size(3));  // C1.7–C1.11
  return o;
}

int64_t count_parameters(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

std::vector<ModuleCost> profile(Network& net, int64_t h, int64_t w) {
  const bool was_training = net->is_training();
  net->eval();
  torch::NoGradGuard ng;
  auto& dec = net->decoder;
  auto& sp = net->spatial;
  const std::map<std::string, std::pair<std::string, int64_t>> parts = {
      {"init", {"C1.1", count_parameters(*net->init)}},
      {"spatial.sub1", {"C2.1-C2.2", count_parameters(*sp->conv1) + count_parameters(*sp->compress1)}},
      {"spatial.sub2", {"C2.3-C2.4", count_parameters(*sp->conv2) + count_parameters(*sp->compress2)}},
      {"semantic1", {"C1.3", count_parameters(*net->semantic1)}},
      {"adder1", {"C1.4", 0}},
      {"semantic2", {"C1.5", count_parameters(*net->semantic2)}},
      {"adder2", {"C1.6", 0}},
      {"decoder.dsconv1", {"C1.7", count_parameters(*dec->dw3) + count_parameters(*dec->pw3)}},
      {"decoder.dsconv2", {"C1.8", count_parameters(*dec->dw4) + count_parameters(*dec->pw4)}},
      {"decoder.pw5_up", {"C1.9", count_parameters(*dec->pw5)}},
      {"decoder.attention", {"C6.1,C7", dec->attention ? count_parameters(*dec->attention) : 0}},
      {"decoder.fuse", {"C1.10", 0}},
      {"decoder.classifier", {"C1.11", count_parameters(*dec->pw6)}},
  };
  std::vector<ModuleCost> rows;
  model::MacCounter::enabled() = true;
  model::MacCounter::total() = 0;
  uint64_t last = 0;
  try {
    net->forward_debug(torch::zeros({1, net->config().in_channels, h, w}),
                       [&](const char* name, const torch::Tensor& out) {
                         ModuleCost r;
                         r.name = name;
                         auto it = parts.find(name);
                         if (it != parts.end()) {
                           r.claim = it->second.first;
                           r.params = it->second.second;
                         }
                         r.out = out.sizes().vec();
                         r.macs = model::MacCounter::total() - last;
                         last = model::MacCounter::total();
                         rows.push_back(r);
                       });
  } catch (...) {
    model::MacCounter::enabled() = false;
    throw;
  }
  model::MacCounter::enabled() = false;
  if (was_training) net->train();
  return rows;
}

void to_channels_last(torch::nn::Module& m) {
  torch::NoGradGuard ng;
  for (auto& p : m.parameters())
    if (p.dim() == 4) p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
}

}  // namespace lightseg
