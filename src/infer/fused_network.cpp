// The inference form of the network: BN folding, the fused operation list, and its LibTorch
// interpreter (the "fused" backend; CPU or CUDA).
#include "infer/fused_network.h"

#include <stdexcept>

#include "lightseg/model/dab.h"
#include "lightseg/model/feb.h"
#include "lightseg/model/residual_block.h"

namespace lightseg {

int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation) {
  return (in + 2 * pad - dilation * (k - 1) - 1) / stride + 1;
}

int64_t pool_out_size_ceil(int64_t in, int64_t k, int64_t stride) {
  int64_t out = (in - k + stride - 1) / stride + 1;  // ceil((in − k) / s) + 1, no padding
  if ((out - 1) * stride >= in) --out;               // the last window must start inside the input
  return out;
}

// Named (not anonymous): the core library is a unity build.
namespace fusion {

using model::ConvBNAct;

struct Folded {
  torch::Tensor weight, bias;
};

// Conv options hold their padding in a c10::variant (LibTorch 1.x) or a std::variant (2.x):
// this declaration makes `get_if<T>(p)` a template call, argument-dependent lookup then
// finds c10::get_if or std::get_if.
template <class T>
void get_if(...) = delete;
template <class V>
const torch::ExpandingArray<2>* explicit_padding(const V& v) {
  return get_if<torch::ExpandingArray<2>>(&v);
}

torch::Tensor f64(const torch::Tensor& t) { return t.detach().to(torch::kCPU, torch::kFloat64); }

// Conv (+ BN channels [c0, c1) of `bn`, when given) → weight and bias in float64.
Folded fold(const torch::nn::Conv2d& conv, const torch::nn::BatchNorm2d& bn, int64_t c0 = 0, int64_t c1 = -1) {
  Folded r;
  r.weight = f64(conv->weight).clone();
  const int64_t out = r.weight.size(0);
  r.bias = conv->options.bias() ? f64(conv->bias).clone() : torch::zeros({out}, torch::kFloat64);
  if (bn) {
    if (c1 < 0) c1 = c0 + out;
    if (c1 - c0 != out) throw std::logic_error("fold: BN channel range does not match the convolution");
    if (!bn->options.track_running_stats())
      throw std::invalid_argument("fold: BatchNorm without running statistics cannot be folded");
    auto gamma = bn->options.affine() ? f64(bn->weight).slice(0, c0, c1) : torch::ones({out}, torch::kFloat64);
    auto beta = bn->options.affine() ? f64(bn->bias).slice(0, c0, c1) : torch::zeros({out}, torch::kFloat64);
    auto s = gamma / torch::sqrt(f64(bn->running_var).slice(0, c0, c1) + bn->options.eps());
    r.weight.mul_(s.view({-1, 1, 1, 1}));
    r.bias = (r.bias - f64(bn->running_mean).slice(0, c0, c1)) * s + beta;
  }
  return r;
}

// BN channels [c0, c1) as a per-channel affine (scale, shift).
Folded affine_of(const torch::nn::BatchNorm2d& bn, int64_t c0, int64_t c1) {
  auto gamma = bn->options.affine() ? f64(bn->weight).slice(0, c0, c1) : torch::ones({c1 - c0}, torch::kFloat64);
  auto beta = bn->options.affine() ? f64(bn->bias).slice(0, c0, c1) : torch::zeros({c1 - c0}, torch::kFloat64);
  auto s = gamma / torch::sqrt(f64(bn->running_var).slice(0, c0, c1) + bn->options.eps());
  return {s, beta - f64(bn->running_mean).slice(0, c0, c1) * s};
}

// A copy (never the network's own storage) of slopes [c0, c1), in the network's dtype.
torch::Tensor slopes_of(const torch::nn::PReLU& act, int64_t c0, int64_t c1) {
  auto w = act->weight.detach().to(torch::kCPU).flatten();
  if (w.numel() == 1) return w.expand({c1 - c0}).clone();
  return w.slice(0, c0, c1).clone();
}

class Builder {
 public:
  // dtype: the network's parameter type; folding runs in float64, results are stored in dtype.
  Builder(FusedNetwork& f, torch::ScalarType dtype) : f_(f), dtype_(dtype) {}
  torch::Tensor cast(const torch::Tensor& t) const { return t.to(dtype_).contiguous(); }

