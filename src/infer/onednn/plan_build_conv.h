// Building a plan's convolutions (PlanBuilder, plan_build.h): one output channel and depthwise
// on our kernels (kernels/single_channel.h, kernels/depthwise.h); dense ones on oneDNN's
// primitives or our Winograd (kernels/winograd.h), whichever measures fastest here, in int8 on
// int8_conv.h in int8 plans; each followed by the pass (epilogue.h) that finishes it.
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.

void PlanBuilder::conv(int i) {
  const auto& op = f_.ops[i];
  const View& x = p_.views_[op.in[0]];
  if (op.weight.size(0) == 1 && op.groups == 1 && x.fmt == View::Fmt::Blocked && op.residual < 0 && op.add.empty() &&
      an_.alias_of[op.out] < 0)
    single_channel_conv(i);
  else if (an_.depthwise[i])
    depthwise_conv(i);
  else
    dense_conv(i);
}

// One output channel (C6.3's attention map): ours, its activation fused.
void PlanBuilder::single_channel_conv(int i) {
  const auto& op = f_.ops[i];
  const View& x = p_.views_[op.in[0]];
  const int64_t I = op.weight.size(1), kh = op.weight.size(2), kw = op.weight.size(3);
  place(op.out);
  auto c = std::make_shared<SingleChannelConv>();
  c->src = x;
  c->dst = p_.views_[op.out];
  const int64_t blocks = round_up(I) / kBlock;
  auto t = torch::zeros({kh, kw, blocks * kBlock});
  t.slice(2, 0, I).copy_(op.weight.to(torch::kCPU, torch::kFloat32)[0].permute({1, 2, 0}));
  c->weight = t.contiguous();
  c->bias = op.bias.to(torch::kCPU, torch::kFloat32).item<float>();
  c->act = op.act;
  if (op.act == Act::PReLU) c->slope = op.slopes.to(torch::kCPU, torch::kFloat32).flatten()[0].item<float>();
  c->kh = kh;
  c->kw = kw;
  c->sh = op.stride[0];
  c->sw = op.stride[1];
  c->ph = op.padding[0];
  c->pw = op.padding[1];
  c->dh = op.dilation[0];
  c->dw = op.dilation[1];
  add_step(op.name + " (one channel)", [c](dnnl::stream&) { run_single_channel(*c); });
}

// A depthwise convolution's kernel and pass from its operation `o` (input x, additions `adds`).
void PlanBuilder::fill_depthwise(DepthwiseConv& c, const FusedOp& o, const View& x, const std::vector<int>& adds) {
  const int64_t O = o.weight.size(0);
  c.e.src = x;
  c.e.act = o.act;
  if (o.act == Act::PReLU) c.e.slopes = param(o.slopes, O);
  if (o.residual >= 0) c.e.residual = &p_.views_[o.residual];
  c.e.adds = views_of(adds);
  c.e.valid = valid(O);
  const int64_t okh = o.weight.size(2), okw = o.weight.size(3);
  const int64_t blocks = round_up(O) / kBlock;
  auto w = o.weight.to(torch::kCPU, torch::kFloat32).reshape({O, okh, okw});
  {  // [blocks·16][kh][kw] → [blocks][kh][kw][16]
    auto t = torch::zeros({blocks * kBlock, okh, okw});
    t.slice(0, 0, O).copy_(w);
    c.weight = t.view({blocks, kBlock, okh, okw}).permute({0, 2, 3, 1}).contiguous();
  }
  c.bias = padded(o.bias, O);
  c.kh = okh;
  c.kw = okw;
  c.sh = o.stride[0];
  c.sw = o.stride[1];
  c.ph = o.padding[0];
  c.pw = o.padding[1];
  c.dh = o.dilation[0];
  c.dw = o.dilation[1];
}

