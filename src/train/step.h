// One optimisation step of the training loop (internal): forward (bf16 autocast when asked),
// the loss with the auxiliary heads', backward with the gradient all-reduce, the check for
// non-finite values, and the update or the skip.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "distributed/gradient_sync.h"
#include "lightseg/train.h"
#include "train/aux_heads.h"
#include "train/ema.h"
#include "train/foreach_adam.h"

namespace lightseg {

// The BatchNorm running statistics (and every other buffer) of some modules, saved into one
// flat copy per dtype (one multi-tensor copy each on CUDA, not hundreds of kernels) and put back
// on a skipped step.
class BufferSnapshot {
 public:
  explicit BufferSnapshot(const std::vector<torch::Tensor>& buffers);
  void save();
  void restore();
  // restore() where ok (a 0-dim bool tensor on the device) is false, without reading it.
  void restore_unless(const torch::Tensor& ok);

 private:
  std::map<c10::ScalarType, std::vector<torch::Tensor>> buffers_;
  std::map<c10::ScalarType, torch::Tensor> saved_, now_;                    // flat, per dtype
  std::map<c10::ScalarType, std::vector<torch::Tensor>> saved_views_, now_views_;  // one per buffer
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
  ForeachAdam* fused = nullptr;    // set: the optimizer's steps through it (opt is its state)
  // With `fused`, no EMA and one process: the non-finite check decided on the device, read by
  // take_totals() (no host synchronisation per step).
  bool deferred = false;
  Network teacher{nullptr};        // set: knowledge distillation from it (eval mode, no gradients)
};

struct StepResult {
  bool finite = true;   // false: skipped (no update, buffers restored)
  double loss = 0;      // the main output's loss (without the auxiliary heads')
};

// What deferred steps did since the last take_totals().
struct StepTotals {
  int64_t steps = 0, finite = 0;   // steps run; with a finite loss and gradients (applied)
  double loss_sum = 0;             // the main output's losses of the finite steps
  int64_t max_skips_in_row = 0;    // the longest run of skipped steps (counted across calls)
};

class TrainStep {
 public:
  explicit TrainStep(StepParts parts);
  // One step on a batch already on the device (images normalised). Deferred: the result's
  // loss is not read (NaN); see take_totals().
  StepResult run(const torch::Tensor& images, const torch::Tensor& labels);
  bool deferred() const { return p_.deferred; }
  // Deferred steps: reads (one synchronisation) and resets the device-side sums.
  StepTotals take_totals();

 private:
  torch::Tensor criterion(const torch::Tensor& logits, const torch::Tensor& labels) const;
  void average_aux_gradients();
  bool all_finite(const torch::Tensor& loss);
  void zero_grad();
  StepParts p_;
  BufferSnapshot buffers_;
  torch::Tensor loss_sum_, finite_, steps_, run_, max_run_;  // deferred sums (device)
};

// bf16 autocast on (or off) for a device type; the API moved in LibTorch 2.4.
void set_autocast(at::DeviceType type, bool on);

}  // namespace lightseg
