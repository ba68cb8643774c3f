#pragma once
// Shared by image.cc, jpeg.cc and png.cc only (not part of the decode contract).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/data/decode/image.h"

namespace batchdist::worker::decode_internal {

/// A box of whole pixels: [x, x + w) x [y, y + h), w, h >= 1.
struct PixelBox {
  int x = 0, y = 0, w = 0, h = 0;
};

/// Checks the chooser's box (finite, w and h > 0; DecodeError otherwise) and
/// clamps it to [0, width] x [0, height].
CropBox checkedBox(const CropBox& box, int width, int height);

/// `box` (source pixels, possibly fractional) times `scale` (the DCT scale) and
/// rounded to whole pixels of a `width` x `height` image, at least 1 x 1.
PixelBox roundBox(const CropBox& box, double scale, int width, int height);

/// The JPEG's DCT scale N/8 for `box` resampled to out_w x out_h: the smallest N
/// in 1, 2, 4 at which the scaled box still covers the output (so the resampling
/// after it never enlarges what the IDCT shrank), else 8 (Note [eighths]).
int jpegScaleEighths(const CropBox& box, int out_w, int out_h);

/// Resamples the w x h RGB region at `src` (`stride` bytes per row) to out_w x
/// out_h straight into `out` (antialiased when shrinking: Note [area then
/// bilinear] in image.cc; bilinear when enlarging), then mirrors it left-right
/// when `flip`. `tmp` holds the intermediate of a shrink by 2 or more.
void resampleInto(const uint8_t* src, int w, int h, std::size_t stride, int out_w, int out_h,
                  bool flip, uint8_t* out, std::vector<uint8_t>* tmp);

/// Mirrors each of the h rows of w RGB pixels at `rgb` left-right, in place
/// (`tmp`: a row's copy).
void mirrorRows(uint8_t* rgb, int w, int h, std::vector<uint8_t>* tmp);

/// Throws DecodeError unless width * height is within (0, kMaxImagePixels].
void checkPixels(const char* format, int64_t width, int64_t height);

void jpegCropResize(const uint8_t* data, std::size_t size, const BoxChooser& choose, int out_w,
                    int out_h, bool flip, uint8_t* out, DecodeScratch* scratch,
                    DecodeTimes* times);
void pngCropResize(const uint8_t* data, std::size_t size, const BoxChooser& choose, int out_w,
                   int out_h, bool flip, uint8_t* out, DecodeScratch* scratch,
                   DecodeTimes* times);
void jpegFull(const uint8_t* data, std::size_t size, std::vector<uint8_t>* rgb, int* width,
              int* height);
void pngFull(const uint8_t* data, std::size_t size, std::vector<uint8_t>* rgb, int* width,
             int* height);

using Clock = std::chrono::steady_clock;
inline double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// Grows `v` to at least `n` bytes without shrinking it (scratch reuse).
inline void ensureSize(std::vector<uint8_t>* v, std::size_t n) {
  if (v->size() < n) v->resize(n);
}

}  // namespace batchdist::worker::decode_internal
