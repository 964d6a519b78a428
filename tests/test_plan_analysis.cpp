// The onednn plans' analysis (src/infer/onednn/analysis.h) on its own: its decisions for the
// default network and for channel counts that break the block alignment, at both widths.
#include <gtest/gtest.h>

#include <map>

#include "infer/fused_network.h"
#include "infer/onednn/analysis.h"
#include "lightseg/network.h"

using namespace lightseg;
using lightseg::onednn::analyse_plan;
using lightseg::onednn::live_taps;
using lightseg::onednn::PlanAnalysis;

namespace {

FusedNetwork fused(const NetworkConfig& cfg) {
  torch::manual_seed(1);
  Network net(cfg);
  net->eval();
  return fuse_network(net, ModelMeta::generic(cfg.num_classes));
}

int op_index(const FusedNetwork& f, const std::string& name) {
  for (size_t i = 0; i < f.ops.size(); ++i)
    if (f.ops[i].name == name) return static_cast<int>(i);
  ADD_FAILURE() << "no operation " << name;
  return 0;
}

}  // namespace

TEST(PlanAnalysis, LivenessCoversEveryRead) {
  const auto f = fused(NetworkConfig{});
  const auto sizes = f.value_sizes(360, 480);
  for (int64_t block : {16, 8}) {
    const PlanAnalysis a = analyse_plan(f, sizes, block, false);
    for (size_t i = 0; i < f.ops.size(); ++i) {
      const auto& op = f.ops[i];
      EXPECT_EQ(a.producer[op.out], static_cast<int>(i)) << op.name;
      std::vector<int> reads = op.in;
      reads.insert(reads.end(), op.add.begin(), op.add.end());
      if (op.residual >= 0) reads.push_back(op.residual);
      for (int v : reads) EXPECT_GE(a.last[v], static_cast<int>(i)) << op.name << " reads value " << v;
    }
    // Without bf16 nothing is stored in bf16 or needs a copy.
    for (int64_t v = 0; v < f.num_values; ++v) {
      EXPECT_FALSE(a.store_bf16[v]);
      EXPECT_FALSE(a.need_shadow[v]);
    }
  }
}

TEST(PlanAnalysis, FusionsAndPairsOfTheDefaultNetwork) {
  const auto f = fused(NetworkConfig{});
  const auto sizes = f.value_sizes(360, 480);
  for (int64_t block : {16, 8}) {
    const PlanAnalysis a = analyse_plan(f, sizes, block, false);
    // C4.3 and C4.4 (FEB's two depthwise branches of P) run as one kernel in every layer.
    int pairs = 0;
    for (size_t i = 0; i + 1 < f.ops.size(); ++i)
      if (a.paired_with_next[i]) {
        ++pairs;
        EXPECT_TRUE(a.paired_with_prev[i + 1]);
        EXPECT_NE(f.ops[i].name.find(".dw2"), std::string::npos) << f.ops[i].name;
        EXPECT_NE(f.ops[i + 1].name.find(".dw_dilated"), std::string::npos) << f.ops[i + 1].name;
      }
    EXPECT_EQ(pairs, NetworkConfig{}.stage1.layers + NetworkConfig{}.stage2.layers);
    // C3.1's max pooling runs inside the affine after it; the depthwise convolutions are ours,
    // C4.6's dense convolutions are not.
    EXPECT_TRUE(a.pool_fused_next[op_index(f, "semantic2.down.pool")]);
    EXPECT_TRUE(a.depthwise[op_index(f, "semantic1.layers.0.dw1")]);
    EXPECT_FALSE(a.depthwise[op_index(f, "semantic1.layers.0.conv3d")]);
    EXPECT_TRUE(a.single_channel[op_index(f, "decoder.attention.conv3d")]);
    // The last operation is the output resize, never folded into anything.
    EXPECT_FALSE(a.resize_folded.back());
    // Every resize folded into a MulAdd's pass is one value's only use.
    for (size_t i = 0; i < f.ops.size(); ++i)
      if (a.resize_folded[i]) {
        EXPECT_EQ(f.ops[i].kind, FusedOp::Kind::Resize);
        EXPECT_EQ(a.readers[f.ops[i].out], 1) << f.ops[i].name;
        EXPECT_EQ(a.upsampled_src[f.ops[i].out], f.ops[i].in[0]) << f.ops[i].name;
      }
  }
}

TEST(PlanAnalysis, ConcatPartsInPlaceOnlyOnBlockBoundaries) {
  // Default channels (multiples of 16): every concat part its producer's pass writes lands in
  // place at a block-aligned offset. c0 = 20: the concats after C1.1 start parts inside a block
  // at both widths and take the gather kernel, with no part written in place.
  NetworkConfig odd;
  odd.c0 = 20;
  for (const auto& cfg : {NetworkConfig{}, odd}) {
    const auto f = fused(cfg);
    const auto sizes = f.value_sizes(96, 128);
    for (int64_t block : {16, 8}) {
      const PlanAnalysis a = analyse_plan(f, sizes, block, false);
      int concats = 0, unaligned = 0;
      for (size_t i = 0; i < f.ops.size(); ++i) {
        const auto& op = f.ops[i];
        if (op.kind != FusedOp::Kind::Concat) continue;
        ++concats;
        int64_t off = 0;
        bool aligned = true;
        for (int part : op.in) {
          aligned = aligned && off % block == 0;
          if (a.alias_of[part] >= 0) {
            EXPECT_EQ(a.alias_of[part], op.out);
            EXPECT_EQ(a.part_offset[part], off);
            EXPECT_EQ(a.part_offset[part] % block, 0);
          }
          off += f.channels[part];
        }
        EXPECT_EQ(a.unaligned[i], !aligned) << op.name << " block " << block;
        if (a.unaligned[i]) {
          ++unaligned;
          for (int part : op.in) EXPECT_LT(a.alias_of[part], 0) << op.name;
        }
      }
      EXPECT_GT(concats, 0);
      if (cfg.c0 == 32) EXPECT_EQ(unaligned, 0) << "block " << block;
      if (cfg.c0 == 20) EXPECT_GT(unaligned, 0) << "block " << block;
    }
  }
}