// Depthwise (C4.3–C4.5, the decoder's): ours, the pass fused. A depthwise convolution of the
// same input whose result only this one adds: the pair runs as one kernel (see PairedDepthwise).
void PlanBuilder::depthwise_conv(int i) {
  if (an_.paired_with_next[i]) return;  // built with the next operation
  const auto& op = f_.ops[i];
  const View& x = p_.views_[op.in[0]];
  if (an_.paired_with_prev[i]) {
    const FusedOp& a = f_.ops[i - 1];
    place(op.out);
    auto c = std::make_shared<PairedDepthwise>();
    fill_depthwise(c->a, a, x, {});
    std::vector<int> adds;
    for (int v : op.add)
      if (v != a.out) adds.push_back(v);
    fill_depthwise(c->b, op, x, adds);
    c->a.e.dst = c->b.e.dst = p_.views_[op.out];
    add_step(a.name + " + " + op.name + " (paired depthwise+pass)", [c](dnnl::stream&) { run_paired(*c); });
    final_pass_ = &c->b.e;
    return;
  }
  place(op.out);
  auto c = std::make_shared<DepthwiseConv>();
  fill_depthwise(*c, op, x, op.add);
  c->e.dst = p_.views_[op.out];
  add_step(op.name + " (depthwise+pass)", [c](dnnl::stream&) { run_depthwise(*c); });
  final_pass_ = &c->e;
}

// A dense convolution as oneDNN takes it. Taps that only ever read padding (a dilation as large
// as the map: C3's deep dilations on small inputs) are dropped: the same sums, and oneDNN's AVX2
// kernels refuse such shapes (its reference kernel would run).
struct PlanBuilder::DenseShape {
  int64_t O, G;
  Taps1 th, tw;                 // the live taps
  int64_t ekh, ekw, dh, dw;     // their count and dilation
  int64_t ph, pw, rh, rw;       // padding before and after
  dims wd;                      // weights' dims (goihw with groups)
  torch::Tensor w_live;         // the live taps' weights, f32, contiguous
};

PlanBuilder::DenseShape PlanBuilder::dense_shape(const FusedOp& op, const View& x, const View& y) const {
  DenseShape s;
  const int64_t I = op.weight.size(1), kh = op.weight.size(2), kw = op.weight.size(3);
  s.O = op.weight.size(0);
  s.G = op.groups;
  s.th = live_taps(kh, op.dilation[0], op.padding[0], op.stride[0], x.H, y.H);
  s.tw = live_taps(kw, op.dilation[1], op.padding[1], op.stride[1], x.W, y.W);
  s.ekh = s.th.count;
  s.ekw = s.tw.count;
  s.dh = s.ekh > 1 ? op.dilation[0] : 1;
  s.dw = s.ekw > 1 ? op.dilation[1] : 1;
  s.wd = s.G == 1 ? dims{s.O, I, s.ekh, s.ekw} : dims{s.G, s.O / s.G, I, s.ekh, s.ekw};
  s.ph = s.th.padding;
  s.pw = s.tw.padding;
  s.rh = (y.H - 1) * op.stride[0] + (s.ekh - 1) * s.dh + 1 - x.H - s.ph;
  s.rw = (y.W - 1) * op.stride[1] + (s.ekw - 1) * s.dw + 1 - x.W - s.pw;
  s.w_live = op.weight.to(torch::kCPU, torch::kFloat32)
                 .slice(2, s.th.first, s.th.first + s.ekh)
                 .slice(3, s.tw.first, s.tw.first + s.ekw)
                 .contiguous();
  return s;
}

void PlanBuilder::dense_conv(int i) {
  const auto& op = f_.ops[i];
  const int out = op.out;
  const View& x = p_.views_[op.in[0]];
  const bool pass = op.act == Act::PReLU || op.residual >= 0 || !op.add.empty() || an_.alias_of[out] >= 0;
  place(out);
  const View& y = p_.views_[out];
  // Destination of the convolution itself: the value's buffer (the pass then runs in place),
  // or a scratch buffer when the value is a concat part at an offset.
  View cdst = y;
  cdst.coff = 0;
  cdst.ctot = y.C;
  float* scratch = nullptr;
  if (an_.alias_of[out] >= 0) cdst.data = scratch = p_.alloc(cdst.floats());
  const DenseShape s = dense_shape(op, x, y);
  if (an_.int8_conv[i]) {
    int8_dense_conv(i, s, cdst, pass);
  } else {
    const bool pass_done = float_dense_conv(i, s, cdst, pass);
    if (pass && !pass_done) conv_pass(op, cdst, op.act);
  }
  if (scratch) p_.release(scratch, cdst.floats());
}

// The pass that finishes a convolution: `src` (its raw result) → the value, with the
// activation `act`, the residual and the additions.
void PlanBuilder::conv_pass(const FusedOp& op, const View& src, Act act) {
  Epilogue* e = conv_pass_epilogue(op, src, act);
  add_step(op.name + " (pass)", [e](dnnl::stream&) { run_epilogue(*e); });
}

