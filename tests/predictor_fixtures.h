// Shared by the predictor, segment and serve tests: a randomly initialised network whose
// label maps vary over the image, saved to a temporary weights file.
#pragma once

#include <filesystem>
#include <string>

#include "lightseg/network.h"
#include "lightseg/weights.h"
#include "synthetic.h"

namespace lightseg::fixtures {

// A random network whose classifier (C1.11, decoder.pw6) is scaled up so that the features,
// not the biases, decide: several classes win somewhere, and they follow the image's content
// (an untrained network otherwise predicts one class almost everywhere).
inline Network random_network(uint64_t seed = 7) {
  torch::manual_seed(seed);
  Network net(NetworkConfig{});
  torch::NoGradGuard ng;
  bool scaled = false;
  for (auto& p : net->named_parameters(true))
    if (p.key().find("decoder.pw6") == 0 && p.key().size() > 7 && p.key().substr(p.key().size() - 7) == ".weight") {
      p.value().mul_(50);
      scaled = true;
    }
  if (!scaled) throw std::logic_error("random_network: the classifier decoder.pw6 was not found");
  net->eval();
  return net;
}

// Saves random_network(seed) with CamVid's metadata to DIR/random.lsw and returns the path.
inline std::string random_weights(const std::filesystem::path& dir, uint64_t seed = 7) {
  Network net = random_network(seed);
  const std::string path = (dir / "random.lsw").string();
  save_network(path, net, ModelMeta::camvid());
  return path;
}

// Tests use small images, for which one intra-op thread is as fast as many; it also keeps
// ctest -j from oversubscribing the cores (OpenMP teams that wait on each other).
inline void one_thread() { torch::set_num_threads(1); }

// Fraction of equal elements of two equally shaped tensors.
inline double agreement(const torch::Tensor& a, const torch::Tensor& b) {
  return a.eq(b).to(torch::kFloat64).mean().item<double>();
}

}  // namespace lightseg::fixtures
