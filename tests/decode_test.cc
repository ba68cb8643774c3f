// The image decoders (Note [decode less]): every kind of JPEG and PNG becomes an
// RGB sample of the requested size; the windowed, DCT-scaled decode agrees with a
// full decode resampled over the same box; bad files throw DecodeError saying why.
#include "worker/data/decode/image.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/image_fixtures.h"

namespace batchdist::worker {
namespace {

using testing::encodeJpeg;
using testing::encodePng;
using testing::patternRgb;
using testing::PngKind;

constexpr int kW = 643, kH = 479;  // ragged: neither a multiple of 8 nor of 16

std::vector<uint8_t> bytesOf(const std::string& s) { return {s.begin(), s.end()}; }

struct Kind {
  std::string name;
  std::string bytes;
  std::vector<uint8_t> expected;  // RGB the file stands for
  bool lossless;
};

std::vector<Kind> allKinds() {
  const std::vector<uint8_t> rgb = patternRgb(kW, kH, 3, 17);
  const std::size_t n = static_cast<std::size_t>(kW) * kH;
  std::vector<uint8_t> gray(n), gray3(n * 3), cmyk(n * 4), cmyk_rgb(n * 3), pal(n * 3);
  for (std::size_t i = 0; i < n; ++i) {
    const uint8_t* p = &rgb[i * 3];
    gray[i] = static_cast<uint8_t>((p[0] + p[1] + p[2] + 1) / 3);
    for (int k = 0; k < 3; ++k) gray3[i * 3 + k] = gray[i];
    const int mx = std::max({p[0], p[1], p[2]});
    cmyk[i * 4 + 3] = static_cast<uint8_t>(255 - mx);
    for (int k = 0; k < 3; ++k) {
      cmyk[i * 4 + k] = static_cast<uint8_t>(mx ? (mx - p[k]) * 255 / mx : 0);
      // what the inks stand for: (255 - C)(255 - K) / 255
      cmyk_rgb[i * 3 + k] =
          static_cast<uint8_t>(std::lround((255.0 - cmyk[i * 4 + k]) * mx / 255.0));
      pal[i * 3 + k] = static_cast<uint8_t>((p[k] + 25) / 51 * 51);
    }
  }
  std::vector<Kind> kinds;
  kinds.push_back({"jpeg_rgb", encodeJpeg(rgb.data(), kW, kH, 3), rgb, false});
  kinds.push_back({"jpeg_gray", encodeJpeg(gray.data(), kW, kH, 1), gray3, false});
  kinds.push_back({"jpeg_cmyk_adobe", encodeJpeg(cmyk.data(), kW, kH, 4), cmyk_rgb, false});
  kinds.push_back({"jpeg_progressive", encodeJpeg(rgb.data(), kW, kH, 3, 90, true), rgb, false});
  kinds.push_back({"png_rgb", encodePng(rgb.data(), kW, kH, PngKind::kRgb8), rgb, true});
  kinds.push_back({"png_rgba", encodePng(rgb.data(), kW, kH, PngKind::kRgba8), rgb, true});
  kinds.push_back({"png_gray", encodePng(rgb.data(), kW, kH, PngKind::kGray8), gray3, true});
  kinds.push_back(
      {"png_gray_alpha", encodePng(rgb.data(), kW, kH, PngKind::kGrayAlpha8), gray3, true});
  kinds.push_back({"png_palette", encodePng(rgb.data(), kW, kH, PngKind::kPalette8), pal, true});
  kinds.push_back({"png_rgb16", encodePng(rgb.data(), kW, kH, PngKind::kRgb16), rgb, true});
  return kinds;
}

const std::vector<Kind>& kinds() {
  static const std::vector<Kind> k = allKinds();
  return k;
}

BoxChooser fixedBox(CropBox b) {
  return [b](int, int) { return b; };
}
BoxChooser wholeImage() {
  return [](int w, int h) { return CropBox{0, 0, double(w), double(h)}; };
}

std::vector<uint8_t> run(const std::string& bytes, const BoxChooser& choose, int ow, int oh,
                         bool flip = false, DecodeTimes* times = nullptr,
                         DecodeScratch* scratch = nullptr) {
  DecodeScratch local;
  std::vector<uint8_t> out(static_cast<std::size_t>(ow) * oh * 3, 0xab);
  decodeCropResize(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), choose, ow, oh,
                   flip, out.data(), scratch ? scratch : &local, times);
  return out;
}

/// Ideal resampling of the box [x0, x1) x [y0, y1) (source pixels) of an RGB image
/// to ow x oh: exact area averages when shrinking both ways, bilinear (OpenCV's
/// half-pixel-centre convention) otherwise.
std::vector<double> reference(const std::vector<uint8_t>& rgb, int w, int h, double x0, double y0,
                              double x1, double y1, int ow, int oh) {
  std::vector<double> out(static_cast<std::size_t>(ow) * oh * 3, 0);
  const double sx = (x1 - x0) / ow, sy = (y1 - y0) / oh;
  auto px = [&](int x, int y, int k) {
    return double(rgb[(static_cast<std::size_t>(y) * w + x) * 3 + k]);
  };
  if (sx >= 1 && sy >= 1) {
    for (int oy = 0; oy < oh; ++oy) {
      const double ya = y0 + oy * sy, yb = ya + sy;
      for (int ox = 0; ox < ow; ++ox) {
        const double xa = x0 + ox * sx, xb = xa + sx;
        double acc[3] = {0, 0, 0}, wsum = 0;
        for (int y = int(std::floor(ya)); y < int(std::ceil(yb)); ++y) {
          const double wy = std::min<double>(yb, y + 1) - std::max<double>(ya, y);
          for (int x = int(std::floor(xa)); x < int(std::ceil(xb)); ++x) {
            const double wgt = wy * (std::min<double>(xb, x + 1) - std::max<double>(xa, x));
            for (int k = 0; k < 3; ++k) acc[k] += wgt * px(std::min(x, w - 1), std::min(y, h - 1), k);
            wsum += wgt;
          }
        }
        for (int k = 0; k < 3; ++k) out[(static_cast<std::size_t>(oy) * ow + ox) * 3 + k] = acc[k] / wsum;
      }
    }
    return out;
  }
  for (int oy = 0; oy < oh; ++oy) {
    const double fy = std::clamp((oy + 0.5) * sy - 0.5, 0.0, y1 - y0 - 1.0) + y0;
    const int ya = int(std::floor(fy)), yb = std::min(ya + 1, h - 1);
    const double ty = fy - ya;
    for (int ox = 0; ox < ow; ++ox) {
      const double fx = std::clamp((ox + 0.5) * sx - 0.5, 0.0, x1 - x0 - 1.0) + x0;
      const int xa = int(std::floor(fx)), xb = std::min(xa + 1, w - 1);
      const double tx = fx - xa;
      for (int k = 0; k < 3; ++k) {
        out[(static_cast<std::size_t>(oy) * ow + ox) * 3 + k] =
            (1 - ty) * ((1 - tx) * px(xa, ya, k) + tx * px(xb, ya, k)) +
            ty * ((1 - tx) * px(xa, yb, k) + tx * px(xb, yb, k));
      }
    }
  }
  return out;
}

double meanAbsDiff(const std::vector<uint8_t>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += std::abs(a[i] - b[i]);
  return s / a.size();
}

std::array<double, 3> meanColour(const std::vector<uint8_t>& rgb) {
  std::array<double, 3> m{0, 0, 0};
  for (std::size_t i = 0; i < rgb.size(); ++i) m[i % 3] += rgb[i];
  for (double& v : m) v /= rgb.size() / 3;
  return m;
}

/// The DCT scale the decoder picks (the contract of jpeg.cc) and the box snapped
/// to that scale's pixel grid, in source pixels.
struct Snapped {
  int denom;
  double x0, y0, x1, y1;
};
Snapped snap(const CropBox& b, int ow, int oh, bool jpeg) {
  int d = 8;
  while (d > 1 && !(b.w / d >= ow && b.h / d >= oh)) d /= 2;
  if (!jpeg) d = 1;
  const int sw = (kW + d - 1) / d, sh = (kH + d - 1) / d;
  auto edge = [d](double v, int n) { return std::clamp<double>(std::lround(v / d), 0, n); };
  Snapped s{d, edge(b.x, sw) * d, edge(b.y, sh) * d, edge(b.x + b.w, sw) * d,
            edge(b.y + b.h, sh) * d};
  s.x1 = std::min<double>(s.x1, kW);
  s.y1 = std::min<double>(s.y1, kH);
  return s;
}

TEST(Decode, SniffsMagicNotNames) {
  const uint8_t jpg[] = {0xff, 0xd8, 0xff, 0xe0};
  const uint8_t png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  EXPECT_EQ(sniffImageFormat(jpg, sizeof jpg), ImageFormat::kJpeg);
  EXPECT_EQ(sniffImageFormat(png, sizeof png), ImageFormat::kPng);
  EXPECT_EQ(sniffImageFormat(png, 7), ImageFormat::kUnknown);
  EXPECT_EQ(sniffImageFormat(jpg, 2), ImageFormat::kUnknown);
  EXPECT_EQ(sniffImageFormat(nullptr, 0), ImageFormat::kUnknown);
}

TEST(Decode, FullDecodeOfEveryKind) {
  for (const Kind& k : kinds()) {
    SCOPED_TRACE(k.name);
    std::vector<uint8_t> rgb;
    int w = 0, h = 0;
    decodeFull(reinterpret_cast<const uint8_t*>(k.bytes.data()), k.bytes.size(), &rgb, &w, &h);
    ASSERT_EQ(w, kW);
    ASSERT_EQ(h, kH);
    ASSERT_EQ(rgb.size(), k.expected.size());
    if (k.lossless) {
      EXPECT_EQ(rgb, k.expected);  // alpha dropped (not composited), 16-bit -> high byte
    } else {
      double mae = 0;
      for (std::size_t i = 0; i < rgb.size(); ++i) mae += std::abs(rgb[i] - k.expected[i]);
      EXPECT_LT(mae / rgb.size(), 8.0);  // q90 of +-12 noise
    }
  }
}

TEST(Decode, EveryKindGivesRgbOfTheRequestedSize) {
  for (const Kind& k : kinds()) {
    SCOPED_TRACE(k.name);
    for (auto [ow, oh] : std::vector<std::pair<int, int>>{{32, 32}, {224, 224}, {100, 37}, {900, 700}}) {
      const std::vector<uint8_t> out = run(k.bytes, wholeImage(), ow, oh);
      ASSERT_EQ(out.size(), std::size_t(ow) * oh * 3);
      const auto got = meanColour(out), want = meanColour(k.expected);
      for (int c = 0; c < 3; ++c) EXPECT_NEAR(got[c], want[c], 2.5) << ow << "x" << oh << " channel " << c;
    }
  }
}

TEST(Decode, WindowedScaledDecodeAgreesWithFullDecode) {
  // (box, output size): scale 1/2, 1/4, 1/8 and 1; at the edges; fractional;
  // narrow and tall; enlarged (bilinear).
  const std::vector<std::pair<CropBox, std::pair<int, int>>> cases = {
      {{0, 0, kW, kH}, {224, 224}},           // 1/2
      {{120, 90, 400, 300}, {48, 48}},        // 1/4, windowed
      {{443, 279, 200, 200}, {24, 24}},       // 1/8, bottom-right corner
      {{0, 0, 200, 160}, {25, 20}},           // 1/8, top-left corner
      {{0, 0, 100, 80}, {100, 80}},           // 1, copy
      {{600, 0, 43, 479}, {20, 100}},         // 1/2, narrow right strip
      {{10.5, 20.25, 300.7, 200.3}, {64, 64}},  // fractional, 1/2 (rounded to its grid)
      {{257, 131, 96, 64}, {40, 40}},         // 1/2 x, 1 y -> scale 1
      {{320, 200, 50, 40}, {100, 100}},       // enlarged
      {{0, 400, kW, 79}, {64, 16}},           // full width bottom rows, 1/4
  };
  for (const Kind& k : kinds()) {
    SCOPED_TRACE(k.name);
    std::vector<uint8_t> full;
    int w = 0, h = 0;
    decodeFull(reinterpret_cast<const uint8_t*>(k.bytes.data()), k.bytes.size(), &full, &w, &h);
    const bool jpeg = k.name.rfind("jpeg", 0) == 0;
    for (const auto& [box, size] : cases) {
      const auto [ow, oh] = size;
      const Snapped s = snap(box, ow, oh, jpeg);
      SCOPED_TRACE("box " + std::to_string(box.x) + "," + std::to_string(box.y) + " " +
                   std::to_string(box.w) + "x" + std::to_string(box.h) + " -> " +
                   std::to_string(ow) + "x" + std::to_string(oh) + " scale 1/" +
                   std::to_string(s.denom));
      const std::vector<uint8_t> got = run(k.bytes, fixedBox(box), ow, oh);
      const std::vector<double> want = reference(full, w, h, s.x0, s.y0, s.x1, s.y1, ow, oh);
      EXPECT_LT(meanAbsDiff(got, want), 3.0);
    }
  }
}

TEST(Decode, FlipMirrorsExactly) {
  for (const Kind& k : kinds()) {
    SCOPED_TRACE(k.name);
    for (const CropBox& box : {CropBox{31, 17, 300, 280}, CropBox{0, 0, kW, kH}}) {
      for (int ow : {224, 33}) {
        const std::vector<uint8_t> a = run(k.bytes, fixedBox(box), ow, 50, false);
        const std::vector<uint8_t> b = run(k.bytes, fixedBox(box), ow, 50, true);
        for (int y = 0; y < 50; ++y) {
          for (int x = 0; x < ow; ++x) {
            for (int c = 0; c < 3; ++c) {
              ASSERT_EQ(b[(y * ow + x) * 3 + c], a[(y * ow + (ow - 1 - x)) * 3 + c])
                  << "at " << x << "," << y;
            }
          }
        }
      }
    }
  }
}

TEST(Decode, SmallBoxDecodesFewerPixels) {
  for (const Kind& k : kinds()) {
    if (k.lossless) continue;  // PNG inflates everything
    SCOPED_TRACE(k.name);
    DecodeTimes full, small, scaled;
    run(k.bytes, wholeImage(), kW, kH, false, &full);
    EXPECT_EQ(full.decoded_pixels, int64_t{kW} * kH);
    run(k.bytes, fixedBox({300, 200, 64, 64}), 64, 64, false, &small);
    EXPECT_LT(small.decoded_pixels, full.decoded_pixels / 20) << "the window was not cropped";
    EXPECT_GT(small.decoded_pixels, 64 * 64 - 1);
    run(k.bytes, wholeImage(), 64, 48, false, &scaled);  // 1/8
    EXPECT_EQ(scaled.decoded_pixels, int64_t{(kW + 7) / 8} * ((kH + 7) / 8));
    EXPECT_GE(full.decode, 0);
    EXPECT_GE(full.transform, 0);
  }
}

TEST(Decode, BoxesAreClampedToTheImage) {
  const Kind& k = kinds()[0];
  const std::vector<uint8_t> a = run(k.bytes, fixedBox({-50, -20, kW + 100, kH + 60}), 64, 64);
  const std::vector<uint8_t> b = run(k.bytes, wholeImage(), 64, 64);
  EXPECT_EQ(a, b);
  // A box entirely past the right edge still decodes (its last column).
  EXPECT_NO_THROW(run(k.bytes, fixedBox({kW + 10, 0, 5, 5}), 8, 8));
  try {
    run(k.bytes, fixedBox({0, 0, std::nan(""), 10}), 8, 8);
    FAIL() << "NaN box accepted";
  } catch (const DecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("not a box"), std::string::npos) << e.what();
  }
}

