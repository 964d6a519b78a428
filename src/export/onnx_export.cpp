// ONNX export: the folded operation list (fused_network.h) written as an ONNX graph with
// libonnx, then checked with onnx::checker and strict shape inference.
#include "lightseg/export.h"
#include "core/json_io.h"

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include "infer/fused_network.h"
#include "lightseg/weights.h"
#include "lightseg/file_io.h"

namespace lightseg {

namespace onnx_export {

// Builds the graph node by node; names are the training-graph module names.
class Writer {
 public:
  Writer(const FusedNetwork& f, const ModelMeta& meta, const OnnxOptions& o, onnx::GraphProto* g)
      : f_(f), o_(o), g_(g), names_(static_cast<size_t>(f.num_values)) {
    sizes_ = f.value_sizes(o.height, o.width);
    (void)meta;
  }

  void write() {
    names_[f_.input] = "image";
    for (const auto& op : f_.ops) write_op(op);
    if (names_[f_.output] != "logits") throw std::logic_error("onnx export: the output is not named logits");
  }

 private:
  // ------------------------------------------------------------------ helpers
  std::string unique(const std::string& base) {
    std::string n = base;
    for (int i = 1; used_.count(n); ++i) n = base + "_" + std::to_string(i);
    used_.insert(n);
    return n;
  }

  std::string init_float(const std::string& name, const torch::Tensor& t, const std::vector<int64_t>& dims) {
    auto c = t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    int64_t n = 1;
    for (auto d : dims) n *= d;
    if (n != c.numel()) throw std::logic_error("onnx export: initializer " + name + " has the wrong size");
    auto* init = g_->add_initializer();
    const std::string nm = unique(name);
    init->set_name(nm);
    init->set_data_type(onnx::TensorProto::FLOAT);
    for (auto d : dims) init->add_dims(d);
    init->set_raw_data(std::string(static_cast<const char*>(c.data_ptr()), sizeof(float) * static_cast<size_t>(n)));
    return nm;
  }

  std::string init_int64(const std::string& name, const std::vector<int64_t>& v) {
    auto* init = g_->add_initializer();
    const std::string nm = unique(name);
    init->set_name(nm);
    init->set_data_type(onnx::TensorProto::INT64);
    init->add_dims(static_cast<int64_t>(v.size()));
    for (auto x : v) init->add_int64_data(x);
    return nm;
  }

  onnx::NodeProto* node(const std::string& type, const std::vector<std::string>& in, const std::string& out) {
    auto* n = g_->add_node();
    n->set_op_type(type);
    n->set_name(out);
    for (const auto& i : in) n->add_input(i);
    n->add_output(out);
    return n;
  }

