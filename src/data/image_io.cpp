#include "lightseg/image_io.h"

#include "data/exif_orientation.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include <jpeglib.h>
#include <png.h>

#include "lightseg/file_io.h"

namespace lightseg {

ImageFormat sniff_format(const void* data, size_t size) {
  const auto* b = static_cast<const unsigned char*>(data);
  auto starts = [&](const char* magic, size_t n, size_t at = 0) {
    return size >= at + n && std::memcmp(b + at, magic, n) == 0;
  };
  if (size >= 8 && png_sig_cmp(const_cast<png_bytep>(b), 0, 8) == 0) return ImageFormat::PNG;
  if (size >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return ImageFormat::JPEG;
  if (starts("GIF87a", 6) || starts("GIF89a", 6)) return ImageFormat::GIF;
  if (starts("RIFF", 4) && starts("WEBP", 4, 8)) return ImageFormat::WebP;
  if (starts("II*\0", 4) || starts("MM\0*", 4)) return ImageFormat::TIFF;
  if (starts("ftyp", 4, 4)) return ImageFormat::HEIF;
  if (starts("BM", 2) && size >= 18) {
    const uint32_t dib = b[14] | (b[15] << 8) | (b[16] << 16) | (uint32_t(b[17]) << 24);
    if (dib == 12 || dib == 40 || dib == 52 || dib == 56 || dib == 64 || dib == 108 || dib == 124) return ImageFormat::BMP;
  }
  return ImageFormat::Unknown;
}

std::string format_name(ImageFormat f) {
  switch (f) {
    case ImageFormat::PNG: return "PNG";
    case ImageFormat::JPEG: return "JPEG";
    case ImageFormat::GIF: return "GIF";
    case ImageFormat::BMP: return "BMP";
    case ImageFormat::WebP: return "WebP";
    case ImageFormat::TIFF: return "TIFF";
    case ImageFormat::HEIF: return "HEIF/AVIF";
    case ImageFormat::Unknown: break;
  }
  return "";
}

// ------------------------------------------------------------------ PNG
namespace {

struct PngReadState {
  const unsigned char* data;
  size_t size, pos;
  char error[256];
};

void png_read_fn(png_structp png, png_bytep out, png_size_t n) {
  auto* s = static_cast<PngReadState*>(png_get_io_ptr(png));
  if (s->pos + n > s->size) png_error(png, "unexpected end of data (truncated file)");
  std::memcpy(out, s->data + s->pos, n);
  s->pos += n;
}

void png_error_fn(png_structp png, png_const_charp msg) {
  auto* s = static_cast<PngReadState*>(png_get_error_ptr(png));
  std::snprintf(s->error, sizeof(s->error), "%s", msg);
  png_longjmp(png, 1);
}

void png_warning_fn(png_structp, png_const_charp) {}

constexpr int64_t kMaxPixels = int64_t(1) << 28;  // 268 M pixels: refuse absurd headers

int64_t pixel_limit(int64_t max_pixels) { return max_pixels > 0 ? std::min(max_pixels, kMaxPixels) : kMaxPixels; }

std::string too_large(const std::string& what, int64_t w, int64_t h, int64_t limit) {
  return what + ": " + std::to_string(w) + "×" + std::to_string(h) + " = " + std::to_string(w * h) +
         " pixels, more than the limit of " + std::to_string(limit);
}

// A 16-bit label read as H×W×2 big-endian bytes → H×W×1 uint8, or an error naming the first
// largest value above 255 (keeping the high or the low byte would silently change the classes).
torch::Tensor label_from_16(const torch::Tensor& be, const std::string& what) {
  auto hi = be.select(2, 0), lo = be.select(2, 1);
  if (hi.any().item<bool>()) {
    auto v = (hi.to(torch::kInt32) * 256 + lo.to(torch::kInt32)).flatten();
    const int64_t at = v.argmax().item<int64_t>(), w = be.size(1);
    throw std::runtime_error(what + ": 16-bit label with value " + std::to_string(v[at].item<int>()) + " at x " +
                             std::to_string(at % w) + ", y " + std::to_string(at / w) +
                             "; class ids must be 0..255 (8-bit)");
  }
  return lo.unsqueeze(2).contiguous();
}

// mode: 0 = image (gray, RGB or RGBA 8-bit), 1 = label (raw indices). size_only: read the
// header, store {width, height} there and return an undefined tensor — the same calls as a
// decode up to png_read_info, so that a size checked beforehand is the size decoded.
torch::Tensor decode_png(const void* data, size_t size, const std::string& what, int mode, int64_t limit,
                         std::pair<int64_t, int64_t>* size_only = nullptr) {
  PngReadState st{static_cast<const unsigned char*>(data), size, 0, {0}};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &st, png_error_fn, png_warning_fn);
  if (!png) throw std::runtime_error(what + ": out of memory");
  png_infop info = png_create_info_struct(png);
  // Everything touched after setjmp lives outside C++ object lifetimes (longjmp-safe).
  torch::Tensor* volatile result = nullptr;
  std::vector<png_bytep>* volatile rows = nullptr;
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    delete rows;
    delete result;
    throw std::runtime_error(what + ": corrupt or truncated PNG (" + std::string(st.error) + ")");
  }
  png_set_read_fn(png, &st, png_read_fn);
  png_read_info(png, info);
  // libpng has checked IHDR: each side is below 2^31, so the product does not overflow.
  const png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
  const int bit_depth = png_get_bit_depth(png, info), color = png_get_color_type(png, info);
  if (size_only || static_cast<int64_t>(w) * h > limit) {
    png_destroy_read_struct(&png, &info, nullptr);
    if (size_only) {
      *size_only = {int64_t(w), int64_t(h)};
      return {};
    }
    throw ImageTooLarge(too_large(what, w, h, limit));
  }
  const bool wide_label = mode == 1 && bit_depth == 16;  // read as is, checked below
  if (bit_depth == 16 && !wide_label) png_set_strip_16(png);
  if (mode == 1) {
    if (color != PNG_COLOR_TYPE_GRAY && color != PNG_COLOR_TYPE_PALETTE)
      png_error(png, "a label must be a single-channel (gray or palette) PNG");
    if (bit_depth < 8) png_set_packing(png);
  } else {
    const bool trns = png_get_valid(png, info, PNG_INFO_tRNS);
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (trns) png_set_tRNS_to_alpha(png);
    // Gray with alpha, stored or from a tRNS colour, becomes RGBA: there is no 2-channel image.
    if (color == PNG_COLOR_TYPE_GRAY_ALPHA || (color == PNG_COLOR_TYPE_GRAY && trns)) png_set_gray_to_rgb(png);
  }
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const int channels = png_get_channels(png, info);
  const int sample_bytes = wide_label ? 2 : 1;
  if (mode == 0 && channels != 1 && channels != 3 && channels != 4) png_error(png, "unexpected channel count");
  const size_t rowbytes = png_get_rowbytes(png, info);
  if (rowbytes != static_cast<size_t>(w) * channels * sample_bytes) png_error(png, "unexpected row layout");
  result = new torch::Tensor(torch::empty({int64_t(h), int64_t(w), int64_t(channels) * sample_bytes}, torch::kUInt8));
  rows = new std::vector<png_bytep>(h);
  auto* base = result->data_ptr<uint8_t>();
  for (png_uint_32 y = 0; y < h; ++y) (*rows)[y] = base + static_cast<size_t>(y) * rowbytes;
  png_read_image(png, rows->data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  torch::Tensor out = *result;
  delete rows;
  delete result;
  return wide_label ? label_from_16(out, what) : out;
}

// ------------------------------------------------------------------ JPEG
struct JpegErr {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char msg[JMSG_LENGTH_MAX];
  char warning[JMSG_LENGTH_MAX];  // the first warning
};

void jpeg_error_exit_fn(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegErr*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->msg);
  longjmp(e->jump, 1);
}

// Keeps libjpeg quiet but still counts warnings (a truncated stream is only a warning to it).
void jpeg_quiet(j_common_ptr cinfo, int level) {
  if (level >= 0) return;
  auto* e = reinterpret_cast<JpegErr*>(cinfo->err);
  if (cinfo->err->num_warnings++ == 0) (*cinfo->err->format_message)(cinfo, e->warning);
}

// As decode_png: size_only reads the header the way a decode does, up to jpeg_read_header.
torch::Tensor decode_jpeg(const void* data, size_t size, const std::string& what, int64_t limit,
                          std::pair<int64_t, int64_t>* size_only = nullptr) {
  jpeg_decompress_struct cinfo;
  JpegErr err;
  err.msg[0] = err.warning[0] = 0;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_error_exit_fn;
  err.mgr.emit_message = jpeg_quiet;
  torch::Tensor* volatile result = nullptr;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    delete result;
    throw std::runtime_error(what + ": corrupt or truncated JPEG (" + std::string(err.msg) + ")");
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, static_cast<const unsigned char*>(data), static_cast<unsigned long>(size));
  jpeg_save_markers(&cinfo, JPEG_APP0 + 1, 0xFFFF);  // Exif: the orientation
  jpeg_read_header(&cinfo, TRUE);
  int orientation = 1;
  for (jpeg_saved_marker_ptr m = cinfo.marker_list; m; m = m->next)
    if (m->marker == JPEG_APP0 + 1 && (orientation = exif_orientation(m->data, m->data_length)) != 1) break;
  // The frame's size as libjpeg found it (it skips stray bytes between segments, with a
  // warning). Checked before jpeg_start_decompress, which for a progressive file already
  // allocates coefficient buffers for the whole frame.
  const int64_t iw = cinfo.image_width, ih = cinfo.image_height;
  if (size_only || iw * ih > limit) {
    jpeg_destroy_decompress(&cinfo);
    if (size_only) {  // as displayed: a quarter turn swaps the sides
      *size_only = orientation_transposes(orientation) ? std::pair<int64_t, int64_t>{ih, iw} : std::pair<int64_t, int64_t>{iw, ih};
      return {};
    }
    throw ImageTooLarge(too_large(what, iw, ih, limit));
  }
  // Warnings (stray bytes, a premature end) make the file refused below anyway: no need to decode.
  if (err.mgr.num_warnings > 0) {
    jpeg_destroy_decompress(&cinfo);
    throw std::runtime_error(what + ": corrupt or truncated JPEG (" + std::string(err.warning) + ")");
  }
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK)
    cinfo.out_color_space = JCS_CMYK;
  else if (cinfo.num_components == 1)
    cinfo.out_color_space = JCS_GRAYSCALE;
  else
    cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  const int64_t h = cinfo.output_height, w = cinfo.output_width, c = cinfo.output_components;
  result = new torch::Tensor(torch::empty({h, w, c}, torch::kUInt8));
  auto* base = result->data_ptr<uint8_t>();
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = base + static_cast<size_t>(cinfo.output_scanline) * w * c;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  // A truncated stream is padded by libjpeg with a warning; treat it as an error.
  const bool truncated = err.mgr.num_warnings > 0;
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  torch::Tensor out = *result;
  delete result;
  if (truncated) throw std::runtime_error(what + ": corrupt or truncated JPEG (" + std::string(err.warning) + ")");
  if (c == 4) {  // CMYK (Adobe inverted) → RGB
    auto f = out.to(torch::kFloat32) / 255.0;
    auto k = f.select(2, 3).unsqueeze(2);
    out = (f.narrow(2, 0, 3) * k * 255.0).round().clamp(0, 255).to(torch::kUInt8).contiguous();
  }
  return apply_orientation(out, orientation);
}

}  // namespace

