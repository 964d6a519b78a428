// The dilated depthwise convolutions of CPU training as undilated ones over the phases of
// their input (internal; model::conv calls it).
#pragma once

#include <torch/torch.h>

namespace lightseg::model {

// A depthwise convolution of dilation (dh, dw), stride 1 and "same" padding, as an undilated
// one over the dh·dw phases of the input ("space to batch"): every tap of a dilated kernel
// reads from the output's own phase, so it is the same sum, in the same order, over the same
// products. For the C4 FEB blocks' dilated depthwise convolutions in CPU training:
// - LibTorch 1.13's oneDNN (2.6) computes their weight gradients WRONG in bfloat16 (cosine
//   with the float32 gradient about 0; its grouped kernel with 16×16 padded blocks), and
//   runs them 2–12× slower than this form (its depthwise kernels take dilation 1 only);
// - in float32 they are right, and this form is faster at dilation 16 (3×: oneDNN falls back
//   to a GEMM there), about even at 8.
torch::Tensor phased_depthwise(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                               int64_t dh, int64_t dw);
// Whether conv() takes phased_depthwise for c on x: a dilated, stride-1 depthwise convolution
// on the CPU with a gradient to compute, in bfloat16 (autocast or a bfloat16 input) or at
// dilation ≥ 16; and set_phased_depthwise(true), the default (false: never, for A/B tests; the environment
// variable LIGHTSEG_PHASED_DEPTHWISE=0 starts a process with it off).
bool phased_depthwise_wanted(const torch::nn::Conv2d& c, const torch::Tensor& x);
void set_phased_depthwise(bool on);

}  // namespace lightseg::model
