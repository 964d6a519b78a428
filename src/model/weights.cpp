#include "lightseg/weights.h"
#include "lightseg/file_io.h"
#include "core/json_io.h"
#include "core/json_number.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>

namespace lightseg {

namespace fs = std::filesystem;
using nlohmann::json;

static const char kMagic[9] = "LSEGWTS1";

static std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

static std::vector<std::pair<std::string, torch::Tensor>> model_tensors(Network& net) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : net->named_parameters(true)) out.emplace_back(p.key(), p.value());
  for (const auto& b : net->named_buffers(true)) out.emplace_back(b.key(), b.value());
  return out;
}

WeightsFile make_weights(Network& net, const ModelMeta& meta) {
  WeightsFile w;
  w.config = net->config();
  w.meta = meta;
  for (auto& [name, t] : model_tensors(net))
    w.tensors.emplace_back(name, t.detach().to(torch::kCPU).contiguous().clone());
  return w;
}

static std::string dtype_name(const torch::Tensor& t) {
  if (t.scalar_type() == torch::kFloat32) return "f32";
  if (t.scalar_type() == torch::kInt64) return "i64";
  throw std::runtime_error("unsupported tensor type in weights: " + std::string(c10::toString(t.scalar_type())));
}

void write_weights(const std::string& path, const WeightsFile& w) {
  json h;
  h["format"] = "lightseg-weights";
  h["version"] = 1;
  h["arch"] = w.meta.arch;
  h["config"] = to_json(w.config);
  h["meta"] = to_json(w.meta);
  h["extra"] = parse_json(w.extra.empty() ? std::string("{}") : w.extra, "the weights' extra JSON");
  std::string data;
  json tl = json::array();
  for (const auto& [name, t0] : w.tensors) {
    torch::Tensor t = t0.detach().to(torch::kCPU).contiguous();
    size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
    tl.push_back({{"name", name}, {"dtype", dtype_name(t)}, {"shape", t.sizes().vec()},
                  {"offset", data.size()}, {"bytes", bytes}});
    data.append(static_cast<const char*>(t.data_ptr()), bytes);
  }
  json bl = json::array();
  for (const auto& [name, b] : w.blobs) {
    bl.push_back({{"name", name}, {"offset", data.size()}, {"bytes", b.size()}});
    data += b;
  }
  h["tensors"] = tl;
  h["blobs"] = bl;
  std::string header = h.dump();
  std::string out(kMagic, 8);
  uint64_t len = header.size();
  out.append(reinterpret_cast<const char*>(&len), 8);
  out += header;
  out += data;
  write_file_atomic(path, out);
}

WeightsFile read_weights(const std::string& path) {
  std::string bytes;
  try {
    bytes = read_file(path);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("weights file: ") + e.what());
  }
  return parse_weights(bytes, path);
}

