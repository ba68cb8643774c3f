// The crop boxes of the train (torchvision RandomResizedCrop.get_params) and
// eval (Resize + CenterCrop) transforms, and the per-sample generator.
#include "worker/data/crop.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <tuple>
#include <vector>

namespace batchdist::worker {
namespace {

TEST(SampleRng, DeterministicPerKey) {
  SampleRng a(7, 3, 12345), b(7, 3, 12345);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.next(), b.next());
}

TEST(SampleRng, KnownFirstValues) {
  // From an independent Python port of the same splitmix64 chain.
  EXPECT_EQ(SampleRng(1, 0, 0).next(), 0x7dea798b3479444fULL);
  EXPECT_EQ(SampleRng(0, 0, 0).next(), 0x598eef50d616cf88ULL);
}

TEST(SampleRng, DiffersAcrossSeedEpochIndex) {
  std::set<uint64_t> firsts;
  int n = 0;
  for (uint64_t seed : {0ULL, 1ULL, 2ULL, 0xffffffffffffffffULL}) {
    for (int64_t epoch : {0, 1, 2, 100}) {
      for (int64_t index = 0; index < 64; ++index) {
        firsts.insert(SampleRng(seed, epoch, index).next());
        ++n;
      }
    }
  }
  EXPECT_EQ(firsts.size(), static_cast<size_t>(n));
  // Swapping epoch and index must not give the same stream.
  EXPECT_NE(SampleRng(5, 1, 2).next(), SampleRng(5, 2, 1).next());
  EXPECT_NE(SampleRng(1, 0, 0).next(), SampleRng(0, 1, 0).next());
  EXPECT_NE(SampleRng(1, 0, 0).next(), SampleRng(0, 0, 1).next());
}

TEST(SampleRng, UniformInRangeAndUnbiased) {
  SampleRng r(3, 0, 0);
  double sum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double u = r.uniform(-2.0, 6.0);
    ASSERT_GE(u, -2.0);
    ASSERT_LT(u, 6.0);
    sum += u;
  }
  EXPECT_NEAR(sum / n, 2.0, 0.03);
}

TEST(RandomResizedCrop, MatchesPythonReference) {
  // torchvision's get_params logic run in Python over the same generator
  // (round() half-to-even, randint(0, n) = int(uniform(0, n))).
  struct Case {
    int w, h;
    uint64_t seed;
    int64_t epoch, index;
    CropBox want;
  };
  const std::vector<Case> cases = {
      {500, 375, 1, 0, 0, {129, 8, 287, 348}},
      {500, 375, 1, 0, 1, {149, 41, 319, 317}},
      {500, 375, 1, 3, 7, {112, 11, 343, 351}},
      {640, 480, 42, 1, 12345, {125, 11, 413, 461}},
      {300, 900, 7, 2, 5, {46, 160, 237, 203}},
  };
  for (const Case& c : cases) {
    SampleRng rng(c.seed, c.epoch, c.index);
    const CropBox b = randomResizedCrop(c.w, c.h, 0.08, 1.0, 3.0 / 4, 4.0 / 3, rng);
    EXPECT_EQ(std::make_tuple(b.x, b.y, b.w, b.h),
              std::make_tuple(c.want.x, c.want.y, c.want.w, c.want.h))
        << c.w << "x" << c.h << " seed " << c.seed << " epoch " << c.epoch << " index " << c.index;
  }
}

