// The analysis of a fused operation list for the onednn plans: see analysis.h.
#include "infer/onednn/analysis.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace lightseg::onednn {

Taps1 live_taps(int64_t k, int64_t dilation, int64_t padding, int64_t stride, int64_t in, int64_t out) {
  int64_t first = -1, last = -1;
  for (int64_t t = 0; t < k; ++t) {
    bool live = false;
    for (int64_t o = 0; o < out && !live; ++o) {
      const int64_t i = o * stride + t * dilation - padding;
      live = i >= 0 && i < in;
    }
    if (live) {
      if (first < 0) first = t;
      last = t;
    }
  }
  const Taps1 all{0, k, padding};
  if (first < 0) return all;  // no tap reads anything (a degenerate shape): as it was
  const Taps1 live{first, last - first + 1, padding - first * dilation};
  const int64_t right = (out - 1) * stride + (live.count - 1) * (live.count > 1 ? dilation : 1) + 1 - in - live.padding;
  return live.padding >= 0 && right >= 0 ? live : all;  // oneDNN takes no negative padding
}

PlanAnalysis analyse_plan(const FusedNetwork& f, const std::vector<std::array<int64_t, 2>>& sizes, int64_t block,
                          bool bf16) {
  const int nv = static_cast<int>(f.num_values);
  const int nops = static_cast<int>(f.ops.size());
  PlanAnalysis r_;
  r_.producer.assign(nv, -1);
  r_.last.assign(nv, -1);
  r_.readers.assign(nv, 0);
  r_.alias_of.assign(nv, -1);
  r_.part_offset.assign(nv, 0);
  r_.upsampled_src.assign(nv, -1);
  r_.store_bf16.assign(nv, false);
  r_.need_shadow.assign(nv, false);
  r_.need_f32.assign(nv, false);
  r_.need_q8.assign(nv, false);  // int8 decisions: none until analyse_int8
  r_.stored.assign(nv, false);
  r_.q8_scale.assign(nv, 0.f);
  r_.int8_conv.assign(nops, false);
  for (auto* v : {&r_.pool_fused_next, &r_.resize_folded, &r_.unaligned, &r_.in_place, &r_.paired_with_next,
                  &r_.paired_with_prev, &r_.single_channel, &r_.depthwise, &r_.reads_bf16})
    v->assign(nops, false);
  auto &producer = r_.producer, &last = r_.last, &readers = r_.readers, &alias_of = r_.alias_of;
  auto& part_offset = r_.part_offset;
  auto& upsampled_src = r_.upsampled_src;
  auto &store_bf16 = r_.store_bf16, &need_shadow = r_.need_shadow, &need_f32 = r_.need_f32;
  auto &pool_fused_next = r_.pool_fused_next, &resize_folded = r_.resize_folded, &unaligned = r_.unaligned;
  auto &paired_with_next = r_.paired_with_next, &paired_with_prev = r_.paired_with_prev;

  // Producer and last reader of every value.
  for (int i = 0; i < nops; ++i) {
    const auto& op = f.ops[i];
    producer[op.out] = i;
    std::vector<int> reads = op.in;
    reads.insert(reads.end(), op.add.begin(), op.add.end());
    if (op.residual >= 0) reads.push_back(op.residual);
    for (int v : reads) {
      last[v] = i;
      ++readers[v];
    }
  }
  // A max pooling whose only reader is the affine right after it: one kernel for both (the
  // pooled map is never stored); what the pooling reads stays live until then.
  for (int i = 1; i + 1 < nops; ++i) {
    const auto &p = f.ops[i], &a = f.ops[i + 1];
    if (p.kind != FusedOp::Kind::MaxPool || a.kind != FusedOp::Kind::Affine || a.in[0] != p.out ||
        readers[p.out] != 1 || !p.add.empty() || p.out == f.output)
      continue;
    pool_fused_next[i] = true;
    for (int v : p.in)
      if (last[v] == i) last[v] = i + 1;
  }
  // A bilinear resize whose only use is as an addition of a MulAdd (C6.1's X3, the ×2 of
  // C1.9): added on the fly by that MulAdd's pass from the small map, never stored.
  for (int i = 1; i < nops; ++i) {
    const auto& op = f.ops[i];
    if (op.kind != FusedOp::Kind::Resize || op.out == f.output || !op.add.empty() || readers[op.out] != 1) continue;
    const int j = last[op.out];
    const auto& r = f.ops[j];
    if (r.kind != FusedOp::Kind::MulAdd || std::count(r.add.begin(), r.add.end(), op.out) != 1 ||
        std::count(r.in.begin(), r.in.end(), op.out) != 0 || f.channels[op.in[0]] != f.channels[r.out])
      continue;
    resize_folded[i] = true;
    upsampled_src[op.out] = op.in[0];
    last[op.in[0]] = std::max(last[op.in[0]], j);
  }
  // Concat parts written in place by their producer's pass (block-aligned offsets).
  // (Only when every part starts on a channel block; otherwise a copy.)
  for (int i = 0; i < nops; ++i) {
    const auto& op = f.ops[i];
    if (op.kind != FusedOp::Kind::Concat) continue;
    int64_t off = 0;
    for (int part : op.in) {
      if (off % block) unaligned[i] = true;
      off += f.channels[part];
    }
    if (unaligned[i]) continue;
    off = 0;
    for (int part : op.in) {
      const int p = producer[part];
      const bool pass = p >= 0 && (f.ops[p].kind == FusedOp::Kind::Conv || f.ops[p].kind == FusedOp::Kind::Affine);
      if (pass && readers[part] == 1 && off % block == 0) {  // read by the concat only
        alias_of[part] = op.out;
        part_offset[part] = off;
      }
      off += f.channels[part];
    }
  }
  // A concat whose every part is written in place by its producer (no copy, no concat step).
  auto all_in_place = [&](int i) {
    const auto& op = f.ops[i];
    return op.kind == FusedOp::Kind::Concat && !unaligned[i] && op.add.empty() &&
           std::all_of(op.in.begin(), op.in.end(), [&](int part) { return alias_of[part] == op.out; });
  };
  // bf16 plans: the convolutions that read bf16 (dense ones, but not on the image and not
  // with one output channel: those run our kernel), the values they need a shadow of, and
  // the values something else reads in f32.
  const int normalised = f.ops.front().out;
  auto single_channel = [&](const FusedOp& op) {
    return op.kind == FusedOp::Kind::Conv && op.weight.size(0) == 1 && op.groups == 1 && op.in[0] != normalised &&
           op.residual < 0 && op.add.empty() && alias_of[op.out] < 0;
  };
  auto depthwise = [&](const FusedOp& op) {  // our depthwise kernel
    return op.kind == FusedOp::Kind::Conv && op.groups > 1 && op.groups == op.weight.size(0) &&
           op.groups == f.channels[op.in[0]] && op.weight.size(1) == 1 && op.weight.size(2) <= 16 &&
           op.in[0] != normalised;
  };
  auto reads_bf16 = [&](const FusedOp& op) {
    return bf16 && op.kind == FusedOp::Kind::Conv && op.groups == 1 && op.in[0] != normalised && !single_channel(op);
  };
  // Values stored in bf16 only: those whose producer is one of our passes or a bf16
  // convolution, and that nothing reads but bf16 convolutions and our kernels (not oneDNN's
  // pooling, resampling or concat, not the output). The others stay f32, with a bf16 copy
  // (shadow) where a bf16 convolution reads them.
  std::vector<bool> f32_only(nv, false), conv_reader(nv, false);
  need_f32[f.output] = f32_only[f.output] = f32_only[normalised] = true;
  for (int i = 1; i < nops; ++i) {
    const auto& op = f.ops[i];
    for (size_t k = 0; k < op.in.size(); ++k) (k == 0 && reads_bf16(op) ? conv_reader : need_f32)[op.in[k]] = true;
    for (int v : op.add) need_f32[v] = true;
    if (op.residual >= 0) need_f32[op.residual] = true;
    const bool ours = op.kind == FusedOp::Kind::Affine || op.kind == FusedOp::Kind::MulAdd ||
                      op.kind == FusedOp::Kind::MaxPool || (op.kind == FusedOp::Kind::Resize && resize_folded[i]) ||
                      (op.kind == FusedOp::Kind::Conv && (reads_bf16(op) || depthwise(op) || single_channel(op))) ||
                      (op.kind == FusedOp::Kind::Concat && all_in_place(i));
    if (!ours)
      for (int v : op.in) f32_only[v] = true;
  }
  for (int i = 1; i < nops; ++i) {
    const auto& op = f.ops[i];
    const int v = op.out;
    const bool writer = op.kind == FusedOp::Kind::Affine || op.kind == FusedOp::Kind::MulAdd ||
                        op.kind == FusedOp::Kind::MaxPool ||
                        (op.kind == FusedOp::Kind::Conv && (reads_bf16(op) || depthwise(op))) ||
                        (op.kind == FusedOp::Kind::Concat && all_in_place(i));
    store_bf16[v] = bf16 && writer && !f32_only[v] && alias_of[v] < 0;
    need_shadow[v] = conv_reader[v] && !store_bf16[v];
  }
  // The parts of a concat stored in bf16 are written in bf16 by their producers' passes.
  for (int v = 0; v < nv; ++v)
    if (alias_of[v] >= 0) {
      store_bf16[v] = store_bf16[alias_of[v]];
      if (store_bf16[v]) need_shadow[v] = false;
    }
  // Paired depthwise convolutions: op i (A) and op i + 1 (B) read the same value, same
  // output size, B adds A's result and nothing else reads A's result.
  auto plain_depthwise = [&](const FusedOp& op) { return depthwise(op) && op.residual < 0 && alias_of[op.out] < 0; };
  for (int i = 1; i + 1 < nops; ++i) {
    const auto &a = f.ops[i], &b = f.ops[i + 1];
    if (!plain_depthwise(a) || !plain_depthwise(b) || !a.add.empty() || b.in[0] != a.in[0] || readers[a.out] != 1 ||
        std::count(b.add.begin(), b.add.end(), a.out) != 1 || sizes[a.out] != sizes[b.out] ||
        paired_with_prev[i] || a.act == Act::Sigmoid)
      continue;
    paired_with_next[i] = paired_with_prev[i + 1] = true;
  }
  for (int i = 0; i < nops; ++i) {
    r_.in_place[i] = all_in_place(i);
    r_.single_channel[i] = single_channel(f.ops[i]);
    r_.depthwise[i] = depthwise(f.ops[i]);
    r_.reads_bf16[i] = reads_bf16(f.ops[i]);
  }
  return r_;
}

