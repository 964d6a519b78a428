// The oneDNN inference backend (internal): the fused operation list compiled per input shape.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "lightseg/engine.h"
#include "infer/fused_network.h"

namespace lightseg {

// onednn_available() and onednn_plan_description() are public, in lightseg/engine.h.
// The channel-block width of this CPU's plans: 16 (nChw16c) where oneDNN has its avx512_core
// kernels, 8 (nChw8c) where it has avx2 ones, 0 below (no plans: onednn is not offered).
// ONEDNN_MAX_CPU_ISA lowers it.
int onednn_plan_block();
// Why the onednn backend cannot run at its speed on this CPU ("" when it can): below AVX2,
// oneDNN would run reference kernels only.
std::string onednn_unsuitable_reason();
// Thrown by make_onednn_engine where onednn_unsuitable_reason() is not empty.
class BackendUnsuitable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// True when onednn is available and the CPU has AVX512-BF16 or AMX (bf16 plans).
bool onednn_bf16_available();
// True when onednn is available with 16-channel plans and oneDNN has its AVX512-VNNI int8
// kernels (int8 plans), within LIGHTSEG_MAX_ISA.
bool onednn_int8_available();
// Throws std::runtime_error when unavailable. bf16: dense convolutions in bf16 (f32
// accumulation; needs AVX512-BF16 or AMX, else std::invalid_argument). int8: dense
// convolutions in int8 (onednn/int8_conv.h; needs onednn_int8_available() and a calibration,
// FusedNetwork::act_absmax, else std::invalid_argument). profile: time every
// step (InferenceEngine::profile()). max_plans: the input shapes whose plans are kept at once
// (a new one beyond them drops them all); test-time augmentation needs one per scale.
std::unique_ptr<InferenceEngine> make_onednn_engine(const FusedNetwork& f, bool bf16 = false, bool profile = false,
                                                    size_t max_plans = 4, bool int8 = false);
// Where a kernel has a native form (AVX-512: the register epilogues, the packed logits, the
// vector argmax; AVX2: the register epilogues) and a portable one, false makes every plan use
// the portable form from the next call on; for tests, so that the path other CPUs take stays
// checked on machines with these. Default true.
void onednn_use_native_kernels(bool on);
// Which dense 3×3 stride-1 convolutions of plans built from now on take the plans' own
// Winograd: -1 (default) where it measures faster than oneDNN's kernels, with the faster of
// its F(4×4, 3×3) and F(6×6, 3×3) tiles; 1 every one it fits (the faster tile); 4 or 6 every
// one it fits, with that tile; 0 none. For tests, so that every path stays checked whatever a
// CPU measures.
void onednn_set_winograd(int mode);
// Which bf16 dense convolutions of plans built from now on run in NHWC (an NHWC bf16 copy of
// the input, an NHWC result read by the pass: the layout oneDNN's AMX kernels take): -1
// (default) where that measures faster than the blocked convolution; 1 every one oneDNN has a
// non-reference kernel for; 0 none. For tests, like onednn_set_winograd.
void onednn_set_bf16_nhwc(int mode);

}  // namespace lightseg
