// The plans' data layout: the channel block, a value's view of its buffer, bilinear taps, and
// the per-operation pass (Epilogue) every kernel ends with.
// Part of the onednn plans (plan_impl.h includes it, once per channel-block width): not a
// standalone header; it sees what the files before it in plan_impl.h define.

using tag = dnnl::memory::format_tag;
using dtype = dnnl::memory::data_type;
using dims = dnnl::memory::dims;
constexpr int64_t kBlock = LIGHTSEG_ONEDNN_BLOCK;
// oneDNN's blocked layout of that width: its AVX-512 kernels take nChw16c, its AVX2/SSE4.1 ones nChw8c.
constexpr tag kBlockedTag = kBlock == 16 ? tag::nChw16c : tag::nChw8c;

int64_t round_up(int64_t c) { return (c + kBlock - 1) / kBlock * kBlock; }

// Where a value lives: a buffer of `ctot` channels in nChw16c (or, for the normalised image,
// plain NCHW or NHWC, whichever the first convolution runs faster on), the value being
// channels [coff, coff + C) of it (coff > 0: a concat part written in place).
struct View {
  float* data = nullptr;  // the storage (of uint16_t elements when bf16)
  int64_t N = 0, C = 0, H = 0, W = 0;
  int64_t ctot = 0, coff = 0;
  enum class Fmt { Blocked, Nchw, Nhwc } fmt = Fmt::Blocked;  // plain formats: the normalised image only
  bool bf16 = false;  // elements are bf16 (bf16 plans: values only bf16-capable kernels read)
  int64_t pixels() const { return H * W; }
  int64_t offset(int64_t n, int64_t g) const {  // element index of pixel 0 of block g of image n
    return ((n * (round_up(ctot) / kBlock) + coff / kBlock + g) * pixels()) * kBlock;
  }
  // Pointer to pixel 0 of channel block g of image n (blocked views), f32 or bf16 storage.
  float* block(int64_t n, int64_t g) const { return data + offset(n, g); }
  uint16_t* blockh(int64_t n, int64_t g) const { return reinterpret_cast<uint16_t*>(data) + offset(n, g); }
  dnnl::memory::desc desc() const {
    return dnnl::memory::desc({N, C, H, W}, bf16 ? dtype::bf16 : dtype::f32,
                              fmt == Fmt::Nchw ? tag::nchw : fmt == Fmt::Nhwc ? tag::nhwc : kBlockedTag);
  }
  // Storage size in floats (bf16: half the elements, rounded up).
  size_t floats() const {
    const auto n = static_cast<size_t>(N * (fmt == Fmt::Blocked ? round_up(ctot) : ctot) * H * W);
    return bf16 ? (n + 1) / 2 : n;
  }
};

// PyTorch's bilinear source index (align_corners = false): i0, i1 and the weight of i1.
struct Taps {
  std::vector<int64_t> i0, i1;
  std::vector<float> w1;
};
Taps taps(int64_t in, int64_t out) {
  Taps t;
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  for (int64_t d = 0; d < out; ++d) {
    float s = scale * (static_cast<float>(d) + 0.5f) - 0.5f;
    if (s < 0.f) s = 0.f;
    int64_t a = std::min(static_cast<int64_t>(s), in - 1);
    t.i0.push_back(a);
    t.i1.push_back(a + (a < in - 1 ? 1 : 0));
    t.w1.push_back(s - static_cast<float>(a));
  }
  return t;
}

// The per-operation pass: out = Σ add + act(x·scale + shift + residual) ⊙ mul, on blocks of
// 16 channels. Per-channel arrays are padded to whole blocks with zeros; `valid` is 1 on real
// channels and 0 on the padding, so padded lanes stay zero (oneDNN's blocked layouts need it).
struct Epilogue {
  View src, dst;
  const float* scale = nullptr;  // with shift: the per-channel affine
  const float* shift = nullptr;
  const float* slopes = nullptr;  // PReLU
  Act act = Act::None;
  const View* residual = nullptr;
  const View* mul = nullptr;  // one channel, broadcast
  std::vector<const View*> adds;  // C or one channel (broadcast)
  // Bilinear upsamplings (align_corners = false) of smaller values with dst's channels, added
  // like `adds`: a resize whose only use is this addition is never stored (C1.9's ×2 of X3).
  struct Upsampled {
    const View* src;
    Taps th, tw;
  };
  std::vector<Upsampled> upsampled;
  const float* valid = nullptr;
  uint16_t* shadow = nullptr;  // bf16 copy of an f32 dst (its own nChw16c buffer), when a bf16 conv reads it
  // int8 plans: the quantized copy of dst an int8 convolution reads: NHWC (oneDNN's int8
  // kernels take no blocked layout), dst.C channels a pixel, round(x / scale) in ±127.
  int8_t* q8 = nullptr;
  float q8_inv = 0.f;          // 1 / scale
  bool write_dst = true;       // false: only the shadow (or the int8 copy) is read later
};

// Per-channel array padded to whole blocks with zeros.
torch::Tensor padded(const torch::Tensor& t, int64_t c) {
  auto r = torch::zeros({round_up(c)}, torch::kFloat32);
  if (t.defined()) r.slice(0, 0, c).copy_(t.to(torch::kCPU, torch::kFloat32).flatten());
  return r;
}
