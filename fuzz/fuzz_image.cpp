// Fuzz target: what every image a user or a client sends goes through (issue 17, D2/D4/D9).
// The format sniffer, the checks before decoding (check_image), the header size
// (decode_image_size), the decoder (decode_image) and the label reader (decode_label).
// Beyond "no crash, no leak, no undefined behaviour" it checks: the checks and the decoder
// agree on the size, a decoded image is H×W×{1,3,4}, a label is H×W.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "fuzz_common.h"
#include "lightseg/image_io.h"

using namespace lightseg;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::once();
  (void)sniff_format(data, size);
  std::pair<int64_t, int64_t> wh{-1, -1};
  try {
    wh = decode_image_size(data, size);
  } catch (const std::runtime_error&) {
  }
  try {  // the checks before decoding agree with the header
    const ImageSize s = check_image(data, size, "input", fuzz::kMaxPixels);
    fuzz::require(s.width == wh.first && s.height == wh.second, "check_image disagrees with decode_image_size");
  } catch (const InputError& e) {
    fuzz::require(e.kind() != InputError::Kind::TooLarge || wh.first * wh.second > fuzz::kMaxPixels,
                  "TooLarge below the limit");
  }
  try {
    const torch::Tensor img = decode_image(data, size, "input", fuzz::kMaxPixels);
    fuzz::require(img.dim() == 3 && img.scalar_type() == torch::kUInt8, "decode_image: not H×W×C uint8");
    const int64_t c = img.size(2);
    fuzz::require(c == 1 || c == 3 || c == 4, "decode_image: channels not 1, 3 or 4");
    fuzz::require(wh.first == img.size(1) && wh.second == img.size(0),
                  "decode_image_size disagrees with the decoded size");
  } catch (const ImageTooLarge&) {
    fuzz::require(wh.first > 0 && wh.first * wh.second > fuzz::kMaxPixels, "ImageTooLarge below the limit");
  } catch (const std::runtime_error&) {
  }
  try {
    const torch::Tensor lab = decode_label(data, size);
    fuzz::require(lab.dim() == 2 && lab.scalar_type() == torch::kUInt8, "decode_label: not H×W uint8");
    fuzz::require(wh.first == lab.size(1) && wh.second == lab.size(0), "decode_label: size differs from the header");
  } catch (const std::runtime_error&) {
  }
  return 0;
}