Epilogue* PlanBuilder::conv_pass_epilogue(const FusedOp& op, const View& src, Act act) {
  auto e = std::make_unique<Epilogue>();
  e->src = src;
  e->dst = p_.views_[op.out];
  e->act = act;
  if (act == Act::PReLU) e->slopes = param(op.slopes, op.weight.size(0));
  if (op.residual >= 0) e->residual = &p_.views_[op.residual];
  e->adds = views_of(op.add);
  e->valid = valid(op.weight.size(0));
  return keep_epilogue(std::move(e));
}

// int8 (int8_conv.h): into an NHWC f32 result, then the pass into the value.
void PlanBuilder::int8_dense_conv(int i, const DenseShape& s, const View& cdst, bool pass) {
  const auto& op = f_.ops[i];
  const View& x = p_.views_[op.in[0]];
  if (!p_.q8_[op.in[0]]) throw std::logic_error("onednn: no int8 input for " + op.name);
  View r = cdst;
  r.fmt = View::Fmt::Nhwc;
  r.bf16 = false;
  r.data = p_.alloc(r.floats());
  const bool post = !pass && (op.act == Act::ReLU || op.act == Act::Sigmoid);
  auto c = make_int8_conv(p_.eng_, x, p_.q8_[op.in[0]], p_.q8_scale_[op.in[0]], s.w_live, op.bias, r,
                          {op.stride[0], op.stride[1]}, {s.dh - 1, s.dw - 1}, {s.ph, s.pw}, {s.rh, s.rw},
                          post ? op.act : Act::None);
  add_step(op.name + " (int8 " + c->impl + ")", [c](dnnl::stream& st) { run_int8_conv(*c, st); });
  conv_pass(op, r, post ? Act::None : op.act);
  p_.release(r.data, r.floats());
}