  int value(int64_t channels) {
    f_.channels.push_back(channels);
    return static_cast<int>(f_.num_values++);
  }

  int conv(const std::string& name, int x, const torch::nn::Conv2d& c, const Folded& w, Act act,
           const torch::Tensor& slopes, int residual = -1, std::vector<int> add = {}) {
    FusedOp op;
    op.kind = FusedOp::Kind::Conv;
    op.name = name;
    op.in = {x};
    op.weight = cast(w.weight);
    op.bias = cast(w.bias);
    const auto& o = c->options;
    op.stride = {(*o.stride())[0], (*o.stride())[1]};
    const auto* pad = explicit_padding(o.padding());
    if (!pad) throw std::invalid_argument("fuse_network: " + name + " uses 'same'/'valid' padding");
    op.padding = {(**pad)[0], (**pad)[1]};
    op.dilation = {(*o.dilation())[0], (*o.dilation())[1]};
    op.groups = o.groups();
    op.residual = residual;
    op.act = act;
    op.slopes = slopes.defined() ? cast(slopes) : slopes;
    op.add = std::move(add);
    op.out = value(op.weight.size(0));
    f_.ops.push_back(std::move(op));
    return f_.ops.back().out;
  }

  // CBA: conv → BN → PReLU (the PReLU optional).
  int cba(const std::string& name, const ConvBNAct& m, int x, int residual = -1, std::vector<int> add = {}) {
    const auto& act = m->bn_act->act;
    return conv(name, x, m->conv, fold(m->conv, m->bn_act->bn), act ? Act::PReLU : Act::None,
                act ? slopes_of(act, 0, m->conv->options.out_channels()) : torch::Tensor(), residual, std::move(add));
  }

  // A plain convolution (its own bias, no BN), e.g. C2.2, C7.2, C1.11.
  int plain(const std::string& name, const torch::nn::Conv2d& c, int x, Act act = Act::None, std::vector<int> add = {}) {
    return conv(name, x, c, fold(c, nullptr), act, torch::Tensor(), -1, std::move(add));
  }

  int affine(const std::string& name, int x, const Folded& a, Act act, const torch::Tensor& slopes) {
    FusedOp op;
    op.kind = FusedOp::Kind::Affine;
    op.name = name;
    op.in = {x};
    op.weight = cast(a.weight);
    op.bias = cast(a.bias);
    op.act = act;
    op.slopes = slopes.defined() ? cast(slopes) : slopes;
    op.out = value(op.weight.size(0));
    f_.ops.push_back(std::move(op));
    return f_.ops.back().out;
  }

  int simple(FusedOp::Kind kind, const std::string& name, std::vector<int> in, int64_t channels, int like = -1,
             std::vector<int> add = {}) {
    FusedOp op;
    op.kind = kind;
    op.name = name;
    op.in = std::move(in);
    op.like = like;
    op.add = std::move(add);
    op.out = value(channels);
    f_.ops.push_back(std::move(op));
    return f_.ops.back().out;
  }

