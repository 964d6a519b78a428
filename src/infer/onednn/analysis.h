// The analysis of a fused operation list for the onednn plans (internal): what each
// operation and value becomes, decided once per input shape before any memory or kernel
// exists. A pure function of the list, the value sizes, the channel-block width and the
// precision, so that tests check its decisions directly (tests/test_plan_analysis.cpp);
// plan.h builds the steps from it.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "infer/fused_network.h"

namespace lightseg::onednn {

struct PlanAnalysis {
  // Per value.
  std::vector<int> producer, last, readers;  // producing op, last op that reads it, number of reads
  std::vector<int> alias_of;                 // a concat part written in place: the concat's value, else -1
  std::vector<int64_t> part_offset;          // ... at this channel offset in it
  std::vector<int> upsampled_src;            // a folded resize's output: the value it resizes, else -1
  std::vector<bool> store_bf16;              // bf16 plans: stored in bf16 only
  std::vector<bool> need_shadow;             // bf16 plans: kept in f32 with a bf16 copy for a bf16 convolution
  std::vector<bool> need_f32;                // read in f32 by something (the output included)
  // Per operation.
  std::vector<bool> pool_fused_next;  // a max pooling run by the affine after it (never stored)
  std::vector<bool> resize_folded;    // a resize added on the fly by its MulAdd's pass (never stored)
  std::vector<bool> unaligned;        // a concat whose parts do not start on channel blocks: our gather
  std::vector<bool> in_place;         // a concat whose every part its producer writes in place: no step
  std::vector<bool> paired_with_next, paired_with_prev;  // FEB's two depthwise branches run as one kernel
  std::vector<bool> single_channel;   // a convolution with one output channel: our kernel
  std::vector<bool> depthwise;        // a depthwise convolution: our kernel
  std::vector<bool> reads_bf16;       // bf16 plans: a dense convolution in bf16
  // int8 plans (analyse_int8; all false before it): the dense convolutions run in int8, each on
  // an int8 NHWC copy of its input; a value only they read is never stored in f32.
  std::vector<bool> int8_conv;        // per operation: a dense convolution in int8
  std::vector<bool> need_q8;          // per value: has an int8 copy
  std::vector<bool> stored;           // per value: kept in f32 (read in f32 by something)
  std::vector<float> q8_scale;        // per value: its int8 copy's scale (|x| bound / 127), else 0
};

// The taps of one kernel dimension that read the input for some output position (the others
// only ever read padding): taps [first, first + count), and the padding that keeps the output
// where it was once the taps before `first` are gone.
struct Taps1 {
  int64_t first = 0, count = 0, padding = 0;
};
Taps1 live_taps(int64_t k, int64_t dilation, int64_t padding, int64_t stride, int64_t in, int64_t out);

// `sizes`: FusedNetwork::value_sizes of the input shape; `block`: channels per block (16, 8).
PlanAnalysis analyse_plan(const FusedNetwork& f, const std::vector<std::array<int64_t, 2>>& sizes, int64_t block,
                          bool bf16);
// Adds the int8 decisions to `an` (analyse_plan's): the dense convolutions that the bf16 plans
// run in bf16 (not the first, not depthwise, not one output channel) run in int8, with their
// input scales from f.act_absmax. std::invalid_argument without a usable calibration.
void analyse_int8(const FusedNetwork& f, PlanAnalysis& an);

}  // namespace lightseg::onednn