torch::Tensor decode_image(const void* data, size_t size, const std::string& what, int64_t max_pixels) {
  if (size == 0) throw std::runtime_error(what + ": empty input");
  switch (sniff_format(data, size)) {
    case ImageFormat::PNG: return decode_png(data, size, what, 0, pixel_limit(max_pixels));
    case ImageFormat::JPEG: return decode_jpeg(data, size, what, pixel_limit(max_pixels));
    default: throw std::runtime_error(what + ": unsupported format (expected PNG or JPEG)");
  }
}

std::pair<int64_t, int64_t> decode_image_size(const void* data, size_t size, const std::string& what) {
  if (size == 0) throw std::runtime_error(what + ": empty input");
  std::pair<int64_t, int64_t> wh{0, 0};
  switch (sniff_format(data, size)) {
    case ImageFormat::PNG: decode_png(data, size, what, 0, kMaxPixels, &wh); break;
    case ImageFormat::JPEG: decode_jpeg(data, size, what, kMaxPixels, &wh); break;
    default: throw std::runtime_error(what + ": unsupported format (expected PNG or JPEG)");
  }
  return wh;
}

ImageSize check_image(const void* data, size_t size, const std::string& what, int64_t max_pixels) {
  using K = InputError::Kind;
  if (size == 0) throw InputError(K::Empty, what + ": empty input (no image data)");
  const ImageFormat f = sniff_format(data, size);
  if (f == ImageFormat::Unknown) throw InputError(K::NotAnImage, what + ": not an image (expected PNG or JPEG)");
  if (f != ImageFormat::PNG && f != ImageFormat::JPEG)
    throw InputError(K::Unsupported, what + ": " + format_name(f) + " images are not supported (expected PNG or JPEG)");
  // The size as the decoder reads it (png_read_info, jpeg_read_header), not a parser of ours:
  // one that stopped where libjpeg skips a stray byte said 0×0 for an image libjpeg then
  // decoded at its full size. A header the decoder cannot read is refused here already.
  ImageSize s;
  try {
    const auto [w, h] = decode_image_size(data, size, what);
    s = {w, h};
  } catch (const std::runtime_error& e) {
    throw InputError(K::Corrupt, e.what());
  }
  if (max_pixels > 0 && s.width * s.height > max_pixels)
    throw InputError(K::TooLarge, what + ": " + std::to_string(s.width) + "×" + std::to_string(s.height) + " = " +
                                      std::to_string(s.width * s.height) + " pixels, more than the limit of " +
                                      std::to_string(max_pixels));
  return s;
}

