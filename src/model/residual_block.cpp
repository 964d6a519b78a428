#include "lightseg/model/residual_block.h"

namespace lightseg::model {

ResidualBlockImpl::ResidualBlockImpl(int64_t c, int64_t d)
    : conv1(register_module("conv1", make_conv(ConvSpec::square(c, c, 3, 1, d)))),
      conv2(register_module("conv2", make_conv(ConvSpec::square(c, c, 3)))),
      bn1(register_module("bn1", BNAct(c, /*act=*/false))),
      bn2(register_module("bn2", BNAct(c, /*act=*/false))) {}

torch::Tensor ResidualBlockImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = torch::relu(bn1->forward(conv(conv1, x)));
  y = bn2->forward(conv(conv2, y));
  return torch::relu(y + x);
}

}  // namespace lightseg::model
