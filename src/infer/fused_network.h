// lightseg: the inference form of the network — a flat list of fused operations.
//
//   FusedNetwork f = fuse_network(net, meta);   // BN folded into the convolutions, normalisation first
//   torch::Tensor logits = run_fused(f, images, scratch);  // LibTorch interpreter (CPU or CUDA)
//
// Every BatchNorm of the training graph (Network) is folded into the convolution in front of
// it (W' = W·γ/σ, b' = (b − μ)·γ/σ + β), or becomes a per-channel affine where nothing
// precedes it (the pooled half of C3.1, DAB's pre-activation). Each operation carries its
// activation and the additions that follow it, so a backend can run it as one kernel:
//
//   Conv:    y = add₁ + add₂ + … + act(conv(x; W', b') + residual)
//   Affine:  y = add… + act(x·scale + shift)
//   MulAdd:  y = add… + x ⊙ m                       (m: one channel, broadcast; C6.1/C7.4)
//   MaxPool: 2×2, stride 2, ceil mode (C3.1);  Concat: along channels;
//   Resize:  bilinear, align_corners = false, to the size of another value (or the input).
//
// "add" operands have the op's channel count or one channel (broadcast: the adders C1.4/C1.6).
// The concat + pointwise conv of each semantic branch (C3.3, C3.4) is written as the sum of two
// pointwise convolutions, one on each half (the same linear map, no concatenated copy).
// The same list drives the LibTorch "fused" backend, the oneDNN backend and the ONNX export.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "lightseg/config.h"
#include "lightseg/network.h"

namespace lightseg {

enum class Act { None, PReLU, ReLU, Sigmoid };

struct FusedOp {
  enum class Kind { Conv, Affine, MaxPool, Concat, Resize, MulAdd };
  Kind kind = Kind::Conv;
  std::string name;      // the training-graph module it comes from, e.g. "semantic1.layers.0.pw1"
  std::vector<int> in;   // values read: Conv/Affine/MaxPool/Resize {x}; Concat the parts; MulAdd {x, m}
  int out = -1;          // value written
  // Conv: OIHW weight (BN folded) and bias [O]. Affine: scale [C] and shift [C].
  torch::Tensor weight, bias;
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
  int residual = -1;          // Conv: value added before the activation (same shape), -1: none
  Act act = Act::None;
  torch::Tensor slopes;       // PReLU: one slope per channel
  std::vector<int> add;       // values added after the activation
  int like = -1;              // Resize: target size is this value's H×W (-1: the network input's)
};

struct FusedNetwork {
  NetworkConfig config;
  int64_t num_values = 0;
  std::vector<int64_t> channels;  // per value
  int input = 0;                  // value 0: the image, N×3×H×W RGB 0..255
  int output = -1;                // N×K×H×W logits
  std::vector<FusedOp> ops;       // in execution order; ops[0] normalises the image (an Affine)
  // int8 inference: per value, the calibrated bound of |x| (ModelMeta::int8_absmax; 0 where the
  // calibration has none); empty without a calibration.
  std::vector<float> act_absmax;

  // Spatial size (H, W) of every value for an h×w input.
  std::vector<std::array<int64_t, 2>> value_sizes(int64_t h, int64_t w) const;
  int64_t count_macs(int64_t h, int64_t w) const;  // convolution MACs per image at h×w
};

// Folds a network (any configuration: FEB, DAB or ResNet stages) and the model's normalisation.
FusedNetwork fuse_network(const Network& net, const ModelMeta& meta);

// Runs the list with LibTorch ops. `images`: N×3×H×W float RGB 0..255 on the weights' device;
// weights and images must share device and dtype (use to(...) first). Returns N×K×H×W logits.
// `observe`, if given, sees every value as it is computed (value index, tensor).
torch::Tensor run_fused(const FusedNetwork& f, const torch::Tensor& images,
                        const std::function<void(int, const torch::Tensor&)>& observe = {});

// Per value, the name ModelMeta::int8_absmax keys it by: the name of the operation that writes
// it ("#2", "#3" … after a name that repeats); "input" for the image.
std::vector<std::string> value_names(const FusedNetwork& f);
// int8 calibration: per value, the largest over `images` (each N×3×H×W, 0..255) of the
// `quantile` of |x| in one image (1: the maximum); only for the inputs of dense convolutions
// (other values: 0). Keyed by value_names(f).
std::map<std::string, float> int8_activation_bounds(const FusedNetwork& f, const std::vector<torch::Tensor>& images,
                                            double quantile = 0.9999);

// A copy with every tensor moved to `device` / `dtype` (4-D weights in channels_last).
FusedNetwork to(const FusedNetwork& f, torch::Device device, torch::ScalarType dtype = torch::kFloat32);

// Output size of a k×k convolution / ceil-mode pooling along one axis (as LibTorch computes it).
int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation);
int64_t pool_out_size_ceil(int64_t in, int64_t k, int64_t stride);

}  // namespace lightseg
