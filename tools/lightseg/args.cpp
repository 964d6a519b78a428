#include "args.h"

#include "lightseg/predictor.h"

#include <stdexcept>

namespace lightseg::cli {

void add_options(CLI::App* sub, Args& a, const std::vector<Opt>& which) {
  for (Opt o : which) {
    switch (o) {
      case Opt::Threads:
        sub->add_option("--threads", a.threads, "Intra-op threads (default: OMP_NUM_THREADS or all cores)")
            ->check(CLI::NonNegativeNumber);
        break;
      case Opt::Device:
        sub->add_option("--device", a.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
        break;
      case Opt::Weights:
        sub->add_option("--weights", a.weights, "Weights file (.lsw); default: the shipped models/camvid.lsw");
        break;
      case Opt::Config:
        sub->add_option("--config", a.config, "Configuration JSON (default: the built-in defaults of docs/NETWORK.md)")
            ->check(CLI::ExistingFile);
        break;
      case Opt::Size:
        sub->add_option("--size", a.size, "Input size HxW")->capture_default_str();
        break;
      case Opt::Json:
        sub->add_flag("--json", a.json, "Print one JSON object (last line of stdout)");
        break;
      case Opt::Data:
        sub->add_option("--data", a.data, "Dataset root folder")->required()->check(CLI::ExistingDirectory);
        break;
      case Opt::Dataset:
        sub->add_option("--dataset", a.dataset, "camvid, cityscapes or list")
            ->check(CLI::IsMember({"camvid", "cityscapes", "list"}))
            ->capture_default_str();
        break;
      case Opt::Split:
        sub->add_option("--split", a.split, "Split name (train, val, test, ...)")->capture_default_str();
        break;
      case Opt::Out:
        sub->add_option("--out", a.out, "Output folder");
        break;
      case Opt::Host:
        sub->add_option("--host", a.host, "Address to listen on (0.0.0.0: every interface)")->capture_default_str();
        break;
      case Opt::Port:
        sub->add_option("--port", a.port, "TCP port (0: any free port)")->check(CLI::Range(0, 65535))->capture_default_str();
        break;
      case Opt::Backend:
        sub->add_option("--backend", a.backend, "Inference backend: auto, onednn, fused or eager")
            ->check(CLI::IsMember({"auto", "onednn", "fused", "eager"}))
            ->capture_default_str();
        break;
      case Opt::Batch:
        sub->add_option("--batch", a.batch, "Images per inference call")->check(CLI::Range(1, 1024))->capture_default_str();
        break;
      case Opt::Iters:
        sub->add_option("--iters", a.iters, "Timed iterations")->check(CLI::Range(1, 1000000))->capture_default_str();
        break;
      case Opt::Precision:
        sub->add_option("--precision", a.precision,
                        sub->get_name() == "train"
                            ? "Compute type: auto, fp32 or bf16"
                            : "Compute type: fp32, bf16, int8 or fp16 (fp16: CUDA only; bf16 on the CPU: onednn backend, "
                              "CPUs with AVX512-BF16 or AMX; int8: onednn backend, CPUs with AVX512-VNNI, weights "
                              "calibrated by `lightseg calibrate`)")
            ->check(sub->get_name() == "train" ? CLI::IsMember({"auto", "fp32", "bf16"})
                                               : CLI::IsMember({"fp32", "fp16", "bf16", "int8"}))
            ->capture_default_str();
        break;
      case Opt::Onnx:
        sub->add_option("--onnx", a.onnx, "Output ONNX file")->required();
        break;
      case Opt::Opset:
        sub->add_option("--opset", a.opset, "ONNX opset (11 to 17)")->check(CLI::Range(11, 17))->capture_default_str();
        break;
      case Opt::Dynamic:
        sub->add_flag("--dynamic", a.dynamic, "Dynamic batch and image size (default: fixed, from --size)");
        break;
      case Opt::Tta:  // test-time augmentation (EngineOptions::scales, flip)
        sub->add_option("--scales", a.scales,
                        "Test-time augmentation: average the predictions at these input scales, e.g. 0.75,1,1.25 "
                        "(each in 0.25..4; one forward pass per scale)")
            ->delimiter(',')
            ->check(CLI::Range(0.25, 4.0))
            ->capture_default_str();
        sub->add_flag("--flip", a.flip, "Test-time augmentation: also average each scale mirrored left-right (2x the passes)");
        break;
      case Opt::InputSize:  // PredictorOptions::input_size
        sub->add_option("--input-size", a.input_size,
                        "Network input size: HxW (exactly, e.g. 360x480) or N (the longest side, aspect kept, sides "
                        "rounded to multiples of 8); each image is resized once and its labels come back at its own "
                        "size. Default: each image's own size")
            ->check([](const std::string& t) {
              try {
                InputSize::parse(t);
                return std::string();
              } catch (const std::exception& e) {
                return std::string(e.what());
              }
            });
        break;
    }
  }
}

c10::ScalarType precision_type(const std::string& p) {
  if (p == "fp16") return c10::ScalarType::Half;
  if (p == "bf16") return c10::ScalarType::BFloat16;
  if (p == "int8") return c10::ScalarType::QInt8;
  if (p == "fp32") return c10::ScalarType::Float;
  throw std::invalid_argument("precision must be fp32, bf16, int8 or fp16, got '" + p + "'");
}

EngineOptions engine_options(const Args& a) {
  EngineOptions o;
  o.backend = a.backend;
  o.device = torch::Device(a.device);
  o.dtype = precision_type(a.precision);
  o.scales = a.scales;
  o.flip = a.flip;
  return o;
}

std::pair<int64_t, int64_t> parse_size(const std::string& s) {
  auto x = s.find_first_of("xX");
  if (x == std::string::npos) throw std::invalid_argument("size must be HxW (e.g. 360x480), got '" + s + "'");
  int64_t h = 0, w = 0;
  try {
    size_t p1 = 0, p2 = 0;
    h = std::stoll(s.substr(0, x), &p1);
    w = std::stoll(s.substr(x + 1), &p2);
    if (p1 != x || p2 != s.size() - x - 1) throw std::invalid_argument("");
  } catch (...) {
    throw std::invalid_argument("size must be HxW (e.g. 360x480), got '" + s + "'");
  }
  if (h < 32 || w < 32) throw std::invalid_argument("size must be at least 32x32, got '" + s + "'");
  if (h > 16384 || w > 16384) throw std::invalid_argument("size is too large: '" + s + "'");
  return {h, w};
}

}  // namespace lightseg::cli
