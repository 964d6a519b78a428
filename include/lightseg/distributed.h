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

// Copies rank 0's parameters and buffers to every rank.
void broadcast_model(Collective& c, Network& net, bool buffers = true);

// Gradient averaging over ranks in buckets of ~bucket_bytes. With overlap, a bucket's
// all-reduce starts from autograd hooks as soon as all its gradients exist (while backward
// still runs); otherwise all buckets are reduced after backward.
class GradientSync {
 public:
  GradientSync(Network& net, std::shared_ptr<Collective> c, size_t bucket_bytes = 1 << 20, bool overlap = true);
  ~GradientSync();
  void begin();   // before backward
  void finish();  // after backward: every parameter's .grad() is the mean over ranks
  double seconds() const { return seconds_; }  // time spent in all-reduce calls/waits
  size_t buckets() const { return buckets_.size(); }

 private:
  struct Bucket;
  void reduce_now(Bucket& b);
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<torch::Tensor> params_;
  std::vector<std::pair<size_t, unsigned>> hooks_;
  std::shared_ptr<Collective> c_;
  bool overlap_;
  double seconds_ = 0;
};

// SyncBN: while set, every BatchNorm of the network in training mode normalises with
// statistics summed over all ranks (forward) and reduces its backward sums likewise.
void enable_sync_batchnorm(std::shared_ptr<Collective> c);
void disable_sync_batchnorm();

}  // namespace lightseg
