#include "data/exif_orientation.h"

#include <cstring>

namespace lightseg {

namespace {
struct TiffReader {
  const uint8_t* p;
  size_t n;
  bool big_endian;
  bool u16(size_t off, uint32_t& v) const {
    if (off > n || n - off < 2) return false;
    v = big_endian ? (p[off] << 8 | p[off + 1]) : (p[off + 1] << 8 | p[off]);
    return true;
  }
  bool u32(size_t off, uint32_t& v) const {
    if (off > n || n - off < 4) return false;
    v = big_endian ? (uint32_t(p[off]) << 24 | uint32_t(p[off + 1]) << 16 | uint32_t(p[off + 2]) << 8 | p[off + 3])
                   : (uint32_t(p[off + 3]) << 24 | uint32_t(p[off + 2]) << 16 | uint32_t(p[off + 1]) << 8 | p[off]);
    return true;
  }
};
}  // namespace

int exif_orientation(const uint8_t* data, size_t size) {
  // "Exif\0\0", then a TIFF header: byte order ("II" or "MM"), 42, the offset of IFD0.
  if (!data || size < 6 + 8 || std::memcmp(data, "Exif\0\0", 6) != 0) return 1;
  const uint8_t* tiff = data + 6;
  const size_t n = size - 6;
  TiffReader r{tiff, n, false};
  if (tiff[0] == 'M' && tiff[1] == 'M') r.big_endian = true;
  else if (!(tiff[0] == 'I' && tiff[1] == 'I')) return 1;
  uint32_t magic = 0, ifd = 0, count = 0;
  if (!r.u16(2, magic) || magic != 42 || !r.u32(4, ifd) || !r.u16(ifd, count)) return 1;
  for (uint32_t i = 0; i < count; ++i) {
    const size_t e = size_t(ifd) + 2 + size_t(i) * 12;
    uint32_t tag = 0, type = 0, cnt = 0, value = 0;
    if (!r.u16(e, tag) || !r.u16(e + 2, type) || !r.u32(e + 4, cnt)) return 1;
    if (tag != 0x0112) continue;
    if (type != 3 || cnt != 1 || !r.u16(e + 8, value)) return 1;  // SHORT, one value, stored in place
    return value >= 1 && value <= 8 ? static_cast<int>(value) : 1;
  }
  return 1;
}

torch::Tensor apply_orientation(const torch::Tensor& hwc, int o) {
  switch (o) {
    case 2: return hwc.flip({1}).contiguous();
    case 3: return hwc.flip({0, 1}).contiguous();
    case 4: return hwc.flip({0}).contiguous();
    case 5: return hwc.transpose(0, 1).contiguous();
    case 6: return hwc.flip({0}).transpose(0, 1).contiguous();
    case 7: return hwc.flip({0, 1}).transpose(0, 1).contiguous();
    case 8: return hwc.flip({1}).transpose(0, 1).contiguous();
    default: return hwc;
  }
}

}  // namespace lightseg
