// The decoders against files written here with libpng and libjpeg themselves: every legal PNG
// colour type and bit depth (tRNS, palette, interlace), the JPEG variants libjpeg reads, 16-bit
// labels, and headers that claim more pixels than the data holds.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include <jpeglib.h>
#include <png.h>

#include "lightseg/image_io.h"
#include "lightseg/predictor.h"
#include "fuzz_seeds.h"
#include "predictor_fixtures.h"

using namespace lightseg;
namespace fs = std::filesystem;

namespace {

// ------------------------------------------------------------------ PNG writing
struct PngFile {
  int width = 13, height = 11;  // odd: partial bytes of packed rows, every Adam7 pass
  int color_type = PNG_COLOR_TYPE_GRAY;
  int bit_depth = 8;
  bool interlace = false;
  bool trns = false;
};

int file_channels(int color_type) {
  switch (color_type) {
    case PNG_COLOR_TYPE_GRAY: return 1;
    case PNG_COLOR_TYPE_GRAY_ALPHA: return 2;
    case PNG_COLOR_TYPE_RGB: return 3;
    case PNG_COLOR_TYPE_RGB_ALPHA: return 4;
    default: return 1;  // palette: one index
  }
}

// The sample stored for pixel (x, y), channel c, in the file's own units (0 .. 2^depth - 1).
// 16-bit samples are k·257, whose 8-bit reduction is k whichever way it is rounded.
uint32_t file_sample(const PngFile& f, int x, int y, int c) {
  if (f.bit_depth == 16) return ((x * 5 + y * 3 + c * 7) % 256) * 257u;
  return (x * 5 + y * 3 + c * 7) % (1u << f.bit_depth);
}

// Palette entry i and its alpha (when the file has a tRNS chunk: the first entries, at most
// as many as the palette has).
std::array<uint8_t, 3> palette_rgb(int i) { return {uint8_t(i * 7), uint8_t(255 - i * 3), uint8_t(i * 11 + 5)}; }
const uint8_t kPaletteAlpha[3] = {0, 128, 200};
int palette_alphas(const PngFile& f) { return std::min(3, 1 << f.bit_depth); }

std::string write_png_file(const PngFile& f, const std::vector<uint32_t>& samples) {
  std::string out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    throw std::runtime_error("test PNG writer failed");
  }
  png_set_write_fn(
      png, &out,
      [](png_structp p, png_bytep d, png_size_t n) {
        static_cast<std::string*>(png_get_io_ptr(p))->append(reinterpret_cast<const char*>(d), n);
      },
      [](png_structp) {});
  png_set_IHDR(png, info, f.width, f.height, f.bit_depth, f.color_type,
               f.interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  std::vector<png_color> plte;
  if (f.color_type == PNG_COLOR_TYPE_PALETTE) {
    for (int i = 0; i < (1 << f.bit_depth); ++i) {
      auto c = palette_rgb(i);
      plte.push_back({c[0], c[1], c[2]});
    }
    png_set_PLTE(png, info, plte.data(), static_cast<int>(plte.size()));
  }
  if (f.trns) {
    if (f.color_type == PNG_COLOR_TYPE_PALETTE) {
      png_set_tRNS(png, info, kPaletteAlpha, palette_alphas(f), nullptr);
    } else {
      // the colour of pixel (0, 0) is transparent
      png_color_16 t{};
      t.gray = static_cast<png_uint_16>(file_sample(f, 0, 0, 0));
      t.red = static_cast<png_uint_16>(file_sample(f, 0, 0, 0));
      t.green = static_cast<png_uint_16>(file_sample(f, 0, 0, 1));
      t.blue = static_cast<png_uint_16>(file_sample(f, 0, 0, 2));
      png_set_tRNS(png, info, nullptr, 0, &t);
    }
  }
  png_write_info(png, info);
  // rows packed as the file stores them: MSB first below 8 bits, big-endian at 16
  const int n = file_channels(f.color_type);
  const size_t rowbytes = (static_cast<size_t>(f.width) * n * f.bit_depth + 7) / 8;
  std::vector<std::vector<uint8_t>> rows(f.height, std::vector<uint8_t>(rowbytes, 0));
  for (int y = 0; y < f.height; ++y)
    for (int x = 0; x < f.width; ++x)
      for (int c = 0; c < n; ++c) {
        const uint32_t v = samples[(static_cast<size_t>(y) * f.width + x) * n + c];
        const size_t bit = (static_cast<size_t>(x) * n + c) * f.bit_depth;
        auto& row = rows[y];
        if (f.bit_depth == 16) {
          row[bit / 8] = uint8_t(v >> 8);
          row[bit / 8 + 1] = uint8_t(v);
        } else {
          row[bit / 8] |= uint8_t(v << (8 - f.bit_depth - bit % 8));
        }
      }
  std::vector<png_bytep> ptrs;
  for (auto& r : rows) ptrs.push_back(r.data());
  png_write_image(png, ptrs.data());  // writes the Adam7 passes itself when interlaced
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

std::vector<uint32_t> pattern(const PngFile& f) {
  const int n = file_channels(f.color_type);
  std::vector<uint32_t> s;
  for (int y = 0; y < f.height; ++y)
    for (int x = 0; x < f.width; ++x)
      for (int c = 0; c < n; ++c) s.push_back(file_sample(f, x, y, c));
  return s;
}

// What decode_image must return for pattern(f): gray, RGB or RGBA 8-bit. Gray with alpha (an
// alpha channel or a tRNS colour) is RGBA, palettes are RGB, or RGBA with a tRNS chunk.
torch::Tensor expected_decode(const PngFile& f) {
  const bool gray = f.color_type == PNG_COLOR_TYPE_GRAY || f.color_type == PNG_COLOR_TYPE_GRAY_ALPHA;
  const bool alpha = f.trns || (f.color_type & PNG_COLOR_MASK_ALPHA);
  const int out_c = (gray && !alpha) ? 1 : alpha ? 4 : 3;
  const int n = file_channels(f.color_type);
  const uint32_t maxval = (1u << f.bit_depth) - 1;
  auto to8 = [&](uint32_t v) { return uint8_t(f.bit_depth == 16 ? v / 257 : v * 255 / maxval); };
  auto t = torch::empty({f.height, f.width, out_c}, torch::kUInt8);
  auto a = t.accessor<uint8_t, 3>();
  for (int y = 0; y < f.height; ++y)
    for (int x = 0; x < f.width; ++x) {
      uint8_t px[4];
      if (f.color_type == PNG_COLOR_TYPE_PALETTE) {
        const int i = static_cast<int>(file_sample(f, x, y, 0));
        auto c = palette_rgb(i);
        px[0] = c[0], px[1] = c[1], px[2] = c[2];
        px[3] = f.trns && i < palette_alphas(f) ? kPaletteAlpha[i] : 255;
      } else {
        uint32_t s[4];
        for (int c = 0; c < n; ++c) s[c] = file_sample(f, x, y, c);
        const int colour = gray ? 1 : 3;
        for (int c = 0; c < 3; ++c) px[c] = to8(s[gray ? 0 : c]);
        if (f.color_type & PNG_COLOR_MASK_ALPHA) {
          px[3] = to8(s[colour]);
        } else {
          bool transparent = true;  // tRNS: exactly the colour of pixel (0, 0)
          for (int c = 0; c < colour; ++c) transparent &= s[c] == file_sample(f, 0, 0, c);
          px[3] = transparent ? 0 : 255;
        }
      }
      for (int c = 0; c < out_c; ++c) a[y][x][c] = px[c];
    }
  return t;
}

std::string png_name(const PngFile& f) {
  const char* type = f.color_type == PNG_COLOR_TYPE_GRAY         ? "gray"
                     : f.color_type == PNG_COLOR_TYPE_GRAY_ALPHA ? "gray+alpha"
                     : f.color_type == PNG_COLOR_TYPE_RGB        ? "rgb"
                     : f.color_type == PNG_COLOR_TYPE_RGB_ALPHA  ? "rgba"
                                                                 : "palette";
  return std::string(type) + " " + std::to_string(f.bit_depth) + "-bit" + (f.trns ? " tRNS" : "") +
         (f.interlace ? " interlaced" : "");
}

// ------------------------------------------------------------------ JPEG writing
struct JpegFile {
  const char* name;
  J_COLOR_SPACE in_space;  // JCS_GRAYSCALE, JCS_RGB or JCS_CMYK
  J_COLOR_SPACE file_space;  // the colour space stored in the file
  bool progressive = false;
  bool subsample = true;   // 4:2:0 chroma (libjpeg's default) or 4:4:4
  int restart_rows = 0;    // restart markers every n MCU rows
  int expect_channels = 3;
};

// 48×32 in flat 16×16 blocks (whole MCUs): the decoded colours stay within a few levels.
constexpr int kJw = 48, kJh = 32;
uint8_t jpeg_sample(int x, int y, int c) { return uint8_t(40 + 50 * ((x / 16 + 2 * (y / 16) + c) % 4)); }

std::string write_jpeg_file(const JpegFile& f) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);  // errors exit: the test's own writer should not fail
  jpeg_create_compress(&cinfo);
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  jpeg_mem_dest(&cinfo, &buf, &len);
  const int n = f.in_space == JCS_GRAYSCALE ? 1 : f.in_space == JCS_RGB ? 3 : 4;
  cinfo.image_width = kJw;
  cinfo.image_height = kJh;
  cinfo.input_components = n;
  cinfo.in_color_space = f.in_space;
  jpeg_set_defaults(&cinfo);
  jpeg_set_colorspace(&cinfo, f.file_space);
  jpeg_set_quality(&cinfo, 95, TRUE);
  if (!f.subsample)
    for (int c = 0; c < cinfo.num_components; ++c) cinfo.comp_info[c].h_samp_factor = cinfo.comp_info[c].v_samp_factor = 1;
  if (f.progressive) jpeg_simple_progression(&cinfo);
  cinfo.restart_in_rows = f.restart_rows;
  jpeg_start_compress(&cinfo, TRUE);
  std::vector<uint8_t> row(static_cast<size_t>(kJw) * n);
  while (cinfo.next_scanline < cinfo.image_height) {
    for (int x = 0; x < kJw; ++x)
      for (int c = 0; c < n; ++c) row[x * n + c] = jpeg_sample(x, cinfo.next_scanline, c);
    JSAMPROW r = row.data();
    jpeg_write_scanlines(&cinfo, &r, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::string out(reinterpret_cast<const char*>(buf), len);
  std::free(buf);
  return out;
}

// The colours decode_image should return: gray or RGB; CMYK as Adobe stores it (inverted:
// 255 is no ink), so R = C·K/255.
torch::Tensor expected_jpeg(const JpegFile& f) {
  const int c_out = f.in_space == JCS_GRAYSCALE ? 1 : 3;
  auto t = torch::empty({kJh, kJw, c_out}, torch::kFloat32);
  auto a = t.accessor<float, 3>();
  for (int y = 0; y < kJh; ++y)
    for (int x = 0; x < kJw; ++x)
      for (int c = 0; c < c_out; ++c)
        a[y][x][c] = f.in_space == JCS_CMYK ? jpeg_sample(x, y, c) * jpeg_sample(x, y, 3) / 255.0f : jpeg_sample(x, y, c);
  return t;
}

// ------------------------------------------------------------------ header surgery
uint32_t crc32_of(const unsigned char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
  }
  return ~c;
}

void put_be32(std::string& s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>(v >> (24 - 8 * i));
}

// A PNG whose IHDR claims width × height (with a valid CRC): the data is that of the original.
std::string png_with_size(std::string png, uint32_t width, uint32_t height) {
  put_be32(png, 16, width);
  put_be32(png, 20, height);
  put_be32(png, 29, crc32_of(reinterpret_cast<const unsigned char*>(png.data()) + 12, 17));
  return png;
}

// Offset of the first JPEG marker 0xFF m (m: one of `codes`) after SOI. Our files have no
// 0xFF byte inside the segments before the scan, so a plain search finds the marker.
size_t marker_offset(const std::string& jpg, std::initializer_list<uint8_t> codes) {
  for (size_t i = 2; i + 1 < jpg.size(); ++i)
    if (uint8_t(jpg[i]) == 0xFF)
      for (uint8_t m : codes)
        if (uint8_t(jpg[i + 1]) == m) return i;
  throw std::logic_error("no such marker");
}

// A JPEG whose SOF claims width × height, optionally with a stray byte before the SOF marker
// (libjpeg skips it with a warning and reads the frame all the same).
std::string jpeg_with_size(std::string jpg, uint16_t width, uint16_t height, bool stray_byte) {
  const size_t sof = marker_offset(jpg, {0xC0, 0xC2});
  jpg[sof + 5] = char(height >> 8), jpg[sof + 6] = char(height);
  jpg[sof + 7] = char(width >> 8), jpg[sof + 8] = char(width);
  if (stray_byte) jpg.insert(sof, 1, '\0');
  return jpg;
}

}  // namespace