// f32 or bf16: the candidates, chosen by measuring them here once: oneDNN's direct algorithm;
// its Winograd for dense 3×3 stride-1 convolutions; for the first convolution also an NHWC
// input; our Winograd F(4×4, 3×3) and F(6×6, 3×3) where they fit; in bf16, NHWC
// (nhwc_bf16_conv: AMX). A layout that only oneDNN's reference kernel takes runs in NHWC
// between two reorders instead.
bool PlanBuilder::float_dense_conv(int i, const DenseShape& s, const View& cdst, bool pass) {
  const auto& op = f_.ops[i];
  const View& x = p_.views_[op.in[0]];
  const auto& eng = p_.eng_;
  dnnl::memory::desc wmd(s.wd, dtype::f32, s.G == 1 ? tag::oihw : tag::goihw);
  dnnl::primitive_attr attr;
  if (!pass && (op.act == Act::ReLU || op.act == Act::Sigmoid)) {
    dnnl::post_ops po;
    po.append_eltwise(1.f, op.act == Act::ReLU ? dnnl::algorithm::eltwise_relu : dnnl::algorithm::eltwise_logistic,
                      0.f, 0.f);
    attr.set_post_ops(po);
  }
  const torch::Tensor& w_plain = s.w_live;
  dnnl::memory wsrc(wmd, eng, w_plain.data_ptr());
  p_.params_.push_back(op.bias.to(torch::kCPU, torch::kFloat32).contiguous().clone());
  dnnl::memory bmem(dnnl::memory::desc({s.O}, dtype::f32, tag::x), eng, p_.params_.back().data_ptr());
  dnnl::memory dmem(cdst.desc(), eng, cdst.data);
  const dims strides{op.stride[0], op.stride[1]}, dil{s.dh - 1, s.dw - 1}, pad_l{s.ph, s.pw}, pad_r{s.rh, s.rw};
  struct Candidate {
    dnnl::convolution_forward prim;
    dnnl::memory src, weights;
    torch::Tensor wbuf;
    View::Fmt fmt;
    std::string impl;
    double seconds = 1e30;
  };
  std::vector<Candidate> cands;
  const bool use_bf16 = an_.reads_bf16[i];
  auto add_candidate = [&](dnnl::algorithm alg, View::Fmt fmt) {
    View xs = x;
    xs.fmt = fmt;
    dnnl::memory::desc sd = xs.desc();
    if (use_bf16 && !x.bf16) {  // the input's shadow
      if (!p_.shadow_[op.in[0]] || x.coff != 0) throw std::logic_error("onednn: no bf16 input for " + op.name);
      sd = dnnl::memory::desc({x.N, x.C, x.H, x.W}, dtype::bf16, kBlockedTag);
    }
    try {
      dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, alg, sd,
                                        dnnl::memory::desc(s.wd, use_bf16 ? dtype::bf16 : dtype::f32, tag::any),
                                        bmem.get_desc(), cdst.desc(), strides, dil, pad_l, pad_r);
      dnnl::convolution_forward::primitive_desc pd(d, attr, eng);
      Candidate c;
      c.impl = pd.impl_info_str();
      c.fmt = fmt;
      c.wbuf = torch::empty({static_cast<int64_t>(pd.weights_desc().get_size() / sizeof(float)) + 1});
      c.weights = dnnl::memory(pd.weights_desc(), eng, c.wbuf.data_ptr());
      dnnl::stream st(eng);
      dnnl::reorder(wsrc, c.weights).execute(st, wsrc, c.weights);
      st.wait();
      c.src = use_bf16 && !x.bf16 ? dnnl::memory(sd, eng, p_.shadow_[op.in[0]]) : dnnl::memory(sd, eng, x.data);
      c.prim = dnnl::convolution_forward(pd);
      cands.push_back(std::move(c));
    } catch (const dnnl::error&) {
      // this algorithm / format is not offered for this shape
    }
  };
  add_candidate(dnnl::algorithm::convolution_direct, x.fmt);
  if (!use_bf16 && s.G == 1 && s.ekh == 3 && s.ekw == 3 && op.stride[0] == 1 && op.stride[1] == 1 && s.dh == 1 &&
      s.dw == 1 && x.fmt == View::Fmt::Blocked)
    add_candidate(dnnl::algorithm::convolution_winograd, x.fmt);
  if (!use_bf16 && x.fmt != View::Fmt::Blocked) add_candidate(dnnl::algorithm::convolution_direct, View::Fmt::Nhwc);
  if (cands.empty()) throw std::runtime_error("onednn: no convolution for " + op.name);
  // A reference (non-JIT) kernel is never the fastest; timing one can take a second.
  auto is_ref = [](const Candidate& c) { return c.impl.rfind("ref", 0) == 0; };
  if (std::any_of(cands.begin(), cands.end(), [&](const Candidate& c) { return !is_ref(c); }))
    cands.erase(std::remove_if(cands.begin(), cands.end(), is_ref), cands.end());
  // Only a reference kernel for the blocked layout (oneDNN's AVX2 kernels refuse some dilated
  // convolutions on small maps): the convolution in NHWC, between two reorders.
  if (is_ref(cands.front()) && !use_bf16 && x.fmt == View::Fmt::Blocked) {
    View xp = x, yp = cdst;
    xp.fmt = yp.fmt = View::Fmt::Nhwc;
    xp.data = p_.alloc(xp.floats());
    yp.data = p_.alloc(yp.floats());
    try {
      dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                        xp.desc(), dnnl::memory::desc(s.wd, dtype::f32, tag::any), bmem.get_desc(),
                                        yp.desc(), strides, dil, pad_l, pad_r);
      dnnl::convolution_forward::primitive_desc pd(d, attr, eng);
      const std::string impl = pd.impl_info_str();
      if (impl.rfind("ref", 0) != 0) {
        auto wbuf = torch::empty({static_cast<int64_t>(pd.weights_desc().get_size() / sizeof(float)) + 1});
        dnnl::memory wmem(pd.weights_desc(), eng, wbuf.data_ptr());
        dnnl::stream st(eng);
        dnnl::reorder(wsrc, wmem).execute(st, wsrc, wmem);
        st.wait();
        p_.params_.push_back(wbuf);
        dnnl::memory xb(x.desc(), eng, x.data), xn(xp.desc(), eng, xp.data);
        dnnl::memory yn(yp.desc(), eng, yp.data);
        dnnl::reorder to_plain(xb, xn), to_blocked(yn, dmem);
        dnnl::convolution_forward prim(pd);
        add_step(op.name + " (nhwc " + impl + ")", [=](dnnl::stream& st2) mutable {
          to_plain.execute(st2, xb, xn);
          prim.execute(st2, {{DNNL_ARG_SRC, xn}, {DNNL_ARG_WEIGHTS, wmem}, {DNNL_ARG_BIAS, bmem}, {DNNL_ARG_DST, yn}});
          to_blocked.execute(st2, yn, dmem);
        });
        cands.clear();
      }
    } catch (const dnnl::error&) {
    }
    p_.release(xp.data, xp.floats());
    p_.release(yp.data, yp.floats());
  }
  // Our Winograd (kernels/winograd.h), where it fits, against the best of these;
  // onednn_set_winograd(4 or 6) forces one tile. (ReLU and sigmoid without a pass are oneDNN
  // post-ops: not taken.)
  std::shared_ptr<WinogradConv> wino;
  double wino_seconds = 1e30;
  const int wmode = winograd_mode();
  if (!cands.empty() && !use_bf16 && cdst.fmt == View::Fmt::Blocked && wmode != 0 && (pass || op.act == Act::None) &&
      winograd_fits(x, cdst, s.G, s.ekh, s.ekw, op.stride[0], op.stride[1], s.dh, s.dw)) {
    wino = fastest_winograd(x, cdst, s.ph, s.pw, w_plain, op.bias, wmode, &wino_seconds);
  }
  if (cands.size() > 1 || wino || (use_bf16 && bf16_nhwc_mode() < 0)) {
    dnnl::stream st(eng);
    for (auto& c : cands) {
      std::unordered_map<int, dnnl::memory> args{
          {DNNL_ARG_SRC, c.src}, {DNNL_ARG_WEIGHTS, c.weights}, {DNNL_ARG_BIAS, bmem}, {DNNL_ARG_DST, dmem}};
      c.prim.execute(st, args);
      st.wait();
      for (int r = 0; r < 3; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        c.prim.execute(st, args);
        st.wait();
        c.seconds = std::min(c.seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    }
  }
  auto best = std::min_element(cands.begin(), cands.end(),
                               [](const Candidate& a, const Candidate& b) { return a.seconds < b.seconds; });
  if (use_bf16 && !cands.empty() && nhwc_bf16_conv(i, s, cdst, pass, attr, bmem, best->seconds)) return true;
  if (wino && (wmode > 0 || wino_seconds < best->seconds)) {
    add_step(op.name + (wino->m == 6 ? " (winograd_6x3: ours)" : " (winograd_4x3: ours)"),
             [wino](dnnl::stream&) { run_winograd(*wino); });
  } else if (!cands.empty()) {
    p_.views_[op.in[0]].fmt = best->fmt;  // the first convolution picks the normalised image's format
    if (best->impl.find("winograd") == std::string::npos &&
        sliced_dense_conv(op, s, best->src, cdst, attr, use_bf16, pass, best->impl))
      return pass;
    p_.params_.push_back(best->wbuf);
    auto prim = best->prim;
    auto smem = best->src, wmem = best->weights;
    add_step(op.name + " (" + best->impl + ")", [prim, smem, wmem, bmem, dmem](dnnl::stream& st) {
      prim.execute(st, {{DNNL_ARG_SRC, smem}, {DNNL_ARG_WEIGHTS, wmem}, {DNNL_ARG_BIAS, bmem}, {DNNL_ARG_DST, dmem}});
    });
  }
  return false;
}

// bf16 in NHWC: oneDNN's AMX kernels take no blocked layout (on nChw16c an AMX CPU runs its
// AVX512-BF16 kernels, ~10× slower on this network's shapes). One step reorders the input (the
// value or its bf16 shadow) into an NHWC bf16 copy and runs the convolution into an NHWC result
// (bf16 where the value is stored in bf16, as the blocked convolution's: half the bytes, 16 %
// less time a call than f32 results); the pass reads that result into the value (as in int8
// plans). Taken where the step (plus a reorder back, where the blocked convolution needs no
// pass) measures faster than `to_beat` (the blocked convolution's seconds), or always under
// onednn_set_bf16_nhwc(1); never under 0 or for a view oneDNN cannot describe (a concat part
// read alone, grouped weights). A plan built like another (auto's pool plan) takes that plan's
// choice.
bool PlanBuilder::nhwc_bf16_conv(int i, const DenseShape& s, const View& cdst, bool pass,
                                 const dnnl::primitive_attr& attr, const dnnl::memory& bmem, double to_beat) {
  const auto& op = f_.ops[i];
  const View& x = p_.views_[op.in[0]];
  int mode = bf16_nhwc_mode();
  if (p_.like_ && p_.like_->nhwc_[i] >= 0) mode = p_.like_->nhwc_[i];  // as the size's first plan chose
  p_.nhwc_[i] = 0;
  const bool from_shadow = !x.bf16;
  if (mode == 0 || x.fmt != View::Fmt::Blocked || x.coff != 0 || x.C != x.ctot || s.G != 1 ||
      (from_shadow && !p_.shadow_[op.in[0]]))
    return false;
  const auto& eng = p_.eng_;
  dnnl::memory xb(dnnl::memory::desc({x.N, x.C, x.H, x.W}, dtype::bf16, kBlockedTag), eng,
                  from_shadow ? static_cast<void*>(p_.shadow_[op.in[0]]) : static_cast<void*>(x.data));
  View xn = x, r = cdst;
  xn.fmt = r.fmt = View::Fmt::Nhwc;
  xn.bf16 = true;
  r.bf16 = cdst.bf16;  // as the blocked convolution's result: bf16 where the value is stored in bf16
  xn.data = p_.alloc(xn.floats());
  r.data = p_.alloc(r.floats());
  bool taken = false;
  try {
    dnnl::convolution_forward::desc d(
        dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, xn.desc(),
        dnnl::memory::desc(s.wd, dtype::bf16, tag::any), bmem.get_desc(), r.desc(), {op.stride[0], op.stride[1]},
        {s.dh - 1, s.dw - 1}, {s.ph, s.pw}, {s.rh, s.rw});
    dnnl::convolution_forward::primitive_desc pd(d, attr, eng);
    const std::string impl = pd.impl_info_str();
    if (impl.rfind("ref", 0) != 0) {
      auto wbuf = torch::empty({static_cast<int64_t>(pd.weights_desc().get_size() / sizeof(float)) + 1});
      dnnl::memory wsrc(dnnl::memory::desc(s.wd, dtype::f32, tag::oihw), eng, s.w_live.data_ptr());
      dnnl::memory wmem(pd.weights_desc(), eng, wbuf.data_ptr());
      dnnl::stream st(eng);
      dnnl::reorder(wsrc, wmem).execute(st, wsrc, wmem);
      st.wait();
      dnnl::memory xm(xn.desc(), eng, xn.data), rm(r.desc(), eng, r.data), dmem(cdst.desc(), eng, cdst.data);
      dnnl::reorder to_nhwc(xb, xm), back(rm, dmem);
      dnnl::convolution_forward prim(pd);
      auto step = [=](dnnl::stream& s2) mutable {
        to_nhwc.execute(s2, xb, xm);
        prim.execute(s2, {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wmem}, {DNNL_ARG_BIAS, bmem}, {DNNL_ARG_DST, rm}});
      };
      double seconds = 1e30;
      if (mode < 0) {
        for (int k = 0; k < 4; ++k) {  // the first call warms up
          auto t0 = std::chrono::steady_clock::now();
          step(st);
          if (!pass) back.execute(st, rm, dmem);  // else the pass, which the blocked convolution has too
          st.wait();
          if (k > 0) seconds = std::min(seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
      }
      if (mode > 0 || seconds < to_beat) {
        p_.params_.push_back(wbuf);
        add_step(op.name + " (nhwc " + impl + ")", step);
        conv_pass(op, r, pass ? op.act : Act::None);  // without a pass: ReLU or sigmoid ran in oneDNN (attr)
        taken = true;
        p_.nhwc_[i] = 1;
      }
    }
  } catch (const dnnl::error&) {
    // no NHWC bf16 convolution of this shape
  }
  p_.release(xn.data, xn.floats());
  p_.release(r.data, r.floats());
  return taken;
}

// In a pool plan (one built within PoolSteps, claim_pool.h), batch 1: the convolution `impl`
// chose, cut into a slice per thread by output channel blocks, each made for one thread, with
// its pass (sliced_conv.h). False where it does not apply (the convolution then runs whole, on OpenMP).
bool PlanBuilder::sliced_dense_conv(const FusedOp& op, const DenseShape& s, const dnnl::memory& src, const View& cdst,
                                    dnnl::primitive_attr attr, bool use_bf16, bool pass, const std::string& impl) {
  const int threads = at::get_num_threads();
  const int64_t B = round_up(s.O) / kBlock;
  if (!steps_on_pool() || int8_ || threads < 2 || cdst.N != 1 || s.G != 1 || B < 2 ||
      cdst.fmt != View::Fmt::Blocked)
    return false;
  // One slice per thread: more (4 per thread) cost 10-15 % more than whole convolutions on a
  // quiet CPU (each slice reads the whole input; narrower slices block worse), one ~4 %.
  const int64_t S = std::min<int64_t>(B, threads);
  const auto& eng = p_.eng_;
  auto c = std::make_shared<SlicedConv>();
  c->eng = eng;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // a scratchpad per slice: slices run at once
  const dims strides{op.stride[0], op.stride[1]}, dil{s.dh - 1, s.dw - 1}, pad_l{s.ph, s.pw}, pad_r{s.rh, s.rw};
  const torch::Tensor bias = op.bias.to(torch::kCPU, torch::kFloat32);
  std::string slice_impl;
  {
    // oneDNN fixes a primitive's thread count when it is made: one, so that a slice runs on
    // the thread that claims it.
    struct OneThread {
      const int was = at::get_num_threads();
      OneThread() { at::set_num_threads(1); }
      ~OneThread() { at::set_num_threads(was); }
    } one;
    dnnl::stream st(eng);
    for (int64_t k = 0; k < S; ++k) {
      SlicedConv::Slice sl;
      sl.g0 = B * k / S;
      sl.g1 = B * (k + 1) / S;
      const int64_t o0 = sl.g0 * kBlock, o1 = std::min(s.O, sl.g1 * kBlock);
      View d = cdst;
      d.data = cdst.bf16 ? reinterpret_cast<float*>(cdst.blockh(0, sl.g0)) : cdst.block(0, sl.g0);
      d.C = d.ctot = o1 - o0;
      const dims wd{o1 - o0, s.wd[1], s.wd[2], s.wd[3]};
      dnnl::memory::desc bd({o1 - o0}, dtype::f32, tag::x);
      dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                           src.get_desc(),
                                           dnnl::memory::desc(wd, use_bf16 ? dtype::bf16 : dtype::f32, tag::any), bd,
                                           d.desc(), strides, dil, pad_l, pad_r);
      dnnl::convolution_forward::primitive_desc pd;
      try {
        pd = dnnl::convolution_forward::primitive_desc(desc, attr, eng);
      } catch (const dnnl::error&) {
        return false;
      }
      slice_impl = pd.impl_info_str();
      if (slice_impl.rfind("ref", 0) == 0) return false;
      auto w = s.w_live.slice(0, o0, o1).contiguous();
      dnnl::memory wsrc(dnnl::memory::desc(wd, dtype::f32, tag::oihw), eng, w.data_ptr());
      c->storage.push_back(torch::empty({static_cast<int64_t>(pd.weights_desc().get_size() / sizeof(float)) + 1}));
      dnnl::memory wm(pd.weights_desc(), eng, c->storage.back().data_ptr());
      dnnl::reorder(wsrc, wm).execute(st, wsrc, wm);
      st.wait();
      c->storage.push_back(bias.slice(0, o0, o1).contiguous().clone());
      dnnl::memory bm(bd, eng, c->storage.back().data_ptr());
      c->storage.push_back(torch::empty({static_cast<int64_t>(pd.scratchpad_desc().get_size() / sizeof(float)) + 1}));
      dnnl::memory sm(pd.scratchpad_desc(), eng, c->storage.back().data_ptr());
      sl.args = {{DNNL_ARG_SRC, src},
                 {DNNL_ARG_WEIGHTS, wm},
                 {DNNL_ARG_BIAS, bm},
                 {DNNL_ARG_DST, dnnl::memory(d.desc(), eng, d.data)},
                 {DNNL_ARG_SCRATCHPAD, sm}};
      sl.prim = dnnl::convolution_forward(pd);
      c->slices.push_back(std::move(sl));
    }
  }
  if (pass) c->pass = conv_pass_epilogue(op, cdst, op.act);
  add_step(op.name + " (" + slice_impl + " in " + std::to_string(S) + " slices" + (pass ? " + pass" : "") +
               ": claim pool; whole: " + impl + ")",
           [c](dnnl::stream&) { run_sliced_conv(*c); });
  return true;
}