TEST(RandomResizedCrop, BoxesInsideWithinScaleAndRatio) {
  const double slo = 0.08, shi = 1.0, rlo = 3.0 / 4, rhi = 4.0 / 3;
  int fallbacks = 0, total = 0;
  for (auto [w, h] : std::vector<std::pair<int, int>>{
           {500, 375}, {375, 500}, {224, 224}, {1920, 1080}, {33, 17}, {7, 9}, {4000, 30}}) {
    for (int64_t i = 0; i < 2000; ++i) {
      SampleRng rng(11, 0, i);
      const CropBox b = randomResizedCrop(w, h, slo, shi, rlo, rhi, rng);
      ++total;
      ASSERT_EQ(b.x, std::floor(b.x));
      ASSERT_EQ(b.w, std::floor(b.w));
      ASSERT_GE(b.x, 0);
      ASSERT_GE(b.y, 0);
      ASSERT_GT(b.w, 0);
      ASSERT_GT(b.h, 0);
      ASSERT_LE(b.x + b.w, w);
      ASSERT_LE(b.y + b.h, h);
      const bool centred = b.x == (w - static_cast<int>(b.w)) / 2 &&
                           b.y == (h - static_cast<int>(b.h)) / 2;
      const bool fallback_shape = (b.w == w || b.h == h);
      // w, h are rounded: the exact area and ratio lie within half a pixel.
      const double area_hi = (b.w + 0.5) * (b.h + 0.5) / (double(w) * h);
      const double area_lo = (b.w - 0.5) * (b.h - 0.5) / (double(w) * h);
      const double ratio_hi = (b.w + 0.5) / (b.h - 0.5), ratio_lo = (b.w - 0.5) / (b.h + 0.5);
      const bool in_scale = area_hi >= slo && area_lo <= shi;
      const bool in_ratio = ratio_hi >= rlo && ratio_lo <= rhi;
      if (!(in_scale && in_ratio)) {
        ++fallbacks;
        ASSERT_TRUE(centred && fallback_shape)
            << w << "x" << h << " index " << i << ": box " << b.x << "," << b.y << " " << b.w
            << "x" << b.h << " is outside scale/ratio and not the fallback";
      }
    }
  }
  EXPECT_LT(fallbacks, total / 5);  // only the 4000x30 image falls back often
}

TEST(RandomResizedCrop, FallbackForExtremeAspect) {
  for (int64_t i = 0; i < 50; ++i) {
    SampleRng r1(1, 0, i), r2(1, 0, i);
    // 1000x10: every try is taller than 10 px -> ratio clamped to 4/3: 13x10 centred.
    const CropBox wide = randomResizedCrop(1000, 10, 0.08, 1.0, 3.0 / 4, 4.0 / 3, r1);
    EXPECT_EQ(std::make_tuple(wide.x, wide.y, wide.w, wide.h), std::make_tuple(493.0, 0.0, 13.0, 10.0));
    const CropBox tall = randomResizedCrop(10, 1000, 0.08, 1.0, 3.0 / 4, 4.0 / 3, r2);
    EXPECT_EQ(std::make_tuple(tall.x, tall.y, tall.w, tall.h), std::make_tuple(0.0, 493.0, 10.0, 13.0));
  }
  // Every try larger than the image, its ratio within range: the whole image.
  SampleRng r(1, 0, 0);
  const CropBox whole = randomResizedCrop(10, 10, 1.5, 2.0, 0.5, 2.0, r);
  EXPECT_EQ(std::make_tuple(whole.x, whole.y, whole.w, whole.h),
            std::make_tuple(0.0, 0.0, 10.0, 10.0));
}

TEST(RandomResizedCrop, SameKeySameBox) {
  SampleRng a(9, 4, 77), b(9, 4, 77);
  const CropBox x = randomResizedCrop(640, 427, 0.08, 1, 0.75, 4.0 / 3, a);
  const CropBox y = randomResizedCrop(640, 427, 0.08, 1, 0.75, 4.0 / 3, b);
  EXPECT_EQ(std::make_tuple(x.x, x.y, x.w, x.h), std::make_tuple(y.x, y.y, y.w, y.h));
}

TEST(ResizeCenterCrop, ImageNetEvalBox) {
  // 375 -> 256: scale 0.68267; 224 / scale = 328.125 centred.
  const CropBox b = resizeCenterCrop(500, 375, 256, 224);
  EXPECT_DOUBLE_EQ(b.w, 328.125);
  EXPECT_DOUBLE_EQ(b.h, 328.125);
  EXPECT_DOUBLE_EQ(b.x, (500 - 328.125) / 2);
  EXPECT_DOUBLE_EQ(b.y, (375 - 328.125) / 2);
  const CropBox p = resizeCenterCrop(375, 500, 256, 224);
  EXPECT_DOUBLE_EQ(p.x, b.y);
  EXPECT_DOUBLE_EQ(p.y, b.x);
  EXPECT_DOUBLE_EQ(p.w, 328.125);
}

TEST(ResizeCenterCrop, CropLargerThanResizeIsClamped) {
  // resize 200, crop 300: the crop is wider than the resized short side.
  const CropBox b = resizeCenterCrop(400, 200, 200, 300);
  EXPECT_DOUBLE_EQ(b.w, 300);
  EXPECT_DOUBLE_EQ(b.h, 200);
  EXPECT_DOUBLE_EQ(b.x, 50);
  EXPECT_DOUBLE_EQ(b.y, 0);
}

}  // namespace
}  // namespace batchdist::worker