/// Expects DecodeError from decodeCropResize (with `needle` in its message) and
/// from decodeFull; returns the message.
std::string expectDecodeError(const std::string& bytes, const std::string& needle,
                              const BoxChooser& choose = wholeImage()) {
  std::string message;
  try {
    run(bytes, choose, 32, 32);
    ADD_FAILURE() << "no DecodeError (want one saying '" << needle << "')";
  } catch (const DecodeError& e) {
    message = e.what();
    EXPECT_NE(message.find(needle), std::string::npos)
        << "message: " << message << "\nwanted: " << needle;
  }
  std::vector<uint8_t> rgb;
  int w = 0, h = 0;
  EXPECT_THROW(decodeFull(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), &rgb, &w, &h),
               DecodeError);
  return message;
}

TEST(DecodeErrors, EmptyAndNotAnImage) {
  expectDecodeError("", "not a JPEG or PNG image (it is empty)");
  expectDecodeError("hello, this is a text file named cat.jpg\n",
                    "not a JPEG or PNG image (starts with \"hello, t...\")");
  expectDecodeError(std::string("GIF89a\x01\x00", 8), "starts with 47 49 46 38 39 61 01 00");
  expectDecodeError(std::string("\xff\xd8", 2), "not a JPEG or PNG");
}

TEST(DecodeErrors, TruncatedJpeg) {
  for (const Kind& k : kinds()) {
    if (k.lossless) continue;
    SCOPED_TRACE(k.name);
    const std::string half = k.bytes.substr(0, k.bytes.size() / 2);
    expectDecodeError(half, "Premature end of JPEG file");
    // A centre crop needs rows past the cut too.
    expectDecodeError(half, "Premature end of JPEG file",
                      fixedBox({kW / 4.0, kH / 4.0, kW / 2.0, kH / 2.0}));
    // Cut inside the header.
    expectDecodeError(k.bytes.substr(0, 100), "JPEG:");
  }
}