  static void attr(onnx::NodeProto* n, const std::string& name, const std::vector<int64_t>& v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (auto x : v) a->add_ints(x);
  }
  static void attr(onnx::NodeProto* n, const std::string& name, int64_t v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void attr(onnx::NodeProto* n, const std::string& name, const std::string& v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(v);
  }

  // Name for the op's final output: "logits" for the network output, else the op's name.
  std::string out_name(const FusedOp& op) { return op.out == f_.output ? unique("logits") : unique(op.name); }

  // A C-channel version of value v (a one-channel map widened by a 1×1 conv with weights 1).
  std::string widened(int v, int64_t c) {
    if (f_.channels[v] == c) return names_[v];
    if (f_.channels[v] != 1) throw std::logic_error("onnx export: cannot broadcast " + names_[v]);
    auto key = std::make_pair(v, c);
    auto it = widened_.find(key);
    if (it != widened_.end()) return it->second;
    const std::string w = init_float(names_[v] + ".ones" + std::to_string(c), torch::ones({c}), {c, 1, 1, 1});
    const std::string out = unique(names_[v] + "/x" + std::to_string(c));
    auto* n = node("Conv", {names_[v], w}, out);
    attr(n, "kernel_shape", std::vector<int64_t>{1, 1});
    return widened_[key] = out;
  }

  // y (named `cur`) → activation and additions; the last node writes `final_name`.
  std::string finish(const FusedOp& op, std::string cur, int64_t c, const std::string& final_name) {
    struct Step {
      std::string type;
      std::vector<std::string> extra;
    };
    std::vector<Step> steps;
    if (op.residual >= 0) steps.push_back({"Add", {names_[op.residual]}});
    switch (op.act) {
      case Act::None: break;
      case Act::PReLU:
        steps.push_back({"PRelu", {init_float(op.name + ".slopes", op.slopes, {c, 1, 1})}});
        break;
      case Act::ReLU: steps.push_back({"Relu", {}}); break;
      case Act::Sigmoid: steps.push_back({"Sigmoid", {}}); break;
    }
    for (int a : op.add) steps.push_back({"Add", {widened(a, c)}});
    if (steps.empty()) {
      // rename: the producing node writes the final name directly
      return cur;
    }
    for (size_t i = 0; i < steps.size(); ++i) {
      const bool last = i + 1 == steps.size();
      const std::string out = last ? final_name : unique(op.name + "/" + steps[i].type);
      std::vector<std::string> in = {cur};
      in.insert(in.end(), steps[i].extra.begin(), steps[i].extra.end());
      node(steps[i].type, in, out);
      cur = out;
    }
    return cur;
  }

  bool has_tail(const FusedOp& op) const { return op.residual >= 0 || op.act != Act::None || !op.add.empty(); }

  // Resize sizes: constant [N, C, h, w] (fixed) or Shape(x)[0:2] ++ Shape(like)[2:4] (dynamic).
  std::string resize_sizes(const FusedOp& op) {
    const int x = op.in[0];
    if (!o_.dynamic) {
      const auto& s = op.like < 0 ? std::array<int64_t, 2>{o_.height, o_.width} : sizes_[op.like];
      return init_int64(op.name + ".sizes", {o_.batch, f_.channels[x], s[0], s[1]});
    }
    auto slice = [&](const std::string& src, int64_t a, int64_t b, const std::string& tag) {
      const std::string shape = unique(src + "/shape");
      node("Shape", {src}, shape);
      const std::string out = unique(src + "/" + tag);
      node("Slice", {shape, init_int64(out + ".starts", {a}), init_int64(out + ".ends", {b}), init_int64(out + ".axes", {0})},
           out);
      return out;
    };
    const std::string nc = slice(names_[x], 0, 2, "nc");
    const std::string hw = slice(op.like < 0 ? std::string("image") : names_[op.like], 2, 4, "hw");
    const std::string sizes = unique(op.name + ".sizes");
    attr(node("Concat", {nc, hw}, sizes), "axis", int64_t{0});
    return sizes;
  }

  // ------------------------------------------------------------------ operations
  void write_op(const FusedOp& op) {
    const int64_t c = f_.channels[op.out];
    const std::string final_name = out_name(op);
    const std::string mid = has_tail(op) ? unique(op.name + "/" + kind_name(op.kind)) : final_name;
    const std::string x = names_[op.in[0]];
    switch (op.kind) {
      case FusedOp::Kind::Conv: {
        const std::string w = init_float(op.name + ".weight", op.weight, op.weight.sizes().vec());
        const std::string b = init_float(op.name + ".bias", op.bias, {c});
        auto* n = node("Conv", {x, w, b}, mid);
        attr(n, "kernel_shape", std::vector<int64_t>{op.weight.size(2), op.weight.size(3)});
        attr(n, "strides", std::vector<int64_t>{op.stride[0], op.stride[1]});
        attr(n, "pads", std::vector<int64_t>{op.padding[0], op.padding[1], op.padding[0], op.padding[1]});
        attr(n, "dilations", std::vector<int64_t>{op.dilation[0], op.dilation[1]});
        attr(n, "group", op.groups);
        break;
      }
      case FusedOp::Kind::Affine: {  // per-channel x·scale + shift: a depthwise 1×1 convolution
        const std::string w = init_float(op.name + ".scale", op.weight, {c, 1, 1, 1});
        const std::string b = init_float(op.name + ".shift", op.bias, {c});
        auto* n = node("Conv", {x, w, b}, mid);
        attr(n, "kernel_shape", std::vector<int64_t>{1, 1});
        attr(n, "group", c);
        break;
      }
      case FusedOp::Kind::MaxPool: {
        auto* n = node("MaxPool", {x}, mid);
        attr(n, "kernel_shape", std::vector<int64_t>{2, 2});
        attr(n, "strides", std::vector<int64_t>{2, 2});
        if (o_.dynamic) {
          attr(n, "ceil_mode", int64_t{1});
        } else {
          // Ceil mode as explicit bottom/right padding (padding never wins a max): OpenCV 4.6
          // ignores the ceil_mode attribute.
          const auto& in = sizes_[op.in[0]];
          const auto& out = sizes_[op.out];
          attr(n, "pads", std::vector<int64_t>{0, 0, (out[0] - 1) * 2 + 2 - in[0], (out[1] - 1) * 2 + 2 - in[1]});
        }
        break;
      }
      case FusedOp::Kind::Concat: {
        std::vector<std::string> in;
        for (int p : op.in) in.push_back(names_[p]);
        attr(node("Concat", in, mid), "axis", int64_t{1});
        break;
      }
      case FusedOp::Kind::Resize: {
        const std::string sizes = resize_sizes(op);
        // roi and scales as empty tensors (not omitted): required before opset 13, allowed
        // after, and what OpenCV 4.6's importer expects (it reads input 2 as a blob).
        std::vector<std::string> in = {x, init_float(op.name + ".roi", torch::empty({0}), {0}),
                                       init_float(op.name + ".scales", torch::empty({0}), {0}), sizes};
        auto* n = node("Resize", in, mid);
        attr(n, "mode", std::string("linear"));
        attr(n, "coordinate_transformation_mode", std::string("half_pixel"));
        break;
      }
      case FusedOp::Kind::MulAdd:
        node("Mul", {x, widened(op.in[1], c)}, mid);
        break;
    }
    names_[op.out] = finish(op, mid, c, final_name);
  }

  static const char* kind_name(FusedOp::Kind k) {
    switch (k) {
      case FusedOp::Kind::Conv: return "Conv";
      case FusedOp::Kind::Affine: return "Affine";
      case FusedOp::Kind::MaxPool: return "MaxPool";
      case FusedOp::Kind::Concat: return "Concat";
      case FusedOp::Kind::Resize: return "Resize";
      case FusedOp::Kind::MulAdd: return "Mul";
    }
    return "op";
  }

  const FusedNetwork& f_;
  OnnxOptions o_;
  onnx::GraphProto* g_;
  std::vector<std::string> names_;
  std::vector<std::array<int64_t, 2>> sizes_;
  std::set<std::string> used_;
  std::map<std::pair<int, int64_t>, std::string> widened_;
};

void set_shape(onnx::ValueInfoProto* v, const std::string& name, const std::vector<std::pair<int64_t, std::string>>& dims) {
  v->set_name(name);
  auto* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto::FLOAT);
  auto* shape = t->mutable_shape();
  for (const auto& [value, param] : dims) {
    auto* d = shape->add_dim();
    if (param.empty())
      d->set_dim_value(value);
    else
      d->set_dim_param(param);
  }
}

int64_t ir_version_for(int opset) { return opset <= 11 ? 6 : opset <= 13 ? 7 : 8; }

// The checker, then strict shape inference: with the fixed export every shape is known, and
// an inferred output shape that differs from the declared N×K×H×W is an error.
void check(onnx::ModelProto& m) {
  try {
    onnx::checker::check_model(m);
    onnx::ShapeInferenceOptions opts{true, 1, false};
    onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(), opts);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("the exported ONNX graph does not pass the checker: ") + e.what());
  }
}

}  // namespace onnx_export

