// The oneDNN backend: the fused operation list (fused_network.h) compiled once per input
// shape into a plan:
//   - oneDNN convolution / resampling primitives, weights reordered (prepacked)
//     once; for dense 3×3 stride-1 convolutions Winograd or direct, whichever measures
//     faster when the plan is built (Winograd runs the init module's 32-channel convs
//     ~2.4× faster); for the first convolution an NCHW or NHWC input, likewise;
//   - every activation in oneDNN's blocked layout, buffers assigned by liveness (most
//     recently freed first: still in cache) and kept between calls. The block width follows
//     the CPU (onednn_plan_block): nChw16c where oneDNN has its AVX-512 kernels
//     (onednn/plan_b16.cpp), nChw8c where it has AVX2 ones (onednn/plan_b8.cpp); the plans
//     and our kernels are one source, onednn/plan_impl.h, compiled once per width;
//   - our own kernels for what oneDNN 2.6 cannot do well: PReLU (its PReLU post-op falls
//     back to the reference kernel), so a convolution that needs PReLU, a residual or an
//     adder is followed by one in-place pass doing all of them (as a "register epilogue":
//     eight vectors at a time in registers from their loads to their stores; the depthwise
//     kernels end the same way); depthwise convolutions with
//     that pass fused (oneDNN's JIT kernel refuses large dilations on small maps), FEB's two
//     depthwise branches and their sum (C4.3–C4.5) in one kernel; one-output-channel
//     convolutions (oneDNN pads them to 16 channels); the attention product; C3.1's max
//     pooling with the BN + PReLU of its half fused (the pooled map is never stored); concat
//     halves written in place (such a concat is stored in bf16 in bf16 plans); the final ×4
//     bilinear upsampling straight into the logits, or fused with the argmax for labels().
// Each step is sequential; parallelism is inside the steps (OpenMP, LibTorch's thread
// count; this file must be compiled with -fopenmp, or at::parallel_for runs serially), or on
// the claim pool (onednn/claim_pool.h: no barrier at a step's end; a pool plan's batch-1
// convolutions in a slice per thread with their pass, onednn/sliced_conv.h): LIGHTSEG_STEPS=
// auto (the default) moves a plan to the pool while its calls run well over its best one.
// With EngineOptions::profile, every step is timed and InferenceEngine::profile() gives the
// mean time of each (the caller prints it: `lightseg bench --profile`).
//
// bf16 plans (EngineOptions::dtype = kBFloat16, CPUs with AVX512-BF16 or AMX): every dense
// convolution but the first reads bf16 activations and bf16 weights, accumulating in f32
// (twice the multiply-accumulates per cycle of f32). A value that only bf16-capable readers
// use (bf16 convolutions and our kernels) is stored in bf16 only; one that an f32-only
// reader also needs (oneDNN resampling, a copying concat; the output) stays f32, and where a
// bf16 convolution reads it, gets a bf16 copy ("shadow", written by the producer's pass, or
// by a oneDNN reorder after a oneDNN producer). Our kernels compute in f32 whatever they
// read. The first convolution stays f32: rounding the normalised image costs the most
// label agreement. Each bf16 convolution runs on the blocked layout or in NHWC (oneDNN's AMX
// kernels take only that: an NHWC copy of the input, an NHWC result the pass reads),
// whichever measures faster when the plan is built (plan_build_conv.h, nhwc_bf16_conv).
//
// int8 plans (EngineOptions::dtype = kQInt8, CPUs with AVX512-VNNI; onednn/int8_conv.h): the
// same dense convolutions run in int8 instead, on weights quantized per output channel and
// an int8 copy of their input quantized with the calibrated scale of that value
// (ModelMeta::int8_absmax, `lightseg calibrate`). oneDNN 2.6's int8 kernels take NHWC only:
// the producer's pass writes the int8 copy in NHWC (a reorder after other producers), the
// convolution writes an NHWC f32 result, and a pass reads it back into the blocked value.
// Values are stored as in the bf16 plans where the CPU has AVX512-BF16, else in f32.
#include "infer/onednn_engine.h"