  // C4: one feature-enhancement layer.
  int fe_layer(const std::string& name, const std::shared_ptr<torch::nn::Module>& layer, int x) {
    if (auto feb = std::dynamic_pointer_cast<model::FEBImpl>(layer)) {
      int t = cba(name + ".dw1", feb->dw1, x);                          // C4.1
      int P = cba(name + ".pw1", feb->pw1, t);                          // C4.2
      int Q1 = cba(name + ".dw2", feb->dw2, P);                         // C4.3
      int U = cba(name + ".dw_dilated", feb->dw_dilated, P, -1, {P, Q1});  // C4.4, C4.5: U = Q2 + P + Q1
      int V = cba(name + ".conv3d", feb->conv3d, U);                    // C4.6
      const int64_t c = feb->act->options.num_parameters();
      return conv(name + ".pw2", V, feb->pw2->conv, fold(feb->pw2->conv, feb->pw2->bn_act->bn), Act::PReLU,
                  slopes_of(feb->act, 0, c), /*residual=*/x);           // C4.7, C4.8: PReLU(x + W)
    }
    if (auto dab = std::dynamic_pointer_cast<model::DABImpl>(layer)) {
      const int64_t c = f_.channels[x];
      int y = affine(name + ".pre", x, affine_of(dab->pre->bn, 0, c), Act::PReLU, slopes_of(dab->pre->act, 0, c));
      y = cba(name + ".reduce", dab->reduce, y);
      int a = cba(name + ".dw13", dab->dw13, cba(name + ".dw31", dab->dw31, y));
      int b = cba(name + ".ddw13", dab->ddw13, cba(name + ".ddw31", dab->ddw31, y), -1, {a});
      const int64_t h = f_.channels[b];
      int z = affine(name + ".post", b, affine_of(dab->post->bn, 0, h), Act::PReLU, slopes_of(dab->post->act, 0, h));
      return plain(name + ".expand", dab->expand, z, Act::None, {x});
    }
    if (auto res = std::dynamic_pointer_cast<model::ResidualBlockImpl>(layer)) {
      int y = conv(name + ".conv1", x, res->conv1, fold(res->conv1, res->bn1->bn), Act::ReLU, torch::Tensor());
      return conv(name + ".conv2", y, res->conv2, fold(res->conv2, res->bn2->bn), Act::ReLU, torch::Tensor(), x);
    }
    throw std::invalid_argument("fuse_network: unknown feature-enhancement layer in " + name);
  }

  // Claim 3: downsampling, FE layers, concat + PW (as two PWs), then the adder's `s` (C1.4/C1.6).
  int semantic(const std::string& name, const model::SemanticBranch& b, int x, int s) {
    int D;
    const auto& down = b->down;
    if (down->conv) {  // C3.1: concat(conv, maxpool) → BN → PReLU, BN/PReLU split per half
      const int64_t cc = down->out_channels - down->in_channels, co = down->out_channels;
      const auto& bn = down->bn_act->bn;
      const auto& act = down->bn_act->act;
      int a = conv(name + ".down.conv", x, down->conv, fold(down->conv, bn, 0, cc), Act::PReLU, slopes_of(act, 0, cc));
      int p = simple(FusedOp::Kind::MaxPool, name + ".down.pool", {x}, f_.channels[x]);
      int q = affine(name + ".down.bn_act", p, affine_of(bn, cc, co), Act::PReLU, slopes_of(act, cc, co));
      D = simple(FusedOp::Kind::Concat, name + ".down.concat", {a, q}, co);
    } else {
      D = cba(name + ".down.cba", down->cba, x);
    }
    int E = D;
    int i = 0;
    for (const auto& layer : b->layers->children()) E = fe_layer(name + ".layers." + std::to_string(i++), layer, E);
    // C3.3 + C3.4: PW(concat(D, E)) = PW_D(D) + PW_E(E); BN and PReLU after the sum.
    const auto& fuse = b->fuse;
    const int64_t c = f_.channels[D];
    Folded w = fold(fuse->conv, fuse->bn_act->bn);
    Folded wd{w.weight.slice(1, 0, c).contiguous(), torch::zeros({w.weight.size(0)}, torch::kFloat64)};
    Folded we{w.weight.slice(1, c, 2 * c).contiguous(), w.bias};
    int t = conv(name + ".fuse.d", D, fuse->conv, wd, Act::None, torch::Tensor());
    return conv(name + ".fuse", E, fuse->conv, we, Act::PReLU,
                slopes_of(fuse->bn_act->act, 0, w.weight.size(0)), /*residual=*/t, {s});
  }

