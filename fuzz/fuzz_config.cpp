// Fuzz target: a training/network config file (`lightseg train --config`, a weights header's
// "config" and "meta"), read as the CLI reads it: NetworkConfig::from_json, the "train" object
// through TrainOptions::apply_json, validate(), ModelMeta::from_json. Invariant: a config that
// is accepted survives to_json → from_json unchanged.
#include <cstdint>

#include "fuzz_common.h"
#include "lightseg/config.h"
#include "lightseg/train.h"

using namespace lightseg;
using nlohmann::json;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::once();
  const json j = json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  try {
    const NetworkConfig c = NetworkConfig::from_json(j);
    fuzz::require(NetworkConfig::from_json(c.to_json()) == c, "network config: to_json/from_json round trip differs");
  } catch (const std::invalid_argument&) {
  } catch (const std::runtime_error&) {
  }
  try {
    TrainOptions o;
    o.data = "data";
    o.out_dir = "out";
    if (j.is_object() && j.contains("train")) o.apply_json(j.at("train"));
    else o.apply_json(j);
    o.validate();
    TrainOptions back;
    back.apply_json(o.to_json());
    fuzz::require(back.to_json() == o.to_json(), "train options: to_json/apply_json round trip differs");
  } catch (const std::invalid_argument&) {
  } catch (const std::runtime_error&) {
  }
  try {
    const ModelMeta m = ModelMeta::from_json(j.is_object() && j.contains("meta") ? j.at("meta") : j);
    (void)m.to_json();
  } catch (const std::invalid_argument&) {
  } catch (const std::runtime_error&) {
  }
  return 0;
}