WeightsFile parse_weights(const std::string& all, const std::string& path) {
  if (all.size() < 16 || std::memcmp(all.data(), kMagic, 8) != 0)
    throw std::runtime_error("'" + path + "' is not a lightseg weights file (bad magic)");
  uint64_t len = 0;
  std::memcpy(&len, all.data() + 8, 8);
  if (len > all.size() - 16) throw std::runtime_error("'" + path + "' is truncated (header)");
  json h;
  try {
    h = json::parse(all.substr(16, len));
  } catch (const json::exception& e) {
    throw std::runtime_error("'" + path + "' has a corrupt header: " + e.what());
  }
  const size_t base = 16 + len, avail = all.size() - base;
  // Whether [off, off + bytes) lies in the data, without computing off + bytes: a crafted
  // offset of 2^64 - 8 wraps the sum around and would point before the data.
  auto in_data = [avail](size_t off, size_t bytes) { return off <= avail && bytes <= avail - off; };
  auto where = [avail](size_t off, size_t bytes) {
    return " (offset " + std::to_string(off) + ", " + std::to_string(bytes) + " bytes; the data has " +
           std::to_string(avail) + ")";
  };
  WeightsFile w;
  try {
    if (h.value("format", "") != "lightseg-weights")
      throw std::runtime_error("'" + path + "' is not a lightseg weights file");
    w.config = network_config_from_json(h.at("config"));
    w.meta = model_meta_from_json(h.at("meta"));
    if (h.contains("extra")) w.extra = h.at("extra").dump();
    std::set<std::string> names;  // a name twice would be loaded twice, the last one winning
    for (const auto& t : h.at("tensors")) {
      const std::string name = t.at("name").get<std::string>();
      if (!names.insert(name).second)
        throw std::runtime_error("'" + path + "' is corrupt: tensor '" + name + "' appears twice");
      const auto shape = json_numbers<int64_t>(t.at("shape"), "shape");
      const size_t off = json_number<size_t>(t.at("offset"), "offset"), bytes = json_number<size_t>(t.at("bytes"), "bytes");
      const std::string dt = t.at("dtype").get<std::string>();
      auto type = dt == "f32" ? torch::kFloat32 : dt == "i64" ? torch::kInt64 : throw std::runtime_error("unknown dtype " + dt);
      // The size from the shape, checked before anything is allocated: no negative or
      // overflowing dimensions, and exactly `bytes`.
      size_t n = type == torch::kFloat32 ? 4 : 8;
      bool fits = true;
      for (int64_t d : shape) {
        if (d < 0 || (d > 0 && n > std::numeric_limits<size_t>::max() / static_cast<size_t>(d))) fits = false;
        else n *= static_cast<size_t>(d);
      }
      if (!fits || n != bytes)
        throw std::runtime_error("'" + path + "' is corrupt at tensor '" + name + "': shape " + shape_str(shape) +
                                 " does not match its " + std::to_string(bytes) + " bytes");
      if (!in_data(off, bytes))
        throw std::runtime_error("'" + path + "' is truncated or corrupt at tensor '" + name + "'" +
                                 where(off, bytes));
      torch::Tensor x = torch::empty(shape, torch::TensorOptions().dtype(type));
      std::memcpy(x.data_ptr(), all.data() + base + off, bytes);
      w.tensors.emplace_back(name, x);
    }
    if (h.contains("blobs"))
      for (const auto& b : h.at("blobs")) {
        const std::string name = b.at("name").get<std::string>();
        if (!names.insert("blob:" + name).second)
          throw std::runtime_error("'" + path + "' is corrupt: blob '" + name + "' appears twice");
        const size_t off = json_number<size_t>(b.at("offset"), "offset"), bytes = json_number<size_t>(b.at("bytes"), "bytes");
        if (!in_data(off, bytes))
          throw std::runtime_error("'" + path + "' is truncated or corrupt at blob '" + name + "'" +
                                   where(off, bytes));
        w.blobs[name] = all.substr(base + off, bytes);
      }
  } catch (const json::exception& e) {
    throw std::runtime_error("'" + path + "' has a malformed header: " + e.what());
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error("'" + path + "': " + e.what());
  }
  return w;
}

void load_into(Network& net, const WeightsFile& w) {
  std::map<std::string, const torch::Tensor*> have;
  for (const auto& [name, t] : w.tensors) have[name] = &t;
  auto mine = model_tensors(net);
  for (auto& [name, t] : mine) {
    auto it = have.find(name);
    if (it == have.end())
      throw std::runtime_error("weights do not fit the model: parameter '" + name + "' (shape " +
                               shape_str(t.sizes().vec()) + ") is missing from the file");
    if (it->second->sizes() != t.sizes())
      throw std::runtime_error("weights do not fit the model: parameter '" + name + "' has shape " +
                               shape_str(it->second->sizes().vec()) + " in the file but " +
                               shape_str(t.sizes().vec()) + " in the model");
  }
  if (have.size() != mine.size()) {
    std::map<std::string, int> m;
    for (auto& [name, t] : mine) m[name] = 1;
    for (const auto& [name, t] : w.tensors)
      if (!m.count(name))
        throw std::runtime_error("weights do not fit the model: the file has parameter '" + name + "' (shape " +
                                 shape_str(t.sizes().vec()) + ") that the model lacks");
  }
  // A diverged run's NaN would otherwise load without a word and predict one class everywhere.
  for (auto& [name, t] : mine) {
    const torch::Tensor& x = *have[name];
    if (!x.is_floating_point()) continue;
    const int64_t bad = x.numel() - torch::isfinite(x).sum().item<int64_t>();
    if (bad > 0)
      throw std::runtime_error("weights are not finite: parameter '" + name + "' holds " + std::to_string(bad) +
                               " NaN or infinite values (of " + std::to_string(x.numel()) + ")");
  }
  torch::NoGradGuard ng;
  for (auto& [name, t] : mine) t.copy_(*have[name]);
}