std::size_t entropyStart(const std::string& jpeg) {
  for (std::size_t i = 2; i + 3 < jpeg.size(); ++i) {
    if (uint8_t(jpeg[i]) == 0xff && uint8_t(jpeg[i + 1]) == 0xda) {
      return i + 2 + (uint8_t(jpeg[i + 2]) << 8 | uint8_t(jpeg[i + 3]));
    }
  }
  return std::string::npos;
}

TEST(DecodeErrors, CorruptJpegEntropyData) {
  const Kind& k = kinds()[0];
  const std::size_t start = entropyStart(k.bytes);
  ASSERT_NE(start, std::string::npos);
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    std::string bad = k.bytes;
    uint64_t s = seed * 0x9e3779b97f4a7c15ULL;
    const std::size_t at = start + (bad.size() - start) / 2;
    for (std::size_t i = at; i < at + 400; ++i) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      bad[i] = static_cast<char>(s);
    }
    SCOPED_TRACE("seed " + std::to_string(seed));
    if (seed == 7) {
      // These 400 bytes happen to be valid Huffman codes without a marker: the
      // decoder desynchronises silently and finishes 161 bytes before EOI.
      // libjpeg only says so at jpeg_finish_decompress ("161 extraneous bytes
      // before marker 0xd9"), a warning we deliberately ignore: real photos
      // (a few in ImageNet) carry it and decode fine in PIL. Documented here so
      // a change of policy shows up.
      EXPECT_NO_THROW(run(bad, wholeImage(), 32, 32));
      continue;
    }
    // "JPEG: Corrupt JPEG data: premature end of data segment" (a warning to
    // libjpeg, which would fill the rest grey).
    expectDecodeError(bad, "Corrupt JPEG data");
  }
}