 private:
  FusedNetwork& f_;
  torch::ScalarType dtype_;
};

}  // namespace fusion

using fusion::Folded;

FusedNetwork fuse_network(const Network& net_in, const ModelMeta& meta) {
  Network net = net_in;  // holder copy (same modules); nothing is modified
  torch::NoGradGuard ng;
  FusedNetwork f;
  f.config = net->config();
  auto params = net->parameters();
  fusion::Builder b(f, params.empty() ? torch::kFloat32 : params.front().scalar_type());
  f.input = b.value(f.config.in_channels);
  // Normalisation (x − mean) / std as x·(1/std) − mean/std.
  Folded norm;
  norm.weight = torch::empty({3}, torch::kFloat64);
  norm.bias = torch::empty({3}, torch::kFloat64);
  if (f.config.in_channels != 3) throw std::invalid_argument("fuse_network: the input must have 3 channels");
  for (int c = 0; c < 3; ++c) {
    norm.weight[c] = 1.0 / meta.std[c];
    norm.bias[c] = -static_cast<double>(meta.mean[c]) / meta.std[c];
  }
  int x = b.affine("normalize", f.input, norm, Act::None, torch::Tensor());
  // C1.1
  int F1 = b.cba("init.conv1", net->init->conv1, x);
  F1 = b.cba("init.conv2", net->init->conv2, F1);
  F1 = b.cba("init.conv3", net->init->conv3, F1);
  // C1.2, claim 2
  const auto& sp = net->spatial;
  int S1 = b.cba("spatial.conv1", sp->conv1, F1);
  int s1 = b.plain("spatial.compress1", sp->compress1, S1);
  int S2 = b.cba("spatial.conv2", sp->conv2, S1);
  int s2 = b.plain("spatial.compress2", sp->compress2, S2);
  // C1.3–C1.6: semantic branches, the adders fused into their last convolution.
  int A1 = b.semantic("semantic1", net->semantic1, F1, s1);
  int A2 = b.semantic("semantic2", net->semantic2, A1, s2);
  // C1.7–C1.11, claims 6–7
  const auto& d = net->decoder;
  int X1 = b.cba("decoder.pw3", d->pw3, b.cba("decoder.dw3", d->dw3, F1));
  int X2 = b.cba("decoder.pw4", d->pw4, b.cba("decoder.dw4", d->dw4, A1));
  int X3s = b.cba("decoder.pw5", d->pw5, A2);
  int F;
  if (d->attention) {
    int X3 = b.simple(FusedOp::Kind::Resize, "decoder.up2", {X3s}, f.channels[X3s], A1);
    int t = b.cba("decoder.attention.pw7", d->attention->pw7, X1);
    int mask = b.plain("decoder.attention.conv3d", d->attention->conv3d, t, Act::Sigmoid);  // C7.2, C7.3
    F = b.simple(FusedOp::Kind::MulAdd, "decoder.fuse", {X1, mask}, f.channels[X1], -1, {X1, X2, X3});  // C7.4, C6.1
  } else {
    F = b.simple(FusedOp::Kind::Resize, "decoder.up2", {X3s}, f.channels[X3s], A1, {X1, X2});  // C1.9, C1.10
  }
  int logits = b.plain("decoder.pw6", d->pw6, F);
  f.output = b.simple(FusedOp::Kind::Resize, "decoder.up4", {logits}, f.channels[logits], -1);
  if (!meta.int8_absmax.empty()) {
    const auto names = value_names(f);
    f.act_absmax.assign(static_cast<size_t>(f.num_values), 0.f);
    for (int v = 0; v < f.num_values; ++v)
      if (auto it = meta.int8_absmax.find(names[v]); it != meta.int8_absmax.end()) f.act_absmax[v] = it->second;
  }
  return f;
}