TEST(PlanAnalysis, Bf16StorageAndShadows) {
  const auto f = fused(NetworkConfig{});
  const PlanAnalysis a = analyse_plan(f, f.value_sizes(360, 480), 16, true);
  const int normalised = f.ops.front().out;
  EXPECT_FALSE(a.store_bf16[f.output]);  // the logits are f32
  EXPECT_FALSE(a.store_bf16[normalised]);
  EXPECT_FALSE(a.reads_bf16[op_index(f, "init.conv1")]);  // the convolution on the image stays f32
  EXPECT_TRUE(a.reads_bf16[op_index(f, "semantic1.layers.0.conv3d")]);
  int bf16_values = 0;
  for (int64_t v = 0; v < f.num_values; ++v) {
    EXPECT_FALSE(a.store_bf16[v] && a.need_shadow[v]) << v;  // a bf16 value needs no bf16 copy
    bf16_values += a.store_bf16[v];
  }
  EXPECT_GT(bf16_values, 10);
  // A value a bf16 convolution reads is in bf16 one way or the other.
  for (size_t i = 0; i < f.ops.size(); ++i)
    if (a.reads_bf16[i]) {
      const int v = f.ops[i].in[0];
      EXPECT_TRUE(a.store_bf16[v] || a.need_shadow[v]) << f.ops[i].name;
    }
}

TEST(PlanAnalysis, LiveTapsDropOnlyPaddingReads) {
  // 3×3 with padding 1 on a 10-wide map: every tap reads something.
  auto t = live_taps(3, 1, 1, 1, 10, 10);
  EXPECT_EQ(t.first, 0);
  EXPECT_EQ(t.count, 3);
  EXPECT_EQ(t.padding, 1);
  // Dilation 8 on a 5-wide map (C3's deep dilations on small inputs): the outer taps only
  // ever read padding; the middle one stays, with no padding left.
  t = live_taps(3, 8, 8, 1, 5, 5);
  EXPECT_EQ(t.first, 1);
  EXPECT_EQ(t.count, 1);
  EXPECT_EQ(t.padding, 0);
}

TEST(PlanAnalysis, Int8RunsTheDenseConvolutionsButTheFirstOnCalibratedInputs) {
  auto f = fused(NetworkConfig{});
  const auto sizes = f.value_sizes(360, 480);
  PlanAnalysis a = analyse_plan(f, sizes, 16, false);
  // Before analyse_int8: sized, and nothing in int8.
  ASSERT_EQ(a.int8_conv.size(), f.ops.size());
  ASSERT_EQ(a.need_q8.size(), static_cast<size_t>(f.num_values));
  for (size_t i = 0; i < f.ops.size(); ++i) EXPECT_FALSE(a.int8_conv[i]);
  // No calibration: refused, naming the command that makes one.
  try {
    lightseg::onednn::analyse_int8(f, a);
    ADD_FAILURE() << "int8 analysed without a calibration";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("lightseg calibrate"), std::string::npos) << e.what();
  }
  f.act_absmax.assign(f.num_values, 0.f);
  for (int64_t v = 0; v < f.num_values; ++v) f.act_absmax[v] = 1.f + static_cast<float>(v);
  lightseg::onednn::analyse_int8(f, a);
  int n_int8 = 0;
  for (size_t i = 0; i < f.ops.size(); ++i) {
    const auto& op = f.ops[i];
    const bool dense = op.kind == FusedOp::Kind::Conv && op.groups == 1 && !a.single_channel[i];
    const bool first = !op.in.empty() && op.in[0] == f.ops[0].out;
    EXPECT_EQ(a.int8_conv[i], dense && !first) << op.name;
    if (!a.int8_conv[i]) continue;
    ++n_int8;
    EXPECT_TRUE(a.need_q8[op.in[0]]) << op.name;
    EXPECT_FLOAT_EQ(a.q8_scale[op.in[0]], f.act_absmax[op.in[0]] / 127.f) << op.name;
  }
  EXPECT_GT(n_int8, 5);
  // What the f32 graph still reads is stored; the output always.
  EXPECT_TRUE(a.stored[f.output]);
  for (size_t i = 0; i < f.ops.size(); ++i)
    for (int v : f.ops[i].add) EXPECT_TRUE(a.stored[v]) << f.ops[i].name;
  // A bound that is not a positive number is refused.
  f.act_absmax[f.ops[op_index(f, "decoder.pw3")].in[0]] = 0.f;
  EXPECT_THROW(lightseg::onednn::analyse_int8(f, a), std::invalid_argument);
}
