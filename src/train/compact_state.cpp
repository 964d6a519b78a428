// The compact training state: see compact_state.h for the forms and what each keeps.
#include "train/compact_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "core/torch_compat.h"
#include "train/archive_bytes.h"

namespace lightseg {

namespace {

constexpr char kOptMagic[8] = {'L', 'S', 'O', 'P', 'T', 'Q', '8', '\n'};
constexpr char kRawMagic[8] = {'L', 'S', 'R', 'A', 'W', 'Q', '8', '\n'};
constexpr int64_t kBlock = 256;
// The binary orders a block of second moments spans at most: a code step is then at most
// 32/254 orders (within 4.5 % of the value).
constexpr float kLogSpan = 32;

// Calls f(param, state) for every parameter with Adam or AdamW state.
template <class F>
void for_each_adam_state(torch::optim::Optimizer& opt, F f) {
  for (auto& g : opt.param_groups())
    for (auto& p : g.params()) {
      auto it = opt.state().find(compat::optimizer_state_key(p));
      if (it == opt.state().end()) continue;
      if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) f(p, *a);
      else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) f(p, *w);
    }
}

bool is_adam(torch::optim::Optimizer& opt) {
  return dynamic_cast<torch::optim::Adam*>(&opt) || dynamic_cast<torch::optim::AdamW*>(&opt);
}

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

struct Reader {
  const std::string& b;
  size_t at = 0;
  const char* what;
  template <class T>
  T get() {
    T v;
    need(sizeof v);
    std::memcpy(&v, b.data() + at, sizeof v);
    at += sizeof v;
    return v;
  }
  const char* take(size_t n) {
    need(n);
    const char* p = b.data() + at;
    at += n;
    return p;
  }
  void need(size_t n) const {
    if (b.size() - at < n) throw std::runtime_error(std::string(what) + ": the compact state is cut short");
  }
};

// v >= 0 as 8-bit codes of log2(v), per block: float lo, float hi, then the codes (0: v == 0).
void put_log_codes(std::string& out, const float* v, int64_t n) {
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
    float lo = std::numeric_limits<float>::infinity(), hi = -lo;
    for (int64_t i = b0; i < b1; ++i)
      if (v[i] > 0 && std::isfinite(v[i])) lo = std::min(lo, std::log2(v[i])), hi = std::max(hi, std::log2(v[i]));
    if (!(lo <= hi)) lo = hi = 0;  // no positive value in the block
    lo = std::max(lo, hi - kLogSpan);  // smaller values come back as 2^lo (larger, never smaller)
    put(out, lo);
    put(out, hi);
    const float span = hi - lo;
    for (int64_t i = b0; i < b1; ++i) {
      uint8_t c = 0;
      if (!std::isfinite(v[i])) c = 255;  // never seen in a finite run: the block's largest
      else if (v[i] > 0)
        c = static_cast<uint8_t>(1 + (span > 0 ? std::lround(std::max(0.f, std::log2(v[i]) - lo) / span * 254) : 0));
      out.push_back(static_cast<char>(c));
    }
  }
}

void get_log_codes(Reader& r, float* v, int64_t n) {
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
    const float lo = r.get<float>(), hi = r.get<float>();
    const auto* c = reinterpret_cast<const uint8_t*>(r.take(static_cast<size_t>(b1 - b0)));
    for (int64_t i = b0; i < b1; ++i)
      v[i] = c[i - b0] == 0 ? 0.f : std::exp2(lo + (hi - lo) * static_cast<float>(c[i - b0] - 1) / 254.f);
  }
}

// d as int8 per block: float scale (max |d| / 127), then the codes.
void put_linear_codes(std::string& out, const float* d, int64_t n) {
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
    float m = 0;
    for (int64_t i = b0; i < b1; ++i) m = std::max(m, std::abs(d[i]));
    const float scale = m > 0 && std::isfinite(m) ? m / 127.f : 0.f;
    put(out, scale);
    for (int64_t i = b0; i < b1; ++i) {
      const long q = scale > 0 ? std::lround(d[i] / scale) : 0;
      out.push_back(static_cast<char>(static_cast<int8_t>(std::clamp<long>(q, -127, 127))));
    }
  }
}

