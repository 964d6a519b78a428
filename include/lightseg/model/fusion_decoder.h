// Claim 1 (C1.7–C1.11) and claim 6: the multi-scale fusion decoder.
//   X1 = DSConv(F1)  (C1.7: DW 3×3 stride 2 with C0 kernels → PW with C1 kernels)
//   X2 = DSConv(A1)  (C1.8: DW 3×3 → PW, both C1)
//   X3 = up×2(PW5(A2)) (C1.9)
//   F  = [SA +] X1 + X2 + X3  (C1.10, C6.1)
//   logits = up×4(PW6(F))     (C1.11)
#pragma once
#include <functional>

#include "lightseg/model/layers.h"
#include "lightseg/model/spatial_attention.h"

namespace lightseg::model {

struct DecoderOutputs {
  torch::Tensor X1, X2, X3, mask, SA, F, logits;
};

// Called after each named step with its output (lightseg info uses it to attribute MACs).
using StageHook = std::function<void(const char* name, const torch::Tensor& out)>;

class FusionDecoderImpl : public torch::nn::Module {
 public:
  FusionDecoderImpl(int64_t c0, int64_t c1, int64_t c2, int64_t num_classes, bool spatial_attention);
  // out_h/out_w: the input image's size (logits are returned at that size).
  DecoderOutputs forward_debug(const torch::Tensor& F1, const torch::Tensor& A1, const torch::Tensor& A2,
                               int64_t out_h, int64_t out_w, const StageHook& hook = nullptr);
  torch::Tensor forward(const torch::Tensor& F1, const torch::Tensor& A1, const torch::Tensor& A2,
                        int64_t out_h, int64_t out_w) {
    return forward_debug(F1, A1, A2, out_h, out_w).logits;
  }

  ConvBNAct dw3{nullptr}, pw3{nullptr};   // C1.7 first depthwise-separable conv
  ConvBNAct dw4{nullptr}, pw4{nullptr};   // C1.8 second depthwise-separable conv
  ConvBNAct pw5{nullptr};                 // C1.9 fifth pointwise conv (+ bilinear upsampling)
  SpatialAttention attention{nullptr};    // C6.1 (null when switched off)
  torch::nn::Conv2d pw6{nullptr};         // C1.11 sixth pointwise conv (classifier)
};
TORCH_MODULE(FusionDecoder);

// Bilinear resize to (h, w), align_corners = false. On the CPU a channels_last float32 or
// bfloat16 input (every network's maps in training) goes to our own operator
// (src/model/score_upsample.h: ~5× LibTorch 1.13's float32 kernels forward and backward, which
// are 3–7× faster than its bfloat16 ones; bfloat16 is resized in float32 and rounded once);
// elsewhere torch's interpolate.
torch::Tensor upsample_to(const torch::Tensor& x, int64_t h, int64_t w);
// upsample_to for class scores on their way to the loss (C1.11's ×4, the auxiliary heads): on
// the CPU a bfloat16 input (autocast training) comes back float32, which the loss takes.
torch::Tensor upsample_scores(const torch::Tensor& x, int64_t h, int64_t w);

}  // namespace lightseg::model
