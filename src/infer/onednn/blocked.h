// The onednn backend's two plan widths and what they share (internal; see onednn_engine.cpp).
#pragma once

#include <memory>

#include "infer/onednn_engine.h"

namespace lightseg::onednn {

// Whether the native forms of the kernels that have a portable twin run: the AVX-512 ones
// (16-channel plans) where the CPU has AVX-512F, the AVX2 ones (8-channel plans) where it has
// AVX2 + FMA, within LIGHTSEG_MAX_ISA, unless the tests switched them off
// (onednn_use_native_kernels).
bool avx512_kernels();
bool avx2_kernels();
// onednn_set_winograd's mode: -1 measured, 1 always (the faster tile), 4 or 6 always with
// that tile, 0 never.
int winograd_mode();
// onednn_set_bf16_nhwc's mode: -1 measured, 1 always, 0 never.
int bf16_nhwc_mode();

// An engine whose plans keep activations in nChw16c (b16: oneDNN's avx512_core kernels; the
// only width with bf16 and int8 plans) or nChw8c (b8: its avx2 and sse41 kernels).
namespace b16 {
std::unique_ptr<InferenceEngine> make_blocked_engine(const FusedNetwork& f, bool bf16, bool int8, bool profile,
                                                     size_t max_plans);
}
namespace b8 {
std::unique_ptr<InferenceEngine> make_blocked_engine(const FusedNetwork& f, bool bf16, bool int8, bool profile,
                                                     size_t max_plans);
}

}  // namespace lightseg::onednn
