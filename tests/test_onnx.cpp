// ONNX export: the checker accepts the graph and OpenCV DNN 4.6 runs it with LibTorch's labels;
// `lightseg export` and `lightseg bench --json` end to end.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cli_run.h"
#include "lightseg/engine.h"
#include "lightseg/features.h"
#include "data/transforms.h"
#include "lightseg/weights.h"
#include "synthetic.h"

#if LIGHTSEG_HAVE_ONNX
#include "lightseg/export.h"
#endif
#if LIGHTSEG_HAVE_ONNX && LIGHTSEG_HAVE_OPENCV
#include <opencv2/dnn.hpp>
#endif

using namespace lightseg;
namespace fs = std::filesystem;

namespace {

Network onnx_net(const NetworkConfig& cfg = NetworkConfig{}) {
  torch::manual_seed(21);
  Network net(cfg);
  {
    torch::NoGradGuard ng;
    for (auto& p : net->named_parameters())
      if (p.key().find("act.weight") != std::string::npos) p.value().uniform_(-0.2, 0.6);
    net->train();
    for (int i = 0; i < 3; ++i) net->forward(torch::randn({2, 3, 64, 96}));
  }
  net->eval();
  return net;
}

torch::Tensor reference(Network& net, const ModelMeta& meta, const torch::Tensor& x) {
  torch::NoGradGuard ng;
  return net->forward(normalize(x, meta));
}

}  // namespace

#if LIGHTSEG_HAVE_ONNX

TEST(Onnx, ExportPassesTheChecker) {
  auto dir = fixtures::temp_dir("onnx");
  auto net = onnx_net();
  ModelMeta meta = ModelMeta::camvid();
  for (int opset : {11, 13, 17}) {
    for (bool dynamic : {false, true}) {
      OnnxOptions o;
      o.opset = opset;
      o.dynamic = dynamic;
      o.height = 97;
      o.width = 131;
      const auto path = (dir / ("m" + std::to_string(opset) + (dynamic ? "d" : "f") + ".onnx")).string();
      export_onnx(net, meta, path, o);
      EXPECT_GT(check_onnx(path), 100) << path;
    }
  }
  OnnxOptions bad;
  bad.opset = 9;
  EXPECT_THROW(onnx_model_bytes(net, meta, bad), std::invalid_argument);
  // a damaged file is rejected
  const auto broken = (dir / "broken.onnx").string();
  {
    std::ofstream f(broken, std::ios::binary);
    f << "not a model";
  }
  EXPECT_THROW(check_onnx(broken), std::runtime_error);
  fs::remove_all(dir);
}

TEST(Onnx, ContractAndMetadataInTheGraph) {
  auto net = onnx_net();
  ModelMeta meta = ModelMeta::camvid();
  std::string bytes = onnx_model_bytes(net, meta, {});
  // names of the contract and the metadata travel in the file
  EXPECT_NE(bytes.find("image"), std::string::npos);
  EXPECT_NE(bytes.find("logits"), std::string::npos);
  EXPECT_NE(bytes.find("Bicyclist"), std::string::npos);  // CamVid class names
  EXPECT_NE(bytes.find("123.675"), std::string::npos);    // mean
  // operators OpenCV 4.6 mishandles are not used
  EXPECT_EQ(bytes.find("Clip"), std::string::npos);
  EXPECT_EQ(bytes.find("Split"), std::string::npos);
  EXPECT_EQ(bytes.find("BatchNormalization"), std::string::npos);  // folded
}

#if LIGHTSEG_HAVE_OPENCV

namespace {

// OpenCV DNN runs the exported file; returns N×K×H×W logits as a tensor.
torch::Tensor run_opencv(const std::string& path, const torch::Tensor& x) {
  cv::dnn::Net cvnet = cv::dnn::readNetFromONNX(path);
  cvnet.setPreferableBackend(cv::dnn::DNN_BACKEND_OPENCV);
  cvnet.setPreferableTarget(cv::dnn::DNN_TARGET_CPU);
  auto xc = x.contiguous();
  std::vector<int> shape(xc.sizes().begin(), xc.sizes().end());
  cv::Mat blob(static_cast<int>(shape.size()), shape.data(), CV_32F, xc.data_ptr<float>());
  cvnet.setInput(blob, "image");
  cv::Mat out = cvnet.forward("logits");
  std::vector<int64_t> osz(out.size.p, out.size.p + out.dims);
  return torch::from_blob(out.ptr<float>(), osz, torch::kFloat32).clone();
}

void expect_opencv_matches(Network& net, const ModelMeta& meta, int64_t h, int64_t w, const fs::path& dir) {
  OnnxOptions o;
  o.height = h;
  o.width = w;
  const auto path = (dir / ("cv_" + std::to_string(h) + "x" + std::to_string(w) + ".onnx")).string();
  export_onnx(net, meta, path, o);
  torch::manual_seed(h * 1000 + w);
  auto x = torch::rand({1, 3, h, w}) * 255;
  auto ref = reference(net, meta, x);
  auto got = run_opencv(path, x);
  ASSERT_EQ(got.sizes(), ref.sizes()) << h << "x" << w;
  const double same = got.argmax(1).eq(ref.argmax(1)).to(torch::kFloat64).mean().item<double>();
  EXPECT_GE(same, 0.999) << h << "x" << w;
  EXPECT_LT((got - ref).abs().max().item<double>(), 1e-2 * std::max(1.0, ref.abs().max().item<double>()))
      << h << "x" << w;
}

}  // namespace