#include <atomic>
#include <string>

#include "core/isa.h"
#include "lightseg/features.h"

#if LIGHTSEG_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>

#include "infer/onednn/blocked.h"
#include "infer/onednn/claim_pool.h"
#endif

namespace lightseg {

#if !LIGHTSEG_HAVE_DNNL

bool onednn_available() { return false; }
bool onednn_bf16_available() { return false; }
bool onednn_int8_available() { return false; }
int onednn_plan_block() { return 0; }
std::string onednn_plan_description() { return ""; }
std::string onednn_step_scheduler() { return "openmp"; }
std::string onednn_unsuitable_reason() { return "this build has no onednn backend"; }
void onednn_use_native_kernels(bool) {}
void onednn_set_winograd(int) {}
void onednn_set_bf16_nhwc(int) {}
std::unique_ptr<InferenceEngine> make_onednn_engine(const FusedNetwork&, bool, bool, size_t, bool) {
  throw std::runtime_error("this build has no onednn backend (libdnnl-dev was not found at configure time)");
}

#else

bool onednn_available() { return true; }
namespace {
std::atomic<bool> g_native_kernels{true};
std::atomic<int> g_winograd{-1};
std::atomic<int> g_bf16_nhwc{-1};
}
void onednn_use_native_kernels(bool on) { g_native_kernels.store(on, std::memory_order_relaxed); }
void onednn_set_winograd(int mode) {
  g_winograd.store(mode < 0 ? -1 : mode == 4 || mode == 6 ? mode : mode > 0 ? 1 : 0, std::memory_order_relaxed);
}
void onednn_set_bf16_nhwc(int mode) { g_bf16_nhwc.store(mode < 0 ? -1 : mode > 0 ? 1 : 0, std::memory_order_relaxed); }
namespace onednn {
int winograd_mode() { return g_winograd.load(std::memory_order_relaxed); }
int bf16_nhwc_mode() { return g_bf16_nhwc.load(std::memory_order_relaxed); }
bool avx512_kernels() {
#if LIGHTSEG_NATIVE_KERNELS && defined(__GNUC__) && defined(__x86_64__)
  static const bool cpu = cpu_isa_level() >= IsaLevel::Avx512;
  return cpu && g_native_kernels.load(std::memory_order_relaxed);
#else
  return false;
#endif
}
bool avx2_kernels() {
#if LIGHTSEG_NATIVE_KERNELS && defined(__GNUC__) && defined(__x86_64__)
  static const bool cpu = cpu_isa_level() >= IsaLevel::Avx2;
  return cpu && g_native_kernels.load(std::memory_order_relaxed);
#else
  return false;
#endif
}
}  // namespace onednn

bool onednn_bf16_available() {
  const auto isa = dnnl::get_effective_cpu_isa();
  return (isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx) &&
         max_isa_level() >= IsaLevel::Avx512Bf16 && onednn_plan_block() == 16;
}

bool onednn_int8_available() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto vnni = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_vnni);
  return (isa & vnni) == vnni && max_isa_level() >= IsaLevel::Avx512 && onednn_plan_block() == 16;
}

int onednn_plan_block() {
#if !defined(__x86_64__) || !LIGHTSEG_NATIVE_KERNELS
  // Not x86: the plans' layouts are those of oneDNN's x86 kernels (elsewhere: reference ones).
  // Without native kernels the plans' own kernels run in their portable form, slower than the
  // fused backend (29 vs 21 ms at 360×480 on a Zen 4): auto must then be fused.
  return 0;
#else
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  auto has = [isa](dnnl::cpu_isa need) { return (isa & static_cast<unsigned>(need)) == static_cast<unsigned>(need); };
  // cpu_isa_level: our kernels' level on this CPU within LIGHTSEG_MAX_ISA (read on every call,
  // even where oneDNN was used before it was read). The 8-lane plans are compiled for AVX2 + FMA
  // (plan_impl.h), which oneDNN's avx2 kernels use too.
  const IsaLevel ours = cpu_isa_level();
  if (has(dnnl::cpu_isa::avx512_core) && ours >= IsaLevel::Avx512) return 16;
  if (has(dnnl::cpu_isa::avx2) && ours >= IsaLevel::Avx2) return 8;
  return 0;
#endif
}

