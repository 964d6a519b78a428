// lightseg export: the network as an ONNX graph (input "image" N×3×H×W RGB 0..255, output
// "logits" N×K×H×W), written with libonnx and checked with its checker.
#include <cstdio>

#include "args.h"
#include "lightseg/features.h"
#include "lightseg/runtime.h"
#include "lightseg/weights.h"
#if LIGHTSEG_HAVE_ONNX
#include "lightseg/export.h"
#endif

namespace lightseg::cli {

void add_export(CLI::App& app, Args& a) {
  auto* sub = app.add_subcommand("export", "Export the network as ONNX (checked with the ONNX checker)");
  add_options(sub, a, {Opt::Weights, Opt::Onnx, Opt::Opset, Opt::Dynamic, Opt::Size, Opt::Batch, Opt::Threads});
  sub->callback([&a]() {
#if LIGHTSEG_HAVE_ONNX
    init_runtime(a.threads);
    const std::string wpath = resolve_weights(a.weights);
    ModelMeta meta;
    Network net = load_network(wpath, &meta);
    OnnxOptions o;
    o.opset = a.opset;
    o.dynamic = a.dynamic;
    o.batch = a.batch;
    std::tie(o.height, o.width) = parse_size(a.size);
    export_onnx(net, meta, a.onnx, o);
    const int nodes = check_onnx(a.onnx);
    std::printf("wrote %s: opset %d, %d nodes, input image %s, output logits %s (checker: ok)\n", a.onnx.c_str(),
                o.opset, nodes,
                o.dynamic ? "Nx3xHxW" : (std::to_string(o.batch) + "x3x" + a.size).c_str(),
                o.dynamic ? ("Nx" + std::to_string(net->config().num_classes) + "xHxW").c_str()
                          : (std::to_string(o.batch) + "x" + std::to_string(net->config().num_classes) + "x" + a.size).c_str());
#else
    throw std::runtime_error("this build has no ONNX export (libonnx-dev was not found at configure time)");
#endif
  });
}

}  // namespace lightseg::cli
