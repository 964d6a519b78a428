// Every difference between the LibTorch versions lightseg builds against (Debian's 1.13 CPU
// build, pip's 2.x CUDA builds) in one place: the rest of the code calls these names.
//   - autocast: 2.4 replaced the per-device functions (set_cpu_enabled, set_autocast_gpu_dtype)
//     by ones that take the device type;
//   - the optimizers' state map: keyed by the parameter's TensorImpl as text (1.13), as a
//     pointer (2.x);
//   - foreach operations with a tensor scalar and _foreach_copy_ (2.4 has both; before, a loop);
//   - c10d: from 2.0 a process group's collectives live in a c10d::Backend (ProcessGroupGloo
//     and ProcessGroupNCCL derive from it, not from c10d::ProcessGroup).
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#define LIGHTSEG_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace lightseg::compat {

// Autocast to `dtype` on (or off) for one device type (kCPU or kCUDA).
inline void set_autocast(at::DeviceType type, at::ScalarType dtype, bool on) {
#if LIGHTSEG_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(type, dtype);
  at::autocast::set_autocast_enabled(type, on);
#else
  if (type == at::kCUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(on);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(on);
  }
#endif
}

// True when autocast is on for the CPU with bf16.
inline bool autocast_cpu_bf16() {
#if LIGHTSEG_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(at::kCPU) && at::autocast::get_autocast_dtype(at::kCPU) == at::kBFloat16;
#else
  return at::autocast::is_cpu_enabled() && at::autocast::get_autocast_cpu_dtype() == at::kBFloat16;
#endif
}

// The key of parameter p in torch::optim::Optimizer::state(): its TensorImpl's address, as
// text (what c10::guts::to_string made of it in 1.13) or as a pointer.
using OptimizerStateKey = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
template <class Key = OptimizerStateKey>  // (a template: only the branch of this LibTorch is compiled)
Key optimizer_state_key(const at::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;
    s << p.unsafeGetTensorImpl();
    return s.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

// self[i] *= scalar for every i, scalar a 0-dim tensor on the tensors' device (no host sync).
inline void foreach_mul_(std::vector<at::Tensor>& self, const at::Tensor& scalar) {
#if LIGHTSEG_TORCH_AT_LEAST(2, 4)
  at::_foreach_mul_(self, scalar);
#else
  for (auto& t : self) t.mul_(scalar);
#endif
}

// self[i].copy_(src[i]) for every i (one launch on CUDA from 2.4).
inline void foreach_copy_(std::vector<at::Tensor>& self, const std::vector<at::Tensor>& src) {
#if LIGHTSEG_TORCH_AT_LEAST(2, 4)
  at::_foreach_copy_(self, src);
#else
  for (size_t i = 0; i < self.size(); ++i) self[i].copy_(src[i]);
#endif
}

}  // namespace lightseg::compat

// The c10d class whose collectives lightseg calls (see src/distributed/distributed.cpp).
#define LIGHTSEG_C10D_BACKEND_CLASS LIGHTSEG_TORCH_AT_LEAST(2, 0)