void add_linear_codes(Reader& r, float* x, int64_t n) {
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
    const float scale = r.get<float>();
    const auto* c = reinterpret_cast<const int8_t*>(r.take(static_cast<size_t>(b1 - b0)));
    for (int64_t i = b0; i < b1; ++i) x[i] += scale * static_cast<float>(c[i - b0]);
  }
}

// A module's parameters and buffers by name, in its own order.
std::vector<std::pair<std::string, torch::Tensor>> named_state(const torch::nn::Module& m) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : m.named_parameters(true)) out.emplace_back(p.key(), p.value());
  for (const auto& b : m.named_buffers(true)) out.emplace_back(b.key(), b.value());
  return out;
}

}  // namespace

std::string compact_optimizer_bytes(torch::optim::Optimizer& opt) {
  if (!is_adam(opt)) return to_archive_bytes(opt);
  torch::NoGradGuard ng;
  std::string out(kOptMagic, sizeof kOptMagic);
  std::vector<torch::Tensor> params;
  for (auto& g : opt.param_groups())
    for (auto& p : g.params()) params.push_back(p);
  put(out, static_cast<uint32_t>(params.size()));
  std::vector<torch::Tensor> moments(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    int64_t step = -1;  // no state yet
    auto it = opt.state().find(compat::optimizer_state_key(params[i]));
    if (it != opt.state().end()) {
      if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
        step = a->step(), moments[i] = a->exp_avg_sq();
      } else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
        step = w->step(), moments[i] = w->exp_avg_sq();
      }
    }
    if (step >= 0 && (!moments[i].defined() || moments[i].numel() != params[i].numel())) step = -1;
    put(out, static_cast<int64_t>(params[i].numel()));
    put(out, step);
  }
  for (auto& v : moments) {
    if (!v.defined()) continue;
    const torch::Tensor f = v.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    put_log_codes(out, f.data_ptr<float>(), f.numel());
  }
  return out;
}

void load_optimizer_bytes(torch::optim::Optimizer& opt, const std::string& bytes, torch::Device device) {
  if (bytes.size() < sizeof kOptMagic || std::memcmp(bytes.data(), kOptMagic, sizeof kOptMagic) != 0) {
    from_archive_bytes(opt, bytes, device);  // torch's archive: the full state, or the first compact form
    return;
  }
  if (!is_adam(opt)) throw std::runtime_error("the checkpoint's optimizer state is Adam's; this run's optimizer is not Adam");
  const bool adamw = dynamic_cast<torch::optim::AdamW*>(&opt) != nullptr;
  Reader r{bytes, sizeof kOptMagic, "optimizer"};
  std::vector<torch::Tensor> params;
  for (auto& g : opt.param_groups())
    for (auto& p : g.params()) params.push_back(p);
  if (r.get<uint32_t>() != params.size())
    throw std::runtime_error("the checkpoint's optimizer state has another number of parameters than this run's");
  std::vector<int64_t> steps(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (r.get<int64_t>() != params[i].numel())
      throw std::runtime_error("the checkpoint's optimizer state does not fit this run's parameters");
    steps[i] = r.get<int64_t>();
  }
  opt.state().clear();
  for (size_t i = 0; i < params.size(); ++i) {
    if (steps[i] < 0) continue;
    torch::Tensor v = torch::empty(params[i].sizes(), torch::kFloat32);
    get_log_codes(r, v.data_ptr<float>(), v.numel());
    v = v.to(device);
    const torch::Tensor m = torch::empty({0}, v.options());  // left out: expand_optimizer_state
    if (adamw) {
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(steps[i]);
      s->exp_avg(m);
      s->exp_avg_sq(v);
      opt.state()[compat::optimizer_state_key(params[i])] = std::move(s);
    } else {
      auto s = std::make_unique<torch::optim::AdamParamState>();
      s->step(steps[i]);
      s->exp_avg(m);
      s->exp_avg_sq(v);
      opt.state()[compat::optimizer_state_key(params[i])] = std::move(s);
    }
  }
  if (r.at != bytes.size()) throw std::runtime_error("the checkpoint's optimizer state has bytes left over");
}