// ------------------------------------------------------------------ every legal PNG
TEST(ImageIO, EveryPngColourTypeAndBitDepthDecodesToGrayRgbOrRgba) {
  std::vector<PngFile> table;
  auto add = [&](int type, int depth, bool trns, bool interlace) {
    PngFile f;
    f.color_type = type, f.bit_depth = depth, f.trns = trns, f.interlace = interlace;
    table.push_back(f);
  };
  for (bool interlace : {false, true}) {
    for (int d : {1, 2, 4, 8, 16})
      for (bool trns : {false, true}) add(PNG_COLOR_TYPE_GRAY, d, trns, interlace);
    for (int d : {1, 2, 4, 8})
      for (bool trns : {false, true}) add(PNG_COLOR_TYPE_PALETTE, d, trns, interlace);
    for (int d : {8, 16}) {
      for (bool trns : {false, true}) add(PNG_COLOR_TYPE_RGB, d, trns, interlace);
      add(PNG_COLOR_TYPE_GRAY_ALPHA, d, false, interlace);
      add(PNG_COLOR_TYPE_RGB_ALPHA, d, false, interlace);
    }
  }
  ASSERT_EQ(table.size(), 2u * (10 + 8 + 8));
  for (const auto& f : table) {
    SCOPED_TRACE(png_name(f));
    const std::string png = write_png_file(f, pattern(f));
    fixtures::save_fuzz_seed("image", png_name(f) + ".png", png);
    torch::Tensor img;
    ASSERT_NO_THROW(img = decode_image(png.data(), png.size()));
    const auto want = expected_decode(f);
    ASSERT_EQ(img.sizes(), want.sizes());
    EXPECT_TRUE(torch::equal(img, want));
    // and the predictor's conversion accepts it
    EXPECT_NO_THROW(to_rgb_chw_float(img));
  }
}