TEST(DecodeErrors, ScratchDecodesOnAfterAFailure) {
  // One DecodeScratch keeps its JPEG decompressor across images: an image that
  // fails half way (truncated, corrupt header) leaves it usable, and the next
  // images decode exactly as with a fresh scratch.
  DecodeScratch reused;
  const CropBox box{31, 17, 300, 280};
  for (const Kind& k : kinds()) {
    SCOPED_TRACE(k.name);
    for (const std::string& bad :
         {k.bytes.substr(0, k.bytes.size() / 2), k.bytes.substr(0, 100), std::string("\xff\xd8\xff")}) {
      std::vector<uint8_t> out(224 * 224 * 3);
      EXPECT_THROW(decodeCropResize(reinterpret_cast<const uint8_t*>(bad.data()), bad.size(),
                                    fixedBox(box), 224, 224, false, out.data(), &reused),
                   DecodeError);
      EXPECT_EQ(run(k.bytes, fixedBox(box), 224, 224, true, nullptr, &reused),
                run(k.bytes, fixedBox(box), 224, 224, true));
      EXPECT_EQ(run(k.bytes, wholeImage(), 64, 48, false, nullptr, &reused),
                run(k.bytes, wholeImage(), 64, 48, false));
    }
  }
}

TEST(DecodeErrors, TruncatedPng) {
  for (const Kind& k : kinds()) {
    if (!k.lossless) continue;
    SCOPED_TRACE(k.name);
    expectDecodeError(k.bytes.substr(0, k.bytes.size() / 2), "PNG:");
    expectDecodeError(k.bytes.substr(0, 20), "PNG:");
  }
}

