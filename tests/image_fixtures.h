#pragma once
// Test data made by the tests themselves: images encoded with the same libjpeg-turbo
// and libpng the decoders use (image_fixtures.cc), tar shards and .npy files
// (archive_fixtures.cc). Used by the unit tests and by batchdist_make_data, which
// writes the folders the mpirun tests, configs and benchmarks train on.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "worker/data/sources/npy.h"

namespace batchdist::testing {

/// A learnable w x h RGB picture for class `cls`: a coarse class-specific colour
/// pattern plus seeded noise (HWC, 3 bytes per pixel).
std::vector<uint8_t> patternRgb(int w, int h, int cls, uint64_t seed);

/// JPEG of `pixels` (HWC with `components` = 1 gray, 3 RGB, 4 CMYK (stored
/// Adobe-inverted, as Photoshop writes it)).
std::string encodeJpeg(const uint8_t* pixels, int w, int h, int components, int quality = 90,
                       bool progressive = false);

enum class PngKind { kRgb8, kRgba8, kGray8, kGrayAlpha8, kPalette8, kRgb16 };
/// PNG of the RGB `pixels` (HWC, 3 bytes per pixel) stored as `kind` (gray: the
/// mean; alpha: a gradient; palette: quantised to 6x6x6 colours; 16-bit: x257).
std::string encodePng(const uint8_t* rgb, int w, int h, PngKind kind);

void writeFile(const std::string& path, const std::string& bytes);

/// A ustar archive of (member name, bytes), in order. Names over 100 bytes get a
/// GNU long-name record.
std::string makeTar(const std::vector<std::pair<std::string, std::string>>& members);

/// A version-1.0 .npy file.
std::string makeNpy(worker::NpyType type, const std::vector<int64_t>& shape,
                    const std::string& data, bool fortran_order = false);

}  // namespace batchdist::testing
