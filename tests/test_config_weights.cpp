// Configuration JSON and the self-describing weights file.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "core/json_io.h"
#include "lightseg/config.h"
#include "lightseg/network.h"
#include "lightseg/weights.h"
#include "fuzz_seeds.h"

using namespace lightseg;
namespace fs = std::filesystem;

namespace {
fs::path tmpdir() {
  auto d = fs::temp_directory_path() / ("lightseg_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::create_directories(d);
  return d;
}
}  // namespace

TEST(Config, DefaultsMatchNetworkMd) {
  NetworkConfig c;
  EXPECT_EQ(c.c0, 32);
  EXPECT_EQ(c.c1, 64);
  EXPECT_EQ(c.c2, 128);
  EXPECT_EQ(c.stage1.layers, 3);
  EXPECT_EQ(c.stage2.layers, 6);
  EXPECT_EQ(c.stage2.dilations, (std::vector<int>{4, 4, 8, 8, 16, 16}));
  EXPECT_TRUE(c.spatial_attention);
  EXPECT_NO_THROW(c.validate());
}

TEST(Config, JsonRoundTripAndPartialOverrides) {
  NetworkConfig c;
  c.c1 = 48;
  c.stage1.type = FELayerType::DAB;
  c.spatial_attention = false;
  EXPECT_EQ(network_config_from_json(to_json(c)), c);
  EXPECT_EQ(NetworkConfig::from_json_string(c.to_json_string(2)), c);  // the public face: JSON text
  EXPECT_THROW(NetworkConfig::from_json_string("{\"c0\": "), std::invalid_argument);
  auto p = network_config_from_json(nlohmann::json::parse(R"({"network": {"num_classes": 19, "stage2": {"layers": 4}}})"));
  EXPECT_EQ(p.num_classes, 19);
  EXPECT_EQ(p.stage2.layers, 4);
  EXPECT_EQ(p.stage2.dilations.size(), 4u);
  EXPECT_EQ(p.c1, 64);
}

TEST(Config, ErrorsNameTheKey) {
  try {
    network_config_from_json(nlohmann::json::parse(R"({"c1": 64, "chanels": 3})"));
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("chanels"), std::string::npos);
  }
  try {
    network_config_from_json(nlohmann::json::parse(R"({"stage1": {"layers": 2, "dilations": [1,2,3]}})"));
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("dilations"), std::string::npos);
  }
  EXPECT_THROW(network_config_from_json(nlohmann::json::parse(R"({"stage1": {"type": "Transformer"}})")),
               std::invalid_argument);
  EXPECT_THROW(network_config_from_json(nlohmann::json::parse(R"({"feb_ratio": 0})")), std::invalid_argument);
}