int64_t expand_optimizer_state(torch::optim::Optimizer& opt) {
  torch::NoGradGuard ng;
  int64_t restarted = 0;
  for_each_adam_state(opt, [&](const torch::Tensor& p, auto& s) {
    const auto as_param = p.options().dtype(torch::kFloat32);
    if (s.exp_avg().defined() && s.exp_avg().numel() == 0 && p.numel() > 0) {
      s.exp_avg(torch::zeros_like(p, as_param));
      ++restarted;
    } else if (s.exp_avg().defined() && s.exp_avg().scalar_type() != torch::kFloat32) {
      s.exp_avg(s.exp_avg().to(as_param));
    }
    if (s.exp_avg_sq().defined() && s.exp_avg_sq().scalar_type() != torch::kFloat32)
      s.exp_avg_sq(s.exp_avg_sq().to(as_param));
    else if (s.exp_avg_sq().defined() && s.exp_avg_sq().device() != p.device())
      s.exp_avg_sq(s.exp_avg_sq().to(p.device()));
  });
  return restarted;
}

std::string compact_weights_delta_bytes(const torch::nn::Module& raw, const torch::nn::Module& ema) {
  torch::NoGradGuard ng;
  const auto a = named_state(raw), b = named_state(ema);
  if (a.size() != b.size()) throw std::logic_error("compact_weights_delta_bytes: two different networks");
  std::string out(kRawMagic, sizeof kRawMagic);
  put(out, static_cast<uint32_t>(a.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    const auto& [name, t] = a[i];
    if (b[i].first != name || b[i].second.sizes() != t.sizes())
      throw std::logic_error("compact_weights_delta_bytes: two different networks ('" + name + "')");
    put(out, static_cast<uint32_t>(name.size()));
    out += name;
    put(out, static_cast<int64_t>(t.numel()));
    if (t.is_floating_point()) {
      out.push_back(0);  // the difference, int8 per block
      const torch::Tensor d = (t.detach().to(torch::kCPU, torch::kFloat32) - b[i].second.detach().to(torch::kCPU, torch::kFloat32)).contiguous();
      put_linear_codes(out, d.data_ptr<float>(), d.numel());
    } else {
      out.push_back(1);  // exact (a BatchNorm's batch count)
      const torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
      put(out, static_cast<uint8_t>(c.element_size()));
      out.append(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel() * c.element_size()));
    }
  }
  return out;
}

void add_weights_delta(torch::nn::Module& raw, const std::string& bytes) {
  if (bytes.size() < sizeof kRawMagic || std::memcmp(bytes.data(), kRawMagic, sizeof kRawMagic) != 0)
    throw std::runtime_error("the checkpoint's raw weights are in no form this version reads");
  torch::NoGradGuard ng;
  Reader r{bytes, sizeof kRawMagic, "raw weights"};
  auto mine = named_state(raw);
  if (r.get<uint32_t>() != mine.size())
    throw std::runtime_error("the checkpoint's raw weights are of another network");
  for (auto& [name, t] : mine) {
    const auto len = r.get<uint32_t>();
    if (std::string(r.take(len), len) != name || r.get<int64_t>() != t.numel())
      throw std::runtime_error("the checkpoint's raw weights are of another network ('" + name + "')");
    const auto kind = r.get<uint8_t>();
    if (kind == 0 && t.is_floating_point()) {
      torch::Tensor x = t.detach().to(torch::kCPU, torch::kFloat32).contiguous().clone();
      add_linear_codes(r, x.data_ptr<float>(), x.numel());
      t.copy_(x.view(t.sizes()));
    } else if (kind == 1 && !t.is_floating_point()) {
      const auto size = r.get<uint8_t>();
      torch::Tensor c = torch::empty(t.sizes(), t.options().device(torch::kCPU));
      if (size != c.element_size()) throw std::runtime_error("the checkpoint's raw weights are of another network ('" + name + "')");
      std::memcpy(c.data_ptr(), r.take(static_cast<size_t>(c.numel() * size)), static_cast<size_t>(c.numel() * size));
      t.copy_(c);
    } else {
      throw std::runtime_error("the checkpoint's raw weights are of another network ('" + name + "')");
    }
  }
  if (r.at != bytes.size()) throw std::runtime_error("the checkpoint's raw weights have bytes left over");
}

}  // namespace lightseg
