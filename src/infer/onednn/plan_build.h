// Building a plan (plan.h): the steps of one input shape, operation by operation, from the
// analysis of the operation list (analysis.h): which of our kernels (kernels/) or oneDNN's
// primitives runs each operation (the fastest measured here where there is a choice), in which
// layout, and which pass (epilogue.h) finishes it. One builder per operation kind: the
// normalisation, affine, max pooling, concat, resize and multiply-add here; the convolutions
// (one output channel, depthwise, dense in f32 / bf16 / int8) in plan_build_conv.h.
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.

class PlanBuilder {
 public:
  PlanBuilder(Plan& plan, const FusedNetwork& f, bool bf16, bool int8);
  // Every operation's steps in order, then the checks of the list's ends.
  void build();

 private:
  // Storage, parameters and steps of the plan.
  void place(int v);  // gives value v its storage (a concat part: its concat's)
  float* param(const torch::Tensor& t, int64_t c);
  float* valid(int64_t c) { return param(torch::ones({c}), c); }
  void add_step(const std::string& label, Plan::Step fn);
  void add_epilogue(std::unique_ptr<Epilogue> e, const std::string& label);
  Epilogue* keep_epilogue(std::unique_ptr<Epilogue> e);  // the plan keeps it; it is the operation's final pass
  // A pass without scale or activation: src into dst, plus the values `adds`.
  void add_copy_pass(const View& src, const View& dst, const std::vector<int>& adds, const std::string& label);
  std::vector<const View*> views_of(const std::vector<int>& vs);
  size_t shadow_floats(int v) const;
  size_t q8_floats(int v) const;

  // One builder per operation kind (the i-th operation of the list).
  void normalize(int i);
  void conv(int i);                  // plan_build_conv.h: picks one of the three below
  void single_channel_conv(int i);   //   one output channel: ours
  void depthwise_conv(int i);        //   depthwise (FEB's two branches paired): ours
  void dense_conv(int i);            //   dense: oneDNN's or our Winograd; int8: int8_conv.h
  void affine(int i);
  void max_pool(int i);
  void concat(int i);
  void resize(int i);
  void mul_add(int i);
  // After every operation: its value's bf16 and int8 copies, and the release of what it read
  // for the last time.
  void bf16_copy(int i);
  void int8_copy(int i);
  void release_last_reads(int i);

  // The dense convolution's parts (plan_build_conv.h).
  struct DenseShape;
  DenseShape dense_shape(const FusedOp& op, const View& x, const View& y) const;
  void int8_dense_conv(int i, const DenseShape& s, const View& cdst, bool pass);
  // True when the pass is part of the convolution's step (a sliced convolution).
  bool float_dense_conv(int i, const DenseShape& s, const View& cdst, bool pass);
  // True when taken: the convolution in NHWC, its pass included (oneDNN's AMX kernels).
  bool nhwc_bf16_conv(int i, const DenseShape& s, const View& cdst, bool pass, const dnnl::primitive_attr& attr,
                      const dnnl::memory& bmem, double to_beat);
  bool sliced_dense_conv(const FusedOp& op, const DenseShape& s, const dnnl::memory& src, const View& cdst,
                         dnnl::primitive_attr attr, bool use_bf16, bool pass, const std::string& impl);
  void conv_pass(const FusedOp& op, const View& src, Act act);
  Epilogue* conv_pass_epilogue(const FusedOp& op, const View& src, Act act);  // kept, no step
  void fill_depthwise(DepthwiseConv& c, const FusedOp& o, const View& x, const std::vector<int>& adds);

  Plan& p_;
  const FusedNetwork& f_;
  const bool int8_;  // bf16 only shapes the analysis (an_)
  PlanAnalysis an_;
  Epilogue* final_pass_ = nullptr;  // the last pass of the current operation: it may write the copies too
};

Plan::Plan(const FusedNetwork& f, const dnnl::engine& eng, int64_t N, int64_t H, int64_t W, bool bf16, bool int8,
           const Plan* like)
    : f_(f), eng_(eng), N_(N), H_(H), W_(W), nhwc_(f.ops.size(), -1), like_(like) {
  PlanBuilder(*this, f, bf16, int8).build();
  like_ = nullptr;  // read while building only: that plan may go before this one
}

