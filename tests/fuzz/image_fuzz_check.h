#pragma once
// The contract the image decoders are fuzzed against, shared by the libFuzzer
// target (tests/fuzz/image_fuzzer.cc) and the seeded mutation test that always
// runs in ctest (tests/data_fuzz_test.cc): for ANY bytes, decodeCropResize writes
// an out_w x out_h RGB sample or throws DecodeError (Note [decode less]). Any
// other exception, a crash, a hang, a write outside the output, or a box chooser
// called with a size the header check should have refused is a bug.
//
// A mode byte (the libFuzzer target: the input's last byte) picks how it is asked:
//   bits 0-1  the crop box: whole image, centre half, spilling over the
//             bottom-right edge, small (decoded at DCT scale 1 or 1/2)
//   bit 2     the output size: 32 x 32 or 7 x 7 (when bits 4-5 are 0)
//   bit 3     flip
//   bits 4-5  1: a 1 x 1 output, 2: 224 x 160 (enlarging), 3: 61 x 13
//   bits 6-7  1: a box wholly outside the image (clamped to its edge), 2: a box
//             spilling over the top-left, 3: a NaN box (must be DecodeError)
// Bits 4-7 are 0 for the behaviour the target had before they existed.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <typeinfo>
#include <vector>

#include "worker/data/decode/image.h"

namespace batchdist::fuzz {

inline void imageOutSize(uint8_t mode, int* w, int* h) {
  switch ((mode >> 4) & 3) {
    case 0: *w = *h = (mode & 4) ? 32 : 7; return;
    case 1: *w = *h = 1; return;
    case 2: *w = 224, *h = 160; return;
    default: *w = 61, *h = 13; return;
  }
}

inline worker::CropBox imageBox(uint8_t mode, int w, int h) {
  using worker::CropBox;
  switch ((mode >> 6) & 3) {
    case 1: return CropBox{w + 5.0, h * 0.5, 3, 3};                       // outside: clamped
    case 2: return CropBox{-w * 0.5, -3.0, w * 0.75, h + 6.0};             // spills top-left
    case 3: return CropBox{std::nan(""), 0, double(w), double(h)};         // not a box
    default: break;
  }
  switch (mode & 3) {
    case 0: return CropBox{0, 0, double(w), double(h)};                    // whole image
    case 1: return CropBox{w / 4.0, h / 4.0, w / 2.0, h / 2.0};              // centre half
    case 2: return CropBox{w * 0.7, h * 0.8, w * 0.3 + 1, h * 0.2 + 1};      // bottom-right, spills over
    default: return CropBox{1, 1, w / 9.0 + 1, h / 9.0 + 1};                 // small: scale 1
  }
}

/// Whether the mode asks for a box that is never valid (DecodeError expected).
inline bool imageModeRefusesAlways(uint8_t mode) { return ((mode >> 6) & 3) == 3; }

/// "" when decodeCropResize(data, size) in `mode` kept the contract, otherwise
/// what it did. `*decoded` (if given): whether it returned a sample; `pixels` (if
/// given) receives it.
inline std::string checkImage(const uint8_t* data, std::size_t size, uint8_t mode,
                              worker::DecodeScratch* scratch, bool* decoded = nullptr,
                              std::vector<uint8_t>* pixels = nullptr) {
  if (decoded) *decoded = false;
  int out_w = 0, out_h = 0;
  imageOutSize(mode, &out_w, &out_h);
  // Guard bytes on both sides of the output: no ASan in the ctest build.
  constexpr std::size_t kGuard = 64;
  constexpr uint8_t kFill = 0xA5;
  const std::size_t n = static_cast<std::size_t>(out_w) * out_h * 3;
  std::vector<uint8_t> buf(n + 2 * kGuard, kFill);
  std::string chooser_problem;
  int calls = 0;
  const auto choose = [&](int w, int h) {
    ++calls;
    if (w <= 0 || h <= 0 || int64_t{w} * h > worker::kMaxImagePixels) {
      chooser_problem = "the box chooser was called for a " + std::to_string(w) + "x" +
                        std::to_string(h) + " image (the header check should refuse it)";
    }
    return imageBox(mode, w, h);
  };
  bool ok = false;
  try {
    worker::decodeCropResize(data, size, choose, out_w, out_h, (mode & 8) != 0,
                             buf.data() + kGuard, scratch);
    ok = true;
  } catch (const worker::DecodeError& e) {
    if (std::strlen(e.what()) == 0) return "DecodeError without a message";
  } catch (const std::exception& e) {
    return std::string("threw ") + typeid(e).name() + " (not DecodeError): " + e.what();
  } catch (...) {
    return "threw a non-std exception";
  }
  if (!chooser_problem.empty()) return chooser_problem;
  if (calls > 1) return "the box chooser was called " + std::to_string(calls) + " times";
  for (std::size_t i = 0; i < kGuard; ++i) {
    if (buf[i] != kFill || buf[kGuard + n + i] != kFill) {
      return "wrote outside the " + std::to_string(out_w) + "x" + std::to_string(out_h) +
             " output";
    }
  }
  if (ok && imageModeRefusesAlways(mode)) return "decoded with a NaN crop box";
  if (ok && calls != 1) return "decoded without asking for the box";
  if (decoded) *decoded = ok;
  if (ok && pixels) pixels->assign(buf.begin() + kGuard, buf.begin() + kGuard + n);
  return "";
}

}  // namespace batchdist::fuzz
