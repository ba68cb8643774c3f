// Format sniffing, dispatch and the resampling shared by the JPEG and PNG
// decoders (Note [decode less] in image.h).
#include "worker/data/decode/image.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <opencv2/imgproc.hpp>
#include <string>

#include "worker/data/decode/internal.h"

namespace batchdist::worker {

namespace {

constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

/// The first bytes of an unknown file, printable: "GIF89a" or "00 01 ff ..".
std::string describeStart(const uint8_t* data, std::size_t size) {
  if (size == 0) return "it is empty";
  const std::size_t n = std::min<std::size_t>(size, 8);
  bool printable = true;
  for (std::size_t i = 0; i < n; ++i) {
    if (data[i] < 0x20 || data[i] > 0x7e) printable = false;
  }
  std::string s = "starts with ";
  if (printable) {
    s += '"';
    s.append(reinterpret_cast<const char*>(data), n);
    s += size > n ? "...\"" : "\"";
    return s;
  }
  static const char kHex[] = "0123456789abcdef";
  for (std::size_t i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += kHex[data[i] >> 4];
    s += kHex[data[i] & 15];
  }
  if (size > n) s += " ...";
  return s;
}

}  // namespace

ImageFormat sniffImageFormat(const uint8_t* data, std::size_t size) {
  if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) return ImageFormat::kJpeg;
  if (size >= 8 && std::memcmp(data, kPngSignature, 8) == 0) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

void decodeCropResize(const uint8_t* data, std::size_t size, const BoxChooser& choose, int out_w,
                      int out_h, bool flip, uint8_t* out, DecodeScratch* scratch,
                      DecodeTimes* times) {
  if (out_w <= 0 || out_h <= 0) {
    throw DecodeError("decodeCropResize: output size " + std::to_string(out_w) + "x" +
                      std::to_string(out_h) + " is not positive");
  }
  switch (sniffImageFormat(data, size)) {
    case ImageFormat::kJpeg:
      decode_internal::jpegCropResize(data, size, choose, out_w, out_h, flip, out, scratch, times);
      return;
    case ImageFormat::kPng:
      decode_internal::pngCropResize(data, size, choose, out_w, out_h, flip, out, scratch, times);
      return;
    case ImageFormat::kUnknown:
      break;
  }
  throw DecodeError("not a JPEG or PNG image (" + describeStart(data, size) + ")");
}

void decodeFull(const uint8_t* data, std::size_t size, std::vector<uint8_t>* rgb, int* width,
                int* height) {
  switch (sniffImageFormat(data, size)) {
    case ImageFormat::kJpeg:
      decode_internal::jpegFull(data, size, rgb, width, height);
      return;
    case ImageFormat::kPng:
      decode_internal::pngFull(data, size, rgb, width, height);
      return;
    case ImageFormat::kUnknown:
      break;
  }
  throw DecodeError("not a JPEG or PNG image (" + describeStart(data, size) + ")");
}

namespace decode_internal {

void checkPixels(const char* format, int64_t width, int64_t height) {
  if (width <= 0 || height <= 0) {
    throw DecodeError(std::string(format) + " header says the image is " + std::to_string(width) +
                      "x" + std::to_string(height));
  }
  if (width * height > kMaxImagePixels) {
    throw DecodeError(std::string(format) + " image is " + std::to_string(width) + "x" +
                      std::to_string(height) + " pixels, over the limit of " +
                      std::to_string(kMaxImagePixels) + " (kMaxImagePixels)");
  }
}

CropBox checkedBox(const CropBox& box, int width, int height) {
  if (!std::isfinite(box.x) || !std::isfinite(box.y) || !std::isfinite(box.w) ||
      !std::isfinite(box.h) || box.w <= 0 || box.h <= 0) {
    throw DecodeError("crop box (x " + std::to_string(box.x) + ", y " + std::to_string(box.y) +
                      ", w " + std::to_string(box.w) + ", h " + std::to_string(box.h) +
                      ") is not a box");
  }
  CropBox b;
  b.x = std::clamp(box.x, 0.0, static_cast<double>(width));
  b.y = std::clamp(box.y, 0.0, static_cast<double>(height));
  b.w = std::clamp(box.x + box.w, 0.0, static_cast<double>(width)) - b.x;
  b.h = std::clamp(box.y + box.h, 0.0, static_cast<double>(height)) - b.y;
  return b;
}

namespace {
// [lo, hi) of whole pixels for [a, a + len) * scale within [0, n), at least 1 wide.
void roundSpan(double a, double len, double scale, int n, int* lo, int* count) {
  int x0 = static_cast<int>(std::lround(a * scale));
  int x1 = static_cast<int>(std::lround((a + len) * scale));
  x0 = std::clamp(x0, 0, n - 1);
  x1 = std::clamp(x1, x0 + 1, n);
  *lo = x0;
  *count = x1 - x0;
}
}  // namespace

PixelBox roundBox(const CropBox& box, double scale, int width, int height) {
  PixelBox p;
  roundSpan(box.x, box.w, scale, width, &p.x, &p.w);
  roundSpan(box.y, box.h, scale, height, &p.y, &p.h);
  return p;
}

int jpegScaleEighths(const CropBox& box, int out_w, int out_h) {
  // Note [eighths]: powers of two only. libjpeg-turbo also scales by 3/8, 5/8,
  // 6/8 and 7/8, but those IDCTs (and the chroma's 6x6 .. 14x14 that replace
  // upsampling) are plain C, while 8x8, 4x4 and 2x2 are SIMD: on 300-600 px
  // photos, RandomResizedCrop(224) decoded 1/3 fewer pixels with N/8 but took
  // 25% longer to decode (the resampling after it saved less than that).
  for (int n = 1; n < 8; n *= 2) {
    if (box.w * n >= 8.0 * out_w && box.h * n >= 8.0 * out_h) return n;
  }
  return 8;
}

void resampleInto(const uint8_t* src, int w, int h, std::size_t stride, int out_w, int out_h,
                  bool flip, uint8_t* out, std::vector<uint8_t>* tmp) {
  // Note [area then bilinear]: OpenCV 4.6's INTER_AREA is fast only for integer
  // factors (448 -> 224: 70 us) and 10-30x slower otherwise (480 -> 224: 1.5 ms,
  // 1000 -> 224: 5 ms). So a shrink by f >= 2 is an exact k-fold box average
  // (k = floor(f), the box trimmed to a multiple of k, centred: under k source
  // pixels, less than one output pixel) followed by bilinear for the rest (f / k < 2,
  // where bilinear's two taps still see every source pixel). The JPEG path has
  // mostly done the k-fold part already, in the IDCT (Note [decode less]).
  cv::Mat in(h, w, CV_8UC3, const_cast<uint8_t*>(src), stride);
  cv::Mat dst(out_h, out_w, CV_8UC3, out);
  const int kx = std::max(1, w / out_w);
  const int ky = std::max(1, h / out_h);
  cv::Mat mid = in;
  if (kx > 1 || ky > 1) {
    const int mw = w / kx, mh = h / ky;
    ensureSize(tmp, static_cast<std::size_t>(mw) * mh * 3);
    mid = cv::Mat(mh, mw, CV_8UC3, tmp->data());
    const cv::Rect kept((w - mw * kx) / 2, (h - mh * ky) / 2, mw * kx, mh * ky);  // centred
    cv::resize(in(kept), mid, mid.size(), 0, 0, cv::INTER_AREA);
  }
  if (mid.cols == out_w && mid.rows == out_h) {
    mid.copyTo(dst);
  } else {
    cv::resize(mid, dst, dst.size(), 0, 0, cv::INTER_LINEAR);
  }
  if (dst.data != out) throw DecodeError("internal: cv::resize reallocated the output");
  if (flip) mirrorRows(out, out_w, out_h, tmp);
}

void mirrorRows(uint8_t* rgb, int w, int h, std::vector<uint8_t>* tmp) {
  // Each row is copied aside, then written back pixel by pixel from its end with
  // 4-byte moves (the 4th byte lands on the next pixel, written right after; the
  // last pixel takes 3): 10x faster than swapping bytes in place (25 vs 270 us at
  // 224 x 224), which the compiler cannot vectorise for fear of aliasing.
  if (w < 2) return;
  const std::size_t row = static_cast<std::size_t>(w) * 3;
  ensureSize(tmp, row + 1);  // + 1: the first 4-byte read of the last pixel
  uint8_t* t = tmp->data();
  for (int y = 0; y < h; ++y) {
    uint8_t* dst = rgb + static_cast<std::size_t>(y) * row;
    std::memcpy(t, dst, row);
    const uint8_t* src = t + row - 3;
    for (int x = 0; x < w - 1; ++x, dst += 3, src -= 3) {
      uint32_t v;
      std::memcpy(&v, src, 4);
      std::memcpy(dst, &v, 4);
    }
    std::memcpy(dst, t, 3);
  }
}

}  // namespace decode_internal

}  // namespace batchdist::worker