PlanBuilder::PlanBuilder(Plan& plan, const FusedNetwork& f, bool bf16, bool int8)
    : p_(plan), f_(f), int8_(int8) {
  const auto sizes = f.value_sizes(p_.H_, p_.W_);
  const int nv = static_cast<int>(f.num_values);
  auto& views = p_.views_;
  views.resize(nv);
  p_.shadow_.assign(nv, nullptr);
  p_.q8_.assign(nv, nullptr);
  p_.q8_scale_.assign(nv, 0.f);
  for (int v = 0; v < nv; ++v) {
    views[v].N = p_.N_;
    views[v].C = views[v].ctot = f.channels[v];
    views[v].H = sizes[v][0];
    views[v].W = sizes[v][1];
  }
  // What each operation and value becomes (analysis.cpp), then the views it implies. int8 plans:
  // the dense convolutions the bf16 plans run in bf16 run in int8 instead (analyse_int8).
  an_ = analyse_plan(f, sizes, kBlock, bf16);
  if (int8) {
    analyse_int8(f, an_);
    p_.q8_scale_ = an_.q8_scale;
  }
  for (int v = 0; v < nv; ++v) {
    if (an_.alias_of[v] >= 0) {
      views[v].coff = an_.part_offset[v];
      views[v].ctot = f.channels[an_.alias_of[v]];
    }
    views[v].bf16 = an_.store_bf16[v];
  }
}

void PlanBuilder::build() {
  const int nops = static_cast<int>(f_.ops.size());
  for (int i = 0; i < nops; ++i) {
    const auto& op = f_.ops[i];
    const int out = op.out;
    final_pass_ = nullptr;
    if (an_.need_shadow[out] && !int8_) {  // allocated first: it must not share memory with this op's scratch
      if (an_.alias_of[out] >= 0 || out == f_.input) throw std::logic_error("onednn: no bf16 copy of " + op.name);
      p_.shadow_[out] = reinterpret_cast<uint16_t*>(p_.alloc(shadow_floats(out)));
    }
    if (an_.need_q8[out]) p_.q8_[out] = reinterpret_cast<int8_t*>(p_.alloc(q8_floats(out)));
    if (i == 0) {
      normalize(i);
      continue;
    }
    switch (op.kind) {
      case FusedOp::Kind::Conv: conv(i); break;
      case FusedOp::Kind::Affine: affine(i); break;
      case FusedOp::Kind::MaxPool: max_pool(i); break;
      case FusedOp::Kind::Concat: concat(i); break;
      case FusedOp::Kind::Resize: resize(i); break;
      case FusedOp::Kind::MulAdd: mul_add(i); break;
    }
    bf16_copy(i);
    int8_copy(i);
    release_last_reads(i);
  }
  if (f_.ops.back().out != f_.output || f_.ops.back().kind != FusedOp::Kind::Resize)
    throw std::logic_error("onednn: the operation list must end with the output resize");
}

void PlanBuilder::place(int v) {
  View& w = p_.views_[v];
  const int a = an_.alias_of[v];
  if (a >= 0) {
    View& c = p_.views_[a];
    if (!c.data) c.data = p_.alloc(c.floats());
    w.data = c.data;
  } else if (!w.data) {
    w.data = p_.alloc(w.floats());
  }
}

float* PlanBuilder::param(const torch::Tensor& t, int64_t c) {
  p_.params_.push_back(padded(t, c));
  return p_.params_.back().data_ptr<float>();
}

void PlanBuilder::add_step(const std::string& label, Plan::Step fn) {
  // No step may run one of oneDNN's reference kernels (they are hundreds of times slower):
  // the plans' layouts are those oneDNN's JIT kernels take on this CPU; should one not be,
  // the engine refuses rather than run at reference speed.
  if (label.find("(ref") != std::string::npos)
    throw BackendUnsuitable("onednn: step " + label + " would run oneDNN's reference kernel on this CPU");
  p_.steps_.push_back(std::move(fn));
  p_.labels_.push_back(label);
}

