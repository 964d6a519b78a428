#include "lightseg/model/init_module.h"

namespace lightseg::model {

// C1.1: CBA(3,2) in→C0, CBA(3,1) C0→C0, CBA(3,1) C0→C0.
InitModuleImpl::InitModuleImpl(int64_t in_channels, int64_t c0)
    : conv1(register_module("conv1", ConvBNAct(ConvSpec::square(in_channels, c0, 3, 2)))),
      conv2(register_module("conv2", ConvBNAct(ConvSpec::square(c0, c0, 3, 1)))),
      conv3(register_module("conv3", ConvBNAct(ConvSpec::square(c0, c0, 3, 1)))) {}

torch::Tensor InitModuleImpl::forward(const torch::Tensor& image) {
  return conv3->forward(conv2->forward(conv1->forward(image)));
}

}  // namespace lightseg::model