TEST(DecodeErrors, CorruptPngData) {
  std::string bad = kinds()[4].bytes;
  for (std::size_t i = bad.size() / 2; i < bad.size() / 2 + 64; ++i) bad[i] = char(i * 7);
  expectDecodeError(bad, "PNG:");
}

TEST(DecodeErrors, HugeJpegHeaderIsRefusedBeforeAllocating) {
  std::string bad = kinds()[0].bytes;
  std::size_t sof = std::string::npos;
  for (std::size_t i = 2; i + 9 < bad.size(); ++i) {
    if (uint8_t(bad[i]) == 0xff && uint8_t(bad[i + 1]) == 0xc0) {
      sof = i;
      break;
    }
  }
  ASSERT_NE(sof, std::string::npos);
  const uint16_t dim = 60000;
  bad[sof + 5] = char(dim >> 8), bad[sof + 6] = char(dim & 0xff);  // height
  bad[sof + 7] = char(dim >> 8), bad[sof + 8] = char(dim & 0xff);  // width
  expectDecodeError(bad, "60000x60000 pixels, over the limit");
}

TEST(DecodeErrors, HugePngHeaderIsRefusedBeforeAllocating) {
  std::string bad = kinds()[4].bytes;
  // IHDR data at 16..28, its CRC (over type and data) at 29..32.
  for (int i = 0; i < 2; ++i) {
    const uint32_t dim = 60000;
    for (int b = 0; b < 4; ++b) bad[16 + 4 * i + b] = char(dim >> (24 - 8 * b));
  }
  const uint32_t crc = static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(bad.data()) + 12, 17));
  for (int b = 0; b < 4; ++b) bad[29 + b] = char(crc >> (24 - 8 * b));
  expectDecodeError(bad, "60000x60000 pixels, over the limit");
}