// ------------------------------------------------------------------ the JPEGs libjpeg reads
TEST(ImageIO, JpegVariantsDecodeToGrayOrRgb) {
  const std::vector<JpegFile> table = {
      {"baseline YCbCr 4:2:0", JCS_RGB, JCS_YCbCr, false, true, 0, 3},
      {"baseline YCbCr 4:4:4", JCS_RGB, JCS_YCbCr, false, false, 0, 3},
      {"progressive YCbCr", JCS_RGB, JCS_YCbCr, true, true, 0, 3},
      {"restart markers", JCS_RGB, JCS_YCbCr, false, true, 1, 3},
      {"RGB stored as RGB", JCS_RGB, JCS_RGB, false, false, 0, 3},
      {"baseline gray", JCS_GRAYSCALE, JCS_GRAYSCALE, false, true, 0, 1},
      {"progressive gray", JCS_GRAYSCALE, JCS_GRAYSCALE, true, true, 0, 1},
      {"CMYK (Adobe)", JCS_CMYK, JCS_CMYK, false, false, 0, 3},
      {"YCCK (Adobe)", JCS_CMYK, JCS_YCCK, false, false, 0, 3},
      {"progressive CMYK", JCS_CMYK, JCS_CMYK, true, false, 0, 3},
  };
  for (const auto& f : table) {
    SCOPED_TRACE(f.name);
    const std::string jpg = write_jpeg_file(f);
    fixtures::save_fuzz_seed("image", std::string(f.name) + ".jpg", jpg);
    torch::Tensor img;
    ASSERT_NO_THROW(img = decode_image(jpg.data(), jpg.size()));
    ASSERT_EQ(img.dim(), 3);
    ASSERT_EQ(img.sizes(), (std::vector<int64_t>{kJh, kJw, f.expect_channels}));
    // inside the blocks: at their edges, upsampled chroma blends neighbouring blocks
    auto inner = [](int64_t n) { return torch::arange(n).remainder(16).ge(4).logical_and(torch::arange(n).remainder(16).lt(12)); };
    auto mask = inner(kJh).view({kJh, 1, 1}).logical_and(inner(kJw).view({1, kJw, 1}));
    const auto diff = (img.to(torch::kFloat32) - expected_jpeg(f)).abs();
    EXPECT_LE(diff.masked_select(mask.expand_as(diff)).max().item<double>(), 6.0);
    EXPECT_LE(diff.mean().item<double>(), 6.0);
  }
}

