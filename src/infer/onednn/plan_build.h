// Building a plan (plan.h): the steps of one input shape, operation by operation, from the
// analysis of the operation list (analysis.h): which of our kernels (kernels/) or oneDNN's
// primitives runs each operation (the fastest measured here where there is a choice), in which
// layout, and which pass (epilogue.h) finishes it.
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.

Plan::Plan(const FusedNetwork& f, const dnnl::engine& eng, int64_t N, int64_t H, int64_t W, bool bf16, bool int8)
    : f_(f), eng_(eng), N_(N), H_(H), W_(W) {
  const auto sizes = f.value_sizes(H, W);
  const int nv = static_cast<int>(f.num_values);
  const int nops = static_cast<int>(f.ops.size());
  views_.resize(nv);
  shadow_.assign(nv, nullptr);
  q8_.assign(nv, nullptr);
  q8_scale_.assign(nv, 0.f);
  for (int v = 0; v < nv; ++v) {
    views_[v].N = N;
    views_[v].C = views_[v].ctot = f.channels[v];
    views_[v].H = sizes[v][0];
    views_[v].W = sizes[v][1];
  }
  // What each operation and value becomes (analysis.cpp), then the views it implies. int8 plans:
  // the dense convolutions the bf16 plans run in bf16 run in int8 instead (analyse_int8).
  PlanAnalysis an = analyse_plan(f, sizes, kBlock, bf16);
  if (int8) analyse_int8(f, an);
  const auto &int8_conv = an.int8_conv, &need_q8 = an.need_q8, &stored = an.stored;
  if (int8) q8_scale_ = an.q8_scale;
  const auto &last = an.last, &alias_of = an.alias_of, &upsampled_src = an.upsampled_src;
  const auto &need_shadow = an.need_shadow, &need_f32 = an.need_f32;
  const auto &pool_fused_next = an.pool_fused_next, &resize_folded = an.resize_folded, &unaligned = an.unaligned;
  const auto &paired_with_next = an.paired_with_next, &paired_with_prev = an.paired_with_prev;
  for (int v = 0; v < nv; ++v) {
    if (alias_of[v] >= 0) {
      views_[v].coff = an.part_offset[v];
      views_[v].ctot = f.channels[alias_of[v]];
    }
    views_[v].bf16 = an.store_bf16[v];
  }
  auto shadow_floats = [&](int v) {
    const View& w = views_[v];
    return static_cast<size_t>(w.N * round_up(w.C) * w.H * w.W + 1) / 2;
  };
  auto q8_floats = [&](int v) {
    const View& w = views_[v];
    return static_cast<size_t>(w.N * w.C * w.H * w.W + 3) / 4;
  };
  Epilogue* final_pass = nullptr;  // the last pass added: it may write the shadow too

  auto place = [&](int v) {  // gives value v its storage (a concat part: its concat's)
    View& w = views_[v];
    if (alias_of[v] >= 0) {
      View& c = views_[alias_of[v]];
      if (!c.data) c.data = alloc(c.floats());
      w.data = c.data;
    } else if (!w.data) {
      w.data = alloc(w.floats());
    }
  };
  auto param = [&](const torch::Tensor& t, int64_t c) {
    params_.push_back(padded(t, c));
    return params_.back().data_ptr<float>();
  };
  auto valid = [&](int64_t c) { return param(torch::ones({c}), c); };
  auto add_step = [&](const std::string& label, Step fn) {
    // No step may run one of oneDNN's reference kernels (they are hundreds of times slower):
    // the plans' layouts are those oneDNN's JIT kernels take on this CPU; should one not be,
    // the engine refuses rather than run at reference speed.
    if (label.find("(ref") != std::string::npos)
      throw BackendUnsuitable("onednn: step " + label + " would run oneDNN's reference kernel on this CPU");
    steps_.push_back(std::move(fn));
    labels_.push_back(label);
  };
  auto add_epilogue = [&](std::unique_ptr<Epilogue> e, const std::string& label) {
    Epilogue* p = e.get();
    final_pass = p;
    epilogues_.push_back(std::move(e));
    add_step(label, [p](dnnl::stream&) { run_epilogue(*p); });
  };
  auto views_of = [&](const std::vector<int>& vs) {
    std::vector<const View*> r;
    for (int v : vs) r.push_back(&views_[v]);
    return r;
  };

  for (int i = 0; i < nops; ++i) {
    const auto& op = f.ops[i];
    const int out = op.out;
    const View& x = views_[op.in[0]];
    final_pass = nullptr;
    if (need_shadow[out] && !int8) {  // allocated first: it must not share memory with this op's scratch
      if (alias_of[out] >= 0 || out == f.input) throw std::logic_error("onednn: no bf16 copy of " + op.name);
      shadow_[out] = reinterpret_cast<uint16_t*>(alloc(shadow_floats(out)));
    }
    if (need_q8[out]) q8_[out] = reinterpret_cast<int8_t*>(alloc(q8_floats(out)));
    if (i == 0) {  // normalisation: image → plain NCHW (or NHWC, see the first convolution)
      if (op.kind != FusedOp::Kind::Affine || op.in[0] != f.input || op.act != Act::None || !op.add.empty())
        throw std::logic_error("onednn: the operation list must start with the normalisation");
      views_[out].fmt = View::Fmt::Nchw;
      place(out);
      const float* sc = param(op.weight, f.channels[out]);
      const float* sh = param(op.bias, f.channels[out]);
      const View* o = &views_[out];
      add_step(op.name, [this, o, sc, sh](dnnl::stream&) { run_normalize(input_, *o, sc, sh); });
      continue;
    }
    switch (op.kind) {
      case FusedOp::Kind::Conv: {
        const int64_t O = op.weight.size(0), I = op.weight.size(1), kh = op.weight.size(2), kw = op.weight.size(3);
        const int64_t G = op.groups;
        if (O == 1 && G == 1 && x.fmt == View::Fmt::Blocked && op.residual < 0 && op.add.empty() &&
            alias_of[out] < 0) {  // one output channel: ours
          place(out);
          auto c = std::make_shared<SingleChannelConv>();
          c->src = x;
          c->dst = views_[out];
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
          break;
        }
        if (an.depthwise[i]) {  // depthwise: ours
          auto fill = [&](DepthwiseConv& c, const FusedOp& o, std::vector<int> adds) {
            c.e.src = x;
            c.e.act = o.act;
            if (o.act == Act::PReLU) c.e.slopes = param(o.slopes, O);
            if (o.residual >= 0) c.e.residual = &views_[o.residual];
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
          };
          // A depthwise convolution of the same input whose result only this one adds:
          // the pair runs as one kernel (see PairedDepthwise).
          if (paired_with_next[i]) break;  // built with the next operation
          if (paired_with_prev[i]) {
            const FusedOp& a = f.ops[i - 1];
            place(out);
            auto c = std::make_shared<PairedDepthwise>();
            fill(c->a, a, {});
            std::vector<int> adds;
            for (int v : op.add)
              if (v != a.out) adds.push_back(v);
            fill(c->b, op, adds);
            c->a.e.dst = c->b.e.dst = views_[out];
            add_step(a.name + " + " + op.name + " (paired depthwise+pass)", [c](dnnl::stream&) { run_paired(*c); });
            final_pass = &c->b.e;
            break;
          }
          place(out);
          auto c = std::make_shared<DepthwiseConv>();
          fill(*c, op, op.add);
          c->e.dst = views_[out];
          add_step(op.name + " (depthwise+pass)", [c](dnnl::stream&) { run_depthwise(*c); });
          final_pass = &c->e;
          break;
        }
        const bool pass = op.act == Act::PReLU || op.residual >= 0 || !op.add.empty() || alias_of[out] >= 0;
        place(out);
        View& y = views_[out];
        // Destination of the convolution itself: the value's buffer (the pass then runs in
        // place), or a scratch buffer when the value is a concat part at an offset.
        View cdst = y;
        cdst.coff = 0;
        cdst.ctot = y.C;
        float* scratch = nullptr;
        if (alias_of[out] >= 0) cdst.data = scratch = alloc(cdst.floats());
        // Taps that only ever read padding (a dilation as large as the map: C3's deep
        // dilations on small inputs) are dropped: the same sums, and oneDNN's AVX2 kernels
        // refuse such shapes (its reference kernel would run).
        const Taps1 th = live_taps(kh, op.dilation[0], op.padding[0], op.stride[0], x.H, y.H);
        const Taps1 tw = live_taps(kw, op.dilation[1], op.padding[1], op.stride[1], x.W, y.W);
        const int64_t ekh = th.count, ekw = tw.count;
        const int64_t dh = ekh > 1 ? op.dilation[0] : 1, dw = ekw > 1 ? op.dilation[1] : 1;
        dims wd = G == 1 ? dims{O, I, ekh, ekw} : dims{G, O / G, I, ekh, ekw};
        dnnl::memory::desc wmd(wd, dtype::f32, G == 1 ? tag::oihw : tag::goihw);
        const int64_t ph = th.padding, pw = tw.padding;
        const int64_t rh = (y.H - 1) * op.stride[0] + (ekh - 1) * dh + 1 - x.H - ph;
        const int64_t rw = (y.W - 1) * op.stride[1] + (ekw - 1) * dw + 1 - x.W - pw;
        if (int8_conv[i]) {  // int8_conv.h: into an NHWC f32 result, then the pass into the value
          if (!q8_[op.in[0]]) throw std::logic_error("onednn: no int8 input for " + op.name);
          View r = cdst;
          r.fmt = View::Fmt::Nhwc;
          r.bf16 = false;
          r.data = alloc(r.floats());
          const bool post = !pass && (op.act == Act::ReLU || op.act == Act::Sigmoid);
          auto w_live = op.weight.to(torch::kCPU, torch::kFloat32).slice(2, th.first, th.first + ekh).slice(3, tw.first, tw.first + ekw);
          auto c = make_int8_conv(eng_, x, q8_[op.in[0]], q8_scale_[op.in[0]], w_live, op.bias, r,
                                  {op.stride[0], op.stride[1]}, {dh - 1, dw - 1}, {ph, pw}, {rh, rw},
                                  post ? op.act : Act::None);
          add_step(op.name + " (int8 " + c->impl + ")", [c](dnnl::stream& s) { run_int8_conv(*c, s); });
          auto e = std::make_unique<Epilogue>();
          e->src = r;
          e->dst = y;
          e->act = post ? Act::None : op.act;
          if (e->act == Act::PReLU) e->slopes = param(op.slopes, O);
          if (op.residual >= 0) e->residual = &views_[op.residual];
          e->adds = views_of(op.add);
          e->valid = valid(O);
          add_epilogue(std::move(e), op.name + " (pass)");
          release(r.data, r.floats());
          if (scratch) release(scratch, cdst.floats());
          break;
        }
        dnnl::primitive_attr attr;
        if (!pass && (op.act == Act::ReLU || op.act == Act::Sigmoid)) {
          dnnl::post_ops po;
          po.append_eltwise(1.f, op.act == Act::ReLU ? dnnl::algorithm::eltwise_relu : dnnl::algorithm::eltwise_logistic,
                            0.f, 0.f);
          attr.set_post_ops(po);
        }
        auto w_plain =
            op.weight.to(torch::kCPU, torch::kFloat32).slice(2, th.first, th.first + ekh).slice(3, tw.first, tw.first + ekw).contiguous();
        dnnl::memory wsrc(wmd, eng_, w_plain.data_ptr());
        params_.push_back(op.bias.to(torch::kCPU, torch::kFloat32).contiguous().clone());
        dnnl::memory bmem(dnnl::memory::desc({O}, dtype::f32, tag::x), eng_, params_.back().data_ptr());
        dnnl::memory dmem(cdst.desc(), eng_, cdst.data);
        // Candidates, chosen by measuring them here once: the direct algorithm; Winograd for
        // dense 3×3 stride-1 convolutions; for the first convolution also an NHWC input.
        struct Candidate {
          dnnl::convolution_forward prim;
          dnnl::memory src, weights;
          torch::Tensor wbuf;
          View::Fmt fmt;
          std::string impl;
          double seconds = 1e30;
        };
        std::vector<Candidate> cands;
        const bool use_bf16 = an.reads_bf16[i];
        auto add_candidate = [&](dnnl::algorithm alg, View::Fmt fmt) {
          View xs = x;
          xs.fmt = fmt;
          dnnl::memory::desc sd = xs.desc();
          if (use_bf16 && !x.bf16) {  // the input's shadow
            if (!shadow_[op.in[0]] || x.coff != 0) throw std::logic_error("onednn: no bf16 input for " + op.name);
            sd = dnnl::memory::desc({x.N, x.C, x.H, x.W}, dtype::bf16, kBlockedTag);
          }
          try {
            dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, alg, sd,
                                              dnnl::memory::desc(wd, use_bf16 ? dtype::bf16 : dtype::f32, tag::any),
                                              bmem.get_desc(),
                                              cdst.desc(), {op.stride[0], op.stride[1]},
                                              {dh - 1, dw - 1}, {ph, pw}, {rh, rw});
            dnnl::convolution_forward::primitive_desc pd(d, attr, eng_);
            Candidate c;
            c.impl = pd.impl_info_str();
            c.fmt = fmt;
            c.wbuf = torch::empty({static_cast<int64_t>(pd.weights_desc().get_size() / sizeof(float)) + 1});
            c.weights = dnnl::memory(pd.weights_desc(), eng_, c.wbuf.data_ptr());
            dnnl::stream s(eng_);
            dnnl::reorder(wsrc, c.weights).execute(s, wsrc, c.weights);
            s.wait();
            c.src = use_bf16 && !x.bf16 ? dnnl::memory(sd, eng_, shadow_[op.in[0]]) : dnnl::memory(sd, eng_, x.data);
            c.prim = dnnl::convolution_forward(pd);
            cands.push_back(std::move(c));
          } catch (const dnnl::error&) {
            // this algorithm / format is not offered for this shape
          }
        };
        add_candidate(dnnl::algorithm::convolution_direct, x.fmt);
        if (!use_bf16 && G == 1 && ekh == 3 && ekw == 3 && op.stride[0] == 1 && op.stride[1] == 1 && dh == 1 &&
            dw == 1 && x.fmt == View::Fmt::Blocked)
          add_candidate(dnnl::algorithm::convolution_winograd, x.fmt);
        if (!use_bf16 && x.fmt != View::Fmt::Blocked) add_candidate(dnnl::algorithm::convolution_direct, View::Fmt::Nhwc);
        if (cands.empty()) throw std::runtime_error("onednn: no convolution for " + op.name);
        // A reference (non-JIT) kernel is never the fastest; timing one can take a second.
        auto is_ref = [](const Candidate& c) { return c.impl.rfind("ref", 0) == 0; };
        if (std::any_of(cands.begin(), cands.end(), [&](const Candidate& c) { return !is_ref(c); }))
          cands.erase(std::remove_if(cands.begin(), cands.end(), is_ref), cands.end());
        // Only a reference kernel for the blocked layout (oneDNN's AVX2 kernels refuse some
        // dilated convolutions on small maps): the convolution in NHWC, between two reorders.
        if (is_ref(cands.front()) && !use_bf16 && x.fmt == View::Fmt::Blocked) {
          View xp = x, yp = cdst;
          xp.fmt = yp.fmt = View::Fmt::Nhwc;
          xp.data = alloc(xp.floats());
          yp.data = alloc(yp.floats());
          try {
            dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                              xp.desc(), dnnl::memory::desc(wd, dtype::f32, tag::any), bmem.get_desc(),
                                              yp.desc(), {op.stride[0], op.stride[1]}, {dh - 1, dw - 1}, {ph, pw},
                                              {rh, rw});
            dnnl::convolution_forward::primitive_desc pd(d, attr, eng_);
            const std::string impl = pd.impl_info_str();
            if (impl.rfind("ref", 0) != 0) {
              auto wbuf = torch::empty({static_cast<int64_t>(pd.weights_desc().get_size() / sizeof(float)) + 1});
              dnnl::memory wmem(pd.weights_desc(), eng_, wbuf.data_ptr());
              dnnl::stream s(eng_);
              dnnl::reorder(wsrc, wmem).execute(s, wsrc, wmem);
              s.wait();
              params_.push_back(wbuf);
              dnnl::memory xb(x.desc(), eng_, x.data), xn(xp.desc(), eng_, xp.data);
              dnnl::memory yn(yp.desc(), eng_, yp.data);
              dnnl::reorder to_plain(xb, xn), to_blocked(yn, dmem);
              dnnl::convolution_forward prim(pd);
              add_step(op.name + " (nhwc " + impl + ")", [=](dnnl::stream& st) mutable {
                to_plain.execute(st, xb, xn);
                prim.execute(st, {{DNNL_ARG_SRC, xn}, {DNNL_ARG_WEIGHTS, wmem}, {DNNL_ARG_BIAS, bmem}, {DNNL_ARG_DST, yn}});
                to_blocked.execute(st, yn, dmem);
              });
              cands.clear();
            }
          } catch (const dnnl::error&) {
          }
          release(xp.data, xp.floats());
          release(yp.data, yp.floats());
        }
        // Our Winograd F(4×4, 3×3) and F(6×6, 3×3) (kernels/winograd.h), where they fit, against
        // the best of these; onednn_set_winograd(4 or 6) forces one tile.
        std::shared_ptr<WinogradConv> wino;
        double wino_seconds = 1e30;
        const int wmode = winograd_mode();
        // (ReLU and sigmoid without a pass are oneDNN post-ops: not taken.)
        if (!cands.empty() && !use_bf16 && cdst.fmt == View::Fmt::Blocked && wmode != 0 &&
            (pass || op.act == Act::None) &&
            winograd_fits(x, cdst, G, ekh, ekw, op.stride[0], op.stride[1], dh, dw)) {
          wino = fastest_winograd(x, cdst, ph, pw, w_plain, op.bias, wmode, &wino_seconds);
        }
        if (cands.size() > 1 || wino) {
          dnnl::stream s(eng_);
          for (auto& c : cands) {
            std::unordered_map<int, dnnl::memory> args{
                {DNNL_ARG_SRC, c.src}, {DNNL_ARG_WEIGHTS, c.weights}, {DNNL_ARG_BIAS, bmem}, {DNNL_ARG_DST, dmem}};
            c.prim.execute(s, args);
            s.wait();
            for (int r = 0; r < 3; ++r) {
              auto t0 = std::chrono::steady_clock::now();
              c.prim.execute(s, args);
              s.wait();
              c.seconds = std::min(c.seconds, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            }
          }
        }
        auto best = std::min_element(cands.begin(), cands.end(),
                                     [](const Candidate& a, const Candidate& b) { return a.seconds < b.seconds; });
        if (wino && (wmode > 0 || wino_seconds < best->seconds)) {
          add_step(op.name + (wino->m == 6 ? " (winograd_6x3: ours)" : " (winograd_4x3: ours)"),
                   [wino](dnnl::stream&) { run_winograd(*wino); });
        } else if (!cands.empty()) {
          views_[op.in[0]].fmt = best->fmt;  // the first convolution picks the normalised image's format
          params_.push_back(best->wbuf);
          auto prim = best->prim;
          auto smem = best->src, wmem = best->weights;
          add_step(op.name + " (" + best->impl + ")", [prim, smem, wmem, bmem, dmem](dnnl::stream& s) {
            prim.execute(s, {{DNNL_ARG_SRC, smem}, {DNNL_ARG_WEIGHTS, wmem}, {DNNL_ARG_BIAS, bmem}, {DNNL_ARG_DST, dmem}});
          });
        }
        if (pass) {
          auto e = std::make_unique<Epilogue>();
          e->src = cdst;
          e->dst = y;
          e->act = op.act;
          if (op.act == Act::PReLU) e->slopes = param(op.slopes, O);
          if (op.residual >= 0) e->residual = &views_[op.residual];
          e->adds = views_of(op.add);
          e->valid = valid(O);
          add_epilogue(std::move(e), op.name + " (pass)");
        }
        if (scratch) release(scratch, cdst.floats());
        break;
      }
      case FusedOp::Kind::Affine: {
        place(out);
        auto e = std::make_unique<Epilogue>();
        e->src = x;
        e->dst = views_[out];
        e->scale = param(op.weight, x.C);
        e->shift = param(op.bias, x.C);
        e->act = op.act;
        if (op.act == Act::PReLU) e->slopes = param(op.slopes, x.C);
        e->adds = views_of(op.add);
        e->valid = valid(x.C);
        if (i > 0 && pool_fused_next[i - 1]) {  // the max pooling before it, then this pass
          const FusedOp& pool = f.ops[i - 1];
          auto c = std::make_shared<MaxPool2x2>();
          c->src = views_[pool.in[0]];
          c->e = *e;
          add_step(pool.name + " + " + op.name + " (max pool+pass)", [c](dnnl::stream&) { run_pool(*c); });
          final_pass = &c->e;
          break;
        }
        add_epilogue(std::move(e), op.name + " (pass)");
        break;
      }
      case FusedOp::Kind::MaxPool: {  // 2×2 stride 2, ceil mode: ours, with the next affine fused
        if (pool_fused_next[i]) break;  // built with the affine that reads it
        place(out);
        auto c = std::make_shared<MaxPool2x2>();
        c->src = x;
        c->e.dst = views_[out];
        c->e.adds = views_of(op.add);
        c->e.valid = valid(x.C);
        add_step(op.name + " (max pool+pass)", [c](dnnl::stream&) { run_pool(*c); });
        final_pass = &c->e;
        break;
      }
      case FusedOp::Kind::Concat: {
        place(out);
        if (unaligned[i]) {  // oneDNN 2.6 copies such a concat with its reference kernel: ours
          auto c = std::make_shared<ChannelConcat>();
          for (int part : op.in) c->parts.push_back(views_[part]);
          c->dst = views_[out];
          add_step(op.name + " (concat)", [c](dnnl::stream&) { run_channel_concat(*c); });
        }
        int64_t off = 0;
        for (int part : op.in) {
          if (!unaligned[i] && alias_of[part] != out) {  // copy this part into its channels
            auto e = std::make_unique<Epilogue>();
            e->src = views_[part];
            e->dst = views_[out];
            e->dst.C = views_[part].C;
            e->dst.coff = off;
            e->valid = valid(views_[part].C);
            add_epilogue(std::move(e), op.name + " (pass)");
          }
          off += f.channels[part];
        }
        if (!op.add.empty()) {
          auto e = std::make_unique<Epilogue>();
          e->src = e->dst = views_[out];
          e->adds = views_of(op.add);
          e->valid = valid(views_[out].C);
          add_epilogue(std::move(e), op.name + " (pass)");
        }
        break;
      }
      case FusedOp::Kind::Resize: {
        if (resize_folded[i]) break;  // added by its reader's pass
        if (out == f.output) {  // straight into the caller's logits (channels_last)
          if (!op.add.empty()) throw std::logic_error("onednn: additions on the output resize");
          auto r = std::make_shared<OutputResize>();
          r->src = x;
          r->H = views_[out].H;
          r->W = views_[out].W;
          r->th = taps(x.H, r->H);
          r->tw = taps(x.W, r->W);
          add_step(op.name, [this, r](dnnl::stream&) { run_output_resize(*r, output_); });
          output_resize_ = r;
          break;
        }
        place(out);
        const View& y = views_[out];
        if (y.H == x.H && y.W == x.W) {
          auto e = std::make_unique<Epilogue>();
          e->src = x;
          e->dst = y;
          e->adds = views_of(op.add);
          e->valid = valid(y.C);
          add_epilogue(std::move(e), op.name + " (pass)");
          break;
        }
        View ry = y;
        ry.coff = 0;
        ry.ctot = y.C;
        float* scratch = nullptr;
        if (alias_of[out] >= 0) ry.data = scratch = alloc(ry.floats());
        dnnl::resampling_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::resampling_linear,
                                         x.desc(), ry.desc());
        dnnl::resampling_forward::primitive_desc pd(d, eng_);
        dnnl::memory smem(x.desc(), eng_, x.data), dmem(ry.desc(), eng_, ry.data);
        dnnl::resampling_forward prim(pd);
        add_step(op.name + " (" + pd.impl_info_str() + ")", [prim, smem, dmem](dnnl::stream& s) {
          prim.execute(s, {{DNNL_ARG_SRC, smem}, {DNNL_ARG_DST, dmem}});
        });
        if (!op.add.empty() || scratch) {
          auto e = std::make_unique<Epilogue>();
          e->src = ry;
          e->dst = y;
          e->adds = views_of(op.add);
          e->valid = valid(y.C);
          add_epilogue(std::move(e), op.name + " (pass)");
        }
        if (scratch) release(scratch, ry.floats());
        break;
      }
      case FusedOp::Kind::MulAdd: {
        place(out);
        auto e = std::make_unique<Epilogue>();
        e->src = x;
        e->dst = views_[out];
        e->mul = &views_[op.in[1]];
        if (e->mul->C != 1) throw std::logic_error("onednn: MulAdd expects a one-channel multiplier");
        for (int v : op.add) {
          if (upsampled_src[v] < 0) {
            e->adds.push_back(&views_[v]);
            continue;
          }
          const View& s = views_[upsampled_src[v]];
          e->upsampled.push_back({&s, taps(s.H, views_[out].H), taps(s.W, views_[out].W)});
        }
        e->valid = valid(x.C);
        add_epilogue(std::move(e), op.name + " (pass)");
        break;
      }
    }
    // The shadow: written by this op's last pass when that pass writes the whole value,
    // else converted from the f32 value by a oneDNN reorder.
    if (shadow_[out]) {
      const View& v = views_[out];
      Epilogue* p = final_pass;
      if (p && p->dst.data == v.data && p->dst.coff == 0 && p->dst.C == v.C && p->dst.ctot == v.ctot) {
        p->shadow = shadow_[out];
        p->write_dst = need_f32[out];
      } else {
        dnnl::memory src(v.desc(), eng_, v.data);
        dnnl::memory dst(dnnl::memory::desc({v.N, v.C, v.H, v.W}, dtype::bf16, kBlockedTag), eng_, shadow_[out]);
        dnnl::reorder r(src, dst);
        add_step(op.name + " (to bf16)", [r, src, dst](dnnl::stream& s) mutable { r.execute(s, src, dst); });
      }
    }
    // The int8 copy: written by this op's last pass when that pass writes the whole value (a
    // concat part included), else quantized from the value by a oneDNN reorder.
    if (q8_[out]) {
      const View& v = views_[out];
      Epilogue* p = final_pass;
      if (p && p->dst.data == v.data && p->dst.coff == v.coff && p->dst.C == v.C) {
        p->q8 = q8_[out];
        p->q8_inv = 1.f / q8_scale_[out];
        p->write_dst = stored[out];
      } else {
        if (alias_of[out] >= 0 || v.fmt != View::Fmt::Blocked)
          throw std::logic_error("onednn: no int8 copy of " + op.name);
        dnnl::memory src(v.desc(), eng_, v.data);
        dnnl::memory dst(dnnl::memory::desc({v.N, v.C, v.H, v.W}, dtype::s8, tag::nhwc), eng_, q8_[out]);
        dnnl::primitive_attr ra;
        ra.set_output_scales(0, {1.f / q8_scale_[out]});
        dnnl::reorder::primitive_desc rpd(eng_, src.get_desc(), eng_, dst.get_desc(), ra);
        dnnl::reorder r(rpd);
        add_step(op.name + " (to int8 " + rpd.impl_info_str() + ")",
                 [r, src, dst](dnnl::stream& s) mutable { r.execute(s, src, dst); });
      }
    }
    // Release what this operation read for the last time (concat parts go with their concat).
    auto drop = [&](int v) {
      if (last[v] != i || v == f.input || alias_of[v] >= 0 || !views_[v].data) return;
      release(views_[v].data, views_[v].floats());
      if (shadow_[v]) release(reinterpret_cast<float*>(shadow_[v]), shadow_floats(v));
      if (q8_[v]) release(reinterpret_cast<float*>(q8_[v]), q8_floats(v));
    };
    std::vector<int> reads = op.in;
    reads.insert(reads.end(), op.add.begin(), op.add.end());
    if (op.residual >= 0) reads.push_back(op.residual);
    if (i > 0 && pool_fused_next[i - 1]) reads.insert(reads.end(), f.ops[i - 1].in.begin(), f.ops[i - 1].in.end());
    for (int v : op.add)
      if (upsampled_src[v] >= 0) reads.push_back(upsampled_src[v]);
    std::sort(reads.begin(), reads.end());
    reads.erase(std::unique(reads.begin(), reads.end()), reads.end());
    for (int v : reads) drop(v);
  }
  if (f.ops.back().out != f.output || f.ops.back().kind != FusedOp::Kind::Resize)
    throw std::logic_error("onednn: the operation list must end with the output resize");
}
