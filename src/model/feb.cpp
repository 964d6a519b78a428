#include "lightseg/model/feb.h"

#include <algorithm>
#include <cmath>

namespace lightseg::model {

static int64_t compressed(int64_t c, double ratio) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::lround(static_cast<double>(c) * ratio)));
}

FEBImpl::FEBImpl(int64_t c, int64_t d, double ratio)
    : dw1(register_module("dw1", ConvBNAct(ConvSpec::depthwise(c)))),
      pw1(register_module("pw1", ConvBNAct(ConvSpec::pointwise(c, compressed(c, ratio))))),
      dw2(register_module("dw2", ConvBNAct(ConvSpec::depthwise(compressed(c, ratio))))),
      dw_dilated(register_module("dw_dilated", ConvBNAct(ConvSpec::depthwise(compressed(c, ratio), 3, 1, d)))),
      conv3d(register_module("conv3d", ConvBNAct(ConvSpec::square(compressed(c, ratio), compressed(c, ratio), 3)))),
      pw2(register_module("pw2", ConvBNAct(ConvSpec::pointwise(compressed(c, ratio), c), /*act=*/false))),
      act(register_module("act", torch::nn::PReLU(torch::nn::PReLUOptions().num_parameters(c)))) {}

FEBOutputs FEBImpl::forward_debug(const torch::Tensor& x) {
  FEBOutputs o;
  o.P = pw1->forward(dw1->forward(x));  // C4.1, C4.2: channel-compressed map P
  o.Q1 = dw2->forward(o.P);             // C4.3
  o.Q2 = dw_dilated->forward(o.P);      // C4.4: reads P, in parallel with C4.3
  o.U = o.P + o.Q1 + o.Q2;              // C4.5 first fusion layer
  o.V = conv3d->forward(o.U);           // C4.6
  o.W = pw2->forward(o.V);              // C4.7
  o.out = model::prelu(x + o.W, act->weight);        // C4.8 second fusion layer (residual)
  return o;
}

torch::Tensor FEBImpl::forward(const torch::Tensor& x) {
  torch::Tensor P = pw1->forward(dw1->forward(x));
  torch::Tensor U = P + dw2->forward(P) + dw_dilated->forward(P);
  return model::prelu(x + pw2->forward(conv3d->forward(U)), act->weight);
}

}  // namespace lightseg::model