std::string onednn_step_scheduler() { return onednn::step_scheduler_name(onednn::step_scheduler()); }

std::string onednn_plan_description() {
  const auto isa = dnnl::get_effective_cpu_isa();
  const char* name = isa == dnnl::cpu_isa::avx512_core_amx    ? "avx512_core_amx"
                     : isa == dnnl::cpu_isa::avx512_core_bf16 ? "avx512_core_bf16"
                     : isa == dnnl::cpu_isa::avx512_core_vnni ? "avx512_core_vnni"
                     : isa == dnnl::cpu_isa::avx512_core      ? "avx512_core"
                     : isa == dnnl::cpu_isa::avx2_vnni        ? "avx2_vnni"
                     : isa == dnnl::cpu_isa::avx2             ? "avx2"
                     : isa == dnnl::cpu_isa::avx              ? "avx"
                                                              : "sse41 or less";
  if (!LIGHTSEG_NATIVE_KERNELS) return "none (built without native kernels: auto is fused)";
  const int b = onednn_plan_block();
  if (!b) return std::string("none (oneDNN has ") + name + ")";
  std::string r = "nChw" + std::to_string(b) + "c plans on oneDNN's " + name + " kernels";
  // AMX convolutions take NHWC only: bf16 plans measure them against the blocked ones
  if (isa == dnnl::cpu_isa::avx512_core_amx && onednn_bf16_available())
    r += " (bf16: dense convolutions in NHWC on AMX where faster)";
  return r;
}

std::string onednn_unsuitable_reason() {
  // A plan's layout must be one oneDNN has JIT kernels for; otherwise it silently runs its
  // reference ones (84 s for one 360×480 image on an AVX2 EPYC with nChw16c plans, against
  // ~55 ms for the fused backend). Below AVX2 the plans are not offered.
  if (onednn_plan_block() > 0) return "";
  if (!LIGHTSEG_NATIVE_KERNELS)
    return "this build has no native kernels (LIGHTSEG_NATIVE_KERNELS=OFF), without which the onednn plans are slower "
           "than the fused backend";
  return std::string("the onednn backend's plans need oneDNN's AVX2 or AVX-512 kernels; ") +
         (max_isa_level() == IsaLevel::Generic ? "LIGHTSEG_MAX_ISA=generic leaves neither"
                                               : "on this CPU (or under ONEDNN_MAX_CPU_ISA) oneDNN has SSE4.1 or less, where "
                                                 "its reference kernels would run");
}

std::unique_ptr<InferenceEngine> make_onednn_engine(const FusedNetwork& f, bool bf16, bool profile, size_t max_plans,
                                                    bool int8) {
  if (bf16 && max_isa_level() < IsaLevel::Avx512Bf16)
    throw std::invalid_argument(std::string("bf16 inference: LIGHTSEG_MAX_ISA=") + isa_level_name(max_isa_level()) +
                                " excludes AVX512-BF16");
  if (int8 && !onednn_int8_available())
    throw std::invalid_argument(
        std::string("int8 inference on the CPU needs AVX512-VNNI (oneDNN's int8 kernels of 16-channel plans); ") +
        (max_isa_level() < IsaLevel::Avx512 ? std::string("LIGHTSEG_MAX_ISA=") + isa_level_name(max_isa_level()) +
                                                  " excludes it"
                                            : "this CPU has none") +
        ": use fp32");
  if (std::string why = onednn_unsuitable_reason(); !why.empty()) throw BackendUnsuitable(why + ": use the fused backend");
  onednn::step_scheduler();  // a bad LIGHTSEG_STEPS is an error here, not in a step
  return onednn_plan_block() == 16 ? onednn::b16::make_blocked_engine(f, bf16, int8, profile, max_plans)
                                   : onednn::b8::make_blocked_engine(f, bf16, int8, profile, max_plans);
}

#endif  // LIGHTSEG_HAVE_DNNL

}  // namespace lightseg