PartialLoad load_matching(Network& net, const WeightsFile& w) {
  std::map<std::string, const torch::Tensor*> have;
  for (const auto& [name, t] : w.tensors) have[name] = &t;
  auto mine = model_tensors(net);
  PartialLoad r;
  r.model_tensors = mine.size();
  std::map<std::string, int> in_model;
  torch::NoGradGuard ng;
  for (auto& [name, t] : mine) {
    in_model[name] = 1;
    auto it = have.find(name);
    if (it == have.end()) {
      r.missing.push_back(name);
      continue;
    }
    const torch::Tensor& x = *it->second;
    if (x.sizes() != t.sizes()) {
      r.reshaped.push_back(name + " (file " + shape_str(x.sizes().vec()) + ", model " + shape_str(t.sizes().vec()) + ")");
      continue;
    }
    if (x.is_floating_point()) {
      const int64_t bad = x.numel() - torch::isfinite(x).sum().item<int64_t>();
      if (bad > 0)
        throw std::runtime_error("weights are not finite: parameter '" + name + "' holds " + std::to_string(bad) +
                                 " NaN or infinite values (of " + std::to_string(x.numel()) + ")");
    }
    t.copy_(x);
    r.loaded.push_back(name);
  }
  for (const auto& [name, t] : w.tensors)
    if (!in_model.count(name)) r.unused.push_back(name);
  return r;
}

std::string PartialLoad::summary() const {
  std::string s = "loaded " + std::to_string(loaded.size()) + " of " + std::to_string(model_tensors) + " tensors";
  auto list = [&](const char* what, const std::vector<std::string>& v) {
    if (v.empty()) return;
    s += std::string("; ") + what + ": ";
    for (size_t i = 0; i < v.size() && i < 6; ++i) s += (i ? ", " : "") + v[i];
    if (v.size() > 6) s += ", ... (" + std::to_string(v.size()) + " in all)";
  };
  list("new (shape differs)", reshaped);
  list("new (not in the file)", missing);
  list("unused from the file", unused);
  return s;
}

Network load_network(const std::string& path, ModelMeta* meta) {
  WeightsFile w = read_weights(path);
  Network net(w.config);
  try {
    load_into(net, w);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error("'" + path + "': " + e.what());
  }
  net->eval();
  if (meta) *meta = w.meta;
  return net;
}

void save_network(const std::string& path, Network& net, const ModelMeta& meta) {
  write_weights(path, make_weights(net, meta));
}

namespace {
std::string& installed_models_dir() {
  static std::string dir;
  return dir;
}
}  // namespace

void set_installed_models_dir(const std::string& dir) { installed_models_dir() = dir; }

std::string default_weights_path() {
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("LIGHTSEG_MODELS")) candidates.push_back(fs::path(env) / "camvid.lsw");
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    // build/bin/lightseg → ../../models ; install prefix bin/ → ../share/lightseg/models
    candidates.push_back(exe.parent_path() / ".." / ".." / "models" / "camvid.lsw");
    candidates.push_back(exe.parent_path() / ".." / "share" / "lightseg" / "models" / "camvid.lsw");
  }
  if (!installed_models_dir().empty()) candidates.push_back(fs::path(installed_models_dir()) / "camvid.lsw");
#ifdef LIGHTSEG_SOURCE_MODELS
  candidates.push_back(fs::path(LIGHTSEG_SOURCE_MODELS) / "camvid.lsw");
#endif
  for (const auto& c : candidates)
    if (fs::exists(c, ec)) return fs::weakly_canonical(c, ec).string();
  return {};
}

}  // namespace lightseg
