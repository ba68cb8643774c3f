// Images for the tests, encoded with the libjpeg-turbo and libpng the decoders use.
#include "tests/image_fixtures.h"

#include <jpeglib.h>
#include <png.h>

#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

namespace batchdist::testing {

namespace {
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
uint8_t clamp8(double v) { return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v + 0.5); }
}  // namespace

std::vector<uint8_t> patternRgb(int w, int h, int cls, uint64_t seed) {
  // Per class: a base colour and a few low-frequency waves (coarse enough to
  // survive a downscale to 8 x 8, so a small CNN can tell classes apart), plus
  // +-12 levels of per-pixel noise.
  const uint64_t c = mix64(0x5eedULL + static_cast<uint64_t>(cls));
  const double base[3] = {static_cast<double>(40 + (c & 0xff) % 176),
                          static_cast<double>(40 + ((c >> 8) & 0xff) % 176),
                          static_cast<double>(40 + ((c >> 16) & 0xff) % 176)};
  const double fx = 1 + (c >> 24) % 3, fy = 1 + (c >> 28) % 3;
  const double phase = ((c >> 32) & 0xff) / 40.0;
  std::vector<uint8_t> px(static_cast<std::size_t>(w) * h * 3);
  uint64_t s = mix64(seed ^ (c << 1));
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const double u = static_cast<double>(x) / w, v = static_cast<double>(y) / h;
      const double a = std::sin(2 * M_PI * fx * u + phase);
      const double b = std::cos(2 * M_PI * fy * v + phase);
      const double wave[3] = {50 * a, 50 * b, 35 * (a * b) + 25 * (u - v)};
      for (int k = 0; k < 3; ++k) {
        s = mix64(s + 0x9e3779b97f4a7c15ULL);
        const double noise = static_cast<double>(s % 25) - 12;
        px[(static_cast<std::size_t>(y) * w + x) * 3 + k] = clamp8(base[k] + wave[k] + noise);
      }
    }
  }
  return px;
}

namespace {
struct JpegErr {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
};
[[noreturn]] void jpegErrorExit(j_common_ptr cinfo) {
  std::longjmp(reinterpret_cast<JpegErr*>(cinfo->err)->jump, 1);
}

bool compressJpeg(jpeg_compress_struct* cinfo, JpegErr* err, const uint8_t* pixels, int w, int h,
                  int components, int quality, bool progressive, unsigned char** buf,
                  unsigned long* len) {
  if (setjmp(err->jump)) return false;
  jpeg_create_compress(cinfo);
  jpeg_mem_dest(cinfo, buf, len);
  cinfo->image_width = static_cast<JDIMENSION>(w);
  cinfo->image_height = static_cast<JDIMENSION>(h);
  cinfo->input_components = components;
  cinfo->in_color_space = components == 1 ? JCS_GRAYSCALE : components == 3 ? JCS_RGB : JCS_CMYK;
  jpeg_set_defaults(cinfo);  // CMYK: stored as CMYK with an Adobe marker
  jpeg_set_quality(cinfo, quality, TRUE);
  if (progressive) jpeg_simple_progression(cinfo);
  jpeg_start_compress(cinfo, TRUE);
  std::vector<uint8_t> row(static_cast<std::size_t>(w) * components);
  while (cinfo->next_scanline < cinfo->image_height) {
    const uint8_t* src =
        pixels + static_cast<std::size_t>(cinfo->next_scanline) * w * components;
    for (std::size_t i = 0; i < row.size(); ++i) {
      // Photoshop's Adobe CMYK JPEGs store the inks inverted (255 = no ink).
      row[i] = components == 4 ? static_cast<uint8_t>(255 - src[i]) : src[i];
    }
    JSAMPROW r = row.data();
    jpeg_write_scanlines(cinfo, &r, 1);
  }
  jpeg_finish_compress(cinfo);
  return true;
}
}  // namespace

std::string encodeJpeg(const uint8_t* pixels, int w, int h, int components, int quality,
                       bool progressive) {
  if (components != 1 && components != 3 && components != 4) {
    throw std::invalid_argument("encodeJpeg: components must be 1, 3 or 4");
  }
  jpeg_compress_struct cinfo{};
  JpegErr err{};
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = jpegErrorExit;
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  const bool ok =
      compressJpeg(&cinfo, &err, pixels, w, h, components, quality, progressive, &buf, &len);
  jpeg_destroy_compress(&cinfo);
  std::string out;
  if (ok) out.assign(reinterpret_cast<const char*>(buf), len);
  std::free(buf);
  if (!ok) throw std::runtime_error("encodeJpeg: libjpeg failed");
  return out;
}

