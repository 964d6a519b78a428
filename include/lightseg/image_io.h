// Image decoding/encoding with libpng and libjpeg-turbo (no OpenCV in the core library).
// Images are uint8 tensors H×W×C (C = 1, 3 or 4), labels uint8 H×W.
// Every failure throws std::runtime_error with a message naming the source.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include <torch/torch.h>

namespace lightseg {

// The format from the first bytes. lightseg reads PNG and JPEG; the others are recognised so
// that an error can name them.
enum class ImageFormat { Unknown, PNG, JPEG, GIF, BMP, WebP, TIFF, HEIF };
ImageFormat sniff_format(const void* data, size_t size);
// "PNG", "JPEG", "GIF", "BMP", "WebP", "TIFF", "HEIF/AVIF"; "" for Unknown.
std::string format_name(ImageFormat f);

// An image whose header gives more pixels than the decoder's limit (the caller's max_pixels,
// and at most 2^28 in any case). Thrown after reading the header, before any pixel is decoded.
class ImageTooLarge : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An input the caller should fix (as opposed to an internal failure). `kind` lets a front end
// choose its answer, e.g. an HTTP status.
class InputError : public std::invalid_argument {
 public:
  enum class Kind {
    Empty,        // no bytes
    NotAnImage,   // neither PNG nor JPEG nor any other recognised image format
    Unsupported,  // a recognised image format that lightseg does not read (GIF, BMP, WebP, TIFF)
    Corrupt,      // PNG/JPEG whose data is corrupt or truncated
    TooLarge,     // more pixels than the limit (check_image's max_pixels, PredictorOptions::max_pixels)
  };
  InputError(Kind kind, const std::string& what) : std::invalid_argument(what), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

// Width and height (each below 2^31, so width·height does not overflow).
struct ImageSize {
  int64_t width = 0, height = 0;
};

// The checks before decoding an image someone sent, each with its InputError kind: empty,
// not an image, a format other than PNG/JPEG (named), a header libpng/libjpeg cannot read
// (Corrupt), more than max_pixels (> 0) from the header (TooLarge). Returns the header's size.
// decode_image(..., max_pixels) checks the limit again on what it decodes.
ImageSize check_image(const void* data, size_t size, const std::string& what = "image", int64_t max_pixels = 0);

// Decodes PNG (any colour type and bit depth, tRNS, interlace; 16-bit is reduced to 8) or JPEG
// (baseline or progressive; gray, YCbCr, RGB, CMYK/YCCK). Returns H×W×C uint8 with C = 1 (gray),
// 3 (RGB) or 4 (RGBA): gray with alpha (an alpha channel or a tRNS colour) becomes RGBA,
// palettes RGB or, with a tRNS chunk, RGBA; CMYK becomes RGB. `what` names the source in errors.
// max_pixels > 0: images of more pixels throw ImageTooLarge. A JPEG is turned as its EXIF
// orientation tag says (as browsers and viewers show it); decode_image_size and check_image
// give that turned size.
torch::Tensor decode_image(const void* data, size_t size, const std::string& what = "image", int64_t max_pixels = 0);
torch::Tensor read_image_file(const std::string& path, int64_t max_pixels = 0);

// {width, height} as the decoder reads them (libpng's png_read_info, libjpeg's jpeg_read_header),
// without decoding any pixel. Throws std::runtime_error, as decode_image would, when the header
// cannot be read. Width and height are each below 2^31 (libpng's and libjpeg's own limits).
std::pair<int64_t, int64_t> decode_image_size(const void* data, size_t size, const std::string& what = "image");

// Reads a label PNG: single-channel values as stored (palette PNGs: the palette index). 16-bit
// labels are read exactly; a value above 255 throws, naming the file (class ids are 8-bit).
torch::Tensor read_label_file(const std::string& path);
torch::Tensor decode_label(const void* data, size_t size, const std::string& what = "label");

// RGB H×W×3 (gray H×W or H×W×1, RGBA H×W×4 are converted) uint8 → 3×H×W float 0..255.
torch::Tensor to_rgb_chw_float(const torch::Tensor& hwc);

// Encodes H×W (gray) or H×W×C (C = 1, 3, 4) uint8 as PNG / JPEG.
std::string encode_png(const torch::Tensor& img, int compression = 3);
std::string encode_jpeg(const torch::Tensor& img, int quality = 90);
void write_png(const std::string& path, const torch::Tensor& img);
void write_jpeg(const std::string& path, const torch::Tensor& img, int quality = 90);

}  // namespace lightseg
