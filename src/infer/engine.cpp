#include "lightseg/engine.h"

#include <stdexcept>

#include "lightseg/transforms.h"

namespace lightseg {

Network clone_network(const Network& net) {
  Network copy(net->config());
  torch::NoGradGuard ng;
  auto src_p = net->named_parameters(true);
  for (auto& p : copy->named_parameters(true)) p.value().copy_(src_p[p.key()]);
  auto src_b = net->named_buffers(true);
  for (auto& b : copy->named_buffers(true)) b.value().copy_(src_b[b.key()]);
  return copy;
}

namespace {

// The training-graph network in eval mode: the reference every faster backend is checked against.
class EagerEngine : public InferenceEngine {
 public:
  EagerEngine(const Network& net, const ModelMeta& meta, torch::Device dev)
      : net_(clone_network(net)), meta_(meta), dev_(dev) {
    net_->eval();
    net_->to(dev_);
    to_channels_last(*net_);
  }
  torch::Tensor logits(const torch::Tensor& images) override {
    c10::InferenceMode guard;
    auto x = normalize(images.to(dev_, torch::kFloat32), meta_).contiguous(torch::MemoryFormat::ChannelsLast);
    return net_->forward(x);
  }
  std::string backend() const override { return "eager"; }
  torch::Device device() const override { return dev_; }

 private:
  Network net_;
  ModelMeta meta_;
  torch::Device dev_;
};

}  // namespace

std::unique_ptr<InferenceEngine> make_engine(const Network& net, const ModelMeta& meta, const std::string& backend,
                                             torch::Device device) {
  if (backend == "auto" || backend == "eager") return std::make_unique<EagerEngine>(net, meta, device);
  throw std::invalid_argument("unknown inference backend '" + backend + "' (expected auto or eager)");
}

}  // namespace lightseg
