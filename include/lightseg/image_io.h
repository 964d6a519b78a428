// Image decoding/encoding with libpng and libjpeg-turbo (no OpenCV in the core library).
// Images are uint8 tensors H×W×C (C = 1, 3 or 4), labels uint8 H×W.
// Every failure throws std::runtime_error with a message naming the source.
#pragma once

#include <string>

#include <torch/torch.h>

namespace lightseg {

enum class ImageFormat { Unknown, PNG, JPEG };
ImageFormat sniff_format(const void* data, size_t size);

// Decodes PNG (any bit depth/colour type; 16-bit is reduced to 8) or JPEG (gray, RGB, CMYK).
// Returns H×W×C uint8 with C = channels of the file (1 gray, 2 gray+alpha → 4? no: see below).
// Gray+alpha is expanded to RGBA; palette PNGs to RGB(A). `what` names the source in errors.
torch::Tensor decode_image(const void* data, size_t size, const std::string& what = "image");
torch::Tensor read_image_file(const std::string& path);

// Reads a label PNG: single-channel 8-bit values as stored (palette PNGs: the palette index).
torch::Tensor read_label_file(const std::string& path);

// RGB H×W×3 (gray H×W or H×W×1, RGBA H×W×4 are converted) uint8 → 3×H×W float 0..255.
torch::Tensor to_rgb_chw_float(const torch::Tensor& hwc);

// Encodes H×W (gray) or H×W×C (C = 1, 3, 4) uint8 as PNG / JPEG.
std::string encode_png(const torch::Tensor& img, int compression = 3);
std::string encode_jpeg(const torch::Tensor& img, int quality = 90);
void write_png(const std::string& path, const torch::Tensor& img);
void write_jpeg(const std::string& path, const torch::Tensor& img, int quality = 90);

std::string read_file(const std::string& path);

}  // namespace lightseg
