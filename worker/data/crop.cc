// Crop boxes of the train and eval transforms (Note [sample seeds] in crop.h).
#include "worker/data/crop.h"

#include <algorithm>
#include <cmath>

namespace batchdist::worker {

namespace {

/// splitmix64's finaliser: a bijection of 64-bit words with good avalanche.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

/// Python's round() (half to even) of a double, as torchvision's int(round(x)).
int roundHalfEven(double x) { return static_cast<int>(std::nearbyint(x)); }

}  // namespace

SampleRng::SampleRng(uint64_t seed, int64_t epoch, int64_t index) {
  // Chained (not xor-ed side by side), so (epoch, index) = (1, 2) and (2, 1)
  // differ; each step is a bijection, so distinct indices give distinct states.
  uint64_t h = mix64(seed + kGolden);
  h = mix64(h ^ (static_cast<uint64_t>(epoch) + 0x632be59bd9b4e019ULL));
  h = mix64(h ^ (static_cast<uint64_t>(index) + 0x85157af5ULL));
  state_ = h;
}

uint64_t SampleRng::next() {
  state_ += kGolden;
  return mix64(state_);
}

double SampleRng::uniform(double lo, double hi) {
  const double u = static_cast<double>(next() >> 11) * 0x1.0p-53;  // [0, 1)
  return lo + (hi - lo) * u;
}

namespace {
/// Uniform integer in [0, n), n >= 1 (torch.randint(0, n)).
int randint(SampleRng& rng, int n) {
  const int v = static_cast<int>(rng.uniform(0.0, static_cast<double>(n)));
  return std::min(v, n - 1);
}
}  // namespace

CropBox randomResizedCrop(int width, int height, double scale_lo, double scale_hi,
                          double ratio_lo, double ratio_hi, SampleRng& rng) {
  const double area = static_cast<double>(width) * height;
  const double log_lo = std::log(ratio_lo);
  const double log_hi = std::log(ratio_hi);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.uniform(scale_lo, scale_hi);
    const double aspect = std::exp(rng.uniform(log_lo, log_hi));
    const int w = roundHalfEven(std::sqrt(target_area * aspect));
    const int h = roundHalfEven(std::sqrt(target_area / aspect));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int i = randint(rng, height - h + 1);
      const int j = randint(rng, width - w + 1);
      return CropBox{static_cast<double>(j), static_cast<double>(i), static_cast<double>(w),
                     static_cast<double>(h)};
    }
  }
  // Fallback: a centre crop with the aspect ratio clamped to [min, max].
  const double in_ratio = static_cast<double>(width) / height;
  const double rmin = std::min(ratio_lo, ratio_hi);
  const double rmax = std::max(ratio_lo, ratio_hi);
  int w = width, h = height;
  if (in_ratio < rmin) {
    w = width;
    h = std::clamp(roundHalfEven(w / rmin), 1, height);
  } else if (in_ratio > rmax) {
    h = height;
    w = std::clamp(roundHalfEven(h * rmax), 1, width);
  }
  const int i = (height - h) / 2;
  const int j = (width - w) / 2;
  return CropBox{static_cast<double>(j), static_cast<double>(i), static_cast<double>(w),
                 static_cast<double>(h)};
}

CropBox resizeCenterCrop(int width, int height, int resize, int size) {
  const double scale = static_cast<double>(resize) / std::min(width, height);
  const double side = size / scale;
  CropBox b;
  b.w = std::min(side, static_cast<double>(width));
  b.h = std::min(side, static_cast<double>(height));
  b.x = (width - b.w) / 2;
  b.y = (height - b.h) / 2;
  return b;
}

}  // namespace batchdist::worker
