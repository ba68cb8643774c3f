// libFuzzer target for the image decoders (Note [decode less]): for any bytes,
// decodeCropResize writes a 32 x 32 RGB sample or throws DecodeError; a crash, a
// sanitizer report, another exception or a hang is a bug. The first byte picks the
// crop box (so windowed, DCT-scaled and full decodes are all reached) and the flip.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/data/decode/image.h"

using batchdist::worker::CropBox;
using batchdist::worker::DecodeError;
using batchdist::worker::DecodeScratch;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static DecodeScratch scratch;
  const uint8_t mode = size > 0 ? data[size - 1] : 0;  // the tail is entropy data or junk
  auto choose = [mode](int w, int h) {
    switch (mode & 3) {
      case 0: return CropBox{0, 0, double(w), double(h)};                   // whole image
      case 1: return CropBox{w / 4.0, h / 4.0, w / 2.0, h / 2.0};             // centre half
      case 2: return CropBox{w * 0.7, h * 0.8, w * 0.3 + 1, h * 0.2 + 1};     // bottom-right, spills over
      default: return CropBox{1, 1, w / 9.0 + 1, h / 9.0 + 1};                // small: scale 1
    }
  };
  const int out = (mode & 4) ? 32 : 7;
  std::vector<uint8_t> pixels(static_cast<size_t>(out) * out * 3);
  try {
    batchdist::worker::decodeCropResize(data, size, choose, out, out, (mode & 8) != 0,
                                        pixels.data(), &scratch);
  } catch (const DecodeError&) {
  }
  return 0;
}
