// lightseg eval: per-class IoU, mIoU and pixel accuracy over a whole split.
#include <cmath>
#include <cstdio>
#include <iostream>

#include "args.h"
#include "lightseg/eval.h"
#include "lightseg/runtime.h"
#include "lightseg/weights.h"
#include "progress.h"

namespace lightseg::cli {

std::string resolve_weights(const std::string& given) {
  if (!given.empty()) return given;
  std::string p = default_weights_path();
  if (p.empty())
    throw std::runtime_error("no --weights given and no shipped default weights found (models/camvid.lsw); "
                             "train some with `lightseg train` or pass --weights FILE");
  return p;
}

void add_eval(CLI::App& app, Args& a) {
  auto* sub = app.add_subcommand("eval", "Evaluate weights on a dataset split (mIoU, per-class IoU, pixel accuracy)");
  add_options(sub, a, {Opt::Data, Opt::Dataset, Opt::Split, Opt::Weights, Opt::Json, Opt::Device, Opt::Threads,
                       Opt::Backend, Opt::Precision, Opt::Tta});
  static std::string save;
  sub->add_option("--save", save, "Write each prediction as an 8-bit label-id PNG into this folder");
  sub->callback([&a]() {
    init_runtime(a.threads);
    const std::string wpath = resolve_weights(a.weights);
    ModelMeta meta;
    Network net = load_network(wpath, &meta);
    torch::Device dev(a.device);
    if (dev.is_cuda() && !torch::cuda::is_available()) throw std::runtime_error("--device cuda: no CUDA available");
    auto data = SegDataset::open(a.dataset, a.data, a.split);
    ProgressLine line;
    EvalOptions eo;
    // The training graph by default (the model card's figures); an inference backend on request.
    eo.engine = engine_options(a);
    if (a.backend == "auto" && a.precision == "fp32") eo.engine.backend = "eager";
    eo.save_dir = save;
    eo.progress = [&](size_t i, size_t n) { line.update("eval " + std::to_string(i) + "/" + std::to_string(n)); };
    auto r = evaluate(net, meta, data, eo);
    line.done();
    auto iou = r.confusion.iou();
    std::printf("weights: %s (backend %s, %s)\n%s/%s: %zu images, %.1f s (%.2f img/s)\n", wpath.c_str(), r.backend.c_str(), a.precision.c_str(), a.dataset.c_str(),
                a.split.c_str(), r.images, r.seconds, r.images / std::max(r.seconds, 1e-9));
    std::printf("%-16s %8s\n", "class", "IoU");
    for (size_t c = 0; c < iou.size(); ++c)
      std::printf("%-16s %8s\n", r.class_names[c].c_str(),
                  std::isnan(iou[c]) ? "n/a" : std::to_string(iou[c]).substr(0, 6).c_str());
    std::printf("%-16s %8.4f\n%-16s %8.4f\n", "mIoU", r.miou(), "pixel acc", r.pixel_accuracy());
    if (a.json) std::cout << r.to_json_string() << std::endl;
  });
}

}  // namespace lightseg::cli
