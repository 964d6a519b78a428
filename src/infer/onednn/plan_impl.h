// The onednn backend's plans, for one channel-block width (internal). Included once per
// width by plan_b16.cpp (nChw16c: oneDNN's AVX-512 kernels) and plan_b8.cpp (nChw8c: its
// AVX2 and SSE4.1 kernels), each defining:
//   LIGHTSEG_ONEDNN_BLOCK    16 or 8 (kBlock: channels per block, floats per vector `vb`)
//   LIGHTSEG_ONEDNN_NS       the namespace of that width's plans (b16, b8)
//   LIGHTSEG_ONEDNN_X86_512  1 where the AVX-512 forms of the kernels (register epilogues,
//                            packed logits, bf16 tiles) are compiled: x86-64 GCC/Clang, 16 lanes
//   LIGHTSEG_ONEDNN_X86_256  1 where the AVX2 forms (register epilogues) are: x86-64, 8 lanes
// See onednn_engine.cpp for what a plan is. Every vector type here is one channel block of
// one pixel (GCC/Clang vector extension: one zmm in the AVX-512 clone of a 16-lane plan, one
// ymm in the AVX2 clone of an 8-lane one, portable code elsewhere).
#pragma once

#if LIGHTSEG_ONEDNN_X86_512
#include <immintrin.h>
#endif

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <new>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "infer/onednn/blocked.h"

namespace lightseg::onednn::LIGHTSEG_ONEDNN_NS {

#include "infer/onednn/layout.h"
#include "infer/onednn/vector.h"
#include "infer/onednn/epilogue.h"
#include "infer/onednn/kernels/depthwise.h"
#include "infer/onednn/kernels/pool.h"
#include "infer/onednn/kernels/single_channel.h"
#include "infer/onednn/kernels/output_resize.h"
#include "infer/onednn/kernels/concat.h"
#include "infer/onednn/plan.h"
#include "infer/onednn/engine.h"

}  // namespace lightseg::onednn::LIGHTSEG_ONEDNN_NS