TEST(Decode, ConcurrentCallsWithOwnScratchAgree) {
  std::vector<std::vector<uint8_t>> want;
  std::vector<CropBox> boxes = {{0, 0, kW, kH}, {100, 50, 300, 200}, {500, 300, 143, 179}};
  for (const Kind& k : kinds()) {
    for (const CropBox& b : boxes) want.push_back(run(k.bytes, fixedBox(b), 56, 56, true));
  }
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      DecodeScratch scratch;  // one per thread, reused
      for (int rep = 0; rep < 3; ++rep) {
        std::size_t i = 0;
        for (const Kind& k : kinds()) {
          for (const CropBox& b : boxes) {
            if (run(k.bytes, fixedBox(b), 56, 56, true, nullptr, &scratch) != want[i]) {
              ++mismatches[t];
            }
            ++i;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

}  // namespace
}  // namespace batchdist::worker

TEST(DecodeErrors, APngHeaderClaimingMoreThanTheFileCanHoldIsRefusedBeforeAllocating) {
  // A valid 16x16 PNG whose IHDR is rewritten to 16384 x 16384 (CRC fixed): 3 KB of
  // file cannot hold 2^28 pixels, so nothing is allocated for them.
  const auto rgb = batchdist::testing::patternRgb(16, 16, 1, 3);
  auto png = batchdist::testing::encodePng(rgb.data(), 16, 16, batchdist::testing::PngKind::kRgb8);
  auto put32 = [&](std::size_t at, uint32_t v) {
    for (int k = 0; k < 4; ++k) png[at + k] = static_cast<char>(v >> (24 - 8 * k));
  };
  put32(16, 16384);  // IHDR data starts at byte 16: width, height
  put32(20, 16384);
  uint32_t crc = 0xFFFFFFFFu;  // CRC-32 of "IHDR" + its 13 data bytes
  for (std::size_t i = 12; i < 12 + 4 + 13; ++i) {
    crc ^= static_cast<uint8_t>(png[i]);
    for (int b = 0; b < 8; ++b) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  put32(29, ~crc);
  batchdist::worker::DecodeScratch scratch;
  std::vector<uint8_t> out(8 * 8 * 3);
  try {
    batchdist::worker::decodeCropResize(reinterpret_cast<const uint8_t*>(png.data()), png.size(),
                                        [](int w, int h) { return batchdist::worker::CropBox{0, 0, double(w), double(h)}; },
                                        8, 8, false, out.data(), &scratch);
    FAIL() << "decoded";
  } catch (const batchdist::worker::DecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be held in"), std::string::npos) << e.what();
  }
  EXPECT_LT(scratch.rgb.capacity(), std::size_t{1} << 20);
}