TEST(Onnx, OpenCvDnnGivesTheSameLabels) {
  auto dir = fixtures::temp_dir("onnx_cv");
  auto net = onnx_net();
  ModelMeta meta = ModelMeta::camvid();
  expect_opencv_matches(net, meta, 360, 480, dir);  // the CamVid size
  expect_opencv_matches(net, meta, 97, 131, dir);   // odd: ceil-mode pooling, uneven resizes
  fs::remove_all(dir);
}

TEST(Onnx, OpenCvDnnOtherConfigurations) {
  auto dir = fixtures::temp_dir("onnx_cv_cfg");
  NetworkConfig cfg;
  cfg.c0 = 20;
  cfg.c1 = 40;
  cfg.c2 = 72;
  cfg.stage1 = {2, FELayerType::DAB, {2, 2}};
  cfg.stage2 = {3, FELayerType::ResNet, {2, 4, 8}};
  cfg.spatial_attention = false;
  cfg.num_classes = 19;
  auto net = onnx_net(cfg);
  expect_opencv_matches(net, ModelMeta::generic(19), 65, 77, dir);
  fs::remove_all(dir);
}

#endif  // LIGHTSEG_HAVE_OPENCV

TEST(Cli, ExportWritesACheckedModel) {
  auto dir = fixtures::temp_dir("cli_export");
  auto net = onnx_net();
  const auto w = (dir / "m.lsw").string();
  save_network(w, net, ModelMeta::camvid());
  const auto out = (dir / "m.onnx").string();
  auto r = fixtures::run_cli({"export", "--weights", w, "--onnx", out, "--size", "64x96"}, dir);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("checker: ok"), std::string::npos) << r.out;
  EXPECT_GT(check_onnx(out), 100);
  r = fixtures::run_cli({"export", "--weights", w, "--onnx", out, "--opset", "5"}, dir);
  EXPECT_NE(r.code, 0);
  fs::remove_all(dir);
}

#endif  // LIGHTSEG_HAVE_ONNX

TEST(Cli, BenchPrintsTheJsonContract) {
  auto dir = fixtures::temp_dir("cli_bench");
  const std::string cfg = std::string(LIGHTSEG_SOURCE_DIR) + "/configs/default.json";
  auto r = fixtures::run_cli(
      {"bench", "--config", cfg, "--size", "64x96", "--iters", "3", "--batch", "2", "--threads", "1", "--json"}, dir);
  ASSERT_EQ(r.code, 0) << r.err;
  auto lines = r.out.substr(0, r.out.find_last_not_of('\n') + 1);
  auto last = lines.substr(lines.find_last_of('\n') + 1);
  auto j = nlohmann::json::parse(last);
  EXPECT_EQ(last.rfind("{\"size\": [64, 96], \"batch\": 2, \"threads\": 1, \"p50_ms\": ", 0), 0u) << last;
  for (const char* k : {"p90_ms", "p99_ms", "fps", "backend", "images_per_s", "peak_gmac_s", "peak_fraction", "input_size"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["input_size"], nlohmann::json::parse("[64, 96]"));  // no --input-size: the network runs at the image's size
  EXPECT_GT(j["min_ms"].get<double>(), 0.0);
  EXPECT_LE(j["min_ms"].get<double>(), j["p50_ms"].get<double>());
  EXPECT_LE(j["p50_ms"].get<double>(), j["p90_ms"].get<double>());
  EXPECT_LE(j["p90_ms"].get<double>(), j["p99_ms"].get<double>());
  EXPECT_EQ(j["backend"], available_backends().front());
  EXPECT_GT(j["peak_gmac_s"].get<double>(), 0.0);
  // speed does not depend on the weights: without any, random ones and a note
  EXPECT_NE(r.err.find("random"), std::string::npos) << r.err;
  r = fixtures::run_cli({"bench", "--backend", "nonsense"}, dir);
  EXPECT_NE(r.code, 0);
  fs::remove_all(dir);
}