Epilogue* PlanBuilder::keep_epilogue(std::unique_ptr<Epilogue> e) {
  Epilogue* p = e.get();
  final_pass_ = p;
  p_.epilogues_.push_back(std::move(e));
  return p;
}

void PlanBuilder::add_epilogue(std::unique_ptr<Epilogue> e, const std::string& label) {
  Epilogue* p = keep_epilogue(std::move(e));
  add_step(label, [p](dnnl::stream&) { run_epilogue(*p); });
}

void PlanBuilder::add_copy_pass(const View& src, const View& dst, const std::vector<int>& adds,
                                const std::string& label) {
  auto e = std::make_unique<Epilogue>();
  e->src = src;
  e->dst = dst;
  e->adds = views_of(adds);
  e->valid = valid(dst.C);
  add_epilogue(std::move(e), label);
}

std::vector<const View*> PlanBuilder::views_of(const std::vector<int>& vs) {
  std::vector<const View*> r;
  for (int v : vs) r.push_back(&p_.views_[v]);
  return r;
}

size_t PlanBuilder::shadow_floats(int v) const {
  const View& w = p_.views_[v];
  return static_cast<size_t>(w.N * round_up(w.C) * w.H * w.W + 1) / 2;
}

size_t PlanBuilder::q8_floats(int v) const {
  const View& w = p_.views_[v];
  return static_cast<size_t>(w.N * w.C * w.H * w.W + 3) / 4;
}

// The image → plain NCHW (or NHWC, see the first convolution), scaled and shifted per channel.
void PlanBuilder::normalize(int i) {
  const auto& op = f_.ops[i];
  const int out = op.out;
  if (op.kind != FusedOp::Kind::Affine || op.in[0] != f_.input || op.act != Act::None || !op.add.empty())
    throw std::logic_error("onednn: the operation list must start with the normalisation");
  p_.views_[out].fmt = View::Fmt::Nchw;
  place(out);
  const float* sc = param(op.weight, f_.channels[out]);
  const float* sh = param(op.bias, f_.channels[out]);
  const View* o = &p_.views_[out];
  Plan* plan = &p_;
  add_step(op.name, [plan, o, sc, sh](dnnl::stream&) { run_normalize(plan->input_, *o, sc, sh); });
}

// Batch norm folded to scale + shift, its activation and additions: a pass; after a max
// pooling the analysis fused into it, the pooling's kernel with this pass.
void PlanBuilder::affine(int i) {
  const auto& op = f_.ops[i];
  const View& x = p_.views_[op.in[0]];
  place(op.out);
  auto e = std::make_unique<Epilogue>();
  e->src = x;
  e->dst = p_.views_[op.out];
  e->scale = param(op.weight, x.C);
  e->shift = param(op.bias, x.C);
  e->act = op.act;
  if (op.act == Act::PReLU) e->slopes = param(op.slopes, x.C);
  e->adds = views_of(op.add);
  e->valid = valid(x.C);
  if (i > 0 && an_.pool_fused_next[i - 1]) {  // the max pooling before it, then this pass
    const FusedOp& pool = f_.ops[i - 1];
    auto c = std::make_shared<MaxPool2x2>();
    c->src = p_.views_[pool.in[0]];
    c->e = *e;
    add_step(pool.name + " + " + op.name + " (max pool+pass)", [c](dnnl::stream&) { run_pool(*c); });
    final_pass_ = &c->e;
    return;
  }
  add_epilogue(std::move(e), op.name + " (pass)");
}

// 2×2 stride 2, ceil mode: ours, with the next affine fused where the analysis says so.
void PlanBuilder::max_pool(int i) {
  if (an_.pool_fused_next[i]) return;  // built with the affine that reads it
  const auto& op = f_.ops[i];
  const View& x = p_.views_[op.in[0]];
  place(op.out);
  auto c = std::make_shared<MaxPool2x2>();
  c->src = x;
  c->e.dst = p_.views_[op.out];
  c->e.adds = views_of(op.add);
  c->e.valid = valid(x.C);
  add_step(op.name + " (max pool+pass)", [c](dnnl::stream&) { run_pool(*c); });
  final_pass_ = &c->e;
}

