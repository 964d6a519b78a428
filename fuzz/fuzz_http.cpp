// Fuzz target: the bytes a client sends to `lightseg serve` (issue 17, D1/D3/D5 and the minor
// list), handled in process as one keep-alive connection (Server::handle_bytes: httplib's
// parsing, our routing, parameters, image decoding, the network on small images, the error
// answers; no socket). Invariant: no answer is a 5xx other than 503 and 501 (a Transfer-Encoding
// other than chunked: RFC 9112's answer; bad input is the client's error, never the server's).
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "fuzz_common.h"
#include "lightseg/network.h"
#include "lightseg/predictor.h"
#include "lightseg/serve.h"

using namespace lightseg;

namespace {

Server& server() {
  static Server* s = [] {
    torch::manual_seed(1);
    NetworkConfig c;  // the shipped architecture, at random weights
    PredictorOptions po;
    po.engine.backend = "fused";
    po.max_pixels = fuzz::kMaxPixels;
    auto pred = std::make_shared<Predictor>(Network(c), ModelMeta::camvid(), po);
    ServerOptions so;
    so.max_bytes = 1 << 20;
    return new Server(pred, so);  // lives for the process (libFuzzer exits without unwinding)
  }();
  return *s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::once();
  const std::string out = server().handle_bytes(std::string(reinterpret_cast<const char*>(data), size));
  // Every status line of the answers.
  for (size_t p = out.find("HTTP/1.1 "); p != std::string::npos; p = out.find("HTTP/1.1 ", p + 1)) {
    if (p > 0 && out[p - 1] != '\n') continue;
    fuzz::require(out.compare(p + 9, 1, "5") != 0 || out.compare(p + 9, 3, "503") == 0 || out.compare(p + 9, 3, "501") == 0,
                  "a 5xx answer to client input");
  }
  return 0;
}
