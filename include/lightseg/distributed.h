// lightseg: data-parallel training across processes and machines on top of PyTorch's c10d
// (ProcessGroupGloo on CPU, ProcessGroupNCCL on CUDA when the LibTorch build has it).
//
// Rendezvous through c10d's TCPStore at MASTER_ADDR:MASTER_PORT; the environment variables
// are torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so existing
// cluster launchers work. GLOO_SOCKET_IFNAME picks the network interface, as in PyTorch.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "lightseg/network.h"

namespace lightseg {

struct DistConfig {
  int rank = 0, world = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  std::string backend = "auto";  // auto (gloo on CPU, nccl on CUDA) | gloo | nccl
  // Fills the fields from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT when set.
  static DistConfig from_env();
  bool enabled() const { return world > 1; }
};

// A process group: the few collectives lightseg needs. Calls block until done (or throw
// after the timeout / when a peer is gone).
class Collective {
 public:
  virtual ~Collective() = default;
  static std::shared_ptr<Collective> create(const DistConfig& cfg, torch::Device device);
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual std::string backend() const = 0;
  virtual void allreduce_sum(torch::Tensor& t) = 0;  // in place, on every rank
  // Starts an all-reduce; the returned handle's wait() completes it.
  struct Pending {
    virtual ~Pending() = default;
    virtual void wait() = 0;
  };
  virtual std::unique_ptr<Pending> allreduce_sum_async(torch::Tensor& t) = 0;
  virtual void broadcast(torch::Tensor& t, int root = 0) = 0;
  virtual void barrier() = 0;
};

// The c10d backends this build can create ("gloo", "nccl"; empty when built without
// distributed training, -DLIGHTSEG_WITH_DISTRIBUTED=OFF).
std::vector<std::string> distributed_backends();

}  // namespace lightseg