// Parts that their producers did not write in place are copied into their channels by a pass;
// parts that do not start on a channel block are gathered by our kernel.
void PlanBuilder::concat(int i) {
  const auto& op = f_.ops[i];
  const int out = op.out;
  auto& views = p_.views_;
  place(out);
  if (an_.unaligned[i]) {  // oneDNN 2.6 copies such a concat with its reference kernel: ours
    auto c = std::make_shared<ChannelConcat>();
    for (int part : op.in) c->parts.push_back(views[part]);
    c->dst = views[out];
    add_step(op.name + " (concat)", [c](dnnl::stream&) { run_channel_concat(*c); });
  }
  int64_t off = 0;
  for (int part : op.in) {
    if (!an_.unaligned[i] && an_.alias_of[part] != out) {  // copy this part into its channels
      View d = views[out];
      d.C = views[part].C;
      d.coff = off;
      add_copy_pass(views[part], d, {}, op.name + " (pass)");
    }
    off += f_.channels[part];
  }
  if (!op.add.empty()) add_copy_pass(views[out], views[out], op.add, op.name + " (pass)");
}

// Bilinear resizes: the output's straight into the caller's logits (output_resize.h); the
// others by oneDNN's resampling, or folded into their reader's pass (never stored).
void PlanBuilder::resize(int i) {
  if (an_.resize_folded[i]) return;  // added by its reader's pass
  const auto& op = f_.ops[i];
  const int out = op.out;
  const View& x = p_.views_[op.in[0]];
  if (out == f_.output) {  // straight into the caller's logits (channels_last)
    if (!op.add.empty()) throw std::logic_error("onednn: additions on the output resize");
    auto r = std::make_shared<OutputResize>();
    r->src = x;
    r->H = p_.views_[out].H;
    r->W = p_.views_[out].W;
    r->th = taps(x.H, r->H);
    r->tw = taps(x.W, r->W);
    Plan* plan = &p_;
    add_step(op.name, [plan, r](dnnl::stream&) { run_output_resize(*r, plan->output_); });
    p_.output_resize_ = r;
    return;
  }
  place(out);
  const View& y = p_.views_[out];
  if (y.H == x.H && y.W == x.W) {
    add_copy_pass(x, y, op.add, op.name + " (pass)");
    return;
  }
  View ry = y;
  ry.coff = 0;
  ry.ctot = y.C;
  float* scratch = nullptr;
  if (an_.alias_of[out] >= 0) ry.data = scratch = p_.alloc(ry.floats());
  dnnl::resampling_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::resampling_linear, x.desc(),
                                   ry.desc());
  dnnl::resampling_forward::primitive_desc pd(d, p_.eng_);
  dnnl::memory smem(x.desc(), p_.eng_, x.data), dmem(ry.desc(), p_.eng_, ry.data);
  dnnl::resampling_forward prim(pd);
  add_step(op.name + " (" + pd.impl_info_str() + ")", [prim, smem, dmem](dnnl::stream& s) {
    prim.execute(s, {{DNNL_ARG_SRC, smem}, {DNNL_ARG_DST, dmem}});
  });
  if (!op.add.empty() || scratch) add_copy_pass(ry, y, op.add, op.name + " (pass)");
  if (scratch) p_.release(scratch, ry.floats());
}

// x · m (one channel) + additions, the folded resizes among them upsampled on the fly: a pass.
void PlanBuilder::mul_add(int i) {
  const auto& op = f_.ops[i];
  const int out = op.out;
  auto& views = p_.views_;
  const View& x = views[op.in[0]];
  place(out);
  auto e = std::make_unique<Epilogue>();
  e->src = x;
  e->dst = views[out];
  e->mul = &views[op.in[1]];
  if (e->mul->C != 1) throw std::logic_error("onednn: MulAdd expects a one-channel multiplier");
  for (int v : op.add) {
    if (an_.upsampled_src[v] < 0) {
      e->adds.push_back(&views[v]);
      continue;
    }
    const View& s = views[an_.upsampled_src[v]];
    e->upsampled.push_back({&s, taps(s.H, views[out].H), taps(s.W, views[out].W)});
  }
  e->valid = valid(x.C);
  add_epilogue(std::move(e), op.name + " (pass)");
}