// ------------------------------------------------------------------ labels
TEST(ImageIO, LabelsOfEveryBitDepthAreReadExactly) {
  auto dir = fixtures::temp_dir("labels");
  // gray 1/2/4/8-bit and palette: the stored value or index; 16-bit: the value, if ≤ 255
  for (int type : {PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_PALETTE})
    for (int depth : {1, 2, 4, 8, 16}) {
      if (type == PNG_COLOR_TYPE_PALETTE && depth == 16) continue;
      PngFile f;
      f.color_type = type, f.bit_depth = depth, f.width = 29, f.height = 7;
      const uint32_t levels = depth == 16 ? 256 : 1u << depth;
      std::vector<uint32_t> s;
      for (int y = 0; y < f.height; ++y)
        for (int x = 0; x < f.width; ++x) s.push_back((x * 37 + y * 11) % levels);  // 16-bit: 0..255 as is
      const std::string path = (dir / (png_name(f) + ".png")).string();
      std::ofstream(path, std::ios::binary) << write_png_file(f, s);
      SCOPED_TRACE(path);
      torch::Tensor lab;
      ASSERT_NO_THROW(lab = read_label_file(path));
      ASSERT_EQ(lab.sizes(), (std::vector<int64_t>{f.height, f.width}));
      auto want = torch::tensor(std::vector<int64_t>(s.begin(), s.end())).view({f.height, f.width}).to(torch::kUInt8);
      EXPECT_TRUE(torch::equal(lab, want)) << "max " << lab.max().item<int>();
    }
  fs::remove_all(dir);
}