std::vector<std::array<int64_t, 2>> FusedNetwork::value_sizes(int64_t h, int64_t w) const {
  std::vector<std::array<int64_t, 2>> s(static_cast<size_t>(num_values), {0, 0});
  s[input] = {h, w};
  for (const auto& op : ops) {
    const auto& x = s[op.in.at(0)];
    switch (op.kind) {
      case FusedOp::Kind::Conv:
        s[op.out] = {conv_out_size(x[0], op.weight.size(2), op.stride[0], op.padding[0], op.dilation[0]),
                     conv_out_size(x[1], op.weight.size(3), op.stride[1], op.padding[1], op.dilation[1])};
        break;
      case FusedOp::Kind::MaxPool:
        s[op.out] = {pool_out_size_ceil(x[0], 2, 2), pool_out_size_ceil(x[1], 2, 2)};
        break;
      case FusedOp::Kind::Resize:
        s[op.out] = op.like < 0 ? std::array<int64_t, 2>{h, w} : s[op.like];
        break;
      default:
        s[op.out] = x;
    }
  }
  return s;
}

int64_t FusedNetwork::count_macs(int64_t h, int64_t w) const {
  auto s = value_sizes(h, w);
  int64_t macs = 0;
  for (const auto& op : ops)
    if (op.kind == FusedOp::Kind::Conv)
      macs += s[op.out][0] * s[op.out][1] * op.weight.size(0) * op.weight.size(1) * op.weight.size(2) * op.weight.size(3);
  return macs;
}

FusedNetwork to(const FusedNetwork& f, torch::Device device, torch::ScalarType dtype) {
  FusedNetwork r = f;
  auto mv = [&](torch::Tensor& t) {
    if (!t.defined()) return;
    t = t.to(device, dtype);
    if (t.dim() == 4) t = t.contiguous(torch::MemoryFormat::ChannelsLast);
  };
  for (auto& op : r.ops) {
    mv(op.weight);
    mv(op.bias);
    mv(op.slopes);
  }
  return r;
}

namespace fusion {
static torch::Tensor channel_view(const torch::Tensor& t) { return t.view({1, -1, 1, 1}); }

static torch::Tensor apply_act(torch::Tensor y, const FusedOp& op) {
  switch (op.act) {
    case Act::None: return y;
    case Act::PReLU: return torch::prelu(y, op.slopes);
    case Act::ReLU: return y.relu_();
    case Act::Sigmoid: return y.sigmoid_();
  }
  return y;
}
}  // namespace fusion

using fusion::apply_act;
using fusion::channel_view;

