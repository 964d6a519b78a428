// int8 plans: a dense convolution on the int8 copy of its input (oneDNN's VNNI kernels).
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.
//
// Symmetric quantization, no zero points: the input x ≈ sx·qx with qx = round(x / sx) in ±127
// (the producer's pass writes qx: Epilogue::q8), sx = the calibrated |x| bound / 127
// (ModelMeta::int8_absmax); the weights per output channel, w[o] ≈ sw[o]·qw[o] with
// sw[o] = max|w[o]| / 127. oneDNN accumulates qx·qw in int32 and writes
// y[o] = sx·sw[o]·(Σ qx·qw + b[o] / (sx·sw[o])) in f32: oneDNN 2.x adds the bias before the
// output scales. Its int8 kernels take NHWC activations only (nChw16c gives its reference
// kernel), so the input copy and the result are NHWC; the pass after the convolution reads the
// NHWC result and writes the value in the plan's blocked layout (epilogue_tile).

struct Int8Conv {
  dnnl::convolution_forward prim;
  dnnl::memory src, weights, bias, dst;
  torch::Tensor wbuf, bbuf;  // the memories' storage
  std::string impl;
};

// x: the input's view (its shape; the int8 copy is q, NHWC), sx its scale; w: OIHW f32 weights
// of the live taps; dst: the NHWC f32 result's view; post: ReLU or sigmoid run by oneDNN.
std::shared_ptr<Int8Conv> make_int8_conv(const dnnl::engine& eng, const View& x, int8_t* q, float sx,
                                         const torch::Tensor& w, const torch::Tensor& bias, const View& dst,
                                         const dims& strides, const dims& dilation, const dims& pad_l,
                                         const dims& pad_r, Act post) {
  const int64_t O = w.size(0);
  auto w64 = w.to(torch::kCPU, torch::kFloat64);
  auto sw = (w64.abs().amax({1, 2, 3}) / 127.0).clamp_min(1e-30);
  auto qw = (w64 / sw.view({O, 1, 1, 1})).round().clamp(-127, 127).to(torch::kChar).contiguous();
  auto scales64 = sw * static_cast<double>(sx);
  auto c = std::make_shared<Int8Conv>();
  c->bbuf = (bias.to(torch::kCPU, torch::kFloat64) / scales64).to(torch::kFloat32).contiguous();
  auto scales_t = scales64.to(torch::kFloat32).contiguous();
  const std::vector<float> scales(scales_t.data_ptr<float>(), scales_t.data_ptr<float>() + O);
  dnnl::primitive_attr attr;
  attr.set_output_scales(1 << 1, scales);  // per output channel (dimension 1)
  if (post == Act::ReLU || post == Act::Sigmoid) {
    dnnl::post_ops po;
    po.append_eltwise(1.f, post == Act::ReLU ? dnnl::algorithm::eltwise_relu : dnnl::algorithm::eltwise_logistic, 0.f,
                      0.f);
    attr.set_post_ops(po);
  }
  const dims wd{O, w.size(1), w.size(2), w.size(3)};
  dnnl::memory::desc sd({x.N, x.C, x.H, x.W}, dtype::s8, tag::nhwc);
  dnnl::memory::desc bd({O}, dtype::f32, tag::x);
  dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, sd,
                                    dnnl::memory::desc(wd, dtype::s8, tag::any), bd, dst.desc(), strides, dilation,
                                    pad_l, pad_r);
  dnnl::convolution_forward::primitive_desc pd(d, attr, eng);
  c->impl = pd.impl_info_str();
  c->wbuf = torch::empty({static_cast<int64_t>(pd.weights_desc().get_size() / sizeof(float)) + 1});
  c->weights = dnnl::memory(pd.weights_desc(), eng, c->wbuf.data_ptr());
  dnnl::memory wsrc(dnnl::memory::desc(wd, dtype::s8, tag::oihw), eng, qw.data_ptr());
  dnnl::stream s(eng);
  dnnl::reorder(wsrc, c->weights).execute(s, wsrc, c->weights);
  s.wait();
  c->src = dnnl::memory(sd, eng, q);
  c->bias = dnnl::memory(bd, eng, c->bbuf.data_ptr());
  c->dst = dnnl::memory(dst.desc(), eng, dst.data);
  c->prim = dnnl::convolution_forward(pd);
  return c;
}

void run_int8_conv(Int8Conv& c, dnnl::stream& s) {
  c.prim.execute(s, {{DNNL_ARG_SRC, c.src}, {DNNL_ARG_WEIGHTS, c.weights}, {DNNL_ARG_BIAS, c.bias}, {DNNL_ARG_DST, c.dst}});
}