TEST(ImageIO, SixteenBitLabelsAboveTwoFiftyFiveAreRefusedNamingTheFile) {
  auto dir = fixtures::temp_dir("labels16");
  PngFile f;
  f.color_type = PNG_COLOR_TYPE_GRAY, f.bit_depth = 16, f.width = 9, f.height = 5;
  std::vector<uint32_t> s(f.width * f.height, 3);
  s[2 * f.width + 6] = 300;  // (x 6, y 2)
  const std::string path = (dir / "label16.png").string();
  std::ofstream(path, std::ios::binary) << write_png_file(f, s);
  try {
    read_label_file(path);
    FAIL() << "a 16-bit label value of 300 must not be read as an 8-bit class id";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("label16.png"), std::string::npos) << m;
    EXPECT_NE(m.find("300"), std::string::npos) << m;
  }
  fs::remove_all(dir);
}

// ------------------------------------------------------------------ the pixel limit
TEST(ImageIO, DecoderRefusesHeadersOverTheLimitBeforeDecoding) {
  auto img = fixtures::shapes_sample(24, 24, 1).first;
  const std::string png = encode_png(img), jpg = encode_jpeg(img);
  JpegFile prog{"progressive", JCS_RGB, JCS_YCbCr, true, true, 0, 3};
  const std::string pjpg = write_jpeg_file(prog);
  // headers that claim 2000×2000 over the data of a small image
  const std::vector<std::pair<std::string, std::string>> big = {
      {"PNG", png_with_size(png, 2000, 2000)},
      {"JPEG", jpeg_with_size(jpg, 2000, 2000, false)},
      {"JPEG, stray byte before SOF", jpeg_with_size(jpg, 2000, 2000, true)},
      {"progressive JPEG", jpeg_with_size(pjpg, 2000, 2000, false)},
  };
  for (const auto& [name, bytes] : big) {
    SCOPED_TRACE(name);
    EXPECT_THROW(decode_image(bytes.data(), bytes.size(), "'big'", 1000 * 1000), ImageTooLarge);
    try {
      decode_image(bytes.data(), bytes.size(), "'big'", 1000 * 1000);
    } catch (const ImageTooLarge& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("'big'"), std::string::npos) << m;
      EXPECT_NE(m.find("2000×2000"), std::string::npos) << m;
    }
    EXPECT_EQ(decode_image_size(bytes.data(), bytes.size()), (std::pair<int64_t, int64_t>{2000, 2000}));
    // without a limit the decoder reads on and finds the data missing
    EXPECT_THROW(decode_image(bytes.data(), bytes.size(), "'big'"), std::runtime_error);
  }
  // at the limit: decoded
  EXPECT_EQ(decode_image(png.data(), png.size(), "x", 24 * 24).sizes(), img.sizes());
  EXPECT_EQ(decode_image(jpg.data(), jpg.size(), "x", 24 * 24).sizes(), img.sizes());
  EXPECT_THROW(decode_image(png.data(), png.size(), "x", 24 * 24 - 1), ImageTooLarge);
  EXPECT_THROW(decode_image(jpg.data(), jpg.size(), "x", 24 * 24 - 1), ImageTooLarge);
}