namespace {
void pngWrite(png_structp png, png_bytep data, png_size_t len) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<const char*>(data), len);
}
void pngFlush(png_structp) {}

bool writePng(png_structp png, png_infop info, std::string* out, int w, int h, int color_type,
              int depth, const std::vector<png_color>& palette,
              const std::vector<std::vector<uint8_t>>& rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_write_fn(png, out, pngWrite, pngFlush);
  png_set_IHDR(png, info, static_cast<png_uint_32>(w), static_cast<png_uint_32>(h), depth,
               color_type, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (!palette.empty()) {
    png_set_PLTE(png, info, palette.data(), static_cast<int>(palette.size()));
  }
  png_write_info(png, info);
  for (const auto& r : rows) png_write_row(png, r.data());
  png_write_end(png, info);
  return true;
}
}  // namespace

std::string encodePng(const uint8_t* rgb, int w, int h, PngKind kind) {
  int color_type = PNG_COLOR_TYPE_RGB, depth = 8, channels = 3;
  switch (kind) {
    case PngKind::kRgb8: break;
    case PngKind::kRgba8: color_type = PNG_COLOR_TYPE_RGB_ALPHA; channels = 4; break;
    case PngKind::kGray8: color_type = PNG_COLOR_TYPE_GRAY; channels = 1; break;
    case PngKind::kGrayAlpha8: color_type = PNG_COLOR_TYPE_GRAY_ALPHA; channels = 2; break;
    case PngKind::kPalette8: color_type = PNG_COLOR_TYPE_PALETTE; channels = 1; break;
    case PngKind::kRgb16: depth = 16; break;
  }
  std::vector<png_color> palette;
  if (kind == PngKind::kPalette8) {
    for (int i = 0; i < 216; ++i) {
      palette.push_back(png_color{static_cast<png_byte>(i / 36 * 51),
                                  static_cast<png_byte>(i / 6 % 6 * 51),
                                  static_cast<png_byte>(i % 6 * 51)});
    }
  }
  std::vector<std::vector<uint8_t>> rows(h);
  for (int y = 0; y < h; ++y) {
    auto& row = rows[y];
    row.resize(static_cast<std::size_t>(w) * channels * depth / 8);
    for (int x = 0; x < w; ++x) {
      const uint8_t* p = rgb + (static_cast<std::size_t>(y) * w + x) * 3;
      const uint8_t gray = static_cast<uint8_t>((p[0] + p[1] + p[2] + 1) / 3);
      const uint8_t alpha = static_cast<uint8_t>(w > 1 ? 255 * x / (w - 1) : 255);
      uint8_t* o = row.data() + static_cast<std::size_t>(x) * channels * depth / 8;
      switch (kind) {
        case PngKind::kRgb8: o[0] = p[0]; o[1] = p[1]; o[2] = p[2]; break;
        case PngKind::kRgba8: o[0] = p[0]; o[1] = p[1]; o[2] = p[2]; o[3] = alpha; break;
        case PngKind::kGray8: o[0] = gray; break;
        case PngKind::kGrayAlpha8: o[0] = gray; o[1] = alpha; break;
        case PngKind::kPalette8:
          o[0] = static_cast<uint8_t>((p[0] + 25) / 51 * 36 + (p[1] + 25) / 51 * 6 +
                                      (p[2] + 25) / 51);
          break;
        case PngKind::kRgb16:
          for (int k = 0; k < 3; ++k) {  // big-endian, x257
            o[2 * k] = p[k];
            o[2 * k + 1] = p[k];
          }
          break;
      }
    }
  }
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  std::string out;
  const bool ok = png && info && writePng(png, info, &out, w, h, color_type, depth, palette, rows);
  png_destroy_write_struct(&png, &info);
  if (!ok) throw std::runtime_error("encodePng: libpng failed");
  return out;
}

void writeFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) throw std::runtime_error("writeFile: cannot write " + path);
}

}  // namespace batchdist::testing
