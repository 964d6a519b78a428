// The onednn backend's plans, for one channel-block width (internal). Included once per
// width by plan_b16.cpp (nChw16c: oneDNN's AVX-512 kernels) and plan_b8.cpp (nChw8c: its
// AVX2 and SSE4.1 kernels), each defining:
//   LIGHTSEG_ONEDNN_BLOCK    16 or 8 (kBlock: channels per block, floats per vector `vb`)
//   LIGHTSEG_ONEDNN_NS       the namespace of that width's plans (b16, b8)
//   LIGHTSEG_ONEDNN_X86_512  1 where the AVX-512 forms of the kernels (register epilogues,
//                            packed logits, bf16 tiles) are compiled: x86-64 GCC/Clang, 16 lanes
//   LIGHTSEG_ONEDNN_X86_256  1 where the AVX2 forms (register epilogues) are: x86-64, 8 lanes
// See onednn_engine.cpp for what a plan is. Every vector type here is one channel block of
// one pixel (GCC/Clang vector extension: one zmm in a 16-lane plan, one ymm in an 8-lane one,
// portable code in a build without native kernels).
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

#include "core/simd.h"  // the one SIMD helper set (outside the target region: always inlined)
#include "infer/onednn/analysis.h"
#include "infer/onednn/blocked.h"
#include "infer/onednn/claim_pool.h"  // parallel_steps: every kernel's threads

// The one dispatch: onednn_plan_block() picks a width from the CPU, oneDNN's ISA and
// LIGHTSEG_MAX_ISA, and every function of that width's plans (defined below, in this
// namespace only) is compiled for the ISA the width runs on: AVX-512 (F, BW, DQ, VL: oneDNN's
// avx512_core) for 16 lanes, AVX2 + FMA for 8. The headers above keep the build's baseline:
// templates defined there are instantiated with it (GCC keeps a template's own target), so no
// shared inline code is built for a newer CPU than the rest of the program.
#if LIGHTSEG_ONEDNN_X86_512 && defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma"))), apply_to = function)
#elif LIGHTSEG_ONEDNN_X86_512
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")
#elif LIGHTSEG_ONEDNN_X86_256 && defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#elif LIGHTSEG_ONEDNN_X86_256
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

namespace lightseg::onednn::LIGHTSEG_ONEDNN_NS {

#include "infer/onednn/layout.h"
#include "infer/onednn/vector.h"
#include "infer/onednn/epilogue.h"
#include "infer/onednn/kernels/depthwise.h"
#include "infer/onednn/kernels/pool.h"
#include "infer/onednn/kernels/single_channel.h"
#include "infer/onednn/kernels/output_resize.h"
#include "infer/onednn/kernels/concat.h"
#include "infer/onednn/kernels/winograd.h"
#include "infer/onednn/int8_conv.h"
#include "infer/onednn/sliced_conv.h"
#include "infer/onednn/plan.h"
#include "infer/onednn/plan_build.h"
#include "infer/onednn/plan_build_conv.h"
#include "infer/onednn/plan_run.h"
#include "infer/onednn/engine.h"

}  // namespace lightseg::onednn::LIGHTSEG_ONEDNN_NS

#if (LIGHTSEG_ONEDNN_X86_512 || LIGHTSEG_ONEDNN_X86_256) && defined(__clang__)
#pragma clang attribute pop
#elif LIGHTSEG_ONEDNN_X86_512 || LIGHTSEG_ONEDNN_X86_256
#pragma GCC pop_options
#endif
