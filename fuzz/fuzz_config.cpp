// Fuzz target: a training/network config file (`lightseg train --config`, a weights header's
// "config" and "meta"), read as the library reads it (core/json_io.h): network_config_from_json, the "train"
// object through apply_json onto TrainOptions, validate(), model_meta_from_json. Invariant: a
// config that is accepted survives to_json → from_json unchanged.
#include <cstdint>

#include "fuzz_common.h"
#include "core/json_io.h"
#include "lightseg/config.h"
#include "lightseg/train.h"

using namespace lightseg;
using nlohmann::json;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::once();
  const json j = json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  try {
    const NetworkConfig c = network_config_from_json(j);
    fuzz::require(network_config_from_json(to_json(c)) == c, "network config: to_json/from_json round trip differs");
  } catch (const std::invalid_argument&) {
  } catch (const std::runtime_error&) {
  }
  try {
    TrainOptions o;
    o.data = "data";
    o.out_dir = "out";
    if (j.is_object() && j.contains("train")) apply_json(o, j.at("train"));
    else apply_json(o, j);
    o.validate();
    TrainOptions back;
    apply_json(back, to_json(o));
    fuzz::require(to_json(back) == to_json(o), "train options: to_json/apply_json round trip differs");
  } catch (const std::invalid_argument&) {
  } catch (const std::runtime_error&) {
  }
  try {
    const ModelMeta m = model_meta_from_json(j.is_object() && j.contains("meta") ? j.at("meta") : j);
    (void)to_json(m);
  } catch (const std::invalid_argument&) {
  } catch (const std::runtime_error&) {
  }
  return 0;
}
