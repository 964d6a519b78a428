// The EXIF orientation of a JPEG (internal; image_io.cpp). A phone stores a portrait photo
// as a landscape frame with an orientation tag (0x0112) saying how to turn it; browsers,
// OpenCV's imread and image viewers apply it, so lightseg does too: the labels line up with the
// picture the user sees.
#pragma once

#include <cstddef>
#include <cstdint>

#include <torch/torch.h>

namespace lightseg {

// The orientation (1..8) in the Exif APP1 segment `data` (starting with "Exif\0\0"), or 1 when
// there is none or the segment is malformed (never reads past size).
int exif_orientation(const uint8_t* data, size_t size);

// Whether this orientation swaps width and height (5..8: a quarter turn).
inline bool orientation_transposes(int orientation) { return orientation >= 5 && orientation <= 8; }

// An H×W×C image turned as the orientation says it is displayed (1: as stored;
// 2 mirrored; 3 half turn; 4 flipped; 5 transposed; 6 a quarter turn clockwise; 7 transverse;
// 8 a quarter turn anticlockwise). Contiguous.
torch::Tensor apply_orientation(const torch::Tensor& hwc, int orientation);

}  // namespace lightseg
