// Adam / AdamW with torch::optim's maths and state, in a handful of kernels per step instead of
// several per parameter (TrainOptions::fused_optimizer; the default on CUDA).
//
// The gradients of all parameters live in one flat buffer (each parameter's .grad() is a view
// of it with the parameter's strides; autograd accumulates into it), and so do the two moments.
// The updates run over those buffers, and over the parameters with at::_foreach_* operations.
// The state stays the optimizer's: read from it on construction (a resumed run), written back by
// export_state() before the optimizer is serialized, so checkpoints are those of the
// unfused optimizer and either form resumes the other's.
//
// A step whose `ok` flag (a 0-dim bool tensor on the device) is false changes nothing: not the
// parameters, not the moments, not the step count. That decision needs no host synchronisation.
#pragma once

#include <vector>

#include <torch/torch.h>

namespace lightseg {

class ForeachAdam {
 public:
  // opt: a torch::optim::Adam (decoupled false) or AdamW (true), without amsgrad, all of whose
  // parameters are dense float32 tensors on one device. Throws std::invalid_argument otherwise,
  // and when the optimizer's state holds different step counts.
  ForeachAdam(torch::optim::Optimizer& opt, bool decoupled);
  ForeachAdam(const ForeachAdam&) = delete;
  ForeachAdam& operator=(const ForeachAdam&) = delete;

  void zero_grad();                       // every gradient 0 (one kernel)
  const torch::Tensor& flat_grad() const { return grad_; }
  // One update at the groups' current learning rates. ok undefined: always; else only where
  // ok is true (the step count then lives on the device until export_state()).
  void step(const torch::Tensor& ok = {});
  // Writes step, exp_avg and exp_avg_sq into the optimizer's state (before serialising it).
  void export_state();
  // Conditional steps read each group's learning rate from a 0-dim tensor on the device,
  // which load_learning_rates() fills from the groups' options (outside the step): a step that
  // is replayed (a CUDA graph) then follows the schedule. Same values, same rounding.
  void use_device_learning_rates();
  void load_learning_rates();

 private:
  struct Group {
    std::vector<torch::Tensor> params, grads, m, v, denom;  // grads, m, v, denom: views of the flat buffers
    int64_t begin = 0, size = 0;
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
    torch::optim::OptimizerOptions* options = nullptr;
    torch::Tensor lr;  // 0-dim double on the device (use_device_learning_rates), else undefined
  };
  torch::optim::Optimizer& opt_;
  bool decoupled_;
  std::vector<Group> groups_;
  torch::Tensor grad_, m_, v_, denom_;
  int64_t step_ = 0;          // steps taken (unconditional steps)
  torch::Tensor step_count_;  // steps taken, on the device (conditional steps); undefined until one
};

}  // namespace lightseg