void analyse_int8(const FusedNetwork& f, PlanAnalysis& an) {
  const int nv = static_cast<int>(f.num_values);
  const int nops = static_cast<int>(f.ops.size());
  if (f.act_absmax.size() != static_cast<size_t>(nv))
    throw std::invalid_argument("int8 inference needs an int8 calibration of the weights (lightseg calibrate)");
  an.int8_conv.assign(nops, false);
  an.need_q8.assign(nv, false);
  an.stored.assign(nv, false);
  an.q8_scale.assign(nv, 0.f);
  for (int i = 1; i < nops; ++i) {
    const FusedOp& op = f.ops[i];
    an.int8_conv[i] = op.kind == FusedOp::Kind::Conv && op.groups == 1 && !an.depthwise[i] && !an.single_channel[i] &&
                      op.in[0] != f.ops[0].out;
    if (an.int8_conv[i]) an.need_q8[op.in[0]] = true;
  }
  for (int i = 0; i < nops; ++i) {
    const FusedOp& op = f.ops[i];
    for (size_t k = 0; k < op.in.size(); ++k)
      if (k > 0 || !an.int8_conv[i]) an.stored[op.in[k]] = true;
    for (int v : op.add) an.stored[v] = true;
    if (op.residual >= 0) an.stored[op.residual] = true;
  }
  an.stored[f.output] = true;
  for (int v = 0; v < nv; ++v) {
    if (!an.need_q8[v]) continue;
    if (!(f.act_absmax[v] > 0.f) || !std::isfinite(f.act_absmax[v]))
      throw std::invalid_argument("int8 calibration: no bound for the input of a convolution (value " +
                                  std::to_string(v) + "); calibrate the weights again");
    an.q8_scale[v] = f.act_absmax[v] / 127.f;
  }
}

}  // namespace lightseg::onednn
