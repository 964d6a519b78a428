#include "lightseg/model/spatial_attention.h"

namespace lightseg::model {

SpatialAttentionImpl::SpatialAttentionImpl(int64_t c1)
    : pw7(register_module("pw7", ConvBNAct(ConvSpec::pointwise(c1, c1)))),
      conv3d(register_module("conv3d", make_conv(ConvSpec::square(c1, 1, 3, 1, 1, 1, /*bias=*/true)))) {}

AttentionOutputs SpatialAttentionImpl::forward_debug(const torch::Tensor& X1) {
  AttentionOutputs o;
  o.mask = torch::sigmoid(conv(conv3d, pw7->forward(X1)));  // C7.1, C7.2, C7.3
  o.SA = X1 * o.mask;                                       // C7.4 (mask broadcast over channels)
  return o;
}

}  // namespace lightseg::model