torch::Tensor read_image_file(const std::string& path, int64_t max_pixels) {
  std::string b = read_file(path);
  return decode_image(b.data(), b.size(), "'" + path + "'", max_pixels);
}

torch::Tensor decode_label(const void* data, size_t size, const std::string& what) {
  if (sniff_format(data, size) != ImageFormat::PNG) throw std::runtime_error(what + ": a label must be a PNG file");
  return decode_png(data, size, what, 1, kMaxPixels).squeeze(2);
}

torch::Tensor read_label_file(const std::string& path) {
  std::string b = read_file(path);
  return decode_label(b.data(), b.size(), "'" + path + "'");
}

torch::Tensor to_rgb_chw_float(const torch::Tensor& img) {
  torch::Tensor x = img.dim() == 2 ? img.unsqueeze(2) : img;
  if (x.dim() != 3) throw std::invalid_argument("image must be H×W or H×W×C");
  const int64_t c = x.size(2);
  if (c == 1) x = x.expand({x.size(0), x.size(1), 3});
  else if (c == 4 || c == 2) x = x.narrow(2, 0, c == 4 ? 3 : 1).expand({x.size(0), x.size(1), 3});
  else if (c != 3) throw std::invalid_argument("image must have 1, 3 or 4 channels, got " + std::to_string(c));
  return x.permute({2, 0, 1}).to(torch::kFloat32).contiguous();
}