// The predictor's limit is checked on the header's size: it must be the size the decoder will
// find, wherever libjpeg and libpng find it, and an unreadable header is no "0×0, passes".
TEST(Predictor, PixelLimitHoldsWhereverTheDecoderFindsTheSize) {
  fixtures::one_thread();
  PredictorOptions o;
  o.max_pixels = 40 * 40;
  Predictor p(fixtures::random_network(), ModelMeta::camvid(), o);
  const auto img = fixtures::shapes_sample(32, 32, 2).first;
  const std::string jpg = encode_jpeg(img), png = encode_png(img);
  auto kind_of = [&](const std::string& bytes, bool decode) {
    try {
      if (decode) p.predict_encoded(bytes.data(), bytes.size(), false, "'upload'");
      else p.check_encoded(bytes.data(), bytes.size(), "'upload'");
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("'upload'"), std::string::npos) << e.what();
      return static_cast<int>(e.kind());
    }
    return -1;
  };
  using K = InputError::Kind;
  // a stray byte before the SOF (or any marker before it): libjpeg skips it and reads the SOF
  std::string before_dqt = jpeg_with_size(jpg, 2000, 2000, false);
  before_dqt.insert(marker_offset(before_dqt, {0xDB}), 1, '\0');
  for (const std::string& bytes : {jpeg_with_size(jpg, 2000, 2000, true), before_dqt}) {
    const auto [w, h] = decode_image_size(bytes.data(), bytes.size());
    const ImageSize s{w, h};
    EXPECT_EQ(s.width, 2000);
    EXPECT_EQ(s.height, 2000);
    EXPECT_EQ(kind_of(bytes, false), int(K::TooLarge));
    EXPECT_EQ(kind_of(bytes, true), int(K::TooLarge));
  }
  // an IHDR of 2^32-1 × 2^32-1 (beyond PNG's 2^31-1): refused, not a product that overflows
  const std::string huge = png_with_size(png, 0xFFFFFFFFu, 0xFFFFFFFFu);
  EXPECT_THROW(decode_image_size(huge.data(), huge.size()), std::runtime_error);
  EXPECT_EQ(kind_of(huge, false), int(K::Corrupt));
  EXPECT_EQ(kind_of(huge, true), int(K::Corrupt));
  // legal but large
  const std::string large = png_with_size(png, 100000, 100000);
  EXPECT_EQ(check_image(large.data(), large.size()).width, 100000);  // no limit given
  EXPECT_EQ(kind_of(large, false), int(K::TooLarge));
  // a header the decoder cannot read is refused by the cheap check already
  EXPECT_EQ(kind_of(jpg.substr(0, marker_offset(jpg, {0xC0})), false), int(K::Corrupt));
  EXPECT_EQ(kind_of(png.substr(0, 20), false), int(K::Corrupt));
  // and what is within the limit passes
  EXPECT_EQ(kind_of(jpg, true), -1);
  EXPECT_EQ(kind_of(png, true), -1);
}