TEST(Weights, SaveLoadRoundTripsBitExactly) {
  auto dir = tmpdir();
  torch::manual_seed(5);
  NetworkConfig cfg;
  cfg.num_classes = 11;
  Network a(cfg);
  a->train();
  {
    torch::NoGradGuard ng;
    a->forward(torch::randn({2, 3, 64, 64}));  // non-default BN buffers
  }
  a->eval();
  auto meta = ModelMeta::camvid();
  save_network((dir / "a.lsw").string(), a, meta);
  ModelMeta meta2;
  Network b = load_network((dir / "a.lsw").string(), &meta2);
  EXPECT_EQ(meta2.class_names, meta.class_names);
  EXPECT_EQ(meta2.palette, meta.palette);
  EXPECT_EQ(meta2.mean, meta.mean);
  EXPECT_EQ(b->config(), a->config());
  auto pa = a->named_parameters();
  auto pb = b->named_parameters();
  for (const auto& p : pa) EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
  auto ba = a->named_buffers();
  auto bb = b->named_buffers();
  for (const auto& p : ba) EXPECT_TRUE(torch::equal(p.value(), bb[p.key()])) << p.key();
  torch::NoGradGuard ng;
  auto x = torch::randn({1, 3, 77, 91});
  EXPECT_TRUE(torch::equal(a->forward(x), b->forward(x)));
  // no temporary file is left behind
  int files = 0;
  for (auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  fs::remove_all(dir);
}

// The smallest network the config allows, through the file's bytes: parse_weights reads what
// write_weights wrote (the fuzz target's entry), and its configs are the config target's seeds.
TEST(Weights, TinyNetworkRoundTripsThroughTheFileBytes) {
  auto dir = tmpdir();
  NetworkConfig cfg;
  cfg.c0 = 2, cfg.c1 = 4, cfg.c2 = 4, cfg.num_classes = 3;
  cfg.stage1 = {1, FELayerType::FEB, {2}};
  cfg.stage2 = {2, FELayerType::DAB, {2, 4}};
  torch::manual_seed(3);
  Network a(cfg);
  a->eval();
  const std::string path = (dir / "tiny.lsw").string();
  save_network(path, a, ModelMeta::camvid());
  std::ifstream f(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_LT(bytes.size(), 40000u);
  const WeightsFile w = parse_weights(bytes, "tiny");
  EXPECT_EQ(w.config, cfg);
  Network b(w.config);
  load_into(b, w);
  b->eval();
  torch::NoGradGuard ng;
  const auto x = torch::randn({1, 3, 32, 48});
  EXPECT_TRUE(torch::equal(a->forward(x), b->forward(x)));
  // Cut anywhere, the bytes are refused with a message naming the source, never read past.
  for (size_t cut : {size_t(0), size_t(8), size_t(17), bytes.size() / 2, bytes.size() - 1}) {
    try {
      parse_weights(bytes.substr(0, cut), "tiny");
      ADD_FAILURE() << "a file cut at " << cut << " parsed";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("tiny"), std::string::npos) << e.what();
    }
  }
  fixtures::save_fuzz_seed("weights", "tiny.lsw", bytes);
  fixtures::save_fuzz_seed("config", "tiny.json", nlohmann::json{{"network", to_json(cfg)}}.dump());
  fixtures::save_fuzz_seed("config", "default.json", nlohmann::json{{"network", to_json(NetworkConfig{})}}.dump());
  fs::remove_all(dir);
}

// Sizes no one means (a typo, a crafted header) are refused before anything is allocated.
TEST(Config, AbsurdSizesAreRefusedNamingTheKey) {
  for (auto [key, value] : {std::pair<const char*, int>{"c2", 1 << 30}, {"num_classes", 256}, {"in_channels", 1000}}) {
    nlohmann::json j = to_json(NetworkConfig{});
    j[key] = value;
    if (std::string(key) == "c2") j["c1"] = 64;
    try {
      network_config_from_json(j);
      ADD_FAILURE() << key << " = " << value << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
  nlohmann::json j = to_json(NetworkConfig{});
  j["stage2"]["dilations"] = {4, 4, 8, 8, 16, 5000};
  EXPECT_THROW(network_config_from_json(j), std::invalid_argument);
}

// Numbers are taken as they are or refused: 1e20 into an int was undefined behaviour (found by
// fuzz/fuzz_config.cpp), 2^32 + 32 wrapped to 32 and 3.7 became 3 without a word.
TEST(Config, NumbersThatDoNotFitAreRefusedNamingTheKey) {
  for (const char* text : {R"({"c0": 1e20})", R"({"c0": 4294967328})", R"({"c0": 3.7})", R"({"c0": "32"})",
                           R"({"stage2": {"layers": 6, "dilations": [4, 4, 8, 8, 16, 8888888888888888888888]}})"}) {
    try {
      network_config_from_json(nlohmann::json::parse(text));
      ADD_FAILURE() << text << " was accepted";
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_TRUE(m.find("c0") != std::string::npos || m.find("dilations") != std::string::npos) << m;
    }
  }
  EXPECT_EQ(network_config_from_json(nlohmann::json::parse(R"({"c0": 16.0})")).c0, 16);  // an integral float is fine
  nlohmann::json meta = to_json(ModelMeta::camvid());
  meta["mean"] = {1e300, 0, 0};
  EXPECT_THROW(model_meta_from_json(meta), std::invalid_argument);
  meta = to_json(ModelMeta::camvid());
  meta["std"] = {1, 0, 1};
  EXPECT_THROW(model_meta_from_json(meta), std::invalid_argument);
}

TEST(Weights, MismatchNamesParameterAndBothShapes) {
  auto dir = tmpdir();
  NetworkConfig small;
  small.c1 = 48;
  Network a(small);
  save_network((dir / "s.lsw").string(), a, ModelMeta::camvid());
  Network b;  // default c1 = 64
  auto w = read_weights((dir / "s.lsw").string());
  try {
    load_into(b, w);
    FAIL() << "expected a mismatch";
  } catch (const std::runtime_error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("semantic1.down.conv.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("[16, 32, 3, 3]"), std::string::npos) << m;
    EXPECT_NE(m.find("[32, 32, 3, 3]"), std::string::npos) << m;
  }
  fs::remove_all(dir);
}

TEST(Weights, CorruptAndTruncatedFilesFailCleanly) {
  auto dir = tmpdir();
  Network a;
  auto p = (dir / "a.lsw").string();
  save_network(p, a, ModelMeta::camvid());
  std::string bytes;
  {
    std::ifstream f(p, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  auto write = [&](const std::string& name, const std::string& b) {
    std::ofstream(dir / name, std::ios::binary) << b;
    return (dir / name).string();
  };
  EXPECT_THROW(read_weights(write("t.lsw", bytes.substr(0, bytes.size() / 2))), std::runtime_error);
  EXPECT_THROW(read_weights(write("h.lsw", bytes.substr(0, 40))), std::runtime_error);
  EXPECT_THROW(read_weights(write("g.lsw", "hello world, not weights")), std::runtime_error);
  EXPECT_THROW(read_weights((dir / "missing.lsw").string()), std::runtime_error);
  fs::remove_all(dir);
}

namespace {
std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Rewrites a weights file with its JSON header edited by `edit` (the data stays as it is).
std::string edit_header(const std::string& bytes, const std::function<void(nlohmann::json&)>& edit) {
  uint64_t len = 0;
  std::memcpy(&len, bytes.data() + 8, 8);
  auto h = nlohmann::json::parse(bytes.substr(16, len));
  edit(h);
  const std::string header = h.dump();
  const uint64_t n = header.size();
  return bytes.substr(0, 8) + std::string(reinterpret_cast<const char*>(&n), 8) + header + bytes.substr(16 + len);
}
}  // namespace

TEST(Weights, OffsetsAndSizesThatWrapAroundAreRefused) {
  auto dir = tmpdir();
  NetworkConfig cfg;
  cfg.c0 = 8, cfg.c1 = 16, cfg.c2 = 32;
  Network a(cfg);
  WeightsFile w = make_weights(a, ModelMeta::camvid());
  w.blobs["optimizer"] = std::string(64, 'x');
  const std::string p = (dir / "a.lsw").string();
  write_weights(p, w);
  const std::string bytes = slurp(p);
  const std::string first = w.tensors.front().first;
  const uint64_t wrap = ~uint64_t(0) - 7;  // 2^64 - 8: base + offset + bytes wraps to 8 bytes before the data
  struct Case {
    const char* name;
    std::function<void(nlohmann::json&)> edit;
    const char* expect;  // in the message
  };
  const std::vector<Case> cases = {
      {"tensor offset 2^64-8", [&](nlohmann::json& h) { h["tensors"][0]["offset"] = wrap; }, first.c_str()},
      {"blob offset 2^64-8", [&](nlohmann::json& h) { h["blobs"][0]["offset"] = wrap; }, "optimizer"},
      {"blob bytes 2^64-8", [&](nlohmann::json& h) { h["blobs"][0]["bytes"] = wrap; }, "optimizer"},
      {"tensor shape of 2^80 elements",
       [&](nlohmann::json& h) { h["tensors"][0]["shape"] = {int64_t(1) << 40, int64_t(1) << 40}; }, first.c_str()},
      {"negative shape", [&](nlohmann::json& h) { h["tensors"][0]["shape"] = {-1, 4}; }, first.c_str()},
      // a name twice: which of the two is loaded would depend on the reader
      {"a tensor twice", [&](nlohmann::json& h) { h["tensors"].push_back(h["tensors"][0]); }, "appears twice"},
      {"a blob twice", [&](nlohmann::json& h) { h["blobs"].push_back(h["blobs"][0]); }, "appears twice"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string f = (dir / "bad.lsw").string();
    std::ofstream(f, std::ios::binary) << edit_header(bytes, c.edit);
    try {
      read_weights(f);
      ADD_FAILURE() << "loaded";
    } catch (const std::runtime_error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("bad.lsw"), std::string::npos) << m;
      EXPECT_NE(m.find(c.expect), std::string::npos) << m;
    }
  }
  // the unedited file still loads
  EXPECT_EQ(read_weights(p).blobs.at("optimizer"), std::string(64, 'x'));
  fs::remove_all(dir);
}

TEST(Weights, DirectoriesAndNonFiniteWeightsAreRefusedByName) {
  auto dir = tmpdir();
  try {
    read_weights(dir.string());
    ADD_FAILURE() << "read a directory";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(dir.string()), std::string::npos) << m;
    EXPECT_NE(m.find("is a directory"), std::string::npos) << m;
  }
  NetworkConfig cfg;
  cfg.c0 = 8, cfg.c1 = 16, cfg.c2 = 32;
  Network a(cfg);
  std::string conv;
  {
    torch::NoGradGuard ng;
    for (auto& p : a->named_parameters(true))
      if (p.value().dim() == 4) {
        conv = p.key();
        p.value().fill_(std::numeric_limits<float>::quiet_NaN());
        break;
      }
  }
  ASSERT_FALSE(conv.empty());
  const std::string p = (dir / "nan.lsw").string();
  save_network(p, a, ModelMeta::camvid());
  try {
    load_network(p);
    ADD_FAILURE() << "loaded NaN weights";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("nan.lsw"), std::string::npos) << m;
    EXPECT_NE(m.find(conv), std::string::npos) << m;
    EXPECT_NE(m.find("finite"), std::string::npos) << m;
  }
  fs::remove_all(dir);
}