// ------------------------------------------------------------------ encoding
namespace {
void png_write_fn(png_structp png, png_bytep data, png_size_t n) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<const char*>(data), n);
}
void png_flush_fn(png_structp) {}

torch::Tensor as_hwc_u8(const torch::Tensor& img) {
  torch::Tensor x = img.dim() == 2 ? img.unsqueeze(2) : img;
  if (x.dim() != 3 || x.scalar_type() != torch::kUInt8)
    throw std::invalid_argument("encode: expected uint8 H×W or H×W×C, got " + c10::str(img.sizes()));
  return x.to(torch::kCPU).contiguous();
}
}  // namespace

std::string encode_png(const torch::Tensor& img, int compression) {
  torch::Tensor x = as_hwc_u8(img);
  const int c = static_cast<int>(x.size(2));
  // volatile: kept in memory across the setjmp below (GCC's -Wclobbered)
  const volatile int type = c == 1 ? PNG_COLOR_TYPE_GRAY : c == 3 ? PNG_COLOR_TYPE_RGB : c == 4 ? PNG_COLOR_TYPE_RGBA : -1;
  if (type < 0) throw std::invalid_argument("encode_png: 1, 3 or 4 channels expected");
  std::string out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    throw std::runtime_error("PNG encoding failed");
  }
  png_set_write_fn(png, &out, png_write_fn, png_flush_fn);
  png_set_compression_level(png, compression);
  png_set_IHDR(png, info, x.size(1), x.size(0), 8, type, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  auto* base = x.data_ptr<uint8_t>();
  for (int64_t y = 0; y < x.size(0); ++y) png_write_row(png, base + y * x.size(1) * c);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

std::string encode_jpeg(const torch::Tensor& img, int quality) {
  torch::Tensor x = as_hwc_u8(img);
  if (x.size(2) == 4) x = x.narrow(2, 0, 3).contiguous();
  const int c = static_cast<int>(x.size(2));
  if (c != 1 && c != 3) throw std::invalid_argument("encode_jpeg: 1 or 3 channels expected");
  jpeg_compress_struct cinfo;
  JpegErr err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_error_exit_fn;
  unsigned char* volatile buf = nullptr;
  unsigned long len = 0;
  if (setjmp(err.jump)) {
    jpeg_destroy_compress(&cinfo);
    std::free(buf);
    throw std::runtime_error(std::string("JPEG encoding failed: ") + err.msg);
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, const_cast<unsigned char**>(&buf), &len);
  cinfo.image_width = x.size(1);
  cinfo.image_height = x.size(0);
  cinfo.input_components = c;
  cinfo.in_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  auto* base = x.data_ptr<uint8_t>();
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = base + static_cast<size_t>(cinfo.next_scanline) * x.size(1) * c;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::string out(reinterpret_cast<const char*>(buf), len);
  std::free(buf);
  return out;
}

void write_png(const std::string& path, const torch::Tensor& img) { write_file_atomic(path, encode_png(img)); }
void write_jpeg(const std::string& path, const torch::Tensor& img, int quality) {
  write_file_atomic(path, encode_jpeg(img, quality));
}

}  // namespace lightseg
