// Fuzz target: a weights file (.lsw) from anywhere (issue 17, D10). parse_weights reads the
// magic, the JSON header, every tensor and blob bound; a file that parses and describes a small
// network is also built and loaded (load_into: shapes, names, NaN checks). Invariant: no tensor
// or blob is larger than the input.
#include <cstdint>

#include "fuzz_common.h"
#include "lightseg/weights.h"

using namespace lightseg;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::once();
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  WeightsFile w;
  try {
    w = parse_weights(bytes, "input");
  } catch (const std::runtime_error&) {
    return 0;
  }
  for (const auto& [name, t] : w.tensors) fuzz::require(t.nbytes() <= size, "a tensor larger than the input");
  for (const auto& [name, b] : w.blobs) fuzz::require(b.size() <= size, "a blob larger than the input");
  const NetworkConfig& c = w.config;
  if (c.c2 > 256 || c.stage1.layers + c.stage2.layers > 16) return 0;  // building it would only be slow
  try {
    Network net(c);
    load_into(net, w);
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
