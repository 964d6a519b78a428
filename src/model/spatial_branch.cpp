#include "lightseg/model/spatial_branch.h"

namespace lightseg::model {

SpatialBranchImpl::SpatialBranchImpl(int64_t c0)
    : conv1(register_module("conv1", ConvBNAct(ConvSpec::square(c0, c0, 3, 2)))),           // C2.1
      compress1(register_module("compress1", make_conv(ConvSpec::pointwise(c0, 1, true)))),  // C2.2
      conv2(register_module("conv2", ConvBNAct(ConvSpec::square(c0, c0, 3, 2)))),           // C2.3
      compress2(register_module("compress2", make_conv(ConvSpec::pointwise(c0, 1, true)))) {}  // C2.4

SpatialOutputs SpatialBranchImpl::forward(const torch::Tensor& F1) {
  SpatialOutputs o;
  o.S1 = conv1->forward(F1);       // C2.1: first spatial-information map, H/4
  o.s1 = conv(compress1, o.S1);    // C2.2: 1 channel
  o.S2 = conv2->forward(o.S1);     // C2.3: reads S1 (not s1), H/8
  o.s2 = conv(compress2, o.S2);    // C2.4: 1 channel
  return o;
}

}  // namespace lightseg::model