torch::Tensor run_fused(const FusedNetwork& f, const torch::Tensor& images,
                        const std::function<void(int, const torch::Tensor&)>& observe) {
  if (images.dim() != 4 || images.size(1) != f.channels[f.input])
    throw std::invalid_argument("fused network input must be N×" + std::to_string(f.channels[f.input]) +
                                "×H×W, got " + c10::str(images.sizes()));
  if (images.size(2) < 32 || images.size(3) < 32)
    throw std::invalid_argument("network input must be at least 32×32, got " + std::to_string(images.size(2)) + "×" +
                                std::to_string(images.size(3)));
  // Last reader of every value, so intermediate tensors are released as early as possible.
  std::vector<int> last(static_cast<size_t>(f.num_values), -1);
  for (int i = 0; i < static_cast<int>(f.ops.size()); ++i) {
    const auto& op = f.ops[i];
    for (int v : op.in) last[v] = i;
    for (int v : op.add) last[v] = i;
    if (op.residual >= 0) last[op.residual] = i;
    if (op.like >= 0) last[op.like] = std::max(last[op.like], i);
  }
  std::vector<torch::Tensor> v(static_cast<size_t>(f.num_values));
  v[f.input] = images;
  for (int i = 0; i < static_cast<int>(f.ops.size()); ++i) {
    const auto& op = f.ops[i];
    const torch::Tensor& x = v[op.in[0]];
    torch::Tensor y;
    bool fresh = true;  // y is a new tensor (in-place updates allowed)
    switch (op.kind) {
      case FusedOp::Kind::Conv:
        y = torch::conv2d(x, op.weight, op.bias, op.stride, op.padding, op.dilation, op.groups);
        if (op.residual >= 0) y.add_(v[op.residual]);
        y = apply_act(y, op);
        break;
      case FusedOp::Kind::Affine:
        y = torch::addcmul(channel_view(op.bias), x, channel_view(op.weight));
        if (i == 0) y = y.contiguous(torch::MemoryFormat::ChannelsLast);
        y = apply_act(y, op);
        break;
      case FusedOp::Kind::MaxPool:
        y = torch::max_pool2d(x, {2, 2}, {2, 2}, {0, 0}, {1, 1}, /*ceil_mode=*/true);
        break;
      case FusedOp::Kind::Concat: {
        std::vector<torch::Tensor> parts;
        for (int p : op.in) parts.push_back(v[p]);
        y = torch::cat(parts, 1);
        break;
      }
      case FusedOp::Kind::Resize: {
        const int64_t h = op.like < 0 ? images.size(2) : v[op.like].size(2);
        const int64_t w = op.like < 0 ? images.size(3) : v[op.like].size(3);
        if (x.size(2) == h && x.size(3) == w) {
          y = x;
          fresh = false;
        } else {
          y = torch::upsample_bilinear2d(x, {h, w}, /*align_corners=*/false);
        }
        break;
      }
      case FusedOp::Kind::MulAdd:
        y = x * v[op.in[1]];
        break;
    }
    for (int a : op.add) {
      if (fresh) {
        y.add_(v[a]);
      } else {
        y = y + v[a];
        fresh = true;
      }
    }
    v[op.out] = y;
    if (observe) observe(op.out, y);
    for (int u : op.in)
      if (last[u] == i && u != f.output) v[u] = torch::Tensor();
    for (int u : op.add)
      if (last[u] == i) v[u] = torch::Tensor();
    if (op.residual >= 0 && last[op.residual] == i) v[op.residual] = torch::Tensor();
  }
  return v[f.output];
}

std::vector<std::string> value_names(const FusedNetwork& f) {
  std::vector<std::string> names(static_cast<size_t>(f.num_values));
  std::map<std::string, int> seen;
  names[f.input] = "input";
  for (const auto& op : f.ops) {
    const int k = ++seen[op.name];
    names[op.out] = k == 1 ? op.name : op.name + "#" + std::to_string(k);
  }
  return names;
}

std::map<std::string, float> int8_activation_bounds(const FusedNetwork& f, const std::vector<torch::Tensor>& images,
                                            double quantile) {
  if (images.empty()) throw std::invalid_argument("int8 calibration needs at least one image");
  if (!(quantile > 0 && quantile <= 1)) throw std::invalid_argument("int8 calibration: quantile must be in (0, 1]");
  std::vector<bool> want(static_cast<size_t>(f.num_values), false);
  for (size_t i = 1; i < f.ops.size(); ++i)
    if (f.ops[i].kind == FusedOp::Kind::Conv && f.ops[i].groups == 1) want[f.ops[i].in[0]] = true;
  std::vector<float> bound(static_cast<size_t>(f.num_values), 0.f);
  torch::NoGradGuard ng;
  for (const auto& batch : images) {
    for (int64_t n = 0; n < batch.size(0); ++n) {
      run_fused(f, batch.slice(0, n, n + 1), [&](int v, const torch::Tensor& y) {
        if (!want[v]) return;
        auto a = y.detach().abs().flatten().to(torch::kFloat32);
        const int64_t k = std::max<int64_t>(1, std::min<int64_t>(a.numel(), static_cast<int64_t>(std::ceil(quantile * a.numel()))));
        const float q = k == a.numel() ? a.max().item<float>() : std::get<0>(a.kthvalue(k)).item<float>();
        bound[v] = std::max(bound[v], q);
      });
    }
  }
  const auto names = value_names(f);
  std::map<std::string, float> r;
  for (int v = 0; v < f.num_values; ++v)
    if (want[v]) r[names[v]] = std::max(bound[v], 1e-6f);
  return r;
}

}  // namespace lightseg
