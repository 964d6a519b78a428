#include "lightseg/model/fusion_decoder.h"

#include "model/score_upsample.h"

namespace lightseg::model {

torch::Tensor upsample_to(const torch::Tensor& x, int64_t h, int64_t w) {
  if (x.size(2) == h && x.size(3) == w) return x;
  if (x.is_cpu() && x.scalar_type() == torch::kBFloat16) {  // C1.9's ×2 under autocast: ours in float32
    const torch::Tensor f = x.to(torch::kFloat32);
    if (score_upsample_applies(f)) return score_upsample(f, h, w).to(torch::kBFloat16);
  } else if (score_upsample_applies(x)) {
    return score_upsample(x, h, w);
  }
  return torch::nn::functional::interpolate(
      x, torch::nn::functional::InterpolateFuncOptions()
             .size(std::vector<int64_t>{h, w})
             .mode(torch::kBilinear)
             .align_corners(false));
}

torch::Tensor upsample_scores(const torch::Tensor& x, int64_t h, int64_t w) {
  return upsample_to(x.is_cpu() && x.scalar_type() == torch::kBFloat16 ? x.to(torch::kFloat32) : x, h, w);
}

FusionDecoderImpl::FusionDecoderImpl(int64_t c0, int64_t c1, int64_t c2, int64_t num_classes,
                                     bool spatial_attention)
    : dw3(register_module("dw3", ConvBNAct(ConvSpec::depthwise(c0, 3, 2)))),   // C1.7: C0 kernels, stride 2
      pw3(register_module("pw3", ConvBNAct(ConvSpec::pointwise(c0, c1)))),     // C1.7: C1 kernels
      dw4(register_module("dw4", ConvBNAct(ConvSpec::depthwise(c1)))),         // C1.8
      pw4(register_module("pw4", ConvBNAct(ConvSpec::pointwise(c1, c1)))),     // C1.8
      pw5(register_module("pw5", ConvBNAct(ConvSpec::pointwise(c2, c1)))),     // C1.9
      pw6(register_module("pw6", make_conv(ConvSpec::pointwise(c1, num_classes, /*bias=*/true)))) {  // C1.11
  if (spatial_attention) attention = register_module("attention", SpatialAttention(c1));
}

DecoderOutputs FusionDecoderImpl::forward_debug(const torch::Tensor& F1, const torch::Tensor& A1,
                                                const torch::Tensor& A2, int64_t out_h, int64_t out_w,
                                                const StageHook& hook) {
  auto step = [&](const char* name, const torch::Tensor& t) {
    if (hook) hook(name, t);
  };
  DecoderOutputs o;
  o.X1 = pw3->forward(dw3->forward(F1));  // C1.7: H/2 → H/4
  step("decoder.dsconv1", o.X1);
  o.X2 = pw4->forward(dw4->forward(A1));  // C1.8
  step("decoder.dsconv2", o.X2);
  o.X3 = upsample_to(pw5->forward(A2), A1.size(2), A1.size(3));  // C1.9: PW5 then upsampling ×2
  step("decoder.pw5_up", o.X3);
  if (attention) {
    auto a = attention->forward_debug(o.X1);  // C7.1–C7.4
    o.mask = a.mask;
    o.SA = a.SA;
    step("decoder.attention", o.SA);
    o.F = o.SA + o.X1 + o.X2 + o.X3;  // C6.1
  } else {
    o.F = o.X1 + o.X2 + o.X3;  // C1.10
  }
  step("decoder.fuse", o.F);
  o.logits = upsample_scores(conv(pw6, o.F), out_h, out_w);  // C1.11: classify, then ×4 to H×W
  step("decoder.classifier", o.logits);
  return o;
}

}  // namespace lightseg::model
