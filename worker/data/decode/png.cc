// PNG through libpng's simplified API: the whole image is inflated to 8-bit RGBA
// (gray, gray+alpha, palette, tRNS and 16-bit all converted by libpng), then the
// box is taken with the alpha dropped (as PIL's convert("RGB"), which does not
// composite) and resampled like a JPEG's (Note [decode less] in image.h).
#include <png.h>

#include <cstring>
#include <string>

#include "worker/data/decode/internal.h"

namespace batchdist::worker::decode_internal {

namespace {

/// png_image_free on every way out (libpng's simplified API catches its own
/// longjmps; no setjmp here).
struct PngImage {
  png_image image;
  PngImage() {
    std::memset(&image, 0, sizeof image);
    image.version = PNG_IMAGE_VERSION;
  }
  ~PngImage() { png_image_free(&image); }
  PngImage(const PngImage&) = delete;
  PngImage& operator=(const PngImage&) = delete;
  [[noreturn]] void fail() const { throw DecodeError(std::string("PNG: ") + image.message); }
};

/// Reads the header of `data`, checks the size and inflates the image to RGBA
/// rows of width * 4 bytes into `rgba`. `between` runs after the header (the
/// crop box is chosen there).
template <typename Between>
void readRgba(const uint8_t* data, std::size_t size, std::vector<uint8_t>* rgba, int* width,
              int* height, Between between) {
  PngImage png;
  if (!png_image_begin_read_from_memory(&png.image, data, size)) png.fail();
  checkPixels("PNG", png.image.width, png.image.height);
  // Deflate shrinks at most ~1032:1, and no PNG row is smaller than a filter byte
  // plus its width at 1 bit: a header claiming far more than the file can hold is
  // refused before the output buffer is allocated (a 3.5 KB file must not make a
  // loader thread allocate 1 GiB).
  const double least_raw = static_cast<double>(png.image.height) * (1.0 + (png.image.width + 7) / 8);
  if (least_raw > 1032.0 * static_cast<double>(size)) {
    throw DecodeError("PNG: the header's " + std::to_string(png.image.width) + "x" +
                      std::to_string(png.image.height) + " image cannot be held in " +
                      std::to_string(size) + " bytes (truncated or corrupt)");
  }
  *width = static_cast<int>(png.image.width);
  *height = static_cast<int>(png.image.height);
  between(*width, *height);
  png.image.format = PNG_FORMAT_RGBA;
  // 16-bit samples without a gAMA/sRGB chunk are sRGB (as PIL reads them), not
  // linear: no gamma curve on the way to 8 bits.
  png.image.flags |= PNG_IMAGE_FLAG_16BIT_sRGB;
  const std::size_t stride = static_cast<std::size_t>(*width) * 4;
  ensureSize(rgba, stride * *height);
  if (!png_image_finish_read(&png.image, nullptr, rgba->data(), static_cast<png_int_32>(stride),
                             nullptr)) {
    png.fail();
  }
}

/// The box of the RGBA image (`width` * 4 bytes a row) packed as RGB at the start
/// of the same buffer (every byte moves to a lower or equal address).
void packBox(uint8_t* rgba, int width, const PixelBox& b) {
  uint8_t* dst = rgba;
  for (int y = b.y; y < b.y + b.h; ++y) {
    const uint8_t* src = rgba + (static_cast<std::size_t>(y) * width + b.x) * 4;
    for (int x = 0; x < b.w; ++x, src += 4, dst += 3) {
      dst[0] = src[0];
      dst[1] = src[1];
      dst[2] = src[2];
    }
  }
}

}  // namespace

void pngCropResize(const uint8_t* data, std::size_t size, const BoxChooser& choose, int out_w,
                   int out_h, bool flip, uint8_t* out, DecodeScratch* scratch,
                   DecodeTimes* times) {
  const Clock::time_point t0 = times ? Clock::now() : Clock::time_point();
  int width = 0, height = 0;
  PixelBox box;
  readRgba(data, size, &scratch->rgb, &width, &height, [&](int w, int h) {
    box = roundBox(checkedBox(choose(w, h), w, h), 1, w, h);
  });
  packBox(scratch->rgb.data(), width, box);
  const Clock::time_point t1 = times ? Clock::now() : Clock::time_point();
  resampleInto(scratch->rgb.data(), box.w, box.h, static_cast<std::size_t>(box.w) * 3, out_w,
               out_h, flip, out, &scratch->row);
  if (times) {
    times->decode = std::chrono::duration<double>(t1 - t0).count();
    times->transform = secondsSince(t1);
    times->decoded_pixels = static_cast<int64_t>(width) * height;
  }
}

void pngFull(const uint8_t* data, std::size_t size, std::vector<uint8_t>* rgb, int* width,
             int* height) {
  readRgba(data, size, rgb, width, height, [](int, int) {});
  packBox(rgb->data(), *width, PixelBox{0, 0, *width, *height});
  rgb->resize(static_cast<std::size_t>(*width) * *height * 3);
}

}  // namespace batchdist::worker::decode_internal
