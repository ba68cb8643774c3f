#pragma once
// Note [sample seeds]: the random transform of a sample is a pure function of
// (seed, epoch, sample index): the same whichever thread makes it, however many
// threads there are, and on a run resumed mid-epoch. No LibTorch here.

#include <cstdint>

#include "worker/data/decode/image.h"

namespace batchdist::worker {

/// A small counter-based generator (splitmix64 over a mixed key): seeding costs
/// nothing, so every sample gets its own.
class SampleRng {
 public:
  SampleRng(uint64_t seed, int64_t epoch, int64_t index);
  uint64_t next();
  /// Uniform in [lo, hi).
  double uniform(double lo, double hi);

 private:
  uint64_t state_;
};

/// torchvision's RandomResizedCrop.get_params: up to 10 tries at an area fraction
/// in [scale_lo, scale_hi] and a log-uniform aspect ratio in [ratio_lo, ratio_hi],
/// then a centre crop with the ratio clamped to that range. Integer box.
CropBox randomResizedCrop(int width, int height, double scale_lo, double scale_hi,
                          double ratio_lo, double ratio_hi, SampleRng& rng);

/// The box of the source that "resize the shorter side to `resize`, then centre
/// crop size x size" keeps (the eval transform), in source pixels.
CropBox resizeCenterCrop(int width, int height, int resize, int size);

}  // namespace batchdist::worker
