#include <chrono>
#include <cmath>
#include <filesystem>

#include "lightseg/engine.h"
#include "lightseg/eval.h"
#include "lightseg/image_io.h"
#include "lightseg/transforms.h"

namespace lightseg {

namespace fs = std::filesystem;

nlohmann::json EvalResult::to_json() const {
  nlohmann::json per = nlohmann::json::object();
  auto iou = confusion.iou();
  for (size_t c = 0; c < iou.size(); ++c) {
    const std::string name = c < class_names.size() ? class_names[c] : "class" + std::to_string(c);
    per[name] = std::isnan(iou[c]) ? nlohmann::json(nullptr) : nlohmann::json(iou[c]);
  }
  return {{"miou", miou()}, {"pixel_acc", pixel_accuracy()}, {"per_class", per}, {"images", images}, {"backend", backend}};
}

torch::Tensor predict_labels(Network& net, const torch::Tensor& x) {
  torch::NoGradGuard ng;
  return net->forward(x.contiguous(torch::MemoryFormat::ChannelsLast)).argmax(1);
}

EvalResult evaluate(Network& net, const ModelMeta& meta, const SegDataset& data, const EvalOptions& o) {
  if (net->config().num_classes != data.num_classes())
    throw std::invalid_argument("the weights have " + std::to_string(net->config().num_classes) +
                                " classes but the dataset has " + std::to_string(data.num_classes()));
  const bool was_training = net->is_training();
  net->eval();
  torch::NoGradGuard ng;
  EvalResult r;
  r.confusion = ConfusionMatrix(data.num_classes(), kIgnore);
  r.class_names = data.meta().class_names;
  std::unique_ptr<InferenceEngine> engine;
  if (o.backend != "eager" || o.dtype != torch::kFloat32) {
    EngineOptions eo;
    eo.backend = o.backend;
    eo.device = o.device;
    eo.dtype = o.dtype;
    engine = make_engine(net, meta, eo);
    r.backend = engine->backend();
  } else {
    r.backend = "eager";
  }
  if (!o.save_dir.empty()) fs::create_directories(o.save_dir);
  auto t0 = std::chrono::steady_clock::now();
  for (size_t i = static_cast<size_t>(o.rank); i < data.size(); i += static_cast<size_t>(o.world)) {
    auto [img, lab] = data.load(i);
    auto rgb = to_rgb_chw_float(img).unsqueeze(0).to(o.device);
    auto pred = (engine ? engine->labels(rgb) : predict_labels(net, normalize(rgb, meta)))[0].to(torch::kCPU);
    r.confusion.update(pred, lab);
    if (!o.save_dir.empty()) {
      auto name = fs::path(data.sample(i).image).stem().string() + ".png";
      write_png((fs::path(o.save_dir) / name).string(), pred.to(torch::kUInt8));
    }
    ++r.images;
    if (o.progress) o.progress(i + 1, data.size());
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (was_training) net->train();
  return r;
}

}  // namespace lightseg