std::string onnx_model_bytes(const Network& net, const ModelMeta& meta, const OnnxOptions& o) {
  if (o.opset < 11 || o.opset > 17)
    throw std::invalid_argument("ONNX opset must be 11..17, got " + std::to_string(o.opset));
  if (!o.dynamic && (o.height < 32 || o.width < 32 || o.batch < 1))
    throw std::invalid_argument("ONNX export size must be at least 32x32 with batch >= 1, got " +
                                std::to_string(o.height) + "x" + std::to_string(o.width) + " batch " +
                                std::to_string(o.batch));
  FusedNetwork f = fuse_network(net, meta);
  onnx::ModelProto m;
  m.set_ir_version(onnx_export::ir_version_for(o.opset));
  m.set_producer_name("lightseg");
  m.set_producer_version("0.1.0");
  m.set_doc_string("lightseg: real-time semantic segmentation (claims 1-7 network). Input image: float32 Nx3xHxW RGB "
                   "0..255; output logits: float32 NxKxHxW.");
  auto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(o.opset);
  auto* meta_prop = m.add_metadata_props();
  meta_prop->set_key("lightseg");
  meta_prop->set_value(nlohmann::json{{"meta", to_json(meta)}, {"config", to_json(f.config)}}.dump());
  auto* g = m.mutable_graph();
  g->set_name("lightseg");
  const int64_t k = f.channels[f.output];
  using D = std::vector<std::pair<int64_t, std::string>>;
  if (o.dynamic) {
    onnx_export::set_shape(g->add_input(), "image", D{{0, "N"}, {3, ""}, {0, "H"}, {0, "W"}});
    onnx_export::set_shape(g->add_output(), "logits", D{{0, "N"}, {k, ""}, {0, "H"}, {0, "W"}});
  } else {
    onnx_export::set_shape(g->add_input(), "image", D{{o.batch, ""}, {3, ""}, {o.height, ""}, {o.width, ""}});
    onnx_export::set_shape(g->add_output(), "logits", D{{o.batch, ""}, {k, ""}, {o.height, ""}, {o.width, ""}});
  }
  onnx_export::Writer(f, meta, o, g).write();
  onnx::ModelProto checked = m;
  onnx_export::check(checked);
  std::string bytes;
  if (!m.SerializeToString(&bytes)) throw std::runtime_error("cannot serialise the ONNX model");
  return bytes;
}

void export_onnx(const Network& net, const ModelMeta& meta, const std::string& path, const OnnxOptions& o) {
  write_file_atomic(path, onnx_model_bytes(net, meta, o));
  check_onnx(path);
}

int check_onnx(const std::string& path) {
  onnx::ModelProto m;
  {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open '" + path + "'");
    if (!m.ParseFromIstream(&f)) throw std::runtime_error("'" + path + "' is not an ONNX model");
  }
  try {
    onnx::checker::check_model(path);
    onnx::ShapeInferenceOptions opts{true, 1, false};
    onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(), opts);
  } catch (const std::exception& e) {
    throw std::runtime_error("'" + path + "' does not pass the ONNX checker: " + e.what());
  }
  return m.graph().node_size();
}

}  // namespace lightseg
