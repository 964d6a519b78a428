#include "lightseg/model/dab.h"

namespace lightseg::model {

static ConvSpec dw_asym(int64_t c, int64_t kh, int64_t kw, int64_t dh, int64_t dw) {
  return ConvSpec{c, c, {kh, kw}, 1, {dh, dw}, c, false};
}

DABImpl::DABImpl(int64_t c, int64_t d)
    : pre(register_module("pre", BNAct(c))),
      reduce(register_module("reduce", ConvBNAct(ConvSpec::square(c, c / 2, 3)))),
      dw31(register_module("dw31", ConvBNAct(dw_asym(c / 2, 3, 1, 1, 1)))),
      dw13(register_module("dw13", ConvBNAct(dw_asym(c / 2, 1, 3, 1, 1)))),
      ddw31(register_module("ddw31", ConvBNAct(dw_asym(c / 2, 3, 1, d, 1)))),
      ddw13(register_module("ddw13", ConvBNAct(dw_asym(c / 2, 1, 3, 1, d)))),
      post(register_module("post", BNAct(c / 2))),
      expand(register_module("expand", make_conv(ConvSpec::pointwise(c / 2, c)))) {}

torch::Tensor DABImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = reduce->forward(pre->forward(x));
  torch::Tensor a = dw13->forward(dw31->forward(y));
  torch::Tensor b = ddw13->forward(ddw31->forward(y));
  return conv(expand, post->forward(a + b)) + x;
}

}  // namespace lightseg::model