// The bf16 copy (shadow) of the operation's value: written by its last pass when that pass
// writes the whole value, else converted from the f32 value by a oneDNN reorder.
void PlanBuilder::bf16_copy(int i) {
  const int out = f_.ops[i].out;
  if (!p_.shadow_[out]) return;
  const View& v = p_.views_[out];
  Epilogue* p = final_pass_;
  if (p && p->dst.data == v.data && p->dst.coff == 0 && p->dst.C == v.C && p->dst.ctot == v.ctot) {
    p->shadow = p_.shadow_[out];
    p->write_dst = an_.need_f32[out];
    return;
  }
  dnnl::memory src(v.desc(), p_.eng_, v.data);
  dnnl::memory dst(dnnl::memory::desc({v.N, v.C, v.H, v.W}, dtype::bf16, kBlockedTag), p_.eng_, p_.shadow_[out]);
  dnnl::reorder r(src, dst);
  add_step(f_.ops[i].name + " (to bf16)", [r, src, dst](dnnl::stream& s) mutable { r.execute(s, src, dst); });
}

// The int8 copy: written by the operation's last pass when that pass writes the whole value (a
// concat part included), else quantized from the value by a oneDNN reorder.
void PlanBuilder::int8_copy(int i) {
  const auto& op = f_.ops[i];
  const int out = op.out;
  if (!p_.q8_[out]) return;
  const View& v = p_.views_[out];
  Epilogue* p = final_pass_;
  if (p && p->dst.data == v.data && p->dst.coff == v.coff && p->dst.C == v.C) {
    p->q8 = p_.q8_[out];
    p->q8_inv = 1.f / p_.q8_scale_[out];
    p->write_dst = an_.stored[out];
    return;
  }
  if (an_.alias_of[out] >= 0 || v.fmt != View::Fmt::Blocked) throw std::logic_error("onednn: no int8 copy of " + op.name);
  dnnl::memory src(v.desc(), p_.eng_, v.data);
  dnnl::memory dst(dnnl::memory::desc({v.N, v.C, v.H, v.W}, dtype::s8, tag::nhwc), p_.eng_, p_.q8_[out]);
  dnnl::primitive_attr ra;
  ra.set_output_scales(0, {1.f / p_.q8_scale_[out]});
  dnnl::reorder::primitive_desc rpd(p_.eng_, src.get_desc(), p_.eng_, dst.get_desc(), ra);
  dnnl::reorder r(rpd);
  add_step(op.name + " (to int8 " + rpd.impl_info_str() + ")",
           [r, src, dst](dnnl::stream& s) mutable { r.execute(s, src, dst); });
}

// Releases what the operation read for the last time (concat parts go with their concat).
void PlanBuilder::release_last_reads(int i) {
  const auto& op = f_.ops[i];
  auto drop = [&](int v) {
    View& w = p_.views_[v];
    if (an_.last[v] != i || v == f_.input || an_.alias_of[v] >= 0 || !w.data) return;
    p_.release(w.data, w.floats());
    if (p_.shadow_[v]) p_.release(reinterpret_cast<float*>(p_.shadow_[v]), shadow_floats(v));
    if (p_.q8_[v]) p_.release(reinterpret_cast<float*>(p_.q8_[v]), q8_floats(v));
  };
  std::vector<int> reads = op.in;
  reads.insert(reads.end(), op.add.begin(), op.add.end());
  if (op.residual >= 0) reads.push_back(op.residual);
  if (i > 0 && an_.pool_fused_next[i - 1]) reads.insert(reads.end(), f_.ops[i - 1].in.begin(), f_.ops[i - 1].in.end());
  for (int v : op.add)
    if (an_.upsampled_src[v] >= 0) reads.push_back(an_.upsampled_src[v]);
  std::sort(reads.begin(), reads.end());
  reads.erase(std::unique(reads.begin(), reads.end()), reads.end());
  for (int v : reads) drop(v);
}
