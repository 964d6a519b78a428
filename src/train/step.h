// One optimisation step of the training loop (internal): forward (bf16 autocast when asked),
// the loss with the auxiliary heads', backward with the gradient all-reduce, the check for
// non-finite values, and the update or the skip.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "dist/gradient_sync.h"
#include "lightseg/train.h"
#include "train/aux_heads.h"
#include "train/ema.h"

namespace lightseg {

// The BatchNorm running statistics (and every other buffer) of some modules, saved as one
// flat copy per dtype (one kernel each on CUDA, not hundreds) and put back on a skipped step.
class BufferSnapshot {
 public:
  explicit BufferSnapshot(const std::vector<torch::Tensor>& buffers);
  void save();
  void restore();

 private:
  std::map<c10::ScalarType, std::vector<torch::Tensor>> buffers_;
  std::map<c10::ScalarType, torch::Tensor> saved_;
};

struct StepParts {
  const TrainOptions& o;
  torch::Device device;
  Network net;
  AuxHeads aux{nullptr};           // null: no deep supervision
  torch::optim::Optimizer& opt;
  torch::Tensor class_weight;      // undefined: unweighted
  std::shared_ptr<Collective> col; // null: one process
  GradientSync* grad_sync = nullptr;
  WeightsEma* ema = nullptr;
  std::function<void(Network&)> after_backward;
};

struct StepResult {
  bool finite = true;   // false: skipped (no update, buffers restored)
  double loss = 0;      // the main output's loss (without the auxiliary heads')
};

class TrainStep {
 public:
  explicit TrainStep(StepParts parts);
  // One step on a batch already on the device (images normalised).
  StepResult run(const torch::Tensor& images, const torch::Tensor& labels);

 private:
  torch::Tensor criterion(const torch::Tensor& logits, const torch::Tensor& labels) const;
  void average_aux_gradients();
  bool all_finite(const torch::Tensor& loss);
  StepParts p_;
  BufferSnapshot buffers_;
};

// bf16 autocast on (or off) for a device type; the API moved in LibTorch 2.4.
void set_autocast(at::DeviceType type, bool on);

}  // namespace lightseg
