// libFuzzer target for the image decoders (Note [decode less]): for any bytes,
// decodeCropResize writes an RGB sample or throws DecodeError; a crash, a
// sanitizer report, another exception or a hang is a bug (image_fuzz_check.h,
// shared with tests/data_fuzz_test.cc). The last byte picks the crop box (so
// windowed, DCT-scaled and full decodes are all reached), the output size and
// the flip.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "image_fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static batchdist::worker::DecodeScratch scratch;
  const uint8_t mode = size > 0 ? data[size - 1] : 0;  // the tail is entropy data or junk
  const std::string problem = batchdist::fuzz::checkImage(data, size, mode, &scratch);
  if (!problem.empty()) {
    std::fprintf(stderr, "image contract broken (mode 0x%02x): %s\n", mode, problem.c_str());
    std::abort();
  }
  return 0;
}
