#include "aux_heads.h"

#include "lightseg/model/fusion_decoder.h"

namespace lightseg {

using model::ConvSpec;

AuxHeadsImpl::AuxHeadsImpl(int64_t c1, int64_t c2, int64_t num_classes)
    : cba1(register_module("cba1", model::ConvBNAct(ConvSpec::square(c1, kHidden, 3)))),
      cba2(register_module("cba2", model::ConvBNAct(ConvSpec::square(c2, kHidden, 3)))),
      cls1(register_module("cls1", model::make_conv(ConvSpec::pointwise(kHidden, num_classes, /*bias=*/true)))),
      cls2(register_module("cls2", model::make_conv(ConvSpec::pointwise(kHidden, num_classes, /*bias=*/true)))) {}

std::pair<torch::Tensor, torch::Tensor> AuxHeadsImpl::forward(const torch::Tensor& M1, const torch::Tensor& M2,
                                                              int64_t h, int64_t w) {
  // Classify at the branch's resolution, then resize (as the main classifier, C1.11, does).
  return {model::upsample_scores(model::conv(cls1, cba1->forward(M1)), h, w),
          model::upsample_scores(model::conv(cls2, cba2->forward(M2)), h, w)};
}

}  // namespace lightseg
