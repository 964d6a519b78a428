// lightseg: ONNX export (our own graph, written with libonnx; library lightseg_export).
//
//   lightseg::OnnxOptions o;            // opset 13, fixed 1×3×360×480
//   lightseg::export_onnx(net, meta, "model.onnx", o);  // writes, then runs the ONNX checker
//
// Contract: input "image", float32 N×3×H×W, RGB, values 0..255 (the normalisation is the
// graph's first node); output "logits", float32 N×num_classes×H×W. The graph is the folded
// operation list of fused_network.h (BatchNorm folded into the convolutions), written with
// operators OpenCV DNN 4.6 imports: Conv, PRelu (slopes [C,1,1]), Relu, Sigmoid, Add, Mul,
// MaxPool (ceil_mode), Concat, Resize (linear, half_pixel, explicit sizes). One-channel maps
// that the network broadcasts over channels (the adders' s1/s2, the attention mask) are
// widened by a 1×1 convolution with weights 1 (exact), so every Add/Mul has equal shapes.
// Fixed export: every size is a constant (from `height`×`width`, batch `batch`).
// Dynamic export: batch, H and W are symbolic and the Resize sizes come from Shape().
// The model's metadata (classes, palette, mean/std, configuration) is stored in
// metadata_props["lightseg"] as JSON.
#pragma once

#include <string>

#include "lightseg/config.h"
#include "lightseg/network.h"

namespace lightseg {

struct OnnxOptions {
  int opset = 13;          // 11..17
  bool dynamic = false;
  int64_t batch = 1;       // fixed export only
  int64_t height = 360, width = 480;  // fixed export only
};

// Serialised ModelProto (already checked).
std::string onnx_model_bytes(const Network& net, const ModelMeta& meta, const OnnxOptions& o = {});
// Writes the model to `path` atomically and checks the written file.
void export_onnx(const Network& net, const ModelMeta& meta, const std::string& path, const OnnxOptions& o = {});
// Runs onnx::checker (full check) and strict shape inference on a file; throws with the
// checker's message. Returns the number of nodes.
int check_onnx(const std::string& path);

}  // namespace lightseg
