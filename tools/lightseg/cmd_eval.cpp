// lightseg eval: per-class IoU, mIoU and pixel accuracy over a whole split.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <vector>

#include "args.h"
#include "lightseg/eval.h"
#include "lightseg/runtime.h"
#include "lightseg/training_data.h"
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
  static std::string save, group_by, only_groups;
  static bool by_group = false;
  sub->add_option("--save", save, "Write each prediction as an 8-bit label-id PNG into this folder");
  sub->add_flag("--by-group", by_group,
                "Also score each group (drive, video, scene; see --group-by) apart: a column per group");
  sub->add_option("--group-by", group_by,
                  "What a sample's group is: prefix (file name up to the first _), dir (parent folder), regex:PATTERN "
                  "or file:PATH (default: dir for cityscapes, else prefix); implies --by-group");
  sub->add_option("--groups", only_groups,
                  "Score only the images of these groups (comma list), e.g. a run's --val-groups: "
                  "--split train,val --groups 0006R0");
  sub->callback([&a]() {
    init_runtime(a.threads);
    const std::string wpath = resolve_weights(a.weights);
    ModelMeta meta;
    Network net = load_network(wpath, &meta);
    torch::Device dev(a.device);
    if (dev.is_cuda() && !torch::cuda::is_available()) throw std::runtime_error("--device cuda: no CUDA available");
    auto data = SegDataset::open(a.dataset, a.data, a.split);
    if (!only_groups.empty()) {  // the images of these groups only
      const auto groups = data.groups(group_by);
      std::vector<std::string> want;
      for (size_t p = 0, q; p <= only_groups.size(); p = q + 1) {
        q = only_groups.find(',', p);
        if (q == std::string::npos) q = only_groups.size();
        if (q > p) want.push_back(only_groups.substr(p, q - p));
      }
      std::vector<size_t> keep;
      for (size_t i = 0; i < groups.size(); ++i)
        if (std::find(want.begin(), want.end(), groups[i]) != want.end()) keep.push_back(i);
      for (const auto& w : want)
        if (std::find(groups.begin(), groups.end(), w) == groups.end())
          throw std::invalid_argument("--groups: no image of group '" + w + "' in " + a.dataset + "/" + a.split +
                                      "; its groups (images) are: " + describe_groups(group_counts(groups)));
      if (keep.empty()) throw std::invalid_argument("--groups: no group named");
      data = data.subset(keep);
    }
    // Scoring images these weights were trained on is no held-out score: say so (training_data.h).
    try {
      std::string source;
      if (auto trained = training_data_of(wpath, read_weights(wpath), &source)) {
        const std::string w = trained_on_warning(*trained, data, a.dataset, a.data, a.split);
        if (!w.empty()) std::fprintf(stderr, "%s (the record of %s)\n", w.c_str(), source.c_str());
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "warning: the weights' training-data record cannot be read (%s): nothing is claimed\n", e.what());
    }
    ProgressLine line;
    EvalOptions eo;
    // The training graph by default (the model card's figures); an inference backend on request.
    eo.engine = engine_options(a);
    if (a.backend == "auto" && a.precision == "fp32") eo.engine.backend = "eager";
    eo.save_dir = save;
    if (by_group || !group_by.empty()) eo.groups = data.groups(group_by);
    eo.progress = [&](size_t i, size_t n) { line.update("eval " + std::to_string(i) + "/" + std::to_string(n)); };
    auto r = evaluate(net, meta, data, eo);
    line.done();
    auto iou = r.confusion.iou();
    std::printf("weights: %s (backend %s, %s)\n%s/%s: %zu images, %.1f s (%.2f img/s)\n", wpath.c_str(), r.backend.c_str(), a.precision.c_str(), a.dataset.c_str(),
                a.split.c_str(), r.images, r.seconds, r.images / std::max(r.seconds, 1e-9));
    // One column for the whole split, then one per group (--by-group).
    std::vector<std::vector<double>> cols{iou};
    for (const auto& g : r.by_group) cols.push_back(g.confusion.iou());
    auto cell = [](double v) { return std::isnan(v) ? std::string("n/a") : std::to_string(v).substr(0, 6); };
    std::printf("%-16s %8s", "class", "IoU");
    for (const auto& g : r.by_group) std::printf(" %10s", g.group.c_str());
    std::printf("\n");
    for (size_t c = 0; c < iou.size(); ++c) {
      std::printf("%-16s %8s", r.class_names[c].c_str(), cell(iou[c]).c_str());
      for (size_t k = 1; k < cols.size(); ++k) std::printf(" %10s", cell(cols[k][c]).c_str());
      std::printf("\n");
    }
    std::printf("%-16s %8.4f", "mIoU", r.miou());
    for (const auto& g : r.by_group) std::printf(" %10.4f", g.confusion.miou());
    std::printf("\n%-16s %8.4f", "pixel acc", r.pixel_accuracy());
    for (const auto& g : r.by_group) std::printf(" %10.4f", g.confusion.pixel_accuracy());
    std::printf("\n");
    if (!r.by_group.empty()) {
      std::printf("%-16s %8zu", "images", r.images);
      for (const auto& g : r.by_group) std::printf(" %10zu", g.images);
      std::printf("\n");
    }
    if (a.json) std::cout << r.to_json_string() << std::endl;
  });
}

}  // namespace lightseg::cli
