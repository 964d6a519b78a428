// The training side of data parallelism (internal): rank 0's weights everywhere, bucketed
// gradient all-reduce, and the process-wide SyncBN hook.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "lightseg/distributed.h"
#include "lightseg/network.h"

namespace lightseg {

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
