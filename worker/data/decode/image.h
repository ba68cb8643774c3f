#pragma once
// Note [decode less]: bytes of one encoded image -> one 3-channel uint8 HWC sample
// of a fixed size, in a single call that decodes as few pixels as it can. For a
// JPEG the crop box picks a DCT scale (1/2, 1/4, 1/8 when the box is shrunk at
// least that much) and only the box's window is run through the inverse DCT
// (libjpeg's jpeg_crop_scanline / jpeg_skip_scanlines): a random-resized crop
// covers about half of an image on average. The box is then resampled straight
// into the caller's slot (OpenCV's imgproc: area filter when shrinking, so it is
// antialiased; bilinear when enlarging) and flipped there.
// No LibTorch here: the readers, the fuzzer and the benchmarks share this code.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/error.h"

namespace batchdist::worker {

/// An image that cannot be decoded; what() says why (the caller adds the file).
class DecodeError : public Error {
 public:
  using Error::Error;
};

enum class ImageFormat { kJpeg, kPng, kUnknown };

/// The format from the first bytes (magic numbers, not the file name).
ImageFormat sniffImageFormat(const uint8_t* data, std::size_t size);

/// A box in the source image's pixel coordinates (x, y: top-left; w, h > 0),
/// within [0, width] x [0, height].
struct CropBox {
  double x = 0, y = 0, w = 0, h = 0;
};

/// Chooses the box once the image's width and height are known (from its header).
using BoxChooser = std::function<CropBox(int width, int height)>;

/// Seconds spent in each part of one decodeCropResize call.
struct DecodeTimes {
  double decode = 0;     ///< entropy decoding, IDCT, colour conversion (PNG: inflate)
  double transform = 0;  ///< resampling and flip
  int64_t decoded_pixels = 0;  ///< pixels the decoder produced (after DCT scaling and windowing)
};

/// Reusable buffers of one thread (no allocation per sample once warm).
struct DecodeScratch {
  std::vector<uint8_t> rgb;
  std::vector<uint8_t> row;
};

/// Decodes `box` (chosen by `choose` from the image's size) of the JPEG or PNG in
/// `data`, resamples it to out_w x out_h and writes 3-channel uint8 HWC rows to
/// `out` (out_w * 3 bytes per row), mirrored left-right when `flip`. Grayscale,
/// CMYK/YCCK, palette, 16-bit and alpha images all become RGB (alpha dropped, as
/// PIL's convert("RGB")). Throws DecodeError on anything it cannot decode
/// (truncated, corrupt, empty, not an image, over kMaxImagePixels); never reads
/// outside `data`.
void decodeCropResize(const uint8_t* data, std::size_t size, const BoxChooser& choose, int out_w,
                      int out_h, bool flip, uint8_t* out, DecodeScratch* scratch,
                      DecodeTimes* times = nullptr);

/// Decodes every pixel to RGB HWC (the benchmarks' decode-only baseline).
void decodeFull(const uint8_t* data, std::size_t size, std::vector<uint8_t>* rgb, int* width,
                int* height);

/// Images larger than this many pixels are refused (a hostile header must not
/// make a rank allocate gigabytes).
constexpr int64_t kMaxImagePixels = int64_t{1} << 28;

}  // namespace batchdist::worker
