// The training step replayed as a CUDA graph (internal; TrainOptions::cuda_graph). The
// deferred step (train/step.h: fused optimizer, the non-finite check and the loss sums on the
// device, no host synchronisation) is captured once with its inputs in fixed buffers; each
// later step copies the batch into them, loads the learning rate into the optimizer's device
// copy, and replays the graph: one launch instead of ~2,000 kernels of a small network.
//
// On the CPU (or a LibTorch without CUDA graphs) the same form runs without the capture: fixed
// buffers, the device learning rate, the step called as it would be captured. So the CPU
// tests check everything but the capture itself against the plain deferred step.
#pragma once

#include <memory>
#include <string>

#include <torch/torch.h>

#include "train/foreach_adam.h"
#include "train/step.h"

namespace lightseg {

// Why the step cannot be captured with these options (empty: it can): a CUDA graph needs the
// deferred step, a loss without data-dependent shapes (not OHEM) and no per-step callback.
std::string graph_step_unavailable(const TrainOptions& o, bool deferred, bool has_after_backward);

// Whether this build can capture CUDA graphs (a LibTorch with CUDA: LIGHTSEG_HAVE_TORCH_CUDA).
bool cuda_graphs_compiled();

class GraphedStep {
 public:
  // step: a deferred TrainStep whose optimizer is `fused`. The first warmup_steps calls run it
  // eagerly (cuDNN's choices, lazily made state), then it is captured.
  GraphedStep(TrainStep& step, ForeachAdam& fused, int warmup_steps = 3);
  ~GraphedStep();
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  // One step on this batch (on the device). A batch of another shape than the captured one
  // runs the eager step. The optimizer's learning rate: the groups' options, as for step.run().
  void run(const torch::Tensor& images, const torch::Tensor& labels);

  // "captured" (a CUDA graph replays), "eager" (CPU, not compiled, or the capture failed: then
  // failure() says why), or "warming up".
  std::string state() const;
  const std::string& failure() const { return failure_; }
  int64_t replays() const { return replays_; }

 private:
  void capture(const torch::Tensor& images, const torch::Tensor& labels);
  TrainStep& step_;
  ForeachAdam& fused_;
  int warmup_;
  int64_t calls_ = 0, replays_ = 0;
  torch::Tensor x_, y_;  // the captured step's inputs
  bool captured_ = false, given_up_ = false;
  std::string failure_;
  struct Graph;  // at::cuda::CUDAGraph where compiled
  std::unique_ptr<Graph> graph_;
};

}  // namespace lightseg
