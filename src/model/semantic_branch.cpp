#include "lightseg/model/semantic_branch.h"

#include "lightseg/model/dab.h"
#include "lightseg/model/feb.h"
#include "lightseg/model/residual_block.h"

namespace lightseg::model {

DownsamplingImpl::DownsamplingImpl(int64_t in, int64_t out) : in_channels(in), out_channels(out) {
  if (out > in) {
    conv = register_module("conv", make_conv(ConvSpec::square(in, out - in, 3, 2)));
    bn_act = register_module("bn_act", BNAct(out));
  } else {
    cba = register_module("cba", ConvBNAct(ConvSpec::square(in, out, 3, 2)));
  }
}

torch::Tensor DownsamplingImpl::forward(const torch::Tensor& x) {
  if (!conv) return cba->forward(x);
  torch::Tensor pooled = torch::max_pool2d(x, {2, 2}, {2, 2}, {0, 0}, {1, 1}, /*ceil_mode=*/true);
  return bn_act->forward(torch::cat({model::conv(conv, x), pooled}, 1));
}

SemanticBranchImpl::SemanticBranchImpl(int64_t in, int64_t out, const StageConfig& stage, double feb_ratio)
    : down(register_module("down", Downsampling(in, out))),
      layers(register_module("layers", torch::nn::Sequential())),
      fuse(register_module("fuse", ConvBNAct(ConvSpec::pointwise(2 * out, out)))) {
  for (int i = 0; i < stage.layers; ++i) {
    const int64_t d = stage.dilations.empty() ? 1 : stage.dilations[i];
    switch (stage.type) {
      case FELayerType::FEB: layers->push_back(FEB(out, d, feb_ratio)); break;
      case FELayerType::DAB: layers->push_back(DAB(out, d)); break;
      case FELayerType::ResNet: layers->push_back(ResidualBlock(out, d)); break;
    }
  }
}

SemanticOutputs SemanticBranchImpl::forward_debug(const torch::Tensor& x) {
  SemanticOutputs o;
  o.D = down->forward(x);                                    // C3.1
  o.E = layers->forward(o.D);                                // C3.2
  o.M = fuse->forward(torch::cat({o.D, o.E}, /*dim=*/1));    // C3.3 concat, C3.4 PW
  return o;
}

}  // namespace lightseg::model