namespace {
// `jpeg` with an Exif APP1 segment holding orientation `o` right after SOI, in either byte order.
std::string with_exif_orientation(const std::string& jpeg, int o, bool big_endian) {
  std::string tiff = big_endian ? std::string("MM\0\x2a\0\0\0\x08", 8) : std::string("II\x2a\0\x08\0\0\0", 8);
  auto u16 = [&](uint32_t v) {
    return big_endian ? std::string{char(v >> 8), char(v & 255)} : std::string{char(v & 255), char(v >> 8)};
  };
  tiff += u16(2);                                                   // two entries
  tiff += u16(0x010F) + u16(2) + std::string("\x04\0\0\0", 4) + "abc" + std::string(1, '\0');  // Make, not ours
  if (big_endian) tiff.replace(tiff.size() - 8, 4, std::string("\0\0\0\x04", 4));
  tiff += u16(0x0112) + u16(3) + (big_endian ? std::string("\0\0\0\x01", 4) : std::string("\x01\0\0\0", 4)) + u16(o) + u16(0);
  tiff += std::string(4, '\0');                                     // no next IFD
  const std::string app1 = std::string("Exif\0\0", 6) + tiff;
  const size_t len = app1.size() + 2;
  return jpeg.substr(0, 2) + "\xFF\xE1" + char(len >> 8) + char(len & 255) + app1 + jpeg.substr(2);
}
}  // namespace

TEST(ImageIO, JpegExifOrientationTurnsTheImageAsViewersShowIt) {
  // 48×64 (h×w), four flat quadrants (JPEG keeps flat blocks nearly exact)
  auto img = torch::zeros({48, 64, 3}, torch::kUInt8);
  img.narrow(0, 0, 24).narrow(1, 0, 32).fill_(200);                            // top left: light
  img.narrow(0, 24, 24).narrow(1, 0, 32).select(2, 0).fill_(250);              // bottom left: red
  img.narrow(0, 0, 24).narrow(1, 32, 32).select(2, 2).fill_(250);              // top right: blue
  const std::string plain = encode_jpeg(img, 95);
  const auto stored = decode_image(plain.data(), plain.size());
  auto near = [](const torch::Tensor& a, const torch::Tensor& b) {
    return a.sizes() == b.sizes() && (a.to(torch::kInt) - b.to(torch::kInt)).abs().max().item<int>() <= 8;
  };
  // what each orientation shows, from the stored image
  std::vector<torch::Tensor> shown = {
      stored,                                  // 1
      stored.flip({1}),                        // 2 mirrored
      stored.flip({0, 1}),                     // 3 half turn
      stored.flip({0}),                        // 4 flipped
      stored.transpose(0, 1),                  // 5 transposed
      stored.flip({0}).transpose(0, 1),        // 6 clockwise
      stored.flip({0, 1}).transpose(0, 1),     // 7 transverse
      stored.flip({1}).transpose(0, 1)};       // 8 anticlockwise
  for (int o = 1; o <= 8; ++o)
    for (bool be : {true, false}) {
      const std::string j = with_exif_orientation(plain, o, be);
      const auto d = decode_image(j.data(), j.size());
      EXPECT_TRUE(near(d, shown[o - 1])) << "orientation " << o << (be ? " MM" : " II");
      const auto [w, h] = decode_image_size(j.data(), j.size());
      EXPECT_EQ(w, d.size(1)) << o;
      EXPECT_EQ(h, d.size(0)) << o;
      EXPECT_EQ(check_image(j.data(), j.size()).width, d.size(1)) << o;
    }
  // a clockwise turn: the stored bottom-left (red) is shown top left
  const std::string cw = with_exif_orientation(plain, 6, true);
  const auto d = decode_image(cw.data(), cw.size());
  EXPECT_GT(d[2][2][0].item<int>(), 230);
  EXPECT_LT(d[2][2][2].item<int>(), 30);
  // malformed Exif (cut short, a bad value, a bad byte order): the image as stored, no error
  std::string cut = with_exif_orientation(plain, 6, true);
  cut[13] = 'X';  // byte order "XM"
  EXPECT_TRUE(near(decode_image(cut.data(), cut.size()), stored));
  const std::string bad = with_exif_orientation(plain, 9, false);
  EXPECT_TRUE(near(decode_image(bad.data(), bad.size()), stored));
  std::string short_ifd = with_exif_orientation(plain, 6, false);
  short_ifd[4] = 0;
  short_ifd[5] = 16;  // the APP1 segment ends inside the TIFF header
  EXPECT_NO_THROW({
    try {
      decode_image(short_ifd.data(), short_ifd.size());
    } catch (const std::runtime_error&) {  // a corrupt stream is an error, not a crash
    }
  });
}
